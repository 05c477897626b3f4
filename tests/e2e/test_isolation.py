"""Ack-timeout isolation end to end with kombu: the seed's scheme, with sub-second timeouts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import kombu
import pytest

pytestmark = pytest.mark.e2e

ISOLATION = (
    "<isolation><ackTimeout>300ms</ackTimeout><checkPeriod>100ms</checkPeriod>{extra}</isolation>"
)


def config(extra: str = "", subscription: str = "shared") -> str:
    return (
        f'<queue name="work" subscription="{subscription}">{ISOLATION.format(extra=extra)}</queue>'
    )


class Worker:
    """A kombu consumer on its own connection; ``acks`` decides whether its handler acks."""

    def __init__(
        self,
        url: str,
        name: str,
        queue: str = "work",
        *,
        acks: bool = True,
        prefetch: int = 5,
        arguments: dict | None = None,
        work: float = 0.0,
    ) -> None:
        self.name = name
        self.acks = acks
        #: seconds each message takes to process before its ack
        self.work = work
        self.conn = kombu.Connection(url)
        self.got: list[kombu.Message] = []
        q = kombu.Queue(
            queue,
            routing_key=queue,
            durable=False,
            auto_delete=False,
            queue_arguments=arguments or {},
        )
        self.consumer = self.conn.Consumer(q, callbacks=[self._on], prefetch_count=prefetch)
        self.consumer.consume()

    def _on(self, body: object, message: kombu.Message) -> None:
        self.got.append(message)
        if self.work:
            time.sleep(self.work)
        if self.acks:
            message.ack()

    def drain(self, seconds: float = 0.05) -> None:
        try:
            self.conn.drain_events(timeout=seconds)
        except TimeoutError:
            pass

    def bodies(self) -> list[int]:
        return [m.payload for m in self.got]

    def close(self) -> None:
        self.conn.release()


def run_until(workers: list[Worker], cond: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in workers:
            w.drain(0.02)
        if cond():
            return True
    return False


def publish(url: str, bodies: range, queue: str = "work") -> None:
    with kombu.Connection(url) as conn:
        p = conn.Producer()
        for i in bodies:
            p.publish(i, routing_key=queue)


def isolated(b, queue: str = "work") -> list[str]:
    return b.call(
        lambda: [c.tag for c in b.broker.vhosts["/"].queues[queue].consumers if c.isolated]
    )


@pytest.fixture
def workers():
    made: list[Worker] = []
    yield made
    for w in made:
        w.close()


def test_scheme_1_2_3_stuck_consumer_isolated_its_messages_moved_then_released(
    broker_factory, workers
):
    b = broker_factory(config())
    stuck = Worker(b.url(), "stuck", acks=False)
    ok1, ok2 = Worker(b.url(), "ok1"), Worker(b.url(), "ok2")
    workers += [stuck, ok1, ok2]
    publish(b.url(), range(30))
    # point 1: the stuck one holds its prefetch; after ackTimeout + checkPeriod it is
    # isolated and the others receive its messages, redelivered
    assert run_until(workers, lambda: sorted(ok1.bodies() + ok2.bodies()) == list(range(30)))
    held = stuck.bodies()
    assert len(held) == 5
    assert isolated(b) == [stuck.got[0].delivery_info["consumer_tag"]]
    moved = [m for m in ok1.got + ok2.got if m.payload in held]
    assert len(moved) == 5 and all(m.delivery_info["redelivered"] for m in moved)
    # point 2: no more deliveries to it
    publish(b.url(), range(30, 40))
    assert run_until(workers, lambda: len(ok1.got) + len(ok2.got) == 40)
    assert len(stuck.got) == 5
    # point 3: it acks (a moved message: accepted, no channel error) and leaves the blocklist
    stuck.got[0].ack()
    assert run_until(workers, lambda: not isolated(b), timeout=1.0)
    stuck.acks = True
    publish(b.url(), range(40, 70))
    assert run_until(workers, lambda: len(stuck.got) > 5)
    assert all(m.payload >= 40 for m in stuck.got[5:])


#: the issue's case: a half-second ack timeout, checked often
IDLE_CONFIG = (
    '<queue name="work"><isolation><ackTimeout>500ms</ackTimeout>'
    "<checkPeriod>100ms</checkPeriod></isolation></queue>"
)


def test_a_healthy_consumer_back_from_an_idle_spell_is_not_isolated(broker_factory, workers):
    b = broker_factory(IDLE_CONFIG)
    # two healthy workers that take 200 ms per message, one message in flight at a time
    a = Worker(b.url(), "a", prefetch=1, work=0.2)
    c = Worker(b.url(), "c", prefetch=1, work=0.2)
    workers += [a, c]
    done = 0
    for i in range(4):
        # a second of quiet: twice ackTimeout since anyone's last ack
        run_until(workers, lambda: False, timeout=1.0)
        publish(b.url(), range(i, i + 1))
        done += 1
        assert run_until(workers, lambda n=done: len(a.got) + len(c.got) == n)
    run_until(workers, lambda: False, timeout=0.3)  # more checks after the last one
    assert isolated(b) == []
    got = a.got + c.got
    assert sorted(m.payload for m in got) == [0, 1, 2, 3]  # each processed exactly once
    assert not any(m.delivery_info["redelivered"] for m in got)
    assert a.got and c.got  # both were tested after a quiet spell


def test_a_stuck_consumer_back_from_an_idle_spell_is_isolated_after_ack_timeout(
    broker_factory, workers, caplog
):
    caplog.set_level(logging.INFO, logger="plugbroker.policy")
    b = broker_factory(IDLE_CONFIG)
    stuck = Worker(b.url(), "stuck", prefetch=1)
    ok = Worker(b.url(), "ok", prefetch=1, work=0.2)
    workers += [stuck, ok]
    publish(b.url(), range(2))  # one each, both acked: both have a last ack
    assert run_until(workers, lambda: len(stuck.got) == 1 and len(ok.got) == 1)
    run_until(workers, lambda: False, timeout=2.0)  # quiet: no clock runs while idle
    stuck.acks = False  # now it hangs on its next message
    publish(b.url(), range(2, 4))
    assert run_until(workers, lambda: bool(isolated(b)), timeout=2.0)
    assert isolated(b) == [stuck.got[1].delivery_info["consumer_tag"]]
    # isolated for holding its message past ackTimeout (500 ms, checked every 100 ms), not for
    # the time since its last ack, which includes the two quiet seconds
    [line] = [r.getMessage() for r in caplog.records if "isolated: no ack for" in r.getMessage()]
    held = float(line.split("isolated: no ack for ")[1].split(" s")[0])
    assert 0.5 < held < 1.5
    assert run_until(workers, lambda: len(ok.got) == 3)
    [moved] = [m for m in ok.got if m.payload == stuck.got[1].payload]
    assert moved.delivery_info["redelivered"]


def test_scheme_3_disconnecting_also_releases(broker_factory, workers, caplog):
    caplog.set_level(logging.INFO, logger="plugbroker.policy")
    b = broker_factory(config())
    stuck, ok = Worker(b.url(), "stuck", acks=False), Worker(b.url(), "ok")
    workers += [ok]
    publish(b.url(), range(10))
    assert run_until([stuck, ok], lambda: len(isolated(b)) == 1)
    stuck.close()
    assert run_until(
        [ok], lambda: b.call(lambda: len(b.broker.vhosts["/"].queues["work"].consumers)) == 1
    )
    assert any(
        "released" in r.getMessage() and "disconnected" in r.getMessage() for r in caplog.records
    )
    assert run_until([ok], lambda: sorted(ok.bodies()) == list(range(10)))


def test_scheme_4_with_two_consumers_both_stuck_only_one_is_isolated(
    broker_factory, workers, caplog
):
    caplog.set_level(logging.INFO, logger="plugbroker.policy")
    b = broker_factory(config())
    a, c = Worker(b.url(), "a", acks=False), Worker(b.url(), "c", acks=False)
    workers += [a, c]
    publish(b.url(), range(10))
    assert run_until(workers, lambda: len(isolated(b)) == 1)
    run_until(workers, lambda: False, timeout=0.6)  # several more checks
    assert len(isolated(b)) == 1  # floor(0.6 x 2) = 1
    assert any("cap held" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("subscription", ["key_shared", "exclusive"])
def test_key_shared_and_exclusive_queues_are_never_isolated(broker_factory, workers, subscription):
    b = broker_factory(
        f'<queue name="work" subscription="{subscription}"/>' + ISOLATION.format(extra="")
    )  # isolation as the vhost default
    first = Worker(b.url(), "a", acks=False)
    workers.append(first)
    if subscription == "key_shared":
        workers.append(Worker(b.url(), "b", acks=False))
    publish(b.url(), range(10))
    run_until(workers, lambda: False, timeout=0.8)  # ackTimeout passes, checks run
    assert isolated(b) == []
    # all ten share one key, so one consumer owns them: it holds its five, nothing moved
    assert sum(len(w.got) for w in workers) == 5
    assert not any(m.delivery_info["redelivered"] for w in workers for m in w.got)


def test_a_consumer_that_never_gets_a_message_is_never_isolated(broker_factory, workers):
    b = broker_factory(config())
    idle, other = Worker(b.url(), "idle", acks=False), Worker(b.url(), "other", acks=False)
    workers += [idle, other]
    run_until(workers, lambda: False, timeout=0.8)
    assert isolated(b) == []


def test_late_ack_of_a_moved_message_not_yet_redelivered_counts_as_acked(broker_factory, workers):
    b = broker_factory(config())
    stuck = Worker(b.url(), "stuck", acks=False, prefetch=3)
    busy = Worker(b.url(), "busy", acks=False, prefetch=3)  # holds its own three, acks none
    workers += [stuck, busy]
    publish(b.url(), range(6))
    assert run_until(workers, lambda: len(stuck.got) == 3 and len(busy.got) == 3)
    busy.got[0].ack()  # busy stays alive; stuck does not
    assert run_until(workers, lambda: isolated(b) == [stuck.got[0].delivery_info["consumer_tag"]])
    # the moved messages wait: busy's window is full
    ready = b.call(lambda: b.broker.vhosts["/"].queues["work"].ready_count)
    assert ready == 2 or ready == 3
    late = stuck.got[1]
    late.ack()  # no channel error, and the message is not delivered again
    assert run_until(workers, lambda: not isolated(b), timeout=1.0)
    for m in busy.got[1:]:
        m.ack()
    busy.acks = True
    run_until(workers, lambda: False, timeout=0.5)
    redelivered = [m.payload for m in busy.got[3:]]
    assert late.payload not in redelivered
    assert stuck.conn.default_channel.is_open


def test_unacked_cap_holds_with_unlimited_prefetch(broker_factory, workers):
    b = broker_factory(config("<maxUnackedPerConsumer>10</maxUnackedPerConsumer>"))
    w = Worker(b.url(), "greedy", acks=False, prefetch=0)
    workers.append(w)
    publish(b.url(), range(40))
    run_until(workers, lambda: len(w.got) >= 10, timeout=1.0)
    run_until(workers, lambda: False, timeout=0.2)
    assert len(w.got) == 10
    for m in w.got[:4]:
        m.ack()
    run_until(workers, lambda: False, timeout=0.2)
    assert len(w.got) == 10  # 6 unacked: above half, still held back
    w.got[4].ack()
    assert run_until(workers, lambda: len(w.got) == 15, timeout=1.0)  # 5 left: refilled to 10


# ------------------------------------------------------------------------------ bounded tries

#: the default cap (maxIsolatedRatio 0.6), the default poisonDeliveries (3); the limits are the
#: broker's (the clients pass none)
POISON_CONFIG = (
    '<queue name="work" subscription="shared">'
    "<isolation><ackTimeout>300ms</ackTimeout><checkPeriod>100ms</checkPeriod></isolation>"
    "<deadLetter><queue>work-dead</queue></deadLetter>"
    "</queue>"
)


class PoisonedWorker(Worker):
    """Acks everything except the poison message, on which its handler "hangs": it never
    settles it (it goes on draining, as a consumer whose worker thread is stuck would keep
    its connection)."""

    def _on(self, body: object, message: kombu.Message) -> None:
        self.got.append(message)
        if body != "poison":
            message.ack()


class ConfirmedPublisher:
    """A bystander on its own py-amqp connection, publishing with confirms throughout."""

    def __init__(self, url: str, queue: str = "bystander") -> None:
        import amqp

        self.conn = amqp.Connection(host=url.split("@")[1].split("/")[0])
        self.conn.connect()
        self.ch = self.conn.channel()
        self.ch.queue_declare(queue, durable=False, auto_delete=False)
        self.ch.confirm_select()
        self.queue = queue
        self.sent = 0
        self._message = amqp.Message

    def publish(self) -> None:
        self.ch.basic_publish_confirm(self._message(b"b"), routing_key=self.queue)
        self.sent += 1

    def close(self) -> int:
        n = self.ch.queue_declare(self.queue, passive=True).message_count
        self.conn.close()
        return n


def dead_count(b, queue: str = "work-dead") -> int:
    return b.call(
        lambda: (
            len(b.broker.vhosts["/"].queues[queue].held)
            if queue in b.broker.vhosts["/"].queues
            else 0
        )
    )


@pytest.mark.parametrize("consumers", [1, 2, 3])
def test_a_message_that_hangs_every_consumer_runs_at_most_poison_deliveries_times(
    broker_factory, workers, tmp_path, consumers
):
    """One, two or three consumers under the default cap (0.6: none, one or one of them may be
    isolated): the message that hangs whoever takes it is handed out, and times out, at most
    three times, then it is in the dead-letter queue with reason poison and every consumer
    goes on consuming."""
    b = broker_factory(POISON_CONFIG, journal=True)
    bystander = ConfirmedPublisher(b.url())
    workers += [PoisonedWorker(b.url(), f"w{i}", prefetch=1) for i in range(consumers)]
    publish(b.url(), ["poison"])
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and not dead_count(b):
        run_until(workers, lambda: False, timeout=0.1)
        bystander.publish()  # the bystander's confirms come back all along
    assert dead_count(b) == 1
    handed = sum(m.payload == "poison" for w in workers for m in w.got)
    assert 1 <= handed <= 3
    assert isolated(b) == []  # those isolated for it are released
    # a consumer still "on" the poison message gets nothing new: no other message waits
    # behind it, nor runs twice for being moved from it
    holders = [w for w in workers if any(m.payload == "poison" for m in w.got)]
    free = [w for w in workers if w not in holders]
    before = {w.name: len(w.got) for w in workers}
    publish(b.url(), range(10))
    if free:
        assert run_until(workers, lambda: sum(len(w.got) - before[w.name] for w in free) == 10)
    assert all(len(w.got) == before[w.name] for w in holders)
    # their late acks of the poison message are accepted without a channel error, and they
    # take new messages again
    for w in holders:
        for m in w.got:
            if m.payload == "poison":
                m.ack()
    publish(b.url(), range(10, 40))
    assert run_until(
        workers,
        lambda: (
            sorted(m.payload for w in workers for m in w.got if m.payload != "poison")
            == list(range(40))
        ),
        timeout=6.0,
    )
    assert all(len(w.got) > before[w.name] for w in workers)
    assert all(w.conn.default_channel.is_open for w in workers)
    bystander.publish()
    assert bystander.close() == bystander.sent
    # the dead letter says why, and how often it timed out
    with kombu.Connection(b.url()) as conn:
        dead = conn.SimpleQueue("work-dead").get(timeout=2)
        death = dead.headers["x-death"][0]
        assert (death["reason"], death["queue"]) == ("poison", "work")
        assert dead.headers["REAL_TOPIC"] == "work" and dead.payload == "poison"
        dead.ack()
    b.stop()
    # the journal counts each timed-out hand-out, then the dead letter
    from plugbroker.plugins.journal import read_journal

    evs = [e for e in read_journal(tmp_path / "journal").to_pylist() if e["queue"] == "work"]
    timed_out = [e for e in evs if e["event"] == "timed_out"]
    assert [e["count"] for e in timed_out] == [1, 2, 3]
    [dl] = [e for e in evs if e["event"] == "dead_lettered"]
    assert dl["reason"] == "poison"
    actions = [e["action"] for e in evs if e["event"] == "policy_action"]
    if consumers == 1:  # never isolated (floor(0.6 x 1) = 0): every timeout counted spared
        assert "IsolateConsumer" not in actions and actions.count("CountTimeout") == 3


def test_a_redelivery_after_a_timeout_shows_the_count(broker_factory, workers):
    b = broker_factory(POISON_CONFIG)
    first = PoisonedWorker(b.url(), "first", prefetch=1)
    workers.append(first)
    publish(b.url(), ["poison"])
    assert run_until([first], lambda: len(first.got) == 1)
    assert "x-ack-timeout-count" not in first.got[0].headers
    second = PoisonedWorker(b.url(), "second", prefetch=1)
    workers.append(second)
    # floor(0.6 x 2) = 1: first is isolated, its message goes to second with the count
    assert run_until(workers, lambda: len(second.got) == 1, timeout=5.0)
    got = second.got[0]
    assert got.headers["x-ack-timeout-count"] == 1 and got.headers["x-delivery-count"] == 1


def test_a_message_whose_consumers_crash_past_the_timeout_is_parked_as_poison(broker_factory):
    """Each consumer holds the message past its ack timeout, then goes away without settling
    it (a crash, not a stall); the check never runs (its period is an hour): the closes alone
    count the timeouts, and without a dead-letter queue it is parked in ``work-DLQ``."""
    b = broker_factory(
        '<queue name="work" subscription="shared">'
        "<isolation><ackTimeout>300ms</ackTimeout><checkPeriod>1h</checkPeriod></isolation>"
        "</queue>"
    )
    bystander = ConfirmedPublisher(b.url())

    def overdue() -> bool:
        def check() -> bool:
            q = b.broker.vhosts["/"].queues["work"]
            now = b.broker.clock.monotonic()
            return any(c.busy_since is not None and now - c.busy_since > 0.3 for c in q.consumers)

        return bool(b.call(check))

    for i in range(3):
        w = PoisonedWorker(b.url(), f"crash-{i}", prefetch=1)
        if i == 0:
            publish(b.url(), ["poison"])  # the queue exists once a consumer declared it
        assert run_until([w], lambda w=w: len(w.got) == 1)
        assert w.got[0].payload == "poison"
        assert w.got[0].delivery_info["redelivered"] == (i > 0)
        assert run_until([w], overdue)
        w.close()  # it goes away without settling it
        bystander.publish()
    with kombu.Connection(b.url()) as conn:
        dead = conn.SimpleQueue("work-DLQ").get(timeout=2)
        assert dead.headers["x-death"][0]["reason"] == "poison" and dead.payload == "poison"
        dead.ack()
    assert b.call(lambda: b.broker.vhosts["/"].queues["work"].message_count) == 0
    assert b.call(lambda: b.broker.vhosts["/"].queues["work-DLQ"].durable)
    # the next consumer is not touched by it
    w = PoisonedWorker(b.url(), "next", prefetch=1)
    publish(b.url(), range(3))
    try:
        assert run_until([w], lambda: [m.payload for m in w.got] == [0, 1, 2])
    finally:
        w.close()
    assert bystander.close() == bystander.sent == 3


def test_consumers_that_close_before_their_timeout_count_nothing(broker_factory):
    b = broker_factory(POISON_CONFIG.replace("300ms", "60s"))
    for i in range(4):
        w = PoisonedWorker(b.url(), f"restart-{i}", prefetch=1)
        if i == 0:
            publish(b.url(), ["poison"])
        assert run_until([w], lambda w=w: len(w.got) == 1)
        w.close()
    q = b.call(lambda: [m.timeouts for m in b.broker.vhosts["/"].queues["work"].held.values()])
    assert q == [0] and dead_count(b) == 0

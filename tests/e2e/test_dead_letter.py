"""Retry and dead letter end to end with kombu and py-amqp: PIP-22, PIP-106, TDMQ's retry queue."""

from __future__ import annotations

import itertools
import sys
import time
import types
from typing import Any

import amqp
import kombu
import pytest

from plugbroker.retry import RetryError, reconsume_later

pytestmark = pytest.mark.e2e


def dl_config(inner: str = "", queue: str = "work", args: str = "") -> str:
    return f'<queue name="{queue}" {args}><deadLetter>{inner}</deadLetter></queue>'


def declare(conn: kombu.Connection, name: str = "work", **arguments: Any) -> kombu.Queue:
    q = kombu.Queue(name, routing_key=name, durable=True, queue_arguments=arguments or None)
    q(conn.default_channel).declare()
    return q


def publish(conn: kombu.Connection, body: Any, queue: str = "work", **kw: Any) -> None:
    conn.Producer().publish(body, routing_key=queue, **kw)


def take(conn: kombu.Connection, queue: str, timeout: float = 3.0) -> kombu.Message | None:
    """basic.get until a message comes (bounded); a dead-letter queue is created by its
    first dead letter, so a 404 before then just means "not yet"."""
    deadline = time.monotonic() + timeout
    channel = conn.channel()
    while time.monotonic() < deadline:
        try:
            m = kombu.Queue(queue, channel=channel, no_declare=True).get(no_ack=False)
        except amqp.exceptions.NotFound:
            channel = conn.channel()
            m = None
        if m is not None:
            return m
        time.sleep(0.02)
    return None


def consume_for(conn: kombu.Connection, queue: kombu.Queue, handler, seconds: float) -> None:
    with conn.Consumer(queue, callbacks=[handler], prefetch_count=1):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.05)
            except TimeoutError:
                pass


def test_always_nack_sees_the_message_max_plus_one_times_then_it_is_in_the_dlq(broker_factory):
    b = broker_factory(dl_config("<maxRedeliveries>3</maxRedeliveries>"))
    seen: list[kombu.Message] = []
    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        publish(conn, {"poison": True}, message_id="order-42")
        consume_for(conn, q, lambda body, m: (seen.append(m), m.requeue()), 1.0)
        assert len(seen) == 4  # maxRedeliveries + 1
        assert [m.headers.get("x-delivery-count") for m in seen] == [None, 1, 2, 3]
        assert [m.delivery_info["redelivered"] for m in seen] == [False, True, True, True]
        dead = take(conn, "work-DLQ")
        assert dead is not None and dead.payload == {"poison": True}
        h = dead.headers
        assert h["REAL_TOPIC"] == "work" and h["ORIGIN_MESSAGE_ID"] == "order-42"
        assert h["RECONSUMETIMES"] == 0
        death = h["x-death"][0]
        assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", "work", 1)
        assert h["x-first-death-reason"] == "delivery_limit"
        assert h["x-first-death-queue"] == "work"
        dead.ack()  # the DLQ is an ordinary queue
        assert b.call(lambda: b.broker.vhosts["/"].queues["work-DLQ"].durable)
        assert b.call(lambda: b.broker.vhosts["/"].queues["work"].message_count) == 0


def test_channel_close_counts_towards_the_limit(broker_factory):
    b = broker_factory(dl_config("<maxRedeliveries>2</maxRedeliveries>"))
    with kombu.Connection(b.url()) as setup:
        declare(setup)
        publish(setup, "crashy")
    for _ in range(3):  # a consumer that dies holding it, three times
        with amqp.Connection(host=f"127.0.0.1:{b.port}") as conn:
            ch = conn.channel()
            assert ch.basic_get("work") is not None
    with kombu.Connection(b.url()) as conn:
        assert take(conn, "work", timeout=0.3) is None
        dead = take(conn, "work-DLQ")
        assert dead is not None and dead.headers["x-death"][0]["reason"] == "delivery_limit"


@pytest.mark.parametrize(
    "reason,setup",
    [
        ("rejected", "reject"),
        ("expired", "ttl"),
        ("maxlen", "overflow"),
    ],
)
def test_x_death_reason_for_each_trigger(broker_factory, reason, setup):
    b = broker_factory(dl_config())
    with kombu.Connection(b.url()) as conn:
        if setup == "ttl":
            declare(conn, **{"x-message-ttl": 50})
            publish(conn, "old")
        elif setup == "overflow":
            declare(conn, **{"x-max-length": 1})
            publish(conn, "first")
            publish(conn, "second")  # drops the head
        else:
            declare(conn)
            publish(conn, "nope")
            m = take(conn, "work")
            assert m is not None
            m.reject(requeue=False)
        dead = take(conn, "work-DLQ")
        assert dead is not None
        assert dead.headers["x-death"][0]["reason"] == reason
        assert dead.headers["REAL_TOPIC"] == "work"


def test_exponential_backoff_delays_grow_as_configured(broker_factory):
    b = broker_factory(
        dl_config(
            "<maxRedeliveries>10</maxRedeliveries>"
            '<backoff type="exponential"><min>100ms</min><max>1s</max>'
            "<multiplier>2</multiplier></backoff>"
        )
    )
    times: list[float] = []
    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        publish(conn, "flaky")
        consume_for(
            conn,
            q,
            lambda body, m: (
                (times.append(time.monotonic()), m.requeue()) if len(times) < 4 else m.ack()
            ),
            1.6,
        )
    gaps = [b2 - a for a, b2 in itertools.pairwise(times)]
    assert len(gaps) == 3
    for gap, expected in zip(gaps, (0.1, 0.2, 0.4)):
        assert expected * 0.9 <= gap < expected + 0.25, gaps


def test_without_backoff_a_requeue_is_immediate(broker_factory):
    b = broker_factory(dl_config("<maxRedeliveries>10</maxRedeliveries>"))
    times: list[float] = []
    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        publish(conn, "again")
        consume_for(
            conn,
            q,
            lambda body, m: (
                (times.append(time.monotonic()), m.requeue()) if len(times) < 3 else m.ack()
            ),
            0.5,
        )
    assert len(times) >= 3 and times[2] - times[0] < 0.2


def test_a_custom_backoff_class_from_a_plugin(broker_factory):
    from plugbroker.hookimpl import hookimpl

    class Linear:
        def __init__(self, params: dict[str, str]) -> None:
            self.step = float(params["step"])

        def next(self, redelivery_count: int) -> float:
            return self.step * (redelivery_count + 1)

    mod = types.ModuleType("linear_backoff")

    @hookimpl
    def broker_register(registry):
        registry.register_backoff("linear", Linear)

    mod.broker_register = broker_register  # type: ignore[attr-defined]
    sys.modules["linear_backoff"] = mod
    try:
        b = broker_factory(
            dl_config('<backoff type="linear"><param name="step" value="0.15"/></backoff>'),
            plugins="<plugins><plugin>linear_backoff</plugin></plugins>",
        )
        times: list[float] = []
        with kombu.Connection(b.url()) as conn:
            q = declare(conn)
            publish(conn, "x")
            consume_for(
                conn,
                q,
                lambda body, m: (
                    (times.append(time.monotonic()), m.requeue()) if len(times) < 3 else m.ack()
                ),
                1.2,
            )
        gaps = [b2 - a for a, b2 in itertools.pairwise(times)]
        assert 0.13 <= gaps[0] < 0.35 and 0.27 <= gaps[1] < 0.5, gaps
    finally:
        sys.modules.pop("linear_backoff", None)


RETRY = "<maxRedeliveries>2</maxRedeliveries><retry><levels>1s 2s</levels></retry>"


class Bystander:
    """Another client publishing with confirms all along: a refused retry (or a failing
    client) must not disturb it."""

    def __init__(self, url: str, queue: str = "bystander") -> None:
        self.conn = amqp.Connection(host=url.split("@")[1].split("/")[0])
        self.conn.connect()
        self.ch = self.conn.channel()
        self.ch.queue_declare(queue, durable=False, auto_delete=False)
        self.ch.confirm_select()
        self.queue = queue
        self.sent = 0

    def publish(self) -> None:
        self.ch.basic_publish_confirm(amqp.Message(b"b"), routing_key=self.queue)
        self.sent += 1

    def close(self) -> int:
        n = self.ch.queue_declare(self.queue, passive=True).message_count
        self.conn.close()
        return n


def test_reconsume_later_with_a_delay_comes_back_to_the_same_queue(broker_factory):
    b = broker_factory(dl_config(RETRY))
    got: list[tuple[float, kombu.Message]] = []

    def handle(body, m):
        got.append((time.monotonic(), m))
        if len(got) == 1:
            assert reconsume_later(m, delay=1) is None
            assert m.acknowledged  # acked, after the broker confirmed the copy
        else:
            m.ack()

    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        assert b.call(lambda: b.broker.vhosts["/"].queues["work-RETRY"].retry_target) == "work"
        publish(conn, {"n": 1}, message_id="m-1")
        consume_for(conn, q, handle, 1.6)
    assert len(got) == 2
    (t0, _first), (t1, again) = got
    assert 0.95 <= t1 - t0 < 1.5
    assert again.payload == {"n": 1}
    h = again.headers
    assert h["REAL_TOPIC"] == "work" and h["RETRY_TOPIC"] == "work-RETRY"
    assert h["RECONSUMETIMES"] == 1 and h["ORIGIN_MESSAGE_ID"] == "m-1"
    assert "x-reconsume-tag" not in h and "x-delay" in h


def test_reconsume_later_by_level_and_next_level_then_dead_letter(broker_factory):
    """maxRedeliveries 2 from the XML: the third reconsume dead-letters; the client names no
    limit, retry queue or dead-letter queue."""
    b = broker_factory(dl_config(RETRY + "<queue>work-dead</queue>"))
    got: list[tuple[float, kombu.Message]] = []

    def handle(body, m):
        got.append((time.monotonic(), m))
        if len(got) == 1:
            reconsume_later(m, level=1)  # 1 s
        else:
            reconsume_later(m)  # next: level 2 = 2 s, then past the limit

    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        publish(conn, "retry-me")
        consume_for(conn, q, handle, 3.6)
        assert len(got) == 3
        gaps = [got[1][0] - got[0][0], got[2][0] - got[1][0]]
        assert 0.95 <= gaps[0] < 1.5 and 1.95 <= gaps[1] < 2.6, gaps
        assert [m.headers.get("RECONSUMETIMES") for _, m in got] == [None, 1, 2]
        origin = got[1][1].headers["ORIGIN_MESSAGE_ID"]
        assert origin == got[2][1].headers["ORIGIN_MESSAGE_ID"]  # the same across retries
        assert len(origin) == 32 and "/" not in origin  # broker-assigned, not a delivery tag
        dead = take(conn, "work-dead")
        assert dead is not None and dead.payload == "retry-me"
        h = dead.headers
        assert h["RECONSUMETIMES"] == 3 and h["REAL_TOPIC"] == "work"
        assert h["RETRY_TOPIC"] == "work-RETRY" and h["ORIGIN_MESSAGE_ID"] == origin
        assert h["x-death"][0]["reason"] == "delivery_limit"
        assert take(conn, "work", timeout=0.2) is None
        assert b.call(lambda: b.broker.vhosts["/"].queues["work-RETRY"].message_count) == 0


def test_max_redeliveries_one_retries_once(broker_factory):
    b = broker_factory(
        dl_config("<maxRedeliveries>1</maxRedeliveries><retry><levels>1s</levels></retry>")
    )
    seen: list[int] = []

    def handle(body, m):
        seen.append(m.headers.get("RECONSUMETIMES", 0))
        reconsume_later(m)

    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        publish(conn, "once")
        consume_for(conn, q, handle, 2.5)
        assert seen == [0, 1]
        assert take(conn, "work-DLQ") is not None


def test_reconsume_later_without_retry_config_raises_and_keeps_the_message(broker_factory):
    b = broker_factory(dl_config("<maxRedeliveries>3</maxRedeliveries>"))
    bystander = Bystander(b.url())
    with kombu.Connection(b.url()) as conn:
        declare(conn)
        declare(conn, "plain")
        publish(conn, "keep-me", queue="plain")
        publish(conn, "keep-me-too")
        for name in ("plain", "work"):  # no <deadLetter> at all; <deadLetter> without <retry>
            m = take(conn, name)
            assert m is not None
            bystander.publish()
            with pytest.raises(RetryError, match=f"queue '{name}' in vhost '/' has no retry queue"):
                reconsume_later(m)
            bystander.publish()
            assert not m.acknowledged
            assert b.call(lambda n=name: b.broker.vhosts["/"].queues[n].unacked_count) == 1
            m.channel.close()  # the consumer gives up: the message is back, not lost
            again = take(conn, name)
            assert again is not None and again.payload == m.payload
            again.ack()
    assert bystander.close() == bystander.sent == 4


def test_reconsume_later_from_py_amqp(broker_factory):
    b = broker_factory(dl_config(RETRY))
    with amqp.Connection(host=f"127.0.0.1:{b.port}") as conn:
        ch = conn.channel()
        ch.queue_declare("work", durable=True, auto_delete=False)
        ch.basic_publish(amqp.Message(b"raw", message_id="p-1"), routing_key="work")
        got: list[amqp.Message] = []
        ch.basic_consume("work", callback=got.append)
        drain = lambda n: [conn.drain_events(timeout=3) for _ in range(n - len(got))]  # noqa: E731
        drain(1)
        reconsume_later(got[0], delay=1)
        drain(2)
        again = got[1]
        assert again.body == b"raw"
        assert again.headers["RECONSUMETIMES"] == 1 and again.headers["ORIGIN_MESSAGE_ID"] == "p-1"
        ch.basic_ack(again.delivery_tag)
        assert ch.queue_declare("work", passive=True).message_count == 0


def test_reconsume_later_refuses_out_of_range_delays(broker_factory):
    b = broker_factory(dl_config(RETRY))
    bystander = Bystander(b.url())
    with kombu.Connection(b.url()) as conn:
        declare(conn)
        publish(conn, "x")
        m = take(conn, "work")
        assert m is not None
        for kw in ({"delay": 0.5}, {"delay": 864_001}, {"level": 0}):
            with pytest.raises(RetryError):
                reconsume_later(m, **kw)
            bystander.publish()
        with pytest.raises(RetryError, match="level 3 is out of range for queue 'work': 1 to 2"):
            reconsume_later(m, level=3)  # the broker's levels decide
        bystander.publish()
        m.ack()  # still unacked after the refusals: the ack goes through
        with pytest.raises(RetryError, match="no unacked delivery with tag"):
            reconsume_later(m, delay=1)  # acked already: nothing to retry (kombu's state aside)
        bystander.publish()
    assert bystander.close() == bystander.sent == 5


def test_dead_letter_cycle_stops(broker, caplog):
    vh = broker.broker.vhosts["/"]
    with kombu.Connection(broker.url()) as conn:
        ch = conn.default_channel
        ch.exchange_declare("cycle", "fanout", durable=False, auto_delete=False)
        for name in ("ping", "pong"):
            ch.queue_declare(
                name,
                durable=False,
                auto_delete=False,
                arguments={"x-message-ttl": 20, "x-dead-letter-exchange": "cycle"},
            )
        ch.queue_bind("pong", "cycle", "")
        ch.queue_bind("ping", "cycle", "")
        publish(conn, "round", queue="ping")

        def state() -> list[tuple[int, int]]:
            return broker.call(
                lambda: [
                    (vh.queues[n].message_count, vh.queues[n].dead_lettered_total)
                    for n in ("ping", "pong")
                ]
            )

        # it dies once in ping (to pong: ping is where it died), once in pong, then the cycle
        # is broken; with a cycle it would bounce on and the counts would keep growing
        deadline = time.monotonic() + 5
        while state() != [(0, 1), (0, 1)] and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a condition, bounded by the deadline
        assert state() == [(0, 1), (0, 1)]
    assert any("dead-letter cycle" in r.getMessage() for r in caplog.records)


def test_a_retry_request_without_confirms_is_refused_with_406(broker_factory):
    b = broker_factory(dl_config(RETRY))
    bystander = Bystander(b.url())
    with amqp.Connection(host=f"127.0.0.1:{b.port}") as conn:
        ch = conn.channel()
        ch.queue_declare("work", durable=True, auto_delete=False)
        request = amqp.Message(b"", application_headers={"x-reconsume-tag": 1})
        ch.basic_publish(request, exchange="amq.retry", routing_key="")
        bystander.publish()
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="retry refused"):
            ch.queue_declare("work", passive=True)
        again = conn.channel()  # the connection and its other channels carry on
        assert again.queue_declare("work", passive=True).message_count == 0
        bystander.publish()
    assert bystander.close() == bystander.sent == 2


def test_reconsume_later_without_write_on_amq_retry_raises_and_keeps_the_message(broker_factory):
    users = (
        '<user name="guest" password="guest" vhosts="/"/>'
        '<user name="eve" password="eve-pw">'
        '<permission vhost="/" configure="^work" write="^(work|amq\\.default)$" read="^work"/>'
        "</user>"
    )
    b = broker_factory(dl_config(RETRY), users=users)
    bystander = Bystander(b.url())
    with kombu.Connection(f"amqp://eve:eve-pw@127.0.0.1:{b.port}/") as conn:
        declare(conn)
        publish(conn, "mine")
        m = take(conn, "work")
        assert m is not None
        with pytest.raises(RetryError, match=r"write access to exchange 'amq\.retry'"):
            reconsume_later(m, delay=1)
        bystander.publish()
        assert not m.acknowledged
        m.ack()  # the consumer's channel is untouched
        bystander.publish()
    assert bystander.close() == bystander.sent == 2


def test_dead_letters_of_a_queue_with_retry_carry_retry_topic_whatever_killed_them(
    broker_factory,
):
    """A dead letter made by a nack, by a reject (both without requeue) and by a TTL expiry,
    in a queue with a retry queue, names that retry queue in ``RETRY_TOPIC``."""
    b = broker_factory(dl_config("<retry><levels>1h</levels></retry>"))
    with amqp.Connection(host=f"127.0.0.1:{b.port}") as conn:
        ch = conn.channel()
        ch.confirm_select()
        ch.queue_declare("work", durable=True, auto_delete=False)
        for body in (b"nacked", b"rejected"):
            ch.basic_publish_confirm(amqp.Message(body), "", "work")
        import pika  # py-amqp has no basic.nack: pika sends it

        params = pika.ConnectionParameters("127.0.0.1", b.port)
        with pika.BlockingConnection(params) as pconn:
            pch = pconn.channel()
            method, _, _ = pch.basic_get("work")
            pch.basic_nack(method.delivery_tag, requeue=False)
        m = ch.basic_get("work")
        ch.basic_reject(m.delivery_tag, requeue=False)
        ch.basic_publish_confirm(amqp.Message(b"expired", expiration="1"), "", "work")
        deadline = time.monotonic() + 5
        while ch.queue_declare("work", passive=True).message_count and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)  # a condition: the expired message leaves at the queue's head
        dead = {}
        for _ in range(3):
            d = ch.basic_get("work-DLQ", no_ack=True)
            assert d is not None
            dead[d.body] = d.headers
    assert set(dead) == {b"nacked", b"rejected", b"expired"}
    for body, h in dead.items():
        assert h["RETRY_TOPIC"] == "work-RETRY", body
        assert h["REAL_TOPIC"] == "work"
    assert [dead[b]["x-death"][0]["reason"] for b in (b"nacked", b"rejected", b"expired")] == [
        "rejected",
        "rejected",
        "expired",
    ]


@pytest.mark.parametrize("subscription", ["exclusive", "failover"])
def test_a_retry_in_an_exclusive_or_failover_subscription_comes_back_at_once(
    broker_factory, subscription
):
    """One consumer at a time: the retry's delay does not apply (the levels here are an hour)."""
    b = broker_factory(
        dl_config("<retry><levels>1h</levels></retry>", args=f'subscription="{subscription}"')
    )
    got: list[kombu.Message] = []
    with kombu.Connection(b.url()) as conn:
        q = declare(conn)
        publish(conn, "again")

        def handler(body: Any, m: kombu.Message) -> None:
            got.append(m)
            if len(got) == 1:
                reconsume_later(m, delay=3600)
            else:
                m.ack()

        with conn.Consumer(q, callbacks=[handler], prefetch_count=1):
            deadline = time.monotonic() + 5
            while len(got) < 2 and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.05)
                except TimeoutError:
                    pass
    assert [m.payload for m in got] == ["again", "again"]
    assert got[1].headers["RECONSUMETIMES"] == 1 and "x-delay" not in got[1].headers
    assert b.call(lambda: b.broker.vhosts["/"].queues["work-RETRY"].message_count) == 0

"""Message fate (broker/domain/fate.py) on a manual clock: every path, its outcome and its hooks.

No sockets and no session: a recording channel stands in for the session's bookkeeping of
delivery tags, and a recording hook object stands in for the plugin host.
"""

from __future__ import annotations

from typing import Any

import pytest

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.compiled import in_use
from plugbroker.decisions import RejectDecision
from plugbroker.domain import fate
from plugbroker.domain.message import Message
from plugbroker.domain.queue import Consumer, Queue
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import VirtualHost


class Hooks:
    """Records every hook call; decision hooks answer from ``answers``."""

    NOTIFICATIONS = (
        "message_acked",
        "message_rejected",
        "message_redelivered",
        "message_dead_lettered",
        "message_expired",
        "message_dropped",
        "message_timed_out",
        "consumer_isolated",
        "consumer_released",
    )

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name in self.NOTIFICATIONS:
            return lambda **kw: self.calls.append((name, kw))
        if name in self.answers:
            answer = self.answers[name]
            return lambda **kw: answer(**kw) if callable(answer) else answer
        return None

    def named(self, name: str) -> list[dict[str, Any]]:
        return [kw for n, kw in self.calls if n == name]


class Channel:
    """Keeps unacked entries by delivery tag, as the session's channel does."""

    def __init__(self, connection_id: str = "conn-1", channel_id: int = 1) -> None:
        self.id = channel_id
        self.connection_id = connection_id
        self.unacked: dict[int, tuple[Message, Queue, Consumer]] = {}
        self.moved: dict[int, tuple[Message, Queue, Consumer]] = {}
        self.next_tag = 1
        self.unheard = False

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, msg: Message, queue: Queue) -> None:
        self.unacked[self.next_tag] = (msg, queue, consumer)
        self.next_tag += 1
        if not consumer.unacked:
            consumer.busy_since = queue.vhost.clock.monotonic()
        consumer.unacked += 1
        if consumer.first_delivery is None:
            consumer.first_delivery = queue.vhost.clock.monotonic()

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        pass

    def take_unacked(self, consumer: Consumer, only: Any = None) -> list[Message]:
        out = []
        for tag, entry in list(self.unacked.items()):
            if entry[2] is consumer and (only is None or entry[0].id in only):
                del self.unacked[tag]
                self.moved[tag] = entry
                out.append(entry[0])
        return out

    def held_by(self, consumer: Consumer) -> Any:
        return (m for m, _, c in self.unacked.values() if c is consumer)

    def close(self) -> None:
        """The channel goes away: its consumers leave and what they held comes back unsettled
        (what the session's teardown does), a consumer past its ack timeout counting one."""
        poisoned: set[int] = set()
        for c in {id(c): c for _, _, c in self.unacked.values()}.values():
            if c.queue.poison_deliveries is not None:
                fate.timed_out_on_close(c, c.queue.vhost.clock.monotonic(), poisoned)
        entries = list(self.unacked.values())
        self.unacked.clear()
        for _, q, c in entries:
            c.unacked -= 1
            if not c.unacked:
                c.busy_since = None
            q.remove_consumer(c)
        by_queue: dict[int, tuple[Queue, list[Message]]] = {}
        for msg, q, _c in entries:  # delivery order, one call per queue, as the session does
            by_queue.setdefault(id(q), (q, []))[1].append(msg)
        for q, held in by_queue.values():
            fate.requeue_unsettled(q, held, "channel-closed", poisoned)
        for _, _, c in entries:
            fate.release(c, "disconnected")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


@pytest.fixture
def vh(clock: ManualClock, hooks: Hooks) -> VirtualHost:
    return VirtualHost("/", clock=clock, timers=Timers(clock), hooks=hooks)


def put(vh: VirtualHost, q: Queue, *bodies: bytes, **props: Any) -> list[Message]:
    out = []
    for body in bodies:
        raw = P.encode(props)
        m = Message.from_publish(
            vh.ids.next(), "", q.name, raw, body, len(body), vh.clock.monotonic(), vh.clock.time()
        )
        vh.deliver_to_queues([q], m)
        out.append(m)
    return out


def consume(q: Queue, ch: Channel, tag: str = "c1", prefetch: int = 0) -> Consumer:
    c = q.add_consumer(tag, ch, no_ack=False, exclusive=False, prefetch=prefetch, arguments={})
    q.dispatch()
    return c


def with_dlq(vh: VirtualHost, name: str = "q", **args: Any) -> tuple[Queue, Queue]:
    dlq, _ = vh.declare_queue("dlq")
    vh.bind(vh.exchanges["amq.direct"], dlq, "dead", {})
    q, _ = vh.declare_queue(
        name,
        arguments={
            "x-dead-letter-exchange": "amq.direct",
            "x-dead-letter-routing-key": "dead",
            **args,
        },
    )
    return q, dlq


# --------------------------------------------------------------------------- settle


def test_ack_settles_counts_and_reports_who_acked(vh, hooks, clock):
    q, _ = vh.declare_queue("q")
    [m] = put(vh, q, b"a")
    ch = Channel()
    c = consume(q, ch)
    clock.advance(3)
    fate.ack(q, m, c, ch, clock.monotonic())
    assert (q.message_count, q.acks_total, c.unacked) == (0, 1, 0)
    assert c.last_ack == clock.monotonic()
    [acked] = hooks.named("message_acked")
    assert acked["consumer_tag"] == "c1" and acked["connection_id"] == "conn-1"
    assert acked["channel_id"] == 1 and acked["message"] is m


def test_the_ack_clock_restarts_at_each_settle_and_stops_when_nothing_is_unacked(vh, clock):
    q, _ = vh.declare_queue("q")
    a, b, c3 = put(vh, q, b"a", b"b", b"c")
    ch = Channel()
    t0 = clock.monotonic()
    c = consume(q, ch)
    assert (c.unacked, c.busy_since) == (3, t0)
    clock.advance(5)
    fate.ack(q, a, c, ch, clock.monotonic())
    assert (c.unacked, c.busy_since) == (2, t0 + 5.0)
    clock.advance(5)
    fate.reject(q, b, c, ch, False, clock.monotonic())
    assert (c.unacked, c.busy_since) == (1, t0 + 10.0)
    clock.advance(5)
    fate.ack(q, c3, c, ch, clock.monotonic())
    assert (c.unacked, c.busy_since, c.last_ack) == (0, None, t0 + 15.0)


def test_isolation_stops_the_clock_and_a_late_settle_leaves_it_stopped(vh, clock):
    q, _ = vh.declare_queue("q")
    put(vh, q, b"a")
    ch = Channel("stuck")
    t0 = clock.monotonic()
    c = consume(q, ch, "stuck")
    clock.advance(10)
    fate.isolate(c, clock.monotonic())
    assert (c.unacked, c.busy_since) == (0, None)
    msg, queue, cons = ch.moved.pop(1)
    clock.advance(1)
    fate.late_settle(queue, msg, cons, ch, True, clock.monotonic())
    assert (c.busy_since, c.last_ack) == (None, t0 + 11.0)


def test_ack_by_an_isolated_consumer_releases_it(vh, hooks, clock):
    q, _ = vh.declare_queue("q")
    [m] = put(vh, q, b"a")
    ch = Channel()
    c = consume(q, ch)
    c.isolated = True  # as if isolated after this delivery went out
    fate.ack(q, m, c, ch, clock.monotonic())
    assert not c.isolated
    assert hooks.named("consumer_released")[0]["reason"] == "acked"


def test_reject_without_requeue_dead_letters_with_reason_rejected(vh, hooks, clock):
    q, dlq = with_dlq(vh)
    [m] = put(vh, q, b"bad")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, m, c, ch, False, clock.monotonic())
    assert q.message_count == 0 and c.unacked == 0
    [dead] = list(dlq.ready)
    assert dead.headers["x-death"][0]["reason"] == "rejected"
    assert [n for n, _ in hooks.calls] == ["message_rejected", "message_dead_lettered"]


def test_reject_without_requeue_and_without_target_drops_and_says_so(vh, hooks, clock):
    q, _ = vh.declare_queue("q")
    [m] = put(vh, q, b"bad")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, m, c, ch, False, clock.monotonic())
    assert q.message_count == 0
    assert hooks.named("message_dropped") == [
        {"vhost": "/", "queue": "q", "message": m, "reason": "rejected"}
    ]


def test_requeue_comes_back_first_redelivered_and_counted(vh, hooks, clock):
    q, _ = vh.declare_queue("q")
    first, _second = put(vh, q, b"1", b"2")
    ch = Channel()
    c = consume(q, ch, prefetch=1)
    fate.reject(q, first, c, ch, True, clock.monotonic())
    assert q.ready.peek() is first
    assert first.redelivered and first.delivery_count == 1
    [redelivered] = hooks.named("message_redelivered")
    assert redelivered["reason"] == "rejected" and redelivered["delivery_count"] == 1


def test_the_delivery_limit_holds_on_reject_and_on_channel_close_alike(vh, hooks, clock):
    q, dlq = with_dlq(vh, "q", **{"x-delivery-limit": 1})
    a, b = put(vh, q, b"a", b"b")
    ch = Channel()
    c = consume(q, ch)
    # first time round: both come back (count 1, within the limit of 1)
    fate.reject(q, a, c, ch, True, clock.monotonic())
    ch.unacked.clear()
    fate.requeue(q, [b], "channel-closed")
    assert sorted(m.delivery_count for m in q.ready) == [1, 1]
    # second time round: both pass the limit, whichever path requeues them
    fate.reject(q, a, c, ch, True, clock.monotonic())
    fate.requeue(q, [b], "channel-closed")
    assert q.message_count == 0
    assert [m.headers["x-death"][0]["reason"] for m in dlq.ready] == [
        "delivery_limit",
        "delivery_limit",
    ]
    # a message that went to the dead-letter queue was not reported as redelivered
    assert len(hooks.named("message_redelivered")) == 2


def test_a_redelivery_delay_holds_the_message_back_on_the_clock(vh, hooks, clock):
    hooks.answers["redelivery_delay"] = 5.0
    q, _ = vh.declare_queue("q")
    [m] = put(vh, q, b"later")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, m, c, ch, True, clock.monotonic())
    assert (q.ready_count, q.delayed, q.message_count) == (0, 1, 1)
    clock.advance(4.9)
    vh.timers.run_due()
    assert q.ready_count == 0
    clock.advance(0.2)
    vh.timers.run_due()
    assert list(q.ready) == [m] and m.delivery_count == 1 and q.delayed == 0


def test_a_plugins_reject_decision_wins(vh, hooks, clock):
    hooks.answers["reject_decision"] = RejectDecision("dead-letter", reason="poison")
    q, dlq = with_dlq(vh)
    [m] = put(vh, q, b"x")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, m, c, ch, True, clock.monotonic())  # asked to requeue; the plugin says no
    [dead] = list(dlq.ready)
    assert dead.headers["x-death"][0]["reason"] == "poison"


# --------------------------------------------------------------------------- isolation


def test_isolation_moves_unacked_messages_and_a_late_ack_settles_one_not_yet_redelivered(
    vh, hooks, clock
):
    q, _ = vh.declare_queue("q")
    a, b = put(vh, q, b"a", b"b")
    stuck_ch = Channel("stuck")
    stuck = consume(q, stuck_ch, "stuck")
    assert stuck.unacked == 2
    clock.advance(10)
    moved = fate.isolate(stuck, clock.monotonic())
    assert moved == 2 and stuck.isolated and stuck.unacked == 0
    assert [m.redelivered for m in q.ready] == [True, True]
    [iso] = hooks.named("consumer_isolated")
    assert iso["moved"] == 2 and iso["last_ack_age"] == 10.0
    # the stuck consumer wakes up and acks its first message: nobody has it yet
    msg, queue, cons = stuck_ch.moved.pop(1)
    fate.late_settle(queue, msg, cons, stuck_ch, True, clock.monotonic())
    assert not stuck.isolated
    assert list(q.ready) == [b] and q.message_count == 1
    assert hooks.named("message_acked")[0]["message"] is a
    assert hooks.named("consumer_released")[0]["reason"] == "acked"


def test_a_late_ack_for_a_message_already_redelivered_leaves_it_with_its_new_consumer(
    vh, hooks, clock
):
    q, _ = vh.declare_queue("q")
    put(vh, q, b"a")
    stuck_ch = Channel("stuck")
    stuck = consume(q, stuck_ch, "stuck")
    fate.isolate(stuck, clock.monotonic())
    other = consume(q, Channel("other"), "other")
    assert other.unacked == 1
    msg, queue, cons = stuck_ch.moved.pop(1)
    fate.late_settle(queue, msg, cons, stuck_ch, True, clock.monotonic())
    assert q.message_count == 1 and other.unacked == 1
    assert hooks.named("message_acked") == []


# --------------------------------------------------------------------------- moving on


def test_redrive_moves_dead_letters_home_with_a_fresh_count(vh, hooks, clock):
    q, dlq = with_dlq(vh, "work", **{"x-delivery-limit": 0})
    [m] = put(vh, q, b"job")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, m, c, ch, True, clock.monotonic())  # over the limit: dead-lettered
    assert dlq.message_count == 1 and q.message_count == 0
    q.remove_consumer(c)
    moved, kept = fate.redrive(dlq)
    assert (moved, kept) == ({"work": 1}, 0)
    [back] = list(q.ready)
    assert back.body == b"job" and back.delivery_count == 0 and not back.redelivered
    assert back.id != m.id and dlq.message_count == 0
    assert hooks.named("message_redelivered")[-1]["reason"] == "redrive"


def test_redrive_keeps_what_the_origin_refuses_or_what_has_no_origin(vh, hooks, clock):
    q, dlq = with_dlq(vh, "work", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    a, _ = put(vh, q, b"a", b"refused at publish")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, a, c, ch, False, clock.monotonic())
    q.remove_consumer(c)
    put(vh, q, b"fills work again")
    put(vh, dlq, b"no origin")
    moved, kept = fate.redrive(dlq)
    assert (moved, kept) == ({}, 2) and dlq.message_count == 2


def test_a_retry_queue_forwards_after_its_delay_and_keeps_the_count(vh, hooks, clock):
    target, _ = vh.declare_queue("work")
    retry, _ = vh.declare_queue(
        "work-RETRY", arguments={"x-retry-target": "work", "x-retry-levels": [2000]}
    )
    [m] = put(vh, retry, b"again", application_headers={"RECONSUMETIMES": 1})
    m.delivery_count = 3
    clock.advance(1.9)
    vh.timers.run_due()
    assert target.message_count == 0 and retry.message_count == 1
    clock.advance(0.2)
    vh.timers.run_due()
    [back] = list(target.ready)
    assert back.body == b"again" and back.delivery_count == 3 and back.id != m.id
    assert retry.message_count == 0
    assert hooks.named("message_redelivered")[-1]["reason"] == "retry"


def test_a_retry_queue_whose_target_is_gone_drops_and_says_so(vh, hooks, clock):
    retry, _ = vh.declare_queue("gone-RETRY", arguments={"x-retry-target": "gone"})
    [m] = put(vh, retry, b"lost", application_headers={"x-delay": 100})
    clock.advance(0.2)
    vh.timers.run_due()
    assert retry.message_count == 0
    assert hooks.named("message_dropped") == [
        {"vhost": "/", "queue": "gone-RETRY", "message": m, "reason": "no-target"}
    ]


def test_expiry_reports_then_dead_letters(vh, hooks, clock):
    q, dlq = with_dlq(vh, "q", **{"x-message-ttl": 100})
    put(vh, q, b"old")
    clock.advance(0.2)
    vh.timers.run_due()
    assert [n for n, _ in hooks.calls] == ["message_expired", "message_dead_lettered"]
    assert dlq.message_count == 1


def test_overflow_drop_head_dead_letters_the_oldest_with_reason_maxlen(vh, hooks, clock):
    q, dlq = with_dlq(vh, "q", **{"x-max-length": 1})
    put(vh, q, b"first", b"second")
    assert [m.body for m in q.ready] == [b"second"]
    [dead] = list(dlq.ready)
    assert dead.body == b"first" and dead.headers["x-death"][0]["reason"] == "maxlen"


# --------------------------------------------------------------------------- what review found


def test_a_reject_that_frees_a_prefetch_slot_lets_the_queue_dispatch_again(vh, hooks, clock):
    q, _ = vh.declare_queue("q")
    first, second = put(vh, q, b"1", b"2")
    ch = Channel()
    c = consume(q, ch, prefetch=1)
    q.dirty = False  # as after the turn that delivered the first
    ch.unacked.pop(1)  # what the session does with the rejected delivery tag
    fate.reject(q, first, c, ch, False, clock.monotonic())
    assert q.dirty  # dispatch is asked for: the consumer has room and a message waits
    q.dispatch()
    assert [entry[0] for entry in ch.unacked.values()] == [second]


def test_a_reject_after_the_queue_was_deleted_changes_nothing_more(vh, hooks, clock):
    q, dlq = with_dlq(vh)
    [m] = put(vh, q, b"gone")
    ch = Channel()
    c = consume(q, ch)
    vh.delete_queue(q, reason="test")
    fate.reject(q, m, c, ch, False, clock.monotonic())
    assert dlq.message_count == 0
    assert [n for n, _ in hooks.calls] == ["message_rejected"]


def test_redrive_never_offers_a_message_to_a_target_that_would_dead_letter_it(vh, hooks, clock):
    # the origin dead-letters what it refuses into the very dead-letter queue being redriven:
    # offering the copy would make the dead-letter queue grow at every redrive
    q, dlq = with_dlq(vh, "work", **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    a, _ = put(vh, q, b"a", b"refused, dead-lettered")
    ch = Channel()
    c = consume(q, ch)
    fate.reject(q, a, c, ch, False, clock.monotonic())
    q.remove_consumer(c)
    put(vh, q, b"fills work again")
    assert dlq.message_count == 2
    for _ in range(3):
        assert fate.redrive(dlq) == ({}, 2)
    assert dlq.message_count == 2 and q.message_count == 1


def test_a_retry_copy_its_target_refuses_is_dropped_and_reported(vh, hooks, clock):
    target, _ = vh.declare_queue(
        "work", arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    retry, _ = vh.declare_queue("work-RETRY", arguments={"x-retry-target": "work"})
    [m] = put(vh, retry, b"no room", application_headers={"x-delay": 100})
    clock.advance(0.2)
    vh.timers.run_due()
    assert retry.message_count == 0 and target.message_count == 0
    assert hooks.named("message_dropped") == [
        {"vhost": "/", "queue": "work-RETRY", "message": m, "reason": "maxlen"}
    ]


def test_isolation_remembers_only_the_messages_it_requeued(vh, hooks, clock):
    q, dlq = with_dlq(vh, "q", **{"x-delivery-limit": 0})
    put(vh, q, b"a")
    stuck = consume(q, Channel("stuck"), "stuck")
    fate.isolate(stuck, clock.monotonic())  # its one message passes the limit instead
    assert dlq.message_count == 1 and q.message_count == 0
    assert q.moved_waiting == set()


# --------------------------------------------------------------------------- reconsume


def with_retry(vh: VirtualHost, limit: int = 2) -> tuple[Queue, Queue, Queue]:
    """``work`` with a retry queue (levels 1 s, 2 s) and a dead-letter queue, as the
    dead-letter plugin would set them up (here by queue arguments)."""
    q, dlq = with_dlq(vh, "work", **{"x-delivery-limit": limit})
    retry, _ = vh.declare_queue(
        "work-RETRY", arguments={"x-retry-target": "work", "x-retry-levels": [1000, 2000]}
    )
    return q, retry, dlq


def test_reconsume_copies_to_the_retry_queue_with_tdmq_headers(vh, hooks, clock):
    q, retry, _dlq = with_retry(vh)
    [m] = put(vh, q, b"job", message_id="order-7")
    ch = Channel()
    consume(q, ch)
    outcome, copy = fate.reconsume(q, m, level=2)
    assert outcome == fate.RETRIED and retry.message_count == 1
    h = copy.headers
    assert (h["REAL_TOPIC"], h["RETRY_TOPIC"], h["RECONSUMETIMES"]) == ("work", "work-RETRY", 1)
    assert h["ORIGIN_MESSAGE_ID"] == "order-7" and h["x-retry-level"] == 2
    assert q.unacked_count == 1  # the original waits for the client's ack
    clock.advance(1.9)
    vh.timers.run_due()
    assert retry.message_count == 1
    clock.advance(0.2)
    vh.timers.run_due()
    assert retry.message_count == 0 and len(q.ready) == 1


def test_reconsume_past_the_limit_dead_letters_with_retry_topic(vh, hooks, clock):
    q, _retry, dlq = with_retry(vh, limit=1)
    [m] = put(vh, q, b"job", application_headers={"RECONSUMETIMES": 1, "ORIGIN_MESSAGE_ID": "o"})
    consume(q, Channel())
    outcome, _copy = fate.reconsume(q, m, delay=5)
    assert outcome == fate.DEAD_LETTERED
    [dead] = list(dlq.ready)
    h = dead.headers
    assert h["RECONSUMETIMES"] == 2 and h["RETRY_TOPIC"] == "work-RETRY"
    assert h["ORIGIN_MESSAGE_ID"] == "o" and h["x-death"][0]["reason"] == "delivery_limit"
    assert "x-delay" not in h


def test_reconsume_is_refused_without_a_retry_queue_or_out_of_range(vh, hooks, clock):
    q, retry, _dlq = with_retry(vh)
    plain, _ = vh.declare_queue("plain")
    [p] = put(vh, plain, b"p")
    [m] = put(vh, q, b"m")
    with pytest.raises(fate.RetryRefused, match="queue 'plain' in vhost '/' has no retry queue"):
        fate.reconsume(plain, p)
    with pytest.raises(fate.RetryRefused, match="level 3 is out of range"):
        fate.reconsume(q, m, level=3)
    with pytest.raises(fate.RetryRefused, match="out of range"):
        fate.reconsume(q, m, delay=0.5)
    with pytest.raises(fate.RetryRefused, match="has no retry queue"):
        fate.reconsume(retry, m)  # a retry queue has none of its own
    vh.delete_queue(retry)
    with pytest.raises(fate.RetryRefused, match="has no retry queue"):
        fate.reconsume(q, m)
    assert q.message_count == 1 and plain.message_count == 1


def test_a_broker_assigned_origin_id_is_unique_and_kept_across_retries(vh, hooks, clock):
    q, _retry, _dlq = with_retry(vh, limit=5)
    a, b = put(vh, q, b"a", b"b")
    _, ca = fate.reconsume(q, a)
    _, cb = fate.reconsume(q, b)
    oa, ob = ca.headers["ORIGIN_MESSAGE_ID"], cb.headers["ORIGIN_MESSAGE_ID"]
    assert oa != ob and len(oa) == 32
    _, again = fate.reconsume(q, ca)  # the copy retried once more
    assert again.headers["ORIGIN_MESSAGE_ID"] == oa


# --------------------------------------------------------------------------- redrive options


def test_redrive_resets_reconsumetimes_and_the_count_unless_told_not_to(vh, hooks, clock):
    q, dlq = with_dlq(vh, "work")
    [m] = put(vh, q, b"job", application_headers={"RECONSUMETIMES": 3, "k": "v"})
    m.delivery_count = 2
    q.get()
    fate.dead_letter(q, m, "rejected")
    q.settle(m)
    dlq.ready[0].delivery_count = 2
    assert fate.redrive(dlq, limit=0) == ({}, 0)
    moved, _ = fate.redrive(dlq)
    assert moved == {"work": 1}
    back = q.ready.popleft()
    assert "RECONSUMETIMES" not in back.headers and back.headers["k"] == "v"
    assert back.delivery_count == 0
    fate.dead_letter(q, back, "rejected")
    dlq.ready[0].delivery_count = 2
    q.settle(back)
    fate.redrive(dlq, reset=False)
    [kept] = list(q.ready)
    assert kept.headers.get("RECONSUMETIMES") is None  # it was reset by the first redrive
    assert kept.delivery_count == 2


def test_redrive_filters_by_reason_and_a_dry_run_moves_nothing(vh, hooks, clock):
    q, dlq = with_dlq(vh, "work")
    for reason in ("rejected", "expired", "rejected"):
        [m] = put(vh, q, reason.encode())
        q.get()
        fate.dead_letter(q, m, reason)
        q.settle(m)
    plan = fate.plan_redrive(dlq, reasons=frozenset({"expired"}))
    assert [m.body for m, _t in plan.moves] == [b"expired"] and plan.skipped == 2
    assert dlq.message_count == 3  # a plan moves nothing
    moved, kept = fate.redrive(dlq, reasons=frozenset({"rejected"}))
    assert (moved, kept) == ({"work": 2}, 1)
    assert [m.body for m in q.ready] == [b"rejected", b"rejected"]
    assert [m.body for m in dlq.ready] == [b"expired"]


def test_a_paced_redrive_moves_at_its_rate_on_the_broker_clock(vh, hooks, clock):
    q, dlq = with_dlq(vh, "work")
    for i in range(10):
        [m] = put(vh, q, b"%d" % i)
        q.get()
        fate.dead_letter(q, m, "rejected")
        q.settle(m)
    paced = fate.PacedRedrive(dlq, rate=20, limit=8)  # a batch of 1 every 50 ms
    paced.start()
    assert q.message_count == 1 and not paced.done
    clock.advance(0.049)
    vh.timers.run_due()
    assert q.message_count == 1
    clock.advance(0.002)
    vh.timers.run_due()
    assert q.message_count == 2
    for _ in range(10):
        clock.advance(0.05)
        vh.timers.run_due()
    assert q.message_count == 8 and dlq.message_count == 2 and paced.done
    assert paced.moved == {"work": 8}
    with pytest.raises(ValueError):
        fate.PacedRedrive(dlq, rate=0)


def test_a_paced_redrive_stops_when_its_queue_is_deleted(vh, hooks, clock):
    q, dlq = with_dlq(vh, "work")
    for i in range(5):
        [m] = put(vh, q, b"%d" % i)
        q.get()
        fate.dead_letter(q, m, "rejected")
        q.settle(m)
    paced = fate.PacedRedrive(dlq, rate=10)
    paced.start()
    vh.delete_queue(dlq)
    clock.advance(1)
    vh.timers.run_due()
    assert paced.done and q.message_count == 1


# --------------------------------------------------------------------------- bounded tries

#: the ack timeout of the queues below, seconds
TIMEOUT = 5.0


def poison_queue(vh: VirtualHost, k: int = 3, dlx: bool = True) -> tuple[Queue, Queue | None]:
    """A shared queue under isolation with ``<poisonDeliveries>`` k and a 5 s ack timeout."""
    if dlx:
        q, dlq = with_dlq(vh)
    else:
        q, _ = vh.declare_queue("q")
        dlq = None
    q.poison_deliveries = k
    q.ack_timeout_ms = round(TIMEOUT * 1000)
    return q, dlq


def death_reasons(dlq: Queue) -> list[str]:
    return [fate.death_reason_of(m) or "" for m in dlq.ready]


def late_ack(ch: Channel, clock: ManualClock) -> None:
    """The consumer of ``ch`` acks every delivery taken back from it (it finished them)."""
    for tag in list(ch.moved):
        msg, queue, cons = ch.moved.pop(tag)
        fate.late_settle(queue, msg, cons, ch, True, clock.monotonic())


def test_a_task_longer_than_its_timeout_runs_at_most_poison_deliveries_times_on_two_consumers(
    vh, hooks, clock
):
    q, dlq = poison_queue(vh)
    [m] = put(vh, q, b"long task")
    a_ch, b_ch = Channel("a"), Channel("b")
    a = consume(q, a_ch, "a")
    b = consume(q, b_ch, "b")
    assert a.unacked == 1 and b.unacked == 0
    clock.advance(TIMEOUT + 1)
    # the check isolates a (the cap of 2 allows one): its delivery counts first
    fate.isolate(a, clock.monotonic(), TIMEOUT)
    q.dispatch()
    assert a.isolated and m.timeouts == 1 and b.unacked == 1  # handed to b
    clock.advance(TIMEOUT + 1)
    # b is over its timeout too but the cap spares it: its timeout counts all the same
    assert fate.count_timeout(b, clock.monotonic(), TIMEOUT) is m and m.timeouts == 2
    assert fate.count_timeout(b, clock.monotonic(), TIMEOUT) is None  # once per timeout
    clock.advance(TIMEOUT)
    assert fate.count_timeout(b, clock.monotonic(), TIMEOUT) is m and m.timeouts == 3
    assert fate.is_poison(q, m)
    fate.expel_poison(q, m, b, clock.monotonic())
    # dead-lettered with reason poison; a, isolated while working on it, is released
    assert death_reasons(dlq) == ["poison"] and q.message_count == 0
    [dead] = hooks.named("message_dead_lettered")
    assert dead["reason"] == "poison" and dead["message"] is m
    assert [t["timeouts"] for t in hooks.named("message_timed_out")] == [1, 2, 3]
    assert [t["consumer_tag"] for t in hooks.named("message_timed_out")] == ["a", "b", "b"]
    assert not a.isolated and hooks.named("consumer_released")[-1]["reason"] == "poison"
    assert not b.isolated and b.unacked == 0 and b.busy_since is None
    # both may still be running it: their late acks are accepted and change nothing
    late_ack(a_ch, clock)
    late_ack(b_ch, clock)
    assert hooks.named("message_acked") == [] and len(dlq.ready) == 1


def test_one_consumer_alone_gets_its_message_dead_lettered_after_three_timeouts(vh, hooks, clock):
    q, dlq = poison_queue(vh)
    [m] = put(vh, q, b"hangs")
    ch = Channel("only")
    c = consume(q, ch, "only")
    for n in (1, 2):
        clock.advance(TIMEOUT + 0.5)
        assert fate.count_timeout(c, clock.monotonic(), TIMEOUT) is m and m.timeouts == n
        assert not fate.is_poison(q, m) and c.unacked == 1
    clock.advance(TIMEOUT + 0.5)
    assert fate.count_timeout(c, clock.monotonic(), TIMEOUT) is m and fate.is_poison(q, m)
    fate.expel_poison(q, m, c, clock.monotonic())
    assert death_reasons(dlq) == ["poison"] and c.unacked == 0
    # still busy with it: it gets nothing new until it settles something, so no other message
    # waits behind the poison one in its prefetch, nor runs twice because it was moved
    [n] = put(vh, q, b"next")
    q.dispatch()
    assert c.unacked == 0 and c.pardon == m.id and n.id in q.held
    assert fate.isolate(c, clock.monotonic(), TIMEOUT) == 0 and not c.isolated
    late_ack(ch, clock)  # it finished the poison message: its late ack is accepted
    assert c.pardon == 0
    q.dispatch()
    assert c.unacked == 1
    clock.advance(TIMEOUT + 1)
    assert fate.count_timeout(c, clock.monotonic(), TIMEOUT) is n and n.timeouts == 1


def test_three_consumers_with_the_default_cap_stop_it_too(vh, hooks, clock):
    q, dlq = poison_queue(vh)
    [m] = put(vh, q, b"poison")
    chans = [Channel(f"c{i}") for i in range(3)]
    cs = [consume(q, ch, f"c{i}") for i, ch in enumerate(chans)]
    holder = next(c for c in cs if c.unacked)
    clock.advance(TIMEOUT + 1)
    fate.isolate(holder, clock.monotonic(), TIMEOUT)  # floor(0.6 x 3) = 1 isolated
    q.dispatch()
    ran_on = {holder.tag}
    while m.id in q.held:
        holder = next(c for c in cs if c.unacked)
        ran_on.add(holder.tag)
        clock.advance(TIMEOUT + 1)
        got = fate.count_timeout(holder, clock.monotonic(), TIMEOUT)  # spared by the cap
        assert got is m
        if fate.is_poison(q, m):
            fate.expel_poison(q, m, holder, clock.monotonic())
    assert m.timeouts == 3 and death_reasons(dlq) == ["poison"]
    # handed out twice: isolated once, then the spared consumer's timeouts count on
    assert len(ran_on) == 2
    assert not any(c.isolated for c in cs)


def test_isolation_of_a_consumer_whose_message_turns_poison_is_not_done(vh, hooks, clock):
    q, dlq = poison_queue(vh, k=1)
    [m, other] = put(vh, q, b"bad", b"queued")
    ch = Channel("a")
    a = consume(q, ch, "a", prefetch=2)
    clock.advance(TIMEOUT + 1)
    assert fate.isolate(a, clock.monotonic(), TIMEOUT) == 0
    assert not a.isolated and a.pardon == m.id and a.unacked == 1  # keeps what it had not started
    assert fate.count_timeout(a, clock.monotonic() + 60, TIMEOUT) is None  # pardoned
    assert death_reasons(dlq) == ["poison"] and other.timeouts == 0
    assert hooks.named("consumer_isolated") == []


def test_only_the_delivery_a_consumer_works_on_counts(vh, hooks, clock):
    q, _ = poison_queue(vh)
    bad, good = put(vh, q, b"bad", b"good")
    a = consume(q, Channel("a"), "a")
    assert a.unacked == 2
    clock.advance(TIMEOUT + 1)
    fate.isolate(a, clock.monotonic(), TIMEOUT)
    # "good" sat in its prefetch behind the one it was working on
    assert (bad.timeouts, good.timeouts) == (1, 0)
    assert a.isolated_for == bad.id


def test_a_delivery_not_due_yet_is_not_the_one_it_works_on(vh, hooks, clock):
    q, _ = poison_queue(vh)
    eta, now_ = put(vh, q, b"eta", b"now")
    ch = Channel("a")
    a = consume(q, ch, "a")
    fate.hold_deferred(a, eta.id, clock.monotonic() + 3600)
    clock.advance(TIMEOUT + 1)
    assert fate.working_delivery(a, clock.monotonic()) is now_
    assert fate.count_timeout(a, clock.monotonic(), TIMEOUT) is now_ and eta.timeouts == 0


def test_a_consumer_that_crashes_past_its_timeout_counts_and_the_third_crash_parks_it(
    vh, hooks, clock
):
    q, _ = poison_queue(vh, dlx=False)
    [m] = put(vh, q, b"crash")
    for i in range(2):
        ch = Channel(f"conn-{i}")
        consume(q, ch, f"c{i}")
        clock.advance(TIMEOUT + 1)
        ch.close()  # it went away past its ack timeout without settling
        q.dispatch()
        assert m.id in q.held and m.timeouts == i + 1
        assert m.delivery_properties() != m.properties  # the count is shown on redelivery
    last = Channel("conn-2")
    consume(q, last, "c2")
    clock.advance(TIMEOUT + 1)
    last.close()
    # no dead-letter target: parked in q-DLQ, declared durable, never dropped
    assert q.message_count == 0 and hooks.named("message_dropped") == []
    parked = vh.queues["q-DLQ"]
    assert parked.durable and death_reasons(parked) == ["poison"]
    assert parked.dead_letter_target


def test_a_channel_that_closes_before_the_timeout_counts_nothing(vh, hooks, clock):
    q, dlq = poison_queue(vh)
    put(vh, q, *[f"m{i}".encode() for i in range(20)])
    for name in ("a", "b", "c", "d"):
        # a rolling restart: each worker prefetches 10, finishes the one it was working on
        # (a warm shutdown), then goes; the 9 behind it were never started
        ch = Channel(name)
        c = consume(q, ch, name, prefetch=10)
        clock.advance(1)
        tag = next(iter(ch.unacked))
        msg, _, _ = ch.unacked.pop(tag)
        fate.ack(q, msg, c, ch, clock.monotonic())
        ch.close()
    assert q.message_count == 16 and dlq is not None and dlq.message_count == 0
    assert all(m.timeouts == 0 for m in q.held.values())
    assert hooks.named("message_timed_out") == []


def test_a_settled_hand_out_starts_afresh(vh, hooks, clock):
    q, dlq = poison_queue(vh, k=2)
    [m] = put(vh, q, b"slow but fine")
    ch = Channel("a")
    a = consume(q, ch, "a")
    clock.advance(TIMEOUT + 1)
    assert fate.count_timeout(a, clock.monotonic(), TIMEOUT) is m
    msg, queue, cons = ch.unacked.pop(1)
    fate.ack(queue, msg, cons, ch, clock.monotonic())  # it finished after all
    assert a.counted == 0 and q.message_count == 0 and not dlq.ready


def test_the_count_is_shown_as_a_header_beside_the_delivery_count(vh, hooks, clock):
    q, _ = poison_queue(vh)
    [m] = put(vh, q, b"x")
    a = consume(q, Channel("a"), "a")
    consume(q, Channel("b"), "b")
    clock.advance(TIMEOUT + 1)
    fate.isolate(a, clock.monotonic(), TIMEOUT)
    headers = P.decode(m.delivery_properties())["application_headers"]
    assert headers["x-ack-timeout-count"] == 1 and headers["x-delivery-count"] == 1


# --------------------------------------------------------------------------- in steps


class StepHooks(Hooks):
    NOTIFICATIONS = (*Hooks.NOTIFICATIONS, "message_removed")


@pytest.fixture
def svh(clock: ManualClock) -> VirtualHost:
    return VirtualHost("/", clock=clock, timers=Timers(clock), hooks=StepHooks())


def test_a_purge_in_steps_empties_the_ready_list_at_once_and_lets_go_a_step_at_a_time(svh):
    hooks = svh.hooks
    q, _ = svh.declare_queue("big")
    msgs = put(svh, q, *(b"m%d" % i for i in range(25)))
    ch = Channel()
    c = consume(q, ch, prefetch=3)  # 3 unacked stay with their consumer
    n, steps = fate.purge_in_steps(q, step=10)
    assert n == 22 and q.ready_count == 0 and len(q.ready) == 0
    assert hooks.named("message_removed") == []  # nothing let go yet
    put(svh, q, b"after")  # a publish after the purge is kept
    removed_per_step = []
    for _ in steps:
        removed_per_step.append(len(hooks.named("message_removed")))
    assert removed_per_step == [10, 20]  # the last step (2 more) ends the iteration
    gone = hooks.named("message_removed")
    assert [kw["message"] for kw in gone] == msgs[3:]  # in delivery order
    assert {kw["reason"] for kw in gone} == {"purged"}
    assert q.message_count == 3 + 1 and [m.body for m in q.ready] == [b"after"]
    assert q.bytes == sum(m.body_size for m in q.held.values())
    assert c.unacked == 3


@pytest.mark.skipif(
    "plugbroker.domain.message" in in_use(),
    reason="compiled build: a mypyc Message cannot be weakly referenced, which this test needs",
)
def test_letting_a_deleted_queues_messages_go_frees_them_a_step_at_a_time(svh):
    import gc
    import weakref

    q, _ = svh.declare_queue("big")
    refs = [weakref.ref(m) for m in put(svh, q, *(b"m%d" % i for i in range(25)))]
    held: list[list[Message]] = []
    assert svh.delete_queue(q, reason="admin", keep=held) == 25
    assert "big" not in svh.queues and q.message_count == 0
    gc.collect()
    alive = []
    for _ in fate.let_go_in_steps(held[0], step=10):
        alive.append(sum(r() is not None for r in refs))
    assert alive == [15, 5]
    assert sum(r() is not None for r in refs) == 0


def _dead_letters(vh: VirtualHost, n: int) -> tuple[Queue, Queue, list[Message]]:
    q, dlq = with_dlq(vh, "work")
    msgs = put(vh, q, *(b"job%d" % i for i in range(n)))
    ch = Channel()
    c = consume(q, ch)
    for tag in sorted(ch.unacked):
        m, _, _ = ch.unacked.pop(tag)
        c.unacked -= 1
        fate.reject(q, m, c, ch, False, vh.clock.monotonic())
    q.remove_consumer(c)
    assert dlq.message_count == n and q.message_count == 0
    return q, dlq, msgs


def test_a_stepwise_redrive_moves_a_step_at_a_time_in_order(svh):
    q, dlq, msgs = _dead_letters(svh, 25)
    run = fate.StepwiseRedrive(dlq, step=10)
    moved_per_step = [sum(run.moved.values()) for _ in run.steps()]
    assert moved_per_step == [10, 20] and run.moved == {"work": 25} and run.kept == 0
    assert run.planned == {"work": 25}
    assert [m.body for m in q.ready] == [m.body for m in msgs]
    assert dlq.message_count == 0
    assert {kw["reason"] for kw in svh.hooks.named("message_removed")} == {"redrive"}


def test_a_stepwise_redrive_passes_over_what_was_consumed_meanwhile(svh):
    q, dlq, _ = _dead_letters(svh, 25)
    run = fate.StepwiseRedrive(dlq, step=10)
    steps = run.steps()
    next(steps)  # 10 moved
    ch = Channel()
    c = consume(dlq, ch, prefetch=5)  # a consumer of the dead-letter queue takes 5
    assert c.unacked == 5
    list(steps)
    assert run.moved == {"work": 20} and run.kept == 0
    assert dlq.message_count == 5 and len(ch.unacked) == 5  # still with their consumer
    assert q.message_count == 20


def test_a_stepwise_redrive_honours_limit_reasons_and_dry_run(svh):
    q, dlq, _ = _dead_letters(svh, 25)
    put(svh, dlq, b"no origin")
    dry = fate.StepwiseRedrive(dlq, dry_run=True, step=4)
    list(dry.steps())
    assert dry.planned == {"work": 25} and dry.moved == {} and dry.kept == 1
    assert dlq.message_count == 26
    none = fate.StepwiseRedrive(dlq, reasons=frozenset({"expired"}), step=4)
    list(none.steps())
    assert none.moved == {} and none.kept == 26
    some = fate.StepwiseRedrive(dlq, limit=7, step=4)
    assert len(list(some.steps())) == 1  # two steps: the limit ends it
    assert some.moved == {"work": 7} and dlq.message_count == 19 and q.message_count == 7


def test_a_queue_deleted_during_a_purge_in_steps_took_the_rest_with_it(svh):
    q, _ = svh.declare_queue("big")
    put(svh, q, *(b"m%d" % i for i in range(25)))
    n, steps = fate.purge_in_steps(q, step=10)
    assert n == 25
    next(steps)
    assert len(svh.hooks.named("message_removed")) == 10
    assert svh.delete_queue(q, reason="client") == 0  # nothing ready: the purge took it
    list(steps)
    assert len(svh.hooks.named("message_removed")) == 10  # the rest went with the queue

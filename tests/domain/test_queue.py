"""Queues on a manual clock: no sockets, no sleeping."""

from __future__ import annotations

from typing import Any

import pytest

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.domain.message import Message
from plugbroker.domain.queue import Consumer, Queue
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import VirtualHost
from plugbroker.errors import ChannelError


class FakeChannel:
    """Records deliveries; acks nothing unless told."""

    def __init__(self, name: str = "c1", open_: bool = True) -> None:
        self.id = 1
        self.connection_id = name
        self.open = open_
        self.delivered: list[tuple[str, Message]] = []
        self.cancelled: list[str] = []
        self.unheard = False

    def can_deliver(self) -> bool:
        return self.open

    def deliver(self, consumer: Consumer, msg: Message, queue: Queue) -> None:
        consumer.unacked += 1
        self.delivered.append((consumer.tag, msg))

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer.tag)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def vh(clock: ManualClock) -> VirtualHost:
    return VirtualHost("/", clock=clock, timers=Timers(clock))


def msg(vh: VirtualHost, body: bytes = b"x", rk: str = "k", **props: Any) -> Message:
    raw = P.encode(props)
    return Message.from_publish(
        vh.ids.next(), "", rk, raw, body, len(body), vh.clock.monotonic(), vh.clock.time()
    )


def put(vh: VirtualHost, q: Queue, *bodies: bytes, **props: Any) -> list[Message]:
    out = [msg(vh, b, **props) for b in bodies]
    for m in out:
        q.enqueue(m)
    return out


def test_running_figures_track_count_bytes_and_oldest(vh, clock):
    q, _ = vh.declare_queue("q")
    assert (q.message_count, q.bytes, q.oldest_arrival) == (0, 0, None)
    first = put(vh, q, b"aaaa")[0]
    clock.advance(5)
    put(vh, q, b"bb")
    assert (q.message_count, q.bytes, q.oldest_arrival) == (2, 6, first.arrival)
    ch = FakeChannel()
    c = q.add_consumer("t", ch, no_ack=False, exclusive=False, prefetch=1, arguments={})
    q.dispatch()
    assert [m.body for _, m in ch.delivered] == [b"aaaa"]
    # delivered-unacked still counts, and is still the oldest
    assert (q.message_count, q.ready_count, q.unacked_count) == (2, 1, 1)
    assert q.oldest_arrival == first.arrival
    q.settle(first)
    c.unacked -= 1
    assert (q.message_count, q.bytes, q.acks_total) == (1, 2, 1)
    assert q.oldest_arrival == first.arrival + 5


def test_round_robin_respects_prefetch(vh):
    q, _ = vh.declare_queue("q")
    a, b = FakeChannel("a"), FakeChannel("b")
    q.add_consumer("a", a, no_ack=False, exclusive=False, prefetch=2, arguments={})
    q.add_consumer("b", b, no_ack=False, exclusive=False, prefetch=1, arguments={})
    put(vh, q, *[bytes([i]) for i in range(10)])
    q.dispatch()
    assert len(a.delivered) == 2 and len(b.delivered) == 1
    assert q.ready_count == 7


def test_unacked_cap_holds_with_unlimited_prefetch_and_resumes_at_half(vh):
    q, _ = vh.declare_queue("q")
    q.max_unacked_per_consumer = 10
    ch = FakeChannel()
    c = q.add_consumer("t", ch, no_ack=False, exclusive=False, prefetch=0, arguments={})
    put(vh, q, *[b"m"] * 30)
    q.dispatch()
    assert c.unacked == 10
    c.unacked = 6  # four acks: still above half, no dispatch
    q.dispatch()
    assert c.unacked == 6
    c.unacked = 5
    q.dispatch()
    assert c.unacked == 10


def test_message_ttl_expires_at_head_on_the_manual_clock(vh, clock):
    q, _ = vh.declare_queue("q", arguments={"x-message-ttl": 1000})
    put(vh, q, b"1", b"2")
    clock.advance(0.5)
    put(vh, q, b"3")
    clock.advance(0.6)
    vh.timers.run_due()
    assert [m.body for m in q.ready] == [b"3"]
    clock.advance(0.5)
    vh.timers.run_due()
    assert q.message_count == 0


def test_per_message_expiration_and_queue_ttl_take_the_lower(vh, clock):
    q, _ = vh.declare_queue("q", arguments={"x-message-ttl": 10_000})
    put(vh, q, b"short", expiration="200")
    clock.advance(0.25)
    vh.timers.run_due()
    assert q.message_count == 0


def test_expired_message_is_dead_lettered_with_x_death(vh, clock):
    dlq, _ = vh.declare_queue("dlq")
    vh.bind(vh.exchanges["amq.direct"], dlq, "dead", {})
    q, _ = vh.declare_queue(
        "q",
        arguments={
            "x-message-ttl": 100,
            "x-dead-letter-exchange": "amq.direct",
            "x-dead-letter-routing-key": "dead",
        },
    )
    put(vh, q, b"bye")
    clock.advance(0.2)
    vh.timers.run_due()
    [dead] = list(dlq.ready)
    death = dead.headers["x-death"][0]
    assert death["reason"] == "expired" and death["queue"] == "q" and death["count"] == 1
    assert dead.headers["x-first-death-reason"] == "expired"
    assert dead.body == b"bye"


def test_dead_letter_cycle_is_broken(vh, clock):
    # q1 -> dlx -> q2 -> dlx -> q1 with TTLs: without cycle detection it goes round forever
    vh.declare_exchange("dlx", "fanout")
    q1, _ = vh.declare_queue("q1", arguments={"x-message-ttl": 10, "x-dead-letter-exchange": "dlx"})
    q2, _ = vh.declare_queue("q2", arguments={"x-message-ttl": 10, "x-dead-letter-exchange": "dlx"})
    vh.bind(vh.exchanges["dlx"], q1, "", {})
    vh.bind(vh.exchanges["dlx"], q2, "", {})
    put(vh, q1, b"loop")
    for _ in range(20):
        clock.advance(0.05)
        vh.timers.run_due()
    assert q1.message_count == 0 and q2.message_count == 0


def test_max_length_drop_head_and_reject_publish(vh):
    q, _ = vh.declare_queue("dh", arguments={"x-max-length": 2})
    put(vh, q, b"1", b"2", b"3")
    assert [m.body for m in q.ready] == [b"2", b"3"]
    r, _ = vh.declare_queue("rp", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    taken = [r.enqueue(m) for m in (msg(vh, b"1"), msg(vh, b"2"), msg(vh, b"3"))]
    assert taken == [True, True, False]
    b, _ = vh.declare_queue("bytes", arguments={"x-max-length-bytes": 5})
    put(vh, b, b"aaa", b"bbb")
    assert [m.body for m in b.ready] == [b"bbb"]


def test_priority_queue_delivers_highest_first(vh):
    q, _ = vh.declare_queue("p", arguments={"x-max-priority": 5})
    for body, prio in ((b"low", 1), (b"high", 5), (b"mid", 3), (b"over", 9)):
        q.enqueue(msg(vh, body, priority=prio))
    assert [m.body for m in q.ready] == [b"high", b"over", b"mid", b"low"]


def test_x_expires_deletes_an_idle_queue(vh, clock):
    _q, _ = vh.declare_queue("idle", arguments={"x-expires": 1000})
    clock.advance(0.9)
    vh.timers.run_due()
    assert "idle" in vh.queues
    clock.advance(0.2)
    vh.timers.run_due()
    assert "idle" not in vh.queues


def test_failover_delivers_to_the_first_consumer_then_the_next(vh):
    q, _ = vh.declare_queue("f", arguments={"x-single-active-consumer": True})
    a, b = FakeChannel("a"), FakeChannel("b")
    ca = q.add_consumer("a", a, no_ack=True, exclusive=False, prefetch=0, arguments={})
    q.add_consumer("b", b, no_ack=True, exclusive=False, prefetch=0, arguments={})
    put(vh, q, b"1", b"2")
    q.dispatch()
    assert len(a.delivered) == 2 and not b.delivered
    q.remove_consumer(ca)
    put(vh, q, b"3")
    q.dispatch()
    assert [m.body for _, m in b.delivered] == [b"3"]


def test_key_shared_keeps_a_key_on_one_consumer_and_spreads_keys(vh):
    q, _ = vh.declare_queue("ks", arguments={"x-subscription-type": "key_shared"})
    chans = [FakeChannel(f"c{i}") for i in range(3)]
    for i, ch in enumerate(chans):
        q.add_consumer(f"t{i}", ch, no_ack=True, exclusive=False, prefetch=0, arguments={})
    for i in range(300):
        q.enqueue(msg(vh, b"m", rk=f"key{i % 30}"))
    q.dispatch()
    owner: dict[str, str] = {}
    for ch in chans:
        for tag, m in ch.delivered:
            assert owner.setdefault(m.routing_key, tag) == tag
    per_consumer = [len({m.routing_key for _, m in ch.delivered}) for ch in chans]
    assert sum(per_consumer) == 30 and min(per_consumer) >= 4


def test_declare_rejects_bad_arguments_with_406(vh):
    with pytest.raises(ChannelError) as e:
        vh.declare_queue("bad", arguments={"x-max-length": "ten"})
    assert e.value.code == 406 and "x-max-length" in e.value.text
    with pytest.raises(ChannelError) as e:
        vh.declare_queue("bad", arguments={"x-overflow": "explode"})
    assert e.value.code == 406
    vh.declare_queue("ok", arguments={"x-message-ttl": 5})
    with pytest.raises(ChannelError) as e:
        vh.declare_queue("ok", arguments={"x-message-ttl": 6})
    assert e.value.code == 406 and "inequivalent" in e.value.text


def test_deleting_a_queue_cancels_its_consumers(vh):
    q, _ = vh.declare_queue("gone")
    ch = FakeChannel()
    q.add_consumer("t", ch, no_ack=False, exclusive=False, prefetch=0, arguments={})
    put(vh, q, b"1")
    vh.delete_queue(q)
    assert ch.cancelled == ["t"] and "gone" not in vh.queues


def test_a_queue_bound_twice_gets_one_copy_and_its_figures_hold(vh):
    q, _ = vh.declare_queue("twice")
    fan = vh.exchanges["amq.fanout"]
    vh.bind(fan, q, "a", {})
    vh.bind(fan, q, "b", {})
    m = msg(vh, b"12345")
    taken, refused = vh.deliver_to_queues(vh.route(fan, m), m)
    assert taken == [q] and not refused
    assert (q.message_count, q.ready_count, q.bytes, q.unacked_count) == (1, 1, 5, 0)


def test_a_fanout_copy_does_not_inherit_the_first_queues_ttl(vh, clock):
    ttl, _ = vh.declare_queue("ttl", arguments={"x-message-ttl": 1000})
    keep, _ = vh.declare_queue("keep")
    fan = vh.exchanges["amq.fanout"]
    vh.bind(fan, ttl, "", {})
    vh.bind(fan, keep, "", {})
    m = msg(vh, b"x")
    vh.deliver_to_queues(vh.route(fan, m), m)
    clock.advance(5)
    vh.timers.run_due()
    assert (ttl.message_count, keep.message_count) == (0, 1)
    assert keep.get() is not None


def test_drop_head_that_drops_the_new_message_is_not_a_refusal(vh):
    q, _ = vh.declare_queue("tiny", arguments={"x-max-length-bytes": 3})
    m = msg(vh, b"12345")
    taken, refused = vh.deliver_to_queues([q], m)
    assert taken == [] and refused is False  # the publisher gets an ack, as in RabbitMQ
    r, _ = vh.declare_queue(
        "strict", arguments={"x-max-length-bytes": 3, "x-overflow": "reject-publish"}
    )
    m2 = msg(vh, b"12345")
    assert vh.deliver_to_queues([r], m2) == ([], True)


def test_a_requeued_message_past_its_ttl_expires_without_consumers(vh, clock):
    dlq, _ = vh.declare_queue("dlq")
    vh.bind(vh.exchanges["amq.fanout"], dlq, "", {})
    q, _ = vh.declare_queue(
        "q", arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "amq.fanout"}
    )
    [m] = put(vh, q, b"late")
    assert q.get() is m  # delivered (basic.get), not acked
    clock.advance(2)
    q.requeue([m])  # its channel closed after the TTL passed
    vh.timers.run_due()
    assert q.message_count == 0 and dlq.message_count == 1

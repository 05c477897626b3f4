"""Recovery in the core: records from a store become vhosts' exchanges, queues and messages.

The store here is a double that returns canned records, so every rule of the rebuild (order,
flags, holds, what is kept on disk, what is discarded, the message-id floor) is checked on a
manual clock without a database. tests/store/test_sqlite_store.py runs the same recovery
against the SQLite store end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.core.recovery import RecoveryStats, recover
from plugbroker.domain.exchange import DelayedExchange
from plugbroker.domain.message import Message, MessageIds
from plugbroker.domain.queue import Queue
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import VirtualHost
from plugbroker.store import (
    BindingRecord,
    DelayedRecord,
    ExchangeRecord,
    MemoryStore,
    MessageRecord,
    QueueRecord,
    StoredTopology,
)


class RecordStore(MemoryStore):
    """Returns the records it was given; remembers what recovery asked of it."""

    durable = True  # type: ignore[assignment]

    def __init__(
        self,
        topology: StoredTopology | None = None,
        messages: tuple[MessageRecord, ...] = (),
        delayed: tuple[DelayedRecord, ...] = (),
        bodies: dict[int, bytes] | None = None,
    ) -> None:
        self.topology = topology or StoredTopology()
        self.messages = messages
        self.delayed = delayed
        self.bodies = bodies or {}
        self.discarded: list[Any] = []
        self.removed: list[int] = []
        self.log: list[str] = []

    @contextmanager
    def recovering(self) -> Iterator[None]:
        self.log.append("begin")
        yield
        self.log.append("end")

    def read_topology(self) -> StoredTopology:
        self.log.append("topology")
        return self.topology

    def read_messages(self) -> Iterator[MessageRecord]:
        self.log.append("messages")
        return iter(self.messages)

    def read_delayed(self) -> Iterator[DelayedRecord]:
        self.log.append("delayed")
        return iter(self.delayed)

    def discard(self, record: Any) -> None:
        self.discarded.append(record)

    def read_body(self, queue: Queue, msg: Message) -> bytes | None:
        return self.bodies.get(msg.id)

    def remove_message(self, queue: Queue, msg: Message) -> None:
        self.removed.append(msg.id)


class World:
    def __init__(self, store: RecordStore, *vhosts: str) -> None:
        self.clock = ManualClock()
        self.timers = Timers(self.clock)
        self.store = store
        self.ids = MessageIds()
        self.vhosts = {
            name: VirtualHost(name, clock=self.clock, timers=self.timers, store=store, ids=self.ids)
            for name in vhosts or ("/",)
        }
        self.vh = self.vhosts[next(iter(self.vhosts))]

    def recover(self) -> RecoveryStats:
        return recover(self.store, self.vhosts, clock=self.clock, ids=self.ids)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.timers.run_due()


PROPS = P.encode({"delivery_mode": 2})
IDS = MessageIds()  # ids of the records the tests make up
NOW = ManualClock().time()  # the wall-clock time every World starts at


def msg(
    body: bytes,
    *,
    queue: str = "q",
    vhost: str = "/",
    id: int | None = None,
    props: bytes = PROPS,
    count: int = 0,
    delivered: bool = False,
    arrival: float = NOW,
    due: float | None = None,
    paged: bool = False,
) -> MessageRecord:
    return MessageRecord(
        (vhost, queue),
        IDS.next() if id is None else id,
        "",
        queue,
        props,
        None if paged else body,
        len(body),
        NOW,
        arrival,
        count,
        delivered,
        due,
    )


def queue_rec(
    name: str = "q", vhost: str = "/", arguments: dict[str, Any] | None = None
) -> QueueRecord:
    return QueueRecord(vhost, name, False, arguments or {}, None)


def test_a_store_that_keeps_nothing_is_not_read() -> None:
    vh = VirtualHost("/", clock=ManualClock(), timers=Timers(ManualClock()))
    stats = recover(MemoryStore(), {"/": vh}, clock=ManualClock(), ids=vh.ids)
    assert stats == RecoveryStats() and vh.ids.next() == 1


def test_topology_then_messages_then_delayed_inside_one_recovering_block() -> None:
    w = World(RecordStore())
    w.recover()
    assert w.store.log == ["begin", "topology", "messages", "delayed", "end"]


def test_exchanges_queues_and_bindings_are_declared_as_recorded() -> None:
    store = RecordStore(
        StoredTopology(
            exchanges=(
                ExchangeRecord("/", "dx", "topic", False, False, {"alternate-exchange": "ae"}),
                ExchangeRecord("/", "ae", "fanout", True, True, {}),
            ),
            queues=(
                QueueRecord("/", "q", False, {"x-max-priority": 5}, "failover"),
                QueueRecord("/", "auto", True, {}, None),
            ),
            bindings=(
                BindingRecord("/", "dx", "queue", "q", "a.*", {}),
                BindingRecord("/", "dx", "exchange", "ae", "ex.#", {"x-foo": "bar"}),
            ),
        )
    )
    w = World(store)
    stats = w.recover()
    vh = w.vh
    dx, ae, q = vh.exchanges["dx"], vh.exchanges["ae"], vh.queues["q"]
    assert dx.type == "topic" and dx.durable and dx.alternate == "ae"
    assert ae.auto_delete and ae.internal
    assert q.durable and q.max_priority == 5 and q.subscription_type == "failover"
    assert vh.queues["auto"].auto_delete
    assert q.bindings() == [("dx", "topic", "a.*")]
    assert [(b.routing_key, b.arguments) for b in dx.bindings.values() if b.destination is ae] == [
        ("ex.#", {"x-foo": "bar"})
    ]
    assert (stats.exchanges, stats.queues, stats.bindings) == (2, 2, 2)
    assert store.discarded == []


def test_what_the_configuration_declared_stays_as_configured() -> None:
    store = RecordStore(
        StoredTopology(
            exchanges=(ExchangeRecord("/", "ex", "fanout", False, False, {}),),
            queues=(queue_rec("q", arguments={"x-max-priority": 9}),),
        ),
        messages=(msg(b"kept"),),
    )
    w = World(store)
    w.vh.declare_exchange("ex", "direct", durable=True)
    configured, _ = w.vh.declare_queue("q", durable=True)
    stats = w.recover()
    assert w.vh.exchanges["ex"].type == "direct"
    assert w.vh.queues["q"] is configured and configured.max_priority is None
    assert [m.body for m in configured.ready] == [b"kept"]  # its messages are restored
    assert (stats.exchanges, stats.queues, stats.messages) == (0, 0, 1)


def test_a_binding_with_a_missing_or_non_durable_end_is_discarded() -> None:
    gone = BindingRecord("/", "nowhere", "queue", "q", "", {})
    transient = BindingRecord("/", "tx", "queue", "q", "", {})
    other_vhost = BindingRecord("/old", "ex", "queue", "q", "", {})
    store = RecordStore(
        StoredTopology(queues=(queue_rec(),), bindings=(gone, transient, other_vhost))
    )
    w = World(store)
    w.vh.declare_exchange("tx", "direct", durable=False)
    stats = w.recover()
    assert store.discarded == [gone, transient]  # of an unknown vhost: left alone
    assert stats.bindings == 0 and w.vh.queues["q"].bindings() == []


def test_what_the_configuration_no_longer_matches_stays_on_disk_untouched() -> None:
    store = RecordStore(
        StoredTopology(
            exchanges=(ExchangeRecord("/old", "ex", "direct", False, False, {}),),
            queues=(queue_rec("q", vhost="/old"), queue_rec("now-transient")),
        ),
        messages=(msg(b"a", queue="q", vhost="/old"), msg(b"b", queue="now-transient")),
    )
    w = World(store)
    transient, _ = w.vh.declare_queue("now-transient", durable=False)
    stats = w.recover()
    assert len(transient.ready) == 0 and stats.messages == 0
    assert store.discarded == [] and store.removed == []


def test_messages_keep_their_order_counts_flags_and_ttl() -> None:
    records = (
        msg(b"m0", count=0, delivered=True),
        msg(b"m1", count=2),
        msg(b"m2", arrival=NOW - 4.0),
        msg(b"m3"),
    )
    store = RecordStore(
        StoredTopology(queues=(queue_rec(arguments={"x-message-ttl": 10_000}),)), messages=records
    )
    w = World(store)
    w.clock.advance(3)  # three seconds after the last write: arrivals are wall-clock
    stats = w.recover()
    q = w.vh.queues["q"]
    got = list(q.ready)
    assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.id for m in got] == [r.id for r in records]
    assert [m.delivery_count for m in got] == [0, 2, 0, 0]
    assert [m.redelivered for m in got] == [True, True, False, False]
    assert all(m.stored for m in got)
    now = w.clock.monotonic()
    assert got[2].expires_at == pytest.approx(now - 7.0 + 10.0)  # 4 s before, plus 3 s since
    assert got[3].expires_at == pytest.approx(now - 3.0 + 10.0)
    assert q.message_count == 4 and q.ready_bytes == 8
    assert stats == RecoveryStats(queues=1, messages=4)


def test_a_nack_backoff_hold_waits_out_what_is_left_of_it() -> None:
    store = RecordStore(
        StoredTopology(queues=(queue_rec(),)),
        messages=(msg(b"held", count=1, due=NOW + 30.0), msg(b"due already", due=NOW - 1.0)),
    )
    w = World(store)
    w.clock.advance(10)
    w.recover()
    q = w.vh.queues["q"]
    assert [m.body for m in q.ready] == [b"due already"] and q.delayed == 1
    assert q.message_count == 2 and q.ready_bytes == len(b"due already")
    w.advance(19.9)
    assert len(q.ready) == 1
    w.advance(0.2)
    assert [m.body for m in q.ready] == [b"held", b"due already"]
    assert q.ready.peek().redelivered  # type: ignore[union-attr]


def test_a_retry_queue_hold_is_re_armed_and_its_body_read_back() -> None:
    paged = msg(b"retry me", queue="retry", due=NOW + 60.0, paged=True)
    store = RecordStore(
        StoredTopology(
            queues=(queue_rec("work"), queue_rec("retry", arguments={"x-retry-target": "work"}))
        ),
        messages=(paged,),
        bodies={paged.id: b"retry me"},
    )
    w = World(store)
    w.clock.advance(20)
    stats = w.recover()
    retry, work = w.vh.queues["retry"], w.vh.queues["work"]
    assert retry.delayed == 1 and len(retry.ready) == 0 and stats.messages == 1
    w.advance(39.9)
    assert len(work.ready) == 0
    w.advance(0.2)
    assert [m.body for m in work.ready] == [b"retry me"]


def test_an_expiring_message_bound_for_a_dead_letter_exchange_gets_its_body_back() -> None:
    raw = P.encode({"delivery_mode": 2, "expiration": "5000"})
    expiring = msg(b"needed", props=raw, paged=True)
    plain = msg(b"stays paged", paged=True)
    store = RecordStore(
        StoredTopology(queues=(queue_rec(arguments={"x-dead-letter-exchange": "dlx"}),)),
        messages=(expiring, plain),
        bodies={expiring.id: b"needed", plain.id: b"stays paged"},
    )
    w = World(store)
    w.recover()
    assert [m.body for m in w.vh.queues["q"].ready] == [b"needed", None]


def test_an_unreadable_message_is_discarded_and_the_rest_restored() -> None:
    bad = msg(b"bad", props=b"\xff")
    store = RecordStore(StoredTopology(queues=(queue_rec(),)), messages=(bad, msg(b"good")))
    w = World(store)
    stats = w.recover()
    assert store.discarded == [bad]
    assert [m.body for m in w.vh.queues["q"].ready] == [b"good"]
    assert (stats.messages, stats.dropped) == (1, 1)


def test_a_message_the_queue_now_refuses_is_removed_from_the_store() -> None:
    records = (msg(b"fits"), msg(b"over the limit"))
    store = RecordStore(
        StoredTopology(
            queues=(queue_rec(arguments={"x-max-length": 1, "x-overflow": "reject-publish"}),)
        ),
        messages=records,
    )
    w = World(store)
    stats = w.recover()
    assert [m.body for m in w.vh.queues["q"].ready] == [b"fits"]
    assert store.removed == [records[1].id]
    assert (stats.messages, stats.dropped) == (1, 1)


def test_delayed_messages_are_re_armed_and_those_of_a_missing_exchange_discarded() -> None:
    held = DelayedRecord("/", "later", IDS.next(), "q", PROPS, b"in 10 s", NOW, NOW + 10.0)
    orphan = DelayedRecord("/", "gone", IDS.next(), "q", PROPS, b"x", NOW, NOW + 10.0)
    elsewhere = DelayedRecord("/old", "later", IDS.next(), "q", PROPS, b"y", NOW, NOW)
    store = RecordStore(
        StoredTopology(
            exchanges=(
                ExchangeRecord(
                    "/", "later", "x-delayed-message", False, False, {"x-delayed-type": "direct"}
                ),
            ),
            queues=(queue_rec(),),
            bindings=(BindingRecord("/", "later", "queue", "q", "q", {}),),
        ),
        delayed=(held, orphan, elsewhere),
    )
    w = World(store)
    w.clock.advance(4)
    stats = w.recover()
    assert isinstance(w.vh.exchanges["later"], DelayedExchange)
    assert stats.delayed == 1 and w.vh.delayed_pending == 1
    assert store.discarded == [orphan]  # of an unknown vhost: left alone
    q = w.vh.queues["q"]
    w.advance(5.9)
    assert len(q.ready) == 0
    w.advance(0.2)
    assert [m.body for m in q.ready] == [b"in 10 s"]


def test_message_ids_continue_above_every_id_on_disk() -> None:
    top = IDS.next() + 1000
    store = RecordStore(
        StoredTopology(queues=(queue_rec(),)),
        # the highest id belongs to a message that is not restored (unknown vhost)
        messages=(msg(b"a"), msg(b"b", vhost="/old", id=top)),
        delayed=(DelayedRecord("/", "gone", top - 5, "q", PROPS, b"x", NOW, NOW),),
    )
    w = World(store)
    w.recover()
    assert w.ids.next() > top

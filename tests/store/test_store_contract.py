"""What every store must do: one test body, run against each implementation.

Each test drives a store through the :class:`plugbroker.store.Store` interface only (the calls the
domain makes, then the records a restart reads back). A store that keeps nothing
(``store.durable`` False) must still accept every call and return no records; the cases that
only make sense for a store that keeps data are skipped by that flag, never by the store's name.
A new store is added to ``IMPLEMENTATIONS`` and gets the whole contract.

No sockets: callbacks a store schedules on the loop go to a fake loop that the test runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from readylist import check_ready_list

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.domain.exchange import DelayedExchange, DirectExchange, Exchange
from plugbroker.domain.message import Message
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
    Store,
    StoredTopology,
)
from plugbroker.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storeworld import FakeLoop


class Harness:
    """One store implementation, opened on a directory: reopen it as a restart would, let it
    finish its writes, kill it as a crash would."""

    def __init__(self, make: Callable[[Path], Store], path: Path) -> None:
        self.make = make
        self.path = path
        self.clock = ManualClock()
        self.alarms: list[str | None] = []
        self.zombies: list[Any] = []
        # the domain objects the store is told about live in a vhost that has no store: the
        # test calls the store under test itself
        self.vh = VirtualHost("/", clock=self.clock, timers=Timers(self.clock))
        self.store = self.open()

    def open(self) -> Store:
        store = self.make(self.path)
        store.attach(self.clock, self.alarms.append)
        self.loop = FakeLoop()
        store.bind_loop(self.loop)  # type: ignore[arg-type]
        return store

    def sync(self) -> None:
        """Hand over this turn's calls, wait until they are on disk, run the callbacks."""
        self.loop.run()
        assert self.store.flush(10)
        self.loop.run()

    def reopen(self) -> None:
        self.store.close()
        self.store = self.open()

    def crash(self) -> None:
        """What kill -9 leaves: nothing pending is written, nothing is closed cleanly."""
        store = self.store
        if isinstance(store, SQLiteStore):
            store._pending.clear()
            store._stopping = True
            store._wake.set()
            store._thread.join(5)
            # a killed process never closes SQLite (closing the last connection would
            # checkpoint and delete the write-ahead log): kept open until the end
            self.zombies.append(store._db)
            import os

            os.close(store._lock_fd)
        self.store = self.open()

    def read(self) -> tuple[StoredTopology, list[MessageRecord], list[DelayedRecord]]:
        with self.store.recovering():
            return (
                self.store.read_topology(),
                list(self.store.read_messages()),
                list(self.store.read_delayed()),
            )

    # domain objects, as the domain would hand them over

    def queue(self, name: str, **kw: Any) -> Queue:
        q = Queue(self.vh, name, durable=True, **kw)
        self.vh.queues[name] = q
        return q

    def exchange(self, name: str, cls: type[Exchange] = DirectExchange, **kw: Any) -> Exchange:
        ex = cls(name, durable=True, **kw)
        self.vh.exchanges[name] = ex
        return ex

    def message(
        self, body: bytes, *, routing_key: str = "q", headers: dict[str, Any] | None = None
    ) -> Message:
        props: dict[str, Any] = {"delivery_mode": 2}
        if headers:
            props["application_headers"] = headers
        m = Message.from_publish(
            self.vh.ids.next(),
            "",
            routing_key,
            P.encode(props),
            body,
            len(body),
            self.clock.monotonic(),
            self.clock.time(),
        )
        m.stored = True
        return m


IMPLEMENTATIONS: dict[str, Callable[[Path], Store]] = {
    "memory": lambda path: MemoryStore(),
    "sqlite": SQLiteStore,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(IMPLEMENTATIONS[request.param], tmp_path / "store")
    yield harness
    harness.store.close()
    for db in harness.zombies:
        db.close()


def durable_only(h: Harness) -> None:
    if not h.store.durable:
        pytest.skip("this store keeps nothing across a restart")


def no_records(h: Harness) -> None:
    topology, messages, delayed = h.read()
    assert topology == StoredTopology()
    assert messages == [] and delayed == []


# ------------------------------------------------------------------------- every store


def test_a_new_store_returns_no_records(h: Harness) -> None:
    no_records(h)


def test_after_durable_callbacks_run_once_each_in_the_order_given(h: Harness) -> None:
    q = h.queue("q")
    h.store.save_queue(q)
    fired: list[int] = []
    for i in range(3):
        h.store.add_message(q, h.message(b"m%d" % i))
        h.store.after_durable(partial(fired.append, i))
    h.sync()
    assert fired == [0, 1, 2]
    h.sync()
    assert fired == [0, 1, 2]


def test_round_trip_returns_what_was_written_if_durable_else_nothing(h: Harness) -> None:
    store = h.store
    dx = h.exchange("dx", arguments={"alternate-exchange": "ae"})
    later = h.exchange("later", DelayedExchange, arguments={"x-delayed-type": "direct"})
    q = h.queue("q", arguments={"x-max-priority": 3}, subscription_type="failover")
    q.dead_letter_target = True  # known as a dead-letter target: the mark is kept
    store.save_exchange("/", dx)
    store.save_exchange("/", later)
    store.save_queue(q)
    store.save_binding("/", "dx", "queue", "q", "a.b", {"x-match": "all"})
    store.save_binding("/", "dx", "exchange", "later", "", {})
    plain = h.message(b"plain")
    counted = h.message(b"counted", headers={"x-death": [{"queue": "w", "count": 1}]})
    held = h.message(b"held")
    for m in (plain, counted, held):
        store.add_message(q, m)
    store.delivered(q, counted)
    counted.delivery_count = 2
    counted.timeouts = 1  # one hand-out of it ran past its ack timeout
    store.update_message(q, counted)
    store.hold_message(q, held, 30.0)
    waiting = h.message(b"in 10 s", routing_key="k")
    store.add_delayed("/", later, waiting, 10.0)
    h.sync()
    wall = h.clock.time()
    h.clock.advance(5)
    h.reopen()

    topology, messages, delayed = h.read()
    if not h.store.durable:
        assert topology == StoredTopology() and messages == [] and delayed == []
        return
    assert topology.exchanges == (
        ExchangeRecord("/", "dx", "direct", False, False, {"alternate-exchange": "ae"}),
        ExchangeRecord(
            "/", "later", "x-delayed-message", False, False, {"x-delayed-type": "direct"}
        ),
    )
    assert topology.queues == (
        QueueRecord("/", "q", False, {"x-max-priority": 3}, "failover", True),
    )
    assert sorted(topology.bindings, key=lambda b: b.dest) == [
        BindingRecord("/", "dx", "exchange", "later", "", {}),
        BindingRecord("/", "dx", "queue", "q", "a.b", {"x-match": "all"}),
    ]
    assert messages == [
        MessageRecord(("/", "q"), plain.id, "", "q", plain.properties, b"plain", 5, wall, wall,
                      0, False, None),
        MessageRecord(("/", "q"), counted.id, "", "q", counted.properties, b"counted", 7, wall,
                      wall, 2, True, None, 1),
        MessageRecord(("/", "q"), held.id, "", "q", held.properties, b"held", 4, wall, wall,
                      0, False, wall + 30.0),
    ]  # fmt: skip
    assert delayed == [
        DelayedRecord("/", "later", waiting.id, "k", waiting.properties, b"in 10 s", wall,
                      wall + 10.0)
    ]  # fmt: skip


def test_exclusive_queue_is_never_kept(h: Harness) -> None:
    q = h.queue("mine", exclusive_owner="conn-1")
    h.store.save_queue(q)
    h.store.add_message(q, h.message(b"x"))
    h.sync()
    h.reopen()
    no_records(h)


def test_close_writes_what_is_pending_and_a_second_close_does_nothing(h: Harness) -> None:
    q = h.queue("q")
    h.store.save_queue(q)
    h.store.add_message(q, h.message(b"pending at close"))
    h.store.close()  # no sync before: close itself writes it out
    h.store.close()
    h.store = h.open()
    _, messages, _ = h.read()
    assert [m.body for m in messages] == ([b"pending at close"] if h.store.durable else [])


def test_read_body_gives_a_stored_body_if_durable(h: Harness) -> None:
    q = h.queue("q")
    h.store.save_queue(q)
    m = h.message(b"on disk")
    h.store.add_message(q, m)
    h.sync()
    assert h.store.read_body(q, m) == (b"on disk" if h.store.durable else None)
    assert h.store.read_body(h.queue("never-saved"), m) is None


def test_a_paged_ready_list_behaves_as_a_ready_list(h: Harness) -> None:
    q = h.queue("q")
    h.store.save_queue(q)
    assert h.store.paged_ready(h.queue("never-saved")) is None
    r = h.store.paged_ready(q)
    if r is None:
        return  # this store does not page: the queue keeps its own list
    check_ready_list(r, h.message)


# ------------------------------------------------------------------------- durable stores


def test_a_message_confirmed_by_after_durable_survives_a_crash(h: Harness) -> None:
    durable_only(h)
    q = h.queue("q")
    h.store.save_queue(q)
    confirmed = h.message(b"confirmed")
    h.store.add_message(q, confirmed)
    fired: list[bool] = []
    h.store.after_durable(lambda: fired.append(True))
    h.sync()
    assert fired == [True]
    h.store.add_message(q, h.message(b"never handed to the writer"))
    h.crash()
    _, messages, _ = h.read()
    assert [m.id for m in messages] == [confirmed.id]


def test_removed_messages_are_gone_and_an_add_removed_in_one_turn_never_lands(
    h: Harness,
) -> None:
    durable_only(h)
    q = h.queue("q")
    h.store.save_queue(q)
    keep, acked, fleeting = (h.message(x) for x in (b"keep", b"acked", b"fleeting"))
    h.store.add_message(q, keep)
    h.store.add_message(q, acked)
    h.sync()
    h.store.remove_message(q, acked)
    h.store.add_message(q, fleeting)
    h.store.remove_message(q, fleeting)
    h.sync()
    h.reopen()
    _, messages, _ = h.read()
    assert [m.body for m in messages] == [b"keep"]


def test_deleting_a_queue_deletes_its_messages_and_bindings(h: Harness) -> None:
    durable_only(h)
    ex = h.exchange("ex")
    q = h.queue("q")
    h.store.save_exchange("/", ex)
    h.store.save_queue(q)
    h.store.save_binding("/", "ex", "queue", "q", "k", {})
    h.store.add_message(q, h.message(b"old"))
    h.sync()
    h.store.delete_queue("/", "q")
    del h.vh.queues["q"]
    again = h.queue("q")  # same name, a new queue
    h.store.save_queue(again)
    h.store.add_message(again, h.message(b"new"))
    h.store.add_message(q, h.message(b"to the deleted queue"))  # nowhere
    h.sync()
    h.reopen()
    topology, messages, _ = h.read()
    assert [r.name for r in topology.queues] == ["q"]
    assert topology.bindings == ()
    assert [m.body for m in messages] == [b"new"]


def test_deleting_an_exchange_deletes_its_bindings_and_held_messages(h: Harness) -> None:
    durable_only(h)
    later = h.exchange("later", DelayedExchange, arguments={"x-delayed-type": "direct"})
    other = h.exchange("other")
    h.store.save_exchange("/", later)
    h.store.save_exchange("/", other)
    h.store.save_binding("/", "later", "exchange", "other", "", {})
    h.store.save_binding("/", "other", "exchange", "later", "", {})
    h.store.add_delayed("/", later, h.message(b"held"), 60.0)
    h.sync()
    h.store.delete_exchange("/", "later")
    h.sync()
    h.reopen()
    topology, _, delayed = h.read()
    assert [e.name for e in topology.exchanges] == ["other"]
    assert topology.bindings == () and delayed == []


def test_binding_arguments_tell_bindings_apart(h: Harness) -> None:
    durable_only(h)
    for args in ({}, {"x-match": "any"}, {"x-match": "any"}):
        h.store.save_binding("/", "ex", "queue", "q", "k", args)
    h.store.delete_binding("/", "ex", "queue", "q", "k", {})
    h.sync()
    h.reopen()
    topology, _, _ = h.read()
    assert topology.bindings == (BindingRecord("/", "ex", "queue", "q", "k", {"x-match": "any"}),)


def test_discarded_records_are_deleted(h: Harness) -> None:
    durable_only(h)
    later = h.exchange("later", DelayedExchange, arguments={"x-delayed-type": "direct"})
    q = h.queue("q")
    h.store.save_queue(q)
    h.store.save_binding("/", "gone", "queue", "q", "k", {})
    bad, good = h.message(b"bad"), h.message(b"good")
    h.store.add_message(q, bad)
    h.store.add_message(q, good)
    h.store.add_delayed("/", later, h.message(b"held"), 60.0)
    h.sync()
    h.reopen()
    topology, messages, delayed = h.read()
    h.store.discard(topology.bindings[0])
    h.store.discard(messages[0])
    h.store.discard(delayed[0])
    h.sync()
    h.reopen()
    topology, messages, delayed = h.read()
    assert topology.bindings == () and delayed == []
    assert [m.id for m in messages] == [good.id]


def test_declarations_replayed_while_recovering_are_not_written_back(h: Harness) -> None:
    durable_only(h)
    ex, q = h.exchange("ex"), h.queue("q")
    with h.store.recovering():
        h.store.save_exchange("/", ex)
        h.store.save_queue(q)
        h.store.save_binding("/", "ex", "queue", "q", "k", {})
    h.sync()
    h.reopen()
    no_records(h)


def test_records_of_bodies_written_by_the_store_are_not_corrupt(h: Harness) -> None:
    durable_only(h)
    q = h.queue("q")
    h.store.save_queue(q)
    bodies = [b"", b"small", bytes(range(256)) * 400]  # empty, inline, over many pages
    for body in bodies:
        h.store.add_message(q, h.message(body))
    h.sync()
    h.crash()
    _, messages, _ = h.read()
    assert [(m.body, m.corrupt) for m in messages] == [(b, False) for b in bodies]


def test_most_messages_removed_then_a_crash_restarts_with_exactly_the_rest(h: Harness) -> None:
    """A store that gives the space of removed messages back (or keeps counts of them) still
    recovers exactly what is left after a crash, and finds no loss in it."""
    durable_only(h)
    q = h.queue("q")
    h.store.save_queue(q)
    sent = [h.message(b"%04d" % i + b"." * 8000) for i in range(300)]
    for m in sent:
        h.store.add_message(q, m)
    h.sync()
    for m in sent[:290]:
        h.store.remove_message(q, m)
    h.sync()
    for _ in range(20):  # a few more turns (work a store does between them)
        h.sync()
    h.crash()
    _, messages, _ = h.read()
    assert [m.id for m in messages] == [m.id for m in sent[290:]]
    assert all(m.body == b"%04d" % (290 + i) + b"." * 8000 for i, m in enumerate(messages))
    h.crash()  # and again, from the store the first restart left
    _, again, _ = h.read()
    assert [m.id for m in again] == [m.id for m in sent[290:]]

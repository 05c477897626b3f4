"""The SQLite store with the real domain (virtual host, queues, messages) on a manual clock.

No sockets: a fake loop collects what the store schedules, :meth:`SQLiteStore.flush` waits for
the writer, and :meth:`FakeLoop.run` runs the callbacks the writer posted back.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.domain import fate
from plugbroker.domain.message import Message
from plugbroker.store import sqlite as S
from plugbroker.store.sqlite import PagedReady, SQLiteStore, StoreError

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storeworld import World, bodies, take_all


def test_confirm_callback_runs_after_the_commit(world: World) -> None:
    _q, _ = world.vh.declare_queue("q", durable=True)
    world.publish("q", b"one")
    fired: list[int] = []
    world.store.after_durable(lambda: fired.append(world.rows()[0][0]))
    world.loop.run()  # hands the turn to the writer; the callback is not on the loop yet
    assert world.store.flush(10)
    assert fired == []
    world.loop.run()
    assert fired == [1]  # when it ran, the row was already committed


def test_add_and_remove_in_one_batch_never_touch_the_disk(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True)
    world.sync()
    inserted = world.store.rows_inserted
    for i in range(100):
        world.publish("q", b"m%d" % i)
    while q.ready:  # consumed and acked within the same turn
        q.settle(q.get())
    world.sync()
    assert world.store.rows_inserted == inserted
    assert world.store.rows_deleted == 0
    assert world.rows() == [(0,)]


def test_transient_messages_and_non_durable_queues_stay_off_disk(world: World) -> None:
    world.vh.declare_queue("durable", durable=True)
    world.vh.declare_queue("transient", durable=False)
    world.publish("durable", b"transient message", persistent=False)
    world.publish("transient", b"persistent message in a transient queue")
    world.publish("durable", b"kept")
    world.sync()
    assert world.rows("SELECT body FROM messages") == [(b"kept",)]
    assert world.rows("SELECT name FROM queues") == [("durable",)]
    world.restart()
    assert "transient" not in world.vh.queues
    assert bodies(world.vh.queues["durable"]) == [b"kept"]


def test_exclusive_durable_queue_is_not_kept(world: World) -> None:
    world.vh.declare_queue("mine", durable=True, exclusive=True, owner="conn-1")
    world.publish("mine", b"x")
    world.sync()
    assert world.rows("SELECT count(*) FROM queues") == [(0,)]
    assert world.rows() == [(0,)]


def test_recovery_restores_order_flags_counts_and_ids(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True, arguments={"x-subscription-type": "failover"})
    for i in range(5):
        world.publish("q", b"m%d" % i)
    world.sync()
    first = q.get()
    world.vh.store.delivered(q, first)  # what Channel.deliver does for a stored message
    second = q.get()
    world.vh.store.delivered(q, second)
    second.delivery_count += 1  # a nack with requeue: counted, then requeued
    q.requeue([second], count=False)
    world.vh.store.update_message(q, second)
    world.sync()
    top = max(m.id for m in q.held.values())
    world.restart(graceful=False)
    q = world.vh.queues["q"]
    assert q.subscription_type == "failover"
    msgs = list(q.ready)
    assert [m.body for m in msgs] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [m.redelivered for m in msgs] == [True, True, False, False, False]
    assert [m.delivery_count for m in msgs] == [0, 1, 0, 0, 0]
    assert msgs[1].delivery_properties() != msgs[1].properties  # carries x-delivery-count
    assert P.decode(msgs[1].delivery_properties())["application_headers"] == {"x-delivery-count": 1}
    assert world.vh.ids.next() > top


def test_acks_are_durable_in_batches(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True)
    for i in range(10):
        world.publish("q", b"m%d" % i)
    world.sync()
    for _ in range(4):
        q.settle(q.get())
    world.sync()
    assert world.store.rows_deleted == 4
    world.restart(graceful=False)
    assert bodies(world.vh.queues["q"]) == [b"m%d" % i for i in range(4, 10)]


def test_topology_round_trip(world: World) -> None:
    vh = world.vh
    dx = vh.declare_exchange("dx", "topic", durable=True, arguments={"alternate-exchange": "ae"})
    tx = vh.declare_exchange("tx", "fanout", durable=False)
    ae = vh.declare_exchange("ae", "fanout", durable=True, internal=True)
    dq, _ = vh.declare_queue("dq", durable=True, arguments={"x-max-priority": 5})
    tq, _ = vh.declare_queue("tq", durable=False)
    vh.bind(dx, dq, "a.*", {})
    vh.bind(dx, dq, "b.#", {"x-foo": "bar"})
    vh.bind(dx, tq, "a.*", {})
    vh.bind(tx, dq, "", {})
    vh.bind(dx, ae, "ex.#", {})
    vh.bind(ae, dq, "", {})
    vh.unbind(dx, dq, "b.#", {"x-foo": "bar"})
    world.sync()
    world.restart()
    vh = world.vh
    assert "tx" not in vh.exchanges and "tq" not in vh.queues
    dx, ae, dq = vh.exchanges["dx"], vh.exchanges["ae"], vh.queues["dq"]
    assert dx.type == "topic" and dx.durable and dx.alternate == "ae"
    assert ae.internal
    assert dq.max_priority == 5 and dq.arguments == {"x-max-priority": 5}
    assert sorted(vh.bindings_of(dq)) == [("ae", "fanout", ""), ("dx", "topic", "a.*")]
    assert [b.routing_key for b in dx.bindings.values() if b.destination is ae] == ["ex.#"]


def test_deleting_a_queue_deletes_its_messages(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True)
    world.publish("q", b"x")
    world.sync()
    world.vh.delete_queue(q)
    _q2, _ = world.vh.declare_queue("q", durable=True)  # same name, a new queue
    world.publish("q", b"y")
    world.sync()
    assert world.rows() == [(1,)]  # deleted with the queue, not left for a restart to find
    world.restart()
    assert bodies(world.vh.queues["q"]) == [b"y"]


def test_dead_lettered_copy_is_kept_with_its_x_death(world: World) -> None:
    vh = world.vh
    dlx = vh.declare_exchange("dlx", "fanout", durable=True)
    dead, _ = vh.declare_queue("dead", durable=True)
    vh.bind(dlx, dead, "", {})
    q, _ = vh.declare_queue("work", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    world.publish("work", b"poison")
    world.sync()
    m = q.get()
    q.settle(m)
    fate.dead_letter(q, m, "rejected")
    world.sync()  # the settle and the copy travel in one transaction
    world.restart(graceful=False)
    (m2,) = world.vh.queues["dead"].ready
    assert m2.body == b"poison"
    death = m2.headers["x-death"][0]
    assert death["queue"] == "work" and death["reason"] == "rejected"
    assert len(world.vh.queues["work"].ready) == 0


def test_delayed_exchange_hold_survives_restart_with_its_due_time(world: World) -> None:
    vh = world.vh
    ex = vh.declare_exchange(
        "later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
    )
    q, _ = vh.declare_queue("q", durable=True)
    vh.bind(ex, q, "q", {})
    world.publish("q", b"in 10 s", exchange="later", headers={"x-delay": 10_000})
    world.sync()
    assert world.rows("SELECT count(*) FROM delayed") == [(1,)]
    world.clock.advance(4)
    world.restart(graceful=False)
    q = world.vh.queues["q"]
    assert len(q.ready) == 0 and world.vh.delayed_pending == 1
    world.clock.advance(5.9)
    world.timers.run_due()
    assert len(q.ready) == 0
    world.clock.advance(0.2)
    world.timers.run_due()
    assert bodies(q) == [b"in 10 s"]
    world.sync()
    assert world.rows("SELECT count(*) FROM delayed") == [(0,)]
    assert world.rows() == [(1,)]
    world.restart(graceful=False)
    assert bodies(world.vh.queues["q"]) == [b"in 10 s"]


def test_nack_backoff_hold_survives_restart(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True)
    world.publish("q", b"a")
    world.publish("q", b"b")
    world.sync()
    m = q.get()
    m.delivery_count += 1
    q.hold_back(m, 30.0)  # what a redelivery-delay plugin asks for
    world.vh.store.update_message(q, m)
    world.sync()
    world.clock.advance(10)
    world.restart(graceful=False)
    q = world.vh.queues["q"]
    assert bodies(q) == [b"b"] and q.delayed == 1 and q.message_count == 2
    world.clock.advance(19.9)
    world.timers.run_due()
    assert bodies(q) == [b"b"]
    world.clock.advance(0.2)
    world.timers.run_due()
    assert len(q.ready) == 2
    got = take_all(world, q)
    assert [m.body for m in got] == [b"a", b"b"]
    assert got[0].delivery_count == 1 and got[0].redelivered


def test_paging_drops_deep_bodies_and_reads_them_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(S, "RESIDENT_BYTES", 100)
    monkeypatch.setattr(S, "RESIDENT_MIN", 10)
    monkeypatch.setattr(S, "LOAD_WINDOW", 8)
    monkeypatch.setattr(S, "LOAD_STEP", 4)
    q, _ = world.vh.declare_queue("q", durable=True)
    assert type(q.ready) is PagedReady
    sent = [b"body-%03d" % i for i in range(60)]
    for b in sent:
        world.publish("q", b)
    world.sync()
    paged = sum(1 for m in q.ready if m.body is None)
    assert paged == 60 - 12  # more than RESIDENT_MIN messages and RESIDENT_BYTES bytes
    assert q.ready_count == 60 and q.ready_bytes == sum(map(len, sent))
    got = []
    stalls = 0
    while len(got) < 60:
        m = q.get()
        if m is None:  # head on disk: a read is under way, the loop did not wait
            stalls += 1
            assert stalls < 100
            world.sync()
            continue
        got.append(m.body)
        q.settle(m)
    assert got == sent
    world.sync()
    assert world.rows() == [(0,)]


def test_recovery_pages_long_queues(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "RESIDENT_BYTES", 100)
    monkeypatch.setattr(S, "RESIDENT_MIN", 5)
    q, _ = world.vh.declare_queue("q", durable=True)
    sent = [b"body-%03d" % i for i in range(40)]
    for b in sent:
        world.publish("q", b)
    world.sync()
    world.restart()
    q = world.vh.queues["q"]
    assert q.ready_count == 40
    resident = [m.body for m in q.ready if m.body is not None]
    assert resident == sent[: len(resident)] and 5 <= len(resident) < 40
    got = []
    while len(got) < 40:
        m = q.get()
        if m is None:
            world.sync()
            continue
        got.append(m.body)
    assert got == sent


def test_expiring_messages_keep_their_bodies_for_dead_lettering(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(S, "RESIDENT_BYTES", 10)
    monkeypatch.setattr(S, "RESIDENT_MIN", 1)
    vh = world.vh
    dlx = vh.declare_exchange("dlx", "fanout", durable=True)
    dead, _ = vh.declare_queue("dead", durable=True)
    vh.bind(dlx, dead, "", {})
    q, _ = vh.declare_queue("q", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    assert type(q.ready) is PagedReady  # no queue TTL: pageable, but not these messages
    for i in range(10):
        world.publish("q", b"plain-%d" % i)
    raw = P.encode({"delivery_mode": 2, "expiration": "5000"})
    m = Message.from_publish(
        vh.ids.next(), "", "q", raw, b"expires", 7, world.clock.monotonic(), world.clock.time()
    )
    vh.deliver_to_queues([q], m)
    world.sync()
    assert m.body == b"expires"  # never paged out live
    world.restart()
    q = world.vh.queues["q"]
    assert [x.body for x in q.ready if x.expiration is not None] == [b"expires"]
    world.clock.advance(6)
    world.timers.run_due()
    q.get()  # expiry is checked at the head as the queue is used
    take_all(world, q)
    (d,) = world.vh.queues["dead"].ready
    assert d.body == b"expires" and d.headers["x-death"][0]["reason"] == "expired"


def test_a_write_failure_holds_confirms_under_an_alarm_until_a_write_succeeds(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    alarms: list[str | None] = []
    world.store.attach(world.clock, alarms.append)
    real = world.store._apply
    failures = [sqlite3.OperationalError("disk I/O error")]

    def flaky(ops: list[tuple[Any, ...]]) -> Any:
        if failures:
            raise failures.pop()
        return real(ops)

    monkeypatch.setattr(world.store, "_apply", flaky)
    world.vh.declare_queue("q", durable=True)
    world.publish("q", b"x")
    fired: list[int] = []
    world.store.after_durable(lambda: fired.append(world.rows()[0][0]))
    world.sync()
    assert fired == [1]  # sent once written, never before
    assert len(alarms) == 2 and "disk I/O error" in (alarms[0] or "") and alarms[1] is None


def test_a_record_that_cannot_be_written_fails_alone(world: World) -> None:
    """A message whose text SQLite cannot encode (a lone surrogate, as the codec now refuses
    at the edge) is left out of its batch and its confirm becomes a failure; the records around
    it are written, no alarm is raised, and the writer does not retry the batch."""
    alarms: list[str | None] = []
    world.store.attach(world.clock, alarms.append)
    world.vh.declare_queue("q", durable=True)
    world.sync()
    outcome: list[str] = []
    world.publish("q", b"before")
    world.store.after_durable(lambda: outcome.append("ok before"), lambda: outcome.append("nack"))
    # a routing key the codec refuses now, delivered straight to the queue (as a bug could)
    poison = Message.from_publish(
        world.vh.ids.next(),
        "",
        "poison-\ud800",
        P.encode({"delivery_mode": 2}),
        b"poison",
        6,
        world.clock.monotonic(),
        world.clock.time(),
    )
    world.vh.deliver_to_queues([world.vh.queues["q"]], poison)
    world.store.after_durable(lambda: outcome.append("ok poison"), lambda: outcome.append("failed"))
    world.publish("q", b"after")
    world.store.after_durable(lambda: outcome.append("ok after"), lambda: outcome.append("nack"))
    world.sync()
    assert outcome == ["ok before", "failed", "ok after"]
    assert alarms == []
    assert world.store.records_failed == 1
    assert world.rows("SELECT body FROM messages ORDER BY seq") == [(b"before",), (b"after",)]
    # the writer goes on as usual
    world.publish("q", b"later")
    fired: list[int] = []
    world.store.after_durable(lambda: fired.append(1))
    world.sync()
    assert fired == [1] and world.rows()[0][0] == 3


def test_an_io_error_in_the_one_by_one_pass_is_retried_under_the_alarm(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    alarms: list[str | None] = []
    world.store.attach(world.clock, alarms.append)
    world.vh.declare_queue("q", durable=True)
    world.sync()
    real = world.store._apply_ops
    failures = [sqlite3.OperationalError("database or disk is full"), ValueError("bad record")]

    def flaky(ops: list[tuple[Any, ...]]) -> Any:
        if failures:
            raise failures.pop()
        return real(ops)

    monkeypatch.setattr(world.store, "_apply_ops", flaky)
    world.publish("q", b"x")
    fired: list[str] = []
    world.store.after_durable(lambda: fired.append("ok"), lambda: fired.append("nack"))
    world.sync()
    assert fired == ["ok"]  # the I/O error kept the batch; the retry wrote it
    assert len(alarms) == 2 and "disk is full" in (alarms[0] or "") and alarms[1] is None
    assert world.rows()[0][0] == 1


# --------------------------------------------------------------------------- refusing stores


def test_corrupt_file_is_refused_naming_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / S.DB_NAME).write_bytes(b"this is not a database at all" * 200)
    with pytest.raises(StoreError) as ei:
        SQLiteStore(store)
    assert str(store / S.DB_NAME) in str(ei.value)
    assert "corrupt or unreadable" in str(ei.value)
    assert (store / S.DB_NAME).read_bytes().startswith(b"this is not")  # left as it was


def test_damaged_page_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    w = World(store, ManualClock())
    w.vh.declare_queue("q", durable=True)
    for _i in range(300):
        w.publish("q", b"x" * 1000)
    w.sync()
    w.store.close()
    db = store / S.DB_NAME
    data = bytearray(db.read_bytes())
    page = 4096
    for off in range(page * 3, page * 3 + 600):  # scribble over a b-tree page's header
        data[off] = 0xFF
    db.write_bytes(bytes(data))
    with pytest.raises(StoreError) as ei:
        SQLiteStore(store)
    assert str(db) in str(ei.value)


def test_newer_layout_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    SQLiteStore(store).close()
    db = sqlite3.connect(str(store / S.DB_NAME))
    db.execute(f"PRAGMA user_version={S.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer than this broker"):
        SQLiteStore(store)


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    db = sqlite3.connect(str(store / S.DB_NAME))
    db.execute("CREATE TABLE something (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a plugbroker store"):
        SQLiteStore(store)


def test_older_layout_is_migrated_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    SQLiteStore(store).close()  # written as the current layout
    current = S.SCHEMA_VERSION
    monkeypatch.setattr(S, "SCHEMA_VERSION", current + 1)
    with pytest.raises(StoreError, match="cannot migrate"):
        SQLiteStore(store)
    ran = []
    monkeypatch.setitem(
        S.MIGRATIONS,
        current,
        lambda db: ran.append(db.execute("ALTER TABLE queues ADD COLUMN extra TEXT")),
    )
    SQLiteStore(store).close()
    assert len(ran) == 1
    db = sqlite3.connect(str(store / S.DB_NAME))
    assert db.execute("PRAGMA user_version").fetchone() == (current + 1,)
    db.close()
    SQLiteStore(store).close()  # already migrated: nothing to do
    assert len(ran) == 1


#: layout 1, as the first releases wrote it (no timed-out counts, no dead-letter marks)
_LAYOUT_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    internal INTEGER NOT NULL, arguments BLOB NOT NULL, PRIMARY KEY (vhost, name));
CREATE TABLE queues (
    qid INTEGER PRIMARY KEY, vhost TEXT NOT NULL, name TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, arguments BLOB NOT NULL, subscription TEXT NOT NULL,
    UNIQUE (vhost, name));
CREATE TABLE bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, dest_kind TEXT NOT NULL, dest TEXT NOT NULL,
    routing_key TEXT NOT NULL, args_key TEXT NOT NULL, arguments BLOB NOT NULL,
    PRIMARY KEY (vhost, source, dest_kind, dest, routing_key, args_key));
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY, qid INTEGER NOT NULL, mid INTEGER NOT NULL,
    exchange TEXT NOT NULL, routing_key TEXT NOT NULL, properties BLOB NOT NULL,
    body BLOB NOT NULL, timestamp REAL NOT NULL, arrival REAL NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0, delivered INTEGER NOT NULL DEFAULT 0,
    due REAL);
CREATE UNIQUE INDEX messages_by_queue ON messages (qid, mid);
CREATE TABLE delayed (
    mid INTEGER PRIMARY KEY, vhost TEXT NOT NULL, exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL, properties BLOB NOT NULL, body BLOB NOT NULL,
    timestamp REAL NOT NULL, due REAL NOT NULL);
"""


def test_a_layout_1_store_is_migrated_with_its_messages(tmp_path: Path) -> None:
    store = tmp_path / "store"
    SQLiteStore(store).close()  # the directory and its marker
    db = sqlite3.connect(str(store / S.DB_NAME), isolation_level=None)
    for table in ("meta", "exchanges", "queues", "bindings", "messages", "delayed"):
        db.execute(f"DROP TABLE {table}")
    db.executescript(_LAYOUT_1)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute("PRAGMA user_version=1")
    db.execute("INSERT INTO queues VALUES (1, '/', 'q', 0, ?, 'shared')", (S._table({}),))
    props = P.encode({"delivery_mode": 2})
    db.execute(
        "INSERT INTO messages VALUES (1, 1, 7, '', 'q', ?, ?, 0, 0, 2, 1, NULL)",
        (props, b"kept"),
    )
    db.close()
    s = SQLiteStore(store)
    try:
        topo = s.read_topology()
        assert [(r.name, r.dead_letter_target) for r in topo.queues] == [("q", False)]
        [rec] = list(s.read_messages())
        assert (rec.id, rec.body, rec.delivery_count, rec.timeouts) == (7, b"kept", 2, 0)
    finally:
        s.close()
    db = sqlite3.connect(str(store / S.DB_NAME))
    assert db.execute("PRAGMA user_version").fetchone() == (S.SCHEMA_VERSION,)
    db.close()


def test_second_broker_on_the_same_store_is_refused(world: World) -> None:
    with pytest.raises(StoreError, match="in use by another broker"):
        SQLiteStore(world.path)


# --------------------------------------------------------------------------- integrity at start


def _filled(world: World, n: int = 50) -> Path:
    world.vh.declare_queue("q", durable=True)
    for i in range(n):
        world.publish("q", f"m{i}".encode())
    world.sync()
    return world.path / S.DB_NAME


def _refusal(path: Path, *words: str) -> str:
    with pytest.raises(StoreError) as info:
        SQLiteStore(path)
    text = str(info.value)
    for w in (*words, "acceptLoss", "--accept-store-loss"):
        assert w in text, text
    return text


def test_a_clean_stop_leaves_a_marker_and_reopens(world: World) -> None:
    _filled(world)
    world.restart()
    marker = json.loads((world.path / S.MARKER_NAME).read_text())
    assert marker["state"] == "running"  # reopened by restart()
    world.store.close()
    marker = json.loads((world.path / S.MARKER_NAME).read_text())
    assert (marker["state"], marker["queues"], marker["messages"]) == ("stopped", 1, 50)
    world.open()
    assert len(world.vh.queues["q"].ready) == 50


@pytest.mark.parametrize("damage", ["empty", "missing", "truncated", "rows"])
def test_a_store_that_lost_data_is_refused_unless_the_loss_is_accepted(
    world: World, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = _filled(world, 300)
    world.store.close()
    if damage == "empty":
        db.write_bytes(b"")
        words: tuple[str, ...] = ("empty (0 bytes)", "300 persistent messages")
    elif damage == "missing":
        db.unlink()
        words = ("missing",)
    elif damage == "truncated":
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 2])
        words = ("truncated",)
    else:
        con = sqlite3.connect(str(db))
        con.execute("DELETE FROM messages WHERE mid % 2 = 0")
        con.commit()
        con.close()
        words = ("fewer than at its last clean stop",)
    _refusal(world.path, *words)
    caplog.set_level(logging.WARNING, logger="plugbroker.store")
    store = SQLiteStore(world.path, accept_loss=True)
    try:
        assert store.lost
        assert any("starting anyway (acceptLoss)" in r.getMessage() for r in caplog.records)
        assert any("300 persistent messages" in r.getMessage() for r in caplog.records)
    finally:
        store.close()
    # the loss was accepted once: the next start is an ordinary one
    SQLiteStore(world.path).close()


def test_a_lost_write_ahead_log_after_a_crash_is_refused(world: World) -> None:
    _filled(world)
    world.restart(graceful=False)  # kill -9: the marker still says running, the WAL is there
    assert len(world.vh.queues["q"].ready) == 50  # a crash with its WAL recovers everything
    world.restart(graceful=False)
    wal = world.path / (S.DB_NAME + "-wal")
    assert wal.exists()
    world.store.close()  # what a real kill leaves is simulated with the zombie connections
    for z in world.zombies:
        z.close()
    world.zombies.clear()
    marker = json.loads((world.path / S.MARKER_NAME).read_text())
    marker["state"] = "running"  # as after kill -9
    (world.path / S.MARKER_NAME).write_text(json.dumps(marker))
    wal.unlink(missing_ok=True)
    _refusal(world.path, "did not stop cleanly", "write-ahead log")
    world.store = SQLiteStore(world.path, accept_loss=True)


def test_a_read_only_store_is_refused_at_start(world: World) -> None:
    db = _filled(world)
    world.store.close()
    db.chmod(0o444)
    try:
        with pytest.raises(StoreError) as info:
            SQLiteStore(world.path)
        assert "read-only" in str(info.value)
    finally:
        db.chmod(0o644)
    world.open()

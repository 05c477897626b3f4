"""The SQLite store finds damage and gives space back: body checksums (at recovery, at
page-in, on a single read), the row count it keeps beside the marker, a layout-2 store
migrated, and the file shrinking as queues drain, without a restart.

The same harness as test_sqlite_store.py: the real domain on a manual clock, no sockets.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from pathlib import Path

import pytest

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.store import integrity, space
from plugbroker.store import sqlite as S
from plugbroker.store.sqlite import SQLiteStore, StoreError

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storeworld import World, take_all


def _flip(world: World, mid: int) -> None:
    """Flip one bit of message ``mid``'s stored body, behind the broker's back."""
    db = sqlite3.connect(str(world.path / S.DB_NAME))
    try:
        (body,) = db.execute("SELECT body FROM messages WHERE mid = ?", (mid,)).fetchone()
        damaged = bytes([body[0] ^ 0x01]) + body[1:]
        db.execute("UPDATE messages SET body = ? WHERE mid = ?", (damaged, mid))
        db.commit()
    finally:
        db.close()


def _corrupt_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "fails its checksum" in r.getMessage()]


# --------------------------------------------------------------------------- checksums


def test_a_damaged_body_is_dead_lettered_as_corrupt_at_recovery(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # a length limit keeps bodies in memory (not pageable): recovery reads them all
    world.vh.declare_queue("work", durable=True, arguments={"x-max-length": 100})
    sent = [world.publish("work", b"body-%d" % i) for i in range(5)]
    world.sync()
    world.store.close()
    _flip(world, sent[2].id)
    caplog.set_level(logging.ERROR, logger="plugbroker.store")
    world.open()
    q = world.vh.queues["work"]
    assert [m.body for m in q.ready] == [b"body-0", b"body-1", b"body-3", b"body-4"]
    assert world.stats.corrupt == 1
    (dead,) = world.vh.queues["work-DLQ"].ready
    assert dead.headers["x-death"][0]["reason"] == "corrupt"
    (line,) = _corrupt_lines(caplog)
    assert "'work'" in line and f"message {sent[2].id}" in line and "'work-DLQ'" in line
    world.sync()
    world.restart()  # the parked copy is stored, the damaged row is gone
    assert len(world.vh.queues["work"].ready) == 4
    assert len(world.vh.queues["work-DLQ"].ready) == 1


def test_a_damaged_body_goes_to_the_queues_dead_letter_exchange(world: World) -> None:
    vh = world.vh
    dlx = vh.declare_exchange("dlx", "fanout", durable=True)
    dead, _ = vh.declare_queue("dead", durable=True)
    vh.bind(dlx, dead, "", {})
    args = {"x-dead-letter-exchange": "dlx", "x-max-length": 10}
    vh.declare_queue("work", durable=True, arguments=args)
    m = world.publish("work", b"to be damaged")
    world.sync()
    world.store.close()
    _flip(world, m.id)
    world.open()
    assert len(world.vh.queues["work"].ready) == 0
    (d,) = world.vh.queues["dead"].ready
    assert d.headers["x-death"][0]["reason"] == "corrupt"
    assert "work-DLQ" not in world.vh.queues


def test_a_damaged_paged_body_is_found_when_read_back(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(S, "RESIDENT_BYTES", 100)
    monkeypatch.setattr(S, "RESIDENT_MIN", 5)
    monkeypatch.setattr(S, "LOAD_WINDOW", 8)
    monkeypatch.setattr(S, "LOAD_STEP", 4)
    world.vh.declare_queue("q", durable=True)
    sent = [world.publish("q", b"body-%03d" % i) for i in range(40)]
    world.sync()
    world.store.close()
    _flip(world, sent[3].id)  # in the head that recovery reads
    _flip(world, sent[30].id)  # deep: read back ahead of dispatch
    caplog.set_level(logging.ERROR, logger="plugbroker.store")
    world.open()
    q = world.vh.queues["q"]
    got = [m.body for m in take_all(world, q)]
    assert got == [b"body-%03d" % i for i in range(40) if i not in (3, 30)]
    world.sync()
    parked = world.vh.queues["q-DLQ"]
    assert len(parked.ready) == 2
    assert {d.headers["x-death"][0]["reason"] for d in parked.ready} == {"corrupt"}
    lines = _corrupt_lines(caplog)
    assert len(lines) == 2 and all("'q'" in line for line in lines)


def test_a_single_read_of_a_damaged_body_returns_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(S, "RESIDENT_BYTES", 10)
    monkeypatch.setattr(S, "RESIDENT_MIN", 1)
    q, _ = world.vh.declare_queue("q", durable=True)
    sent = [world.publish("q", b"body-%d" % i) for i in range(5)]
    world.sync()
    assert sent[4].body is None  # paged out
    assert world.store.read_body(q, sent[4]) == b"body-4"
    _flip(world, sent[4].id)
    caplog.set_level(logging.ERROR, logger="plugbroker.store")
    assert world.store.read_body(q, sent[4]) is None
    assert f"message {sent[4].id} of queue 'q'" in _corrupt_lines(caplog)[0]


def test_the_checksum_covers_properties_and_body() -> None:
    props, body = P.encode({"delivery_mode": 2}), b"payload"
    crc = integrity.checksum(props, body)
    assert integrity.intact(crc, props, body)
    assert not integrity.intact(crc, props, b"payloae")
    assert not integrity.intact(crc, P.encode({"delivery_mode": 1}), body)
    assert integrity.intact(None, props, b"anything")  # a row written before checksums


# --------------------------------------------------------------------------- the row count


def test_rows_deleted_with_the_marker_are_still_found(world: World) -> None:
    world.vh.declare_queue("q", durable=True)
    for i in range(100):
        world.publish("q", b"m%d" % i)
    world.sync()
    world.store.close()
    (world.path / S.MARKER_NAME).unlink()
    db = sqlite3.connect(str(world.path / S.DB_NAME))
    db.execute("DELETE FROM messages WHERE mid % 3 = 0")
    db.commit()
    db.close()
    with pytest.raises(StoreError) as info:
        SQLiteStore(world.path)
    assert "holds 67 persistent messages where its own count says 100" in str(info.value)
    s = SQLiteStore(world.path, accept_loss=True)
    assert s.lost
    s.close()
    SQLiteStore(world.path).close()  # the count was reset to what is there


def test_the_row_count_follows_adds_removes_queue_deletes_and_a_crash(world: World) -> None:
    vh = world.vh
    q, _ = vh.declare_queue("q", durable=True)
    vh.declare_queue("gone", durable=True)
    for i in range(30):
        world.publish("q", b"m%d" % i)
        world.publish("gone", b"g%d" % i)
    world.sync()
    for m in take_all(world, q)[:10]:
        q.settle(m)
    vh.delete_queue(vh.queues["gone"])
    world.sync()
    db = sqlite3.connect(str(world.path / S.DB_NAME))
    try:
        assert integrity.stored_rows(db) == integrity.count_rows(db) == 20
    finally:
        db.close()
    world.restart(graceful=False)  # a crash: no clean stop, no marker check of the counts
    assert len(world.vh.queues["q"].ready) == 20


# --------------------------------------------------------------------------- migration


def _layout_2_store(store: Path) -> None:
    """A store as layout 2 wrote it: no checksums, no row count, no incremental vacuum."""
    SQLiteStore(store).close()  # the directory and its marker
    (store / S.DB_NAME).unlink()
    db = sqlite3.connect(str(store / S.DB_NAME), isolation_level=None)
    layout_2 = S._SCHEMA.replace(", crc INTEGER", "")
    assert layout_2 != S._SCHEMA
    db.executescript(layout_2)
    db.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    db.execute("PRAGMA user_version=2")
    db.execute("INSERT INTO queues VALUES (1, '/', 'q', 0, ?, 'shared', 1)", (S._table({}),))
    props = P.encode({"delivery_mode": 2})
    for i in range(1, 201):
        db.execute(
            "INSERT INTO messages VALUES (?, 1, ?, '', 'q', ?, ?, 0, 0, 1, 1, NULL, 2)",
            (i, i, props, b"kept-%d" % i + b"." * 2000),
        )
    db.close()


def test_a_layout_2_store_is_migrated_with_its_messages(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _layout_2_store(store)
    s = SQLiteStore(store)
    try:
        topo = s.read_topology()
        assert [(r.name, r.dead_letter_target) for r in topo.queues] == [("q", True)]
        recs = list(s.read_messages())
        assert len(recs) == 200 and not any(r.corrupt for r in recs)
        assert (recs[0].id, recs[0].body[:6], recs[0].delivery_count, recs[0].timeouts) == (
            1,
            b"kept-1",
            1,
            2,
        )
    finally:
        s.close()
    db = sqlite3.connect(str(store / S.DB_NAME))
    try:
        assert db.execute("PRAGMA user_version").fetchone() == (S.SCHEMA_VERSION,)
        assert db.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # incremental from now on
        assert db.execute("SELECT count(*) FROM messages WHERE crc IS NULL").fetchone() == (200,)
        assert integrity.stored_rows(db) == 200
    finally:
        db.close()
    # a migrated store restarts as an ordinary one, its old rows delivered unchecked
    w = World(store, ManualClock())
    try:
        assert len(take_all(w, w.vh.queues["q"])) == 200
    finally:
        w.store.close()


# --------------------------------------------------------------------------- space


def _sizes(path: Path) -> int:
    db = path / S.DB_NAME
    wal = path / (S.DB_NAME + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def test_a_drained_store_gives_its_space_back_without_a_restart(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True)
    for i in range(400):
        world.publish("q", b"%05d" % i + b"x" * 20_000)
        if i % 50 == 49:
            world.sync()
    world.sync()
    full = _sizes(world.path)
    assert full > 8_000_000
    for m in take_all(world, q):
        q.settle(m)
    world.sync()
    keeper = world.store._space
    # the writer steps while nothing else waits; a batch (any) gives it one more step
    for _ in range(200):
        if not keeper.pending:
            break
        world.sync()
    assert not keeper.pending and keeper.pages_freed > 1000 and keeper.truncations >= 1
    assert _sizes(world.path) < full // 10
    wal = world.path / (S.DB_NAME + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    world.restart(graceful=False)  # and what is left is a sound store
    assert len(world.vh.queues["q"].ready) == 0


def test_a_queue_that_stays_short_moves_no_pages(world: World) -> None:
    q, _ = world.vh.declare_queue("q", durable=True)
    for _ in range(20):
        for _i in range(20):
            world.publish("q", b"y" * 2000)
        world.sync()
        for m in take_all(world, q):
            q.settle(m)
        world.sync()
    assert world.store._space.steps == 0  # freed pages are reused, not handed back


def test_space_prepare_switches_an_old_file_to_incremental(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (x)")
    db.execute("INSERT INTO t VALUES (zeroblob(100000))")
    assert db.execute("PRAGMA auto_vacuum").fetchone() == (0,)
    assert space.prepare(db, path)
    assert db.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    assert db.execute("SELECT length(x) FROM t").fetchone() == (100000,)
    db.close()

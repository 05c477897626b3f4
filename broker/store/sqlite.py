"""The embedded durable store: SQLite in WAL mode, written by one thread, group-committed.

What goes to disk (docs/durability.md says the same for users): durable exchanges, durable
queues (arguments, subscription type), bindings between durable ends, persistent messages in
durable queues (raw properties, so ``x-death`` history too, body, delivery count, a
"delivered" flag, the wall-clock due time of a nack-backoff hold) and persistent messages held
by a durable ``x-delayed-message`` exchange (with their wall-clock due time).

Threading. The event loop never does I/O here: every call from the domain appends one small
tuple to a list (O(1)). Once per loop turn (``loop.call_soon``) that list is handed to the
writer thread, so the operations of one synchronous piece of domain code (e.g. settle a message
then dead-letter a copy) always land in the same transaction. The writer takes everything
handed over since it last woke, applies it in one transaction (an add and a remove of the same
message inside one batch cancel out without touching the disk), commits, then runs the
``after_durable`` callbacks of that batch on the loop (``call_soon_threadsafe``): that is when
publisher confirms go out.

Paging. Bodies of messages deep in a long ready queue are dropped from memory once on disk;
the writer reads them back in batches ahead of dispatch. The queue keeps its ready messages in a
:class:`PagedReady` (a :class:`plugbroker.domain.ready.ReadyList` this store provides through
:meth:`SQLiteStore.paged_ready`), which reports itself empty to the dispatcher while its head's
body is not in memory, until the read completes: the loop never waits for the disk.

Recovery. The store reads rows into records (:mod:`plugbroker.store.base`); the core rebuilds the
domain from them (:mod:`plugbroker.core.recovery`). A queue's row id stays inside the store: a map from
``(vhost, queue name)`` to it, and one from the live :class:`Queue` object to it for the calls
the domain makes per message.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqp.serialization import dumps as _amqp_dumps
from amqp.serialization import loads as _amqp_loads

from plugbroker.config import ConfigError
from plugbroker.domain.damage import expel_corrupt
from plugbroker.domain.message import Message
from plugbroker.domain.ready import requeue_in_place, with_front_heap
from plugbroker.store import integrity, space
from plugbroker.store.base import (
    BindingRecord,
    DelayedRecord,
    ExchangeRecord,
    MessageRecord,
    QueueRecord,
    StoredTopology,
)
from plugbroker.store.integrity import checksum, intact

if TYPE_CHECKING:
    import asyncio

    from plugbroker.clock import Clock
    from plugbroker.domain.exchange import Exchange
    from plugbroker.domain.queue import Queue

log = logging.getLogger("plugbroker.store")

#: the layout this code writes; older layouts are migrated by MIGRATIONS, newer ones refused
SCHEMA_VERSION = 3
DB_NAME = "plugbroker.db"
LOCK_NAME = "LOCK"
#: beside the database: a store exists here, did the broker stop cleanly, what did it hold
MARKER_NAME = "plugbroker.state"

#: ``synchronous`` pragma: NORMAL survives kill -9 (the WAL is in the OS page cache once
#: committed); FULL also survives power loss (fsync per commit). See docs/durability.md.
DEFAULT_SYNCHRONOUS = "NORMAL"
SYNC_ENV = "PLUGBROKER_STORE_SYNC"

#: paging: bodies of a ready queue beyond this many bytes are dropped from memory once on disk
RESIDENT_BYTES = int(os.environ.get("PLUGBROKER_STORE_RESIDENT_BYTES", 8 * 1024 * 1024))
#: ...but the first this many messages always keep theirs
RESIDENT_MIN = 2048
#: page-in: look this many messages ahead of the head, read up to LOAD_BYTES of bodies
LOAD_WINDOW = 4096
LOAD_BYTES = 4 * 1024 * 1024
#: ...every LOAD_STEP messages taken from the head (and whenever the head has no body)
LOAD_STEP = 1024

# operation codes (first item of each operation tuple)
_ADD, _REMOVE, _UPDATE, _DELIVERED, _HOLD, _DADD, _DREMOVE, _LOAD, _CALLBACK, _SQL, _SYNC = range(
    11
)

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    internal INTEGER NOT NULL, arguments BLOB NOT NULL, PRIMARY KEY (vhost, name));
CREATE TABLE queues (
    qid INTEGER PRIMARY KEY, vhost TEXT NOT NULL, name TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, arguments BLOB NOT NULL, subscription TEXT NOT NULL,
    dead_letter_target INTEGER NOT NULL DEFAULT 0, UNIQUE (vhost, name));
CREATE TABLE bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, dest_kind TEXT NOT NULL, dest TEXT NOT NULL,
    routing_key TEXT NOT NULL, args_key TEXT NOT NULL, arguments BLOB NOT NULL,
    PRIMARY KEY (vhost, source, dest_kind, dest, routing_key, args_key));
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY, qid INTEGER NOT NULL, mid INTEGER NOT NULL,
    exchange TEXT NOT NULL, routing_key TEXT NOT NULL, properties BLOB NOT NULL,
    body BLOB NOT NULL, timestamp REAL NOT NULL, arrival REAL NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0, delivered INTEGER NOT NULL DEFAULT 0,
    due REAL, timeouts INTEGER NOT NULL DEFAULT 0, crc INTEGER);
CREATE UNIQUE INDEX messages_by_queue ON messages (qid, mid);
CREATE TABLE delayed (
    mid INTEGER PRIMARY KEY, vhost TEXT NOT NULL, exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL, properties BLOB NOT NULL, body BLOB NOT NULL,
    timestamp REAL NOT NULL, due REAL NOT NULL);
"""


def _v1_to_v2(db: sqlite3.Connection) -> None:
    """Layout 2: a message's count of timed-out hand-outs, a queue's dead-letter-target mark."""
    db.execute("ALTER TABLE messages ADD COLUMN timeouts INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE queues ADD COLUMN dead_letter_target INTEGER NOT NULL DEFAULT 0")


def _v2_to_v3(db: sqlite3.Connection) -> None:
    """Layout 3: a checksum per message (none for the rows written before), a row count."""
    db.execute("ALTER TABLE messages ADD COLUMN crc INTEGER")
    integrity.set_rows(db, integrity.count_rows(db))


#: ``{from_version: function(connection)}`` upgrading a store one version up
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3}

_TABLES = {"meta", "exchanges", "queues", "bindings", "messages", "delayed"}


class StoreError(ConfigError):
    """The store cannot be used (corrupt, unreadable, newer layout, locked): the broker refuses
    to start rather than start empty. ``str()`` is ``<db file>: <what is wrong>``."""

    def __init__(self, message: str, *, file: str | Path) -> None:
        super().__init__(message, file=str(file))


def _is_io_error(exc: BaseException) -> bool:
    """An error of the disk or the database file (retried, with the store alarm), as opposed
    to one of a record (left out of its batch)."""
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, sqlite3.Error) and not isinstance(
        exc,
        (
            sqlite3.IntegrityError,
            sqlite3.InterfaceError,
            sqlite3.DataError,
            sqlite3.ProgrammingError,
        ),
    )


def _table(args: dict[str, Any]) -> bytes:
    raw: bytes = _amqp_dumps("F", [args or {}])
    return raw


def _untable(raw: bytes) -> dict[str, Any]:
    return _amqp_loads("F", raw, 0)[0][0] if raw else {}


def _args_key(args: dict[str, Any]) -> str:
    # the same canonical form the domain uses to tell bindings apart
    return repr(tuple(sorted((k, repr(v)) for k, v in (args or {}).items())))


# ------------------------------------------------------------------------------------- paging


class PagedReady(deque[Message]):
    """The ready list (:class:`plugbroker.domain.ready.ReadyList`) of a durable queue, whose
    messages deep in the queue may have no body in memory (``msg.body is None``: it is on
    disk).

    ``bool(ready)`` is False while the head has no body: the dispatcher and basic.get see an
    empty queue for the few milliseconds the writer takes to read the next bodies, and the
    loop never waits. ``len(ready)`` stays the true count, so figures are unaffected.
    A deque, like the domain's :class:`plugbroker.domain.ready.FifoReady`: ``len`` and ``append``
    stay in C.
    """

    __slots__ = ("_front", "_since", "loading", "paged", "qid", "queue", "store")

    def __init__(self, store: SQLiteStore, queue: Queue, qid: int) -> None:
        super().__init__()
        self.store = store
        self.queue = queue
        #: the queue's row id in the store
        self.qid = qid
        #: roughly how many messages have no body in memory (a hint for read-ahead)
        self.paged = 0
        self.loading = False
        self._since = 0

    def __bool__(self) -> bool:
        if not len(self):
            return False
        if self[0].body is None:
            if not self.loading:
                self.load_ahead()
            return False
        return True

    def popleft(self) -> Message:
        m = _popleft(self)
        if self.paged > 0:
            self._since += 1
            if self._since >= LOAD_STEP and not self.loading:
                self.load_ahead()
        return m

    def peek(self) -> Message | None:
        return self[0] if len(self) else None

    def requeue(self, msgs: list[Message]) -> None:
        # back to their original positions, as the domain's lists do
        requeue_in_place(self, msgs, _PagedWithRequeued)

    def put_front(self, msgs: list[Message]) -> None:
        self.extendleft(reversed(msgs))

    def drain(self) -> list[Message]:
        self.paged = 0
        out = list(self)
        self.clear()
        return out

    def load_ahead(self) -> None:
        """Ask the writer for the missing bodies among the next messages."""
        self._since = 0
        need: list[Message] = []
        nbytes = 0
        for m in islice(self, LOAD_WINDOW):
            nbytes += m.body_size
            if m.body is None:
                need.append(m)
            if nbytes >= LOAD_BYTES:
                break
        if need:
            self.loading = True
            self.store.load_bodies(self, need)

    def loaded(self, msgs: list[Message], bodies: list[bytes | None], bad: set[int]) -> None:
        """On the loop: the writer read these bodies; those of ``bad`` fail their checksum."""
        self.loading = False
        q = self.queue
        for m, b in zip(msgs, bodies):
            if m.body is not None:
                continue
            if bad and m.id in bad and b is not None:
                if self.paged > 0:
                    self.paged -= 1
                expel_corrupt(q, m, b)
                continue
            if b is None:
                if q.drop_unreadable(m):
                    log.error(
                        "message %d of queue '%s' in vhost '%s' has no body in the store; dropped",
                        m.id,
                        q.name,
                        q.vhost.name,
                    )
                m.body = b""
                continue
            m.body = b
            self.paged -= 1
        q.wake()


_popleft = deque.popleft
_PagedWithRequeued = with_front_heap(PagedReady)


# ------------------------------------------------------------------------------ batch writing
#
# sqlite3's executemany releases and retakes the GIL around every row; with the event loop
# busy, each retake can wait. One statement for many rows keeps SQLite's work for the whole
# chunk outside the GIL (so it overlaps with the loop on another core) and costs one retake.

_CHUNK = 256  # rows per statement: 13 columns x 256 = 3328 parameters (SQLite allows 32766)
_INSERT: dict[int, str] = {}


#: the columns a new message row is written with (``timeouts`` starts at its default)
_MESSAGE_COLUMNS = (
    "seq, qid, mid, exchange, routing_key, properties, body, timestamp, arrival, "
    "delivery_count, delivered, due, crc"
)


def _insert_sql(n: int) -> str:
    sql = _INSERT.get(n)
    if sql is None:
        sql = _INSERT[n] = f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES " + ",".join(
            ["(?,?,?,?,?,?,?,?,?,?,?,?,?)"] * n
        )
    return sql


def _insert_rows(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert in statements of _CHUNK rows, the rest in power-of-two statements (so only a
    handful of distinct statements exist, all in sqlite3's statement cache)."""
    i, n = 0, len(rows)
    while i < n:
        k = _CHUNK
        while k > n - i:
            k //= 2
        db.execute(_insert_sql(k), [v for row in rows[i : i + k] for v in row])
        i += k


def _by_queue(db: sqlite3.Connection, sql: str, keys: Any) -> None:
    """``sql`` (with ``qid = ?`` and ``mid IN ({})``) once per queue and chunk of ids."""
    groups: dict[int, list[int]] = {}
    for qid, mid in keys:
        g = groups.get(qid)
        if g is None:
            groups[qid] = [mid]
        else:
            g.append(mid)
    for qid, mids in groups.items():
        i, n = 0, len(mids)
        while i < n:
            k = _CHUNK * 4
            while k > n - i:
                k //= 2
            db.execute(sql.format(",".join("?" * k)), (qid, *mids[i : i + k]))
            i += k


# -------------------------------------------------------------------------------------- store


class SQLiteStore:
    """The :class:`plugbroker.store.Store` kept in ``<dir>/plugbroker.db``."""

    durable = True

    def __init__(
        self, path: str | Path, *, synchronous: str | None = None, accept_loss: bool = False
    ) -> None:
        self.dir = Path(path)
        self.file = self.dir / DB_NAME
        self.marker = self.dir / MARKER_NAME
        #: start even if the integrity checks find data lost (logging what was lost)
        self.accept_loss = accept_loss
        self._reader: sqlite3.Connection | None = None
        #: what the integrity checks found lost, when started with ``accept_loss``
        self.lost: list[str] = []
        self.synchronous = (synchronous or os.environ.get(SYNC_ENV) or DEFAULT_SYNCHRONOUS).upper()
        if self.synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"unknown synchronous mode {self.synchronous!r}", file=self.file)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store directory: {exc}", file=self.dir) from None
        self._lock_fd = self._lock()
        try:
            marker = self._read_marker()
            self._check_files(marker)
            try:
                self._db = self._open(expect_data=marker is not None)
            except StoreError:
                if not self.lost:
                    raise
                # the loss is accepted and what is left does not open: keep it aside, start empty
                self._move_aside()
                self._db = self._open()
            try:
                self._check_contents(marker)
                self._load_ids()
                self._write_marker("running")
            except BaseException:
                self._db.close()
                raise
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Clock | None = None
        self._on_alarm: Callable[[str | None], None] | None = None
        #: the live queue object of each saved queue -> its row id (the per-message lookup)
        self._qid_of: dict[Queue, int] = {}
        #: (vhost, name) -> the live queue object saved under it
        self._live: dict[tuple[str, str], Queue] = {}
        #: operations of the current loop turn, not yet handed to the writer
        self._pending: list[tuple[Any, ...]] = []
        #: operation lists handed to the writer (deque: append/popleft are thread-safe)
        self._handed: deque[list[tuple[Any, ...]]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._recovering = False
        self._failed: str | None = None
        #: id(msg) -> msg: added deep in a queue, body to drop once committed (if still ready)
        self._pageout: dict[int, Message] = {}
        self._offset: float | None = None  # wall - monotonic, computed once per turn
        #: counters (read by tests and the benchmark)
        self.batches = 0
        self.ops_written = 0
        self.rows_inserted = 0
        self.rows_deleted = 0
        #: operations left out of a batch because their record could not be written
        self.records_failed = 0
        self.t_apply = 0.0  # seconds in the writer building and executing batches
        self.t_commit = 0.0  # ...and committing them
        #: hands the space of consumed messages back to the filesystem (writer thread)
        self._space = space.SpaceKeeper(self._db, self.file)
        self._thread = threading.Thread(target=self._writer, name="store-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ opening

    def _lock(self) -> int:
        lock = self.dir / LOCK_NAME
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file: {exc}", file=lock) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(
                "the store is in use by another broker process (locked)", file=self.file
            ) from None
        return fd

    # ------------------------------------------------------------------ integrity at start
    #
    # A marker file beside the database (MARKER_NAME) says that a store exists here, whether
    # the broker using it stopped cleanly, and what it held then. SQLite alone cannot tell a
    # database that lost its data (a 0-byte or truncated file, a write-ahead log deleted after a
    # crash) from a new one; the marker can, so such a store is refused instead of silently
    # starting with less. ``accept_loss`` starts anyway and logs what was lost.

    def _read_marker(self) -> dict[str, Any] | None:
        try:
            text = self.marker.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the store marker: {exc}", file=self.marker) from None
        try:
            marker = json.loads(text)
            if not isinstance(marker, dict) or marker.get("state") not in ("running", "stopped"):
                raise ValueError("no state")
        except ValueError:
            self._loss(
                f"the store marker {self.marker.name} is damaged ({text[:60]!r}), so whether "
                "data was lost cannot be told",
                None,
            )
            return None
        return marker

    def _write_marker(self, state: str) -> None:
        """Write the marker atomically (temporary file, fsync, rename, fsync the directory)."""
        counts = self._counts()
        marker = {
            "state": state,
            "since": time.time(),
            "pid": os.getpid(),
            "queues": counts[0],
            "messages": counts[1],
            "db_bytes": self.file.stat().st_size,
        }
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(marker, f)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.marker)
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"cannot write the store marker: {exc}", file=self.marker) from None

    def _counts(self) -> tuple[int, int]:
        db = self._db
        queues = db.execute("SELECT count(*) FROM queues").fetchone()[0]
        messages = db.execute("SELECT count(*) FROM messages").fetchone()[0]
        return int(queues), int(messages)

    def _loss(self, problem: str, marker: dict[str, Any] | None) -> None:
        """Refuse to start over ``problem``, or with ``accept_loss`` log it and carry on."""
        held = ""
        if marker is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(marker.get("since", 0)))
            how = "stopped cleanly" if marker["state"] == "stopped" else "started"
            held = (
                f" (when the broker last {how}, at {when}, it held {marker.get('queues', '?')} "
                f"durable queues and {marker.get('messages', '?')} persistent messages)"
            )
        if not self.accept_loss:
            raise StoreError(
                f"{problem}{held}; refusing to start. To start anyway with what is left, "
                'accepting the loss, set <store acceptLoss="true"> for one start (or run with '
                "--accept-store-loss)",
                file=self.file,
            )
        log.warning("%s: %s%s; starting anyway (acceptLoss)", self.file, problem, held)
        self.lost.append(problem)

    def _move_aside(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            f = self.file.with_name(DB_NAME + suffix)
            if f.exists():
                dest = f.with_name(f"{DB_NAME}.damaged-{stamp}{suffix}")
                f.rename(dest)
                log.warning("%s: does not open; moved aside to %s (acceptLoss)", f, dest.name)
        self.lost.append("the damaged database was moved aside; the store starts empty")

    def _check_files(self, marker: dict[str, Any] | None) -> None:
        """Before SQLite opens (and would create) the file: missing, empty, truncated, a lost
        write-ahead log, a read-only file."""
        if self.file.exists() and not self.file.stat().st_mode & 0o222:
            raise StoreError(
                "the store file is read-only; a broker could not write a persistent message "
                "to it — make it writable (chmod u+w) or point <store path> elsewhere",
                file=self.file,
            )
        size = self.file.stat().st_size if self.file.exists() else -1
        wal = self.file.with_name(DB_NAME + "-wal")
        if size > 0 and not (wal.exists() and wal.stat().st_size):
            # with no write-ahead log to complete it, the file is as long as its header says
            whole = integrity.header_bytes(self.file)
            if whole is not None and size < whole:
                self._loss(f"{DB_NAME} is truncated: {size} bytes, its header says {whole}", marker)
        if marker is None:
            return
        if size < 0:
            self._loss(f"{DB_NAME} is missing though its marker says a store was here", marker)
        elif size == 0:
            self._loss(f"{DB_NAME} is empty (0 bytes) though its marker says it held data", marker)
        wal = self.file.with_name(DB_NAME + "-wal")
        if size > 0 and marker["state"] == "running" and not wal.exists():
            self._loss(
                f"the broker did not stop cleanly and the write-ahead log {wal.name} is "
                "missing: what was committed since the last checkpoint is lost",
                marker,
            )

    def _check_contents(self, marker: dict[str, Any] | None) -> None:
        """After opening: writable (a read-only mount), no fewer rows than at the last clean
        stop, no fewer message rows than the store's own count."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('opened', ?)", (repr(time.time()),)
            )
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise StoreError(
                f"the store cannot be written ({exc}); refusing to start — make it writable "
                "or point <store path> elsewhere",
                file=self.file,
            ) from None
        if marker is not None and marker["state"] == "stopped":
            queues, messages = self._counts()
            if queues < int(marker.get("queues", 0)) or messages < int(marker.get("messages", 0)):
                self._loss(
                    f"the store holds {queues} durable queues and {messages} persistent "
                    "messages, fewer than at its last clean stop",
                    marker,
                )
        self._rows = integrity.check_rows(self._db, lambda problem: self._loss(problem, marker))

    def _open(self, *, expect_data: bool = False) -> sqlite3.Connection:
        existed = self.file.exists() and self.file.stat().st_size > 0
        try:
            db = sqlite3.connect(str(self.file), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store: {exc}", file=self.file) from None
        try:
            space.set_mode(db)  # before WAL mode: a new file is created in it
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(
                    f"cannot switch the store to WAL mode (got {mode})", file=self.file
                )
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            db.execute("PRAGMA cache_size=-65536")
            db.execute("PRAGMA temp_store=MEMORY")
            db.execute("PRAGMA wal_autocheckpoint=4096")
            db.execute("PRAGMA journal_size_limit=67108864")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if version == 0 and not tables:
                if expect_data and not self.lost:
                    self._loss(f"{DB_NAME} has no tables though its marker says it held data", None)
                if existed:
                    log.info("store %s is empty; creating the layout", self.file)
                self._create(db)
            else:
                if version == 0:
                    raise StoreError(
                        "not a plugbroker store (tables without a schema version); refusing "
                        "to use it — move it aside",
                        file=self.file,
                    )
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"the store has layout version {version}, newer than this broker's "
                        f"{SCHEMA_VERSION}; refusing to start (use a newer plugbroker)",
                        file=self.file,
                    )
                while version < SCHEMA_VERSION:
                    migrate = MIGRATIONS.get(version)
                    if migrate is None:
                        raise StoreError(
                            f"the store has layout version {version}, which this broker "
                            f"(version {SCHEMA_VERSION}) cannot migrate; refusing to start",
                            file=self.file,
                        )
                    log.warning(
                        "migrating store %s from layout %d to %d", self.file, version, version + 1
                    )
                    db.execute("BEGIN IMMEDIATE")
                    migrate(db)
                    version += 1
                    db.execute(f"PRAGMA user_version={version}")
                    db.execute(
                        "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),)
                    )
                    db.execute("COMMIT")
                missing = _TABLES - {
                    r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                }
                if missing:
                    raise StoreError(
                        f"the store lacks table(s) {', '.join(sorted(missing))}; refusing to start",
                        file=self.file,
                    )
                check = db.execute("PRAGMA quick_check").fetchall()
                if check != [("ok",)]:
                    detail = "; ".join(str(r[0]) for r in check[:3])
                    raise StoreError(
                        f"the store is corrupt ({detail}); refusing to start — "
                        "restore a backup or move it aside",
                        file=self.file,
                    )
                space.prepare(db, self.file)
        except StoreError:
            db.close()
            raise
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(
                f"the store is corrupt or unreadable ({exc}); refusing to start — "
                "restore a backup or move it aside",
                file=self.file,
            ) from None
        return db

    @staticmethod
    def _create(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                db.execute(stmt)
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        db.execute("INSERT INTO meta VALUES ('created', ?)", (repr(time.time()),))
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("COMMIT")

    def _load_ids(self) -> None:
        db = self._db
        try:
            #: (vhost, queue name) -> the queue's row id, for every queue row on disk
            self._queues: dict[tuple[str, str], int] = {
                (v, n): qid for qid, v, n in db.execute("SELECT qid, vhost, name FROM queues")
            }
            self._next_qid = (db.execute("SELECT max(qid) FROM queues").fetchone()[0] or 0) + 1
            self._seq = (db.execute("SELECT max(seq) FROM messages").fetchone()[0] or 0) + 1
        except sqlite3.Error as exc:
            raise StoreError(
                f"the store is corrupt or unreadable ({exc}); refusing to start", file=self.file
            ) from None

    def __str__(self) -> str:
        return str(self.file)

    def attach(self, clock: Clock, on_alarm: Callable[[str | None], None]) -> None:
        """Wall-clock times come from ``clock``; write failures raise an alarm there."""
        self._clock = clock
        self._on_alarm = on_alarm

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The broker's loop is known: callbacks run there from now on."""
        self._loop = loop
        if self._pending:
            self._handoff()

    # ------------------------------------------------------------------ loop side: O(1) each

    def _op(self, op: tuple[Any, ...]) -> None:
        p = self._pending
        p.append(op)
        if len(p) == 1:
            loop = self._loop
            if loop is not None:
                loop.call_soon(self._handoff)

    def _handoff(self) -> None:
        ops = self._pending
        if not ops:
            return
        self._pending = []
        self._offset = None
        self._handed.append(ops)
        self._wake.set()

    def _wall(self, mono: float) -> float:
        off = self._offset
        if off is None:
            c = self._clock
            off = self._offset = (
                (c.time() - c.monotonic()) if c is not None else (time.time() - time.monotonic())
            )
        return mono + off

    def _now_wall(self) -> float:
        c = self._clock
        return c.time() if c is not None else time.time()

    def add_message(self, queue: Queue, msg: Message) -> None:
        qid = self._qid_of.get(queue, 0)
        if not qid or msg.body is None:
            if msg.body is None:  # a copy of a paged message: must not happen (Queue.pageable)
                log.error(
                    "message %d for queue '%s' has no body in memory; not stored",
                    msg.id,
                    queue.name,
                )
            msg.stored = False
            return
        seq = self._seq
        self._seq = seq + 1
        page = None
        r = queue.ready
        if (
            isinstance(r, PagedReady)
            and len(r) > RESIDENT_MIN
            and queue.ready_bytes > RESIDENT_BYTES
            and msg.expires_at is None
        ):
            page = r
            self._pageout[id(msg)] = msg
        p = self._pending
        p.append(
            (
                _ADD,
                qid,
                msg.id,
                seq,
                msg.exchange,
                msg.routing_key,
                msg.properties,
                msg.body,
                msg.timestamp,
                self._wall(msg.arrival),
                msg.delivery_count,
                page,
                msg,
            )
        )
        if len(p) == 1 and self._loop is not None:
            self._loop.call_soon(self._handoff)

    def remove_message(self, queue: Queue, msg: Message) -> None:
        qid = self._qid_of.get(queue, 0)
        if qid:
            if self._pageout:
                self._pageout.pop(id(msg), None)
            p = self._pending
            p.append((_REMOVE, qid, msg.id))
            if len(p) == 1 and self._loop is not None:
                self._loop.call_soon(self._handoff)

    def update_message(self, queue: Queue, msg: Message) -> None:
        qid = self._qid_of.get(queue, 0)
        if qid:
            self._op((_UPDATE, qid, msg.id, (msg.delivery_count, msg.timeouts)))

    def delivered(self, queue: Queue, msg: Message) -> None:
        """A stored message went to a consumer for the first time (redelivered after a
        restart if it is still there)."""
        qid = self._qid_of.get(queue, 0)
        if qid:
            if self._pageout:
                self._pageout.pop(id(msg), None)
            p = self._pending
            p.append((_DELIVERED, qid, msg.id))
            if len(p) == 1 and self._loop is not None:
                self._loop.call_soon(self._handoff)

    def hold_message(self, queue: Queue, msg: Message, delay: float) -> None:
        """A stored message is held back (nack backoff) for ``delay`` seconds."""
        if self._recovering:
            return
        qid = self._qid_of.get(queue, 0)
        if qid:
            self._op((_HOLD, qid, msg.id, self._now_wall() + delay))

    def add_delayed(self, vhost: str, exchange: Exchange, msg: Message, delay: float) -> None:
        """A persistent message is held by a durable x-delayed-message exchange."""
        if self._recovering:
            return
        self._op(
            (
                _DADD,
                msg.id,
                vhost,
                exchange.name,
                msg.routing_key,
                msg.properties,
                msg.body,
                msg.timestamp,
                self._now_wall() + delay,
            )
        )

    def remove_delayed(self, vhost: str, msg: Message) -> None:
        self._op((_DREMOVE, msg.id))

    def read_body(self, queue: Queue, msg: Message) -> bytes | None:
        """Read one paged-out body now, on the calling (loop) thread.

        For the rare paths that copy a message off a ready list before dispatch would have
        loaded it (dead-lettering on expiry or overflow, an admin redrive). It uses a connection
        of its own: a WAL reader neither waits for nor blocks the writer, and a paged body has
        been committed before it was dropped from memory. Pending writes are handed off first.
        """
        qid = self._qid_of.get(queue, 0)
        if not qid or self._closed:
            return None
        reader = self._reader
        if reader is None:
            reader = self._reader = sqlite3.connect(
                str(self.file), isolation_level=None, check_same_thread=False
            )
        row = reader.execute(
            "SELECT body, properties, crc FROM messages WHERE qid = ? AND mid = ?", (qid, msg.id)
        ).fetchone()
        if row is None:
            return None
        if not intact(row[2], row[1], row[0]):
            log.error(
                "message %d of queue '%s' in vhost '%s': its stored body (%d bytes) fails its "
                "checksum; not used",
                msg.id,
                queue.name,
                queue.vhost.name,
                len(row[0]),
            )
            return None
        body: bytes = row[0]
        return body

    def load_bodies(self, ready: PagedReady, msgs: list[Message]) -> None:
        self._op((_LOAD, ready.qid, [m.id for m in msgs], ready, msgs))

    def after_durable(
        self, callback: Callable[[], None], on_failure: Callable[[], None] | None = None
    ) -> None:
        p = self._pending
        p.append((_CALLBACK, callback, on_failure))
        if len(p) == 1 and self._loop is not None:
            self._loop.call_soon(self._handoff)

    # topology: rare, written as SQL statements in order with the message operations

    def _sql(self, *stmts: tuple[str, tuple[Any, ...]]) -> None:
        self._op((_SQL, stmts))

    def paged_ready(self, queue: Queue) -> PagedReady | None:
        """A paging ready list for a saved queue (the domain asks only for pageable ones)."""
        qid = self._qid_of.get(queue)
        return PagedReady(self, queue, qid) if qid is not None else None

    def save_queue(self, queue: Queue) -> None:
        if queue.exclusive_owner is not None:
            return  # exclusive queues end with their connection: never kept across restarts
        key = (queue.vhost.name, queue.name)
        qid = self._queues.get(key)
        if qid is None:
            qid = self._queues[key] = self._next_qid
            self._next_qid += 1
        old = self._live.get(key)
        if old is not None and old is not queue:
            self._qid_of.pop(old, None)
        self._live[key] = queue
        self._qid_of[queue] = qid
        if self._recovering:
            return
        self._sql(
            (
                "INSERT OR REPLACE INTO queues VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    qid,
                    key[0],
                    key[1],
                    int(queue.auto_delete),
                    _table(queue.arguments),
                    queue.subscription_type,
                    int(queue.dead_letter_target),
                ),
            )
        )

    def delete_queue(self, vhost: str, name: str) -> None:
        qid = self._queues.pop((vhost, name), None)
        q = self._live.pop((vhost, name), None)
        if q is not None:
            self._qid_of.pop(q, None)
        if qid is None:
            return
        self._sql(
            ("DELETE FROM messages WHERE qid = ?", (qid,)),
            ("DELETE FROM queues WHERE qid = ?", (qid,)),
            (
                "DELETE FROM bindings WHERE vhost = ? AND dest_kind = 'queue' AND dest = ?",
                (vhost, name),
            ),
        )

    def save_exchange(self, vhost: str, exchange: Exchange) -> None:
        if self._recovering:
            return
        self._sql(
            (
                "INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?, ?, ?)",
                (
                    vhost,
                    exchange.name,
                    exchange.type,
                    int(exchange.auto_delete),
                    int(exchange.internal),
                    _table(exchange.arguments),
                ),
            )
        )

    def delete_exchange(self, vhost: str, name: str) -> None:
        self._sql(
            ("DELETE FROM exchanges WHERE vhost = ? AND name = ?", (vhost, name)),
            (
                "DELETE FROM bindings WHERE vhost = ? AND (source = ? OR "
                "(dest_kind = 'exchange' AND dest = ?))",
                (vhost, name, name),
            ),
            ("DELETE FROM delayed WHERE vhost = ? AND exchange = ?", (vhost, name)),
        )

    def save_binding(
        self,
        vhost: str,
        source: str,
        dest_kind: str,
        dest: str,
        key: str,
        arguments: dict[str, Any],
    ) -> None:
        if self._recovering:
            return
        self._sql(
            (
                "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?, ?, ?, ?)",
                (vhost, source, dest_kind, dest, key, _args_key(arguments), _table(arguments)),
            )
        )

    def delete_binding(
        self,
        vhost: str,
        source: str,
        dest_kind: str,
        dest: str,
        key: str,
        arguments: dict[str, Any],
    ) -> None:
        self._sql(
            (
                "DELETE FROM bindings WHERE vhost = ? AND source = ? AND dest_kind = ? AND "
                "dest = ? AND routing_key = ? AND args_key = ?",
                (vhost, source, dest_kind, dest, key, _args_key(arguments)),
            )
        )

    # ------------------------------------------------------------------ writer thread

    def _writer(self) -> None:
        handed = self._handed
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            ops: list[tuple[Any, ...]] = []
            while handed:
                ops.extend(handed.popleft())
            if ops:
                self._write(ops)
            del ops  # not held while waiting: its callbacks hold publishers' connections
            if self._stopping and not handed:
                return
            # give disk space back: one bounded step after a batch, more while nothing waits
            keeper = self._space
            while keeper.pending and not self._stopping and self._failed is None:
                if not keeper.step() or handed:
                    break

    def _write(self, ops: list[tuple[Any, ...]]) -> None:
        """Write one batch. An I/O error (disk full, read-only, I/O) keeps the batch and retries
        it with a growing pause, the store alarm raised meanwhile and cleared once a write
        succeeds. A record that cannot be written (text SQLite cannot encode, a value out of
        range, a bug) is not retried: the batch is written again one operation at a time, the
        failing operations are left out and the confirms waiting on them become nacks."""
        delay = 0.05
        while True:
            try:
                try:
                    result = self._apply(ops)
                except Exception as exc:
                    self._rollback()
                    if _is_io_error(exc):
                        raise
                    result = self._apply_each(ops, exc)
                break
            except Exception as exc:  # an I/O error: never confirm, retry
                self._rollback()
                if not _is_io_error(exc):  # a bug outside any one record
                    log.exception("%s: store write failed", self.file)
                reason = f"store write failed ({exc}); confirms are held until it succeeds"
                if self._failed is None:
                    log.error("%s: %s", self.file, reason)
                    self._failed = reason
                    self._call_loop(self._alarm, "store: " + reason)
                if self._stopping and delay > 1.0:
                    log.error("%s: giving up on %d operations at shutdown", self.file, len(ops))
                    return
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        if self._failed is not None:
            log.warning("%s: store writes succeed again", self.file)
            self._failed = None
            self._call_loop(self._alarm, None)
        self.batches += 1
        self.ops_written += len(ops)
        callbacks, pageouts, loads, syncs, written = result
        self.rows_inserted += written[0]
        self.rows_deleted += written[1]
        self._rows += written[2]
        if written[1] or written[2] < 0:
            self._space.deleted()
        for ev in syncs:
            ev.set()
        if callbacks or pageouts or loads:
            self._call_loop(self._committed, callbacks, pageouts, loads)

    def _rollback(self) -> None:
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def _apply_each(
        self, ops: list[tuple[Any, ...]], first: BaseException
    ) -> tuple[list[Any], list[Any], list[Any], list[threading.Event], list[int]]:
        """The batch again, each operation in its own savepoint: one that raises (other than
        an I/O error, which propagates) is left out, and the ``after_durable`` callback that
        follows it runs its ``on_failure`` instead (the publisher's nack)."""
        db = self._db
        callbacks: list[Callable[[], None]] = []
        pageouts: list[Any] = []
        loads: list[tuple[Any, ...]] = []
        syncs: list[threading.Event] = []
        written = [0, 0, 0]
        failed = 0
        broken = False  # an operation since the last callback was left out
        t_start = time.perf_counter()
        db.execute("BEGIN")
        for op in ops:
            if op[0] == _CALLBACK:
                cb = op[2] if broken and op[2] is not None else op[1]
                callbacks.append(cb)
                broken = False
                continue
            db.execute("SAVEPOINT one")
            try:
                one = self._apply_ops([op])
            except Exception as exc:
                if _is_io_error(exc):
                    raise
                db.execute("ROLLBACK TO one")
                db.execute("RELEASE one")
                failed += 1
                broken = True
                if failed == 1:
                    log.error(
                        "%s: a record cannot be written (%s: %s); left out of the batch, its "
                        "publisher is nacked",
                        self.file,
                        type(exc).__name__,
                        exc,
                    )
                continue
            db.execute("RELEASE one")
            _, p, lo, sy, w = one
            pageouts.extend(p)
            loads.extend(lo)
            syncs.extend(sy)
            written[0] += w[0]
            written[1] += w[1]
            written[2] += w[2]
        self._count_rows(written[2])
        t_commit = time.perf_counter()
        db.execute("COMMIT")
        self.t_apply += t_commit - t_start
        self.t_commit += time.perf_counter() - t_commit
        self.records_failed += failed
        if failed:
            log.warning(
                "%s: %d of %d operations could not be written and were left out (first: %s: %s)",
                self.file,
                failed,
                len(ops),
                type(first).__name__,
                first,
            )
        return callbacks, pageouts, self._read_loads(loads), syncs, written

    def _count_rows(self, change: int) -> None:
        """Inside the batch's transaction: the message row count it leaves."""
        if change:
            integrity.set_rows(self._db, self._rows + change)

    def _call_loop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed (shutdown)
            pass

    def _apply(
        self, ops: list[tuple[Any, ...]]
    ) -> tuple[list[Any], list[Any], list[Any], list[threading.Event], list[int]]:
        """One transaction for a batch; returns what the loop must hear about afterwards."""
        db = self._db
        t_start = time.perf_counter()
        db.execute("BEGIN")
        callbacks, pageouts, loads, syncs, written = self._apply_ops(ops)
        self._count_rows(written[2])
        t_commit = time.perf_counter()
        db.execute("COMMIT")
        self.t_apply += t_commit - t_start
        self.t_commit += time.perf_counter() - t_commit
        return callbacks, pageouts, self._read_loads(loads), syncs, written

    def _apply_ops(
        self, ops: list[tuple[Any, ...]]
    ) -> tuple[list[Any], list[Any], list[Any], list[threading.Event], list[int]]:
        """The statements of ``ops`` inside the caller's transaction (adds and removes of one
        message cancel out); nothing it returns has happened unless it returns."""
        db = self._db
        adds: dict[tuple[int, int], tuple[Any, ...]] = {}
        dels: dict[tuple[int, int], None] = {}
        counts: dict[tuple[int, int], tuple[int, int]] = {}  # (delivery count, timeouts)
        delivered: dict[tuple[int, int], None] = {}
        holds: dict[tuple[int, int], float] = {}
        dadds: dict[int, tuple[Any, ...]] = {}
        ddels: dict[int, None] = {}
        callbacks: list[Callable[[], None]] = []
        syncs: list[threading.Event] = []
        pageouts: list[tuple[PagedReady, Message]] = []
        loads: list[tuple[Any, ...]] = []
        written = [0, 0, 0]  # rows inserted, rows deleted, change in the row count

        def flush() -> None:
            if adds:
                rows = []
                for key, op in adds.items():
                    c = counts.pop(key, None)
                    cnt = op[10] if c is None else c[0]
                    if c is not None and c[1]:
                        counts[key] = c  # its timeouts go in with the update below
                    dl = 1 if delivered.pop(key, 0) is None else 0
                    rows.append(
                        (
                            op[3],
                            op[1],
                            op[2],
                            op[4],
                            op[5],
                            op[6],
                            op[7],
                            op[8],
                            op[9],
                            cnt,
                            dl,
                            holds.pop(key, None),
                            checksum(op[6], op[7]),
                        )
                    )
                    if op[11] is not None:
                        pageouts.append((op[11], op[12]))
                _insert_rows(db, rows)
                written[0] += len(rows)
                written[2] += len(rows)
                adds.clear()
            if counts:
                db.executemany(
                    "UPDATE messages SET delivery_count = ?, timeouts = ? WHERE qid = ? AND mid = ?",
                    [(c[0], c[1], k[0], k[1]) for k, c in counts.items()],
                )
                counts.clear()
            if delivered:
                _by_queue(
                    db, "UPDATE messages SET delivered = 1 WHERE qid = ? AND mid IN ({})", delivered
                )
                delivered.clear()
            if holds:
                db.executemany(
                    "UPDATE messages SET due = ? WHERE qid = ? AND mid = ?",
                    [(d, k[0], k[1]) for k, d in holds.items()],
                )
                holds.clear()
            if dels:
                before = db.total_changes
                _by_queue(db, "DELETE FROM messages WHERE qid = ? AND mid IN ({})", dels)
                written[1] += len(dels)
                written[2] -= db.total_changes - before
                dels.clear()
            if dadds:
                db.executemany(
                    "INSERT OR REPLACE INTO delayed VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [op[1:] for op in dadds.values()],
                )
                dadds.clear()
            if ddels:
                db.executemany("DELETE FROM delayed WHERE mid = ?", [(m,) for m in ddels])
                ddels.clear()

        for op in ops:
            kind = op[0]
            if kind == _ADD:
                key = (op[1], op[2])
                adds[key] = op
                dels.pop(key, None)
            elif kind == _CALLBACK:
                callbacks.append(op[1])
            elif kind == _REMOVE:
                key = (op[1], op[2])
                counts.pop(key, None)
                delivered.pop(key, None)
                holds.pop(key, None)
                if adds.pop(key, None) is None:
                    dels[key] = None
            elif kind == _DELIVERED:
                delivered[(op[1], op[2])] = None
            elif kind == _UPDATE:
                counts[(op[1], op[2])] = op[3]
            elif kind == _HOLD:
                holds[(op[1], op[2])] = op[3]
            elif kind == _DADD:
                dadds[op[1]] = op
                ddels.pop(op[1], None)
            elif kind == _DREMOVE:
                if dadds.pop(op[1], None) is None:
                    ddels[op[1]] = None
            elif kind == _LOAD:
                loads.append(op)
            elif kind == _SYNC:
                syncs.append(op[1])
            elif kind == _SQL:
                flush()
                for sql, params in op[1]:
                    before = db.total_changes
                    db.execute(sql, params)
                    if sql.startswith("DELETE FROM messages"):
                        written[2] -= db.total_changes - before
        flush()
        return callbacks, pageouts, loads, syncs, written

    def _read_loads(self, loads: list[tuple[Any, ...]]) -> list[Any]:
        """Bodies asked for by page-in operations, read after the commit and checked against
        their checksums: ``(ready, msgs, bodies, ids of the messages whose body fails)``."""
        db = self._db
        results = []
        for _, qid, mids, ready, msgs in loads:
            found: dict[int, bytes] = {}
            bad: set[int] = set()
            for lo in range(0, len(mids), _CHUNK):
                part = mids[lo : lo + _CHUNK]
                for mid, body, props, crc in db.execute(
                    "SELECT mid, body, properties, crc FROM messages WHERE qid = ? AND mid IN "
                    f"({','.join('?' * len(part))})",
                    (qid, *part),
                ):
                    found[mid] = body
                    if not intact(crc, props, body):
                        bad.add(mid)
            results.append((ready, msgs, [found.get(mid) for mid in mids], bad))
        return results

    def _committed(
        self,
        callbacks: list[Callable[[], None]],
        pageouts: list[tuple[PagedReady, Message]],
        loads: list[tuple[PagedReady, list[Message], list[bytes | None], set[int]]],
    ) -> None:
        """On the loop, after a commit: drop paged-out bodies, deliver reads, run callbacks."""
        if pageouts:
            pending = self._pageout
            for ready, m in pageouts:
                if pending.pop(id(m), None) is not None and m.body is not None:
                    m.body = None  # on disk; see PagedReady
                    ready.paged += 1
        for ready, msgs, bodies, bad in loads:
            ready.loaded(msgs, bodies, bad)
        for cb in callbacks:
            try:
                cb()
            except Exception:
                log.exception("after-durable callback failed")

    def _alarm(self, reason: str | None) -> None:
        on_alarm = self._on_alarm
        if on_alarm is not None:
            on_alarm(reason)

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is committed (tests, tools). Not for the
        loop's hot path: it waits for the disk."""
        done = threading.Event()
        self._pending.append((_SYNC, done))
        self._handoff()
        return done.wait(timeout)

    def close(self) -> None:
        """Write out everything pending, stop the writer, checkpoint, release the lock."""
        if self._closed:
            return
        self._closed = True
        self._handoff()
        self._stopping = True
        self._wake.set()
        self._thread.join(60)
        if self._thread.is_alive():
            log.error("%s: the store writer did not finish within 60 s", self.file)
            return
        try:
            if self._reader is not None:
                self._reader.close()
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            stopped = self._failed is None
            if stopped:
                self._write_marker("stopped")
            self._db.close()
        except (sqlite3.Error, StoreError) as exc:
            log.warning("%s: closing the store: %s", self.file, exc)
        os.close(self._lock_fd)
        log.info(
            "store %s closed (%d batches, %d operations written; %d message rows "
            "inserted, %d deleted; writer busy %.2f s, of which commits %.2f s)",
            self.file,
            self.batches,
            self.ops_written,
            self.rows_inserted,
            self.rows_deleted,
            self.t_apply + self.t_commit,
            self.t_commit,
        )

    # ------------------------------------------------------------------ recovery
    #
    # Rows become records (plugbroker.store.base); the core rebuilds the domain from them. While
    # it does, what it declares is on disk already: save_* and holds are not written back.

    @contextmanager
    def recovering(self) -> Iterator[None]:
        """Around the core's rebuild; at the end, the heads of paged queues are read into
        memory (before the broker listens). A database error is a :class:`StoreError`."""
        self._recovering = True
        try:
            yield
            for q, qid in self._qid_of.items():
                r = q.ready
                if isinstance(r, PagedReady):
                    self._load_resident(r, qid)
        except sqlite3.Error as exc:
            raise StoreError(
                f"the store is corrupt or unreadable ({exc}); refusing to start — "
                "restore a backup or move it aside",
                file=self.file,
            ) from None
        finally:
            self._recovering = False

    def read_topology(self) -> StoredTopology:
        db = self._db
        return StoredTopology(
            exchanges=tuple(
                ExchangeRecord(vh, name, type_, bool(auto_delete), bool(internal), _untable(args))
                for vh, name, type_, auto_delete, internal, args in db.execute(
                    "SELECT vhost, name, type, auto_delete, internal, arguments FROM exchanges"
                )
            ),
            queues=tuple(
                QueueRecord(vh, name, bool(auto_delete), _untable(args), stype or None, bool(dlt))
                for vh, name, auto_delete, args, stype, dlt in db.execute(
                    "SELECT vhost, name, auto_delete, arguments, subscription, dead_letter_target "
                    "FROM queues"
                )
            ),
            bindings=tuple(
                BindingRecord(vh, source, kind, dest, key, _untable(args))
                for vh, source, kind, dest, key, args in db.execute(
                    "SELECT vhost, source, dest_kind, dest, routing_key, arguments FROM bindings"
                )
            ),
        )

    def read_messages(self) -> Iterator[MessageRecord]:
        """Every message row of a queue row, in insertion order. The body of a message in a
        queue with a paging list is not read (None): the queue's head is read at the end of
        recovery, the rest as dispatch gets near. Rows of no queue row are deleted."""
        names = {qid: key for key, qid in self._queues.items()}
        paged = ",".join(
            str(qid) for q, qid in self._qid_of.items() if isinstance(q.ready, PagedReady)
        )
        orphans: set[int] = set()
        cur = self._db.execute(
            "SELECT qid, mid, exchange, routing_key, properties, "
            f"CASE WHEN qid IN ({paged or '0'}) THEN NULL ELSE body END, length(body), "
            "timestamp, arrival, delivery_count, delivered, due, timeouts, crc FROM messages "
            "ORDER BY seq"
        )
        # one record per row: built with tuple.__new__ (a named tuple's own __new__ is a
        # Python function), the queue's key object shared by its records
        new = tuple.__new__
        record = MessageRecord
        for qid, mid, ex, rk, props, body, size, ts, arrival, count, dlv, due, tmo, crc in cur:
            key = names.get(qid)
            if key is None:
                orphans.add(qid)
                continue
            # a paged body (None) is checked when it is read back
            bad = body is not None and not intact(crc, props, body)
            yield new(
                record,
                (key, mid, ex, rk, props, body, size, ts, arrival, count, dlv != 0, due, tmo, bad),
            )
        for qid in sorted(orphans):
            log.warning("store: messages of a queue with no record (id %d) dropped", qid)
            self._sql(("DELETE FROM messages WHERE qid = ?", (qid,)))

    def read_delayed(self) -> Iterator[DelayedRecord]:
        for mid, vh, ex, rk, props, body, ts, due in self._db.execute(
            "SELECT mid, vhost, exchange, routing_key, properties, body, timestamp, due "
            "FROM delayed ORDER BY due"
        ):
            yield DelayedRecord(vh, ex, mid, rk, props, body, ts, due)

    def discard(self, record: BindingRecord | MessageRecord | DelayedRecord) -> None:
        if isinstance(record, MessageRecord):
            qid = self._queues.get(record.queue)
            if qid is not None:
                self._op((_REMOVE, qid, record.id))
        elif isinstance(record, DelayedRecord):
            self._op((_DREMOVE, record.id))
        else:
            self.delete_binding(
                record.vhost,
                record.source,
                record.dest_kind,
                record.dest,
                record.routing_key,
                record.arguments,
            )

    def _load_resident(self, r: PagedReady, qid: int) -> None:
        """Read the bodies of the head of a recovered paged queue now (before listening)."""
        nbytes = 0
        n = 0
        cur = self._db.cursor()
        for m in r:
            if n >= RESIDENT_MIN and nbytes >= RESIDENT_BYTES // 2:
                break
            n += 1
            nbytes += m.body_size
            if m.body is None:
                row = cur.execute(
                    "SELECT body, properties, crc FROM messages WHERE qid = ? AND mid = ?",
                    (qid, m.id),
                ).fetchone()
                if row is None:
                    m.body = b""
                elif intact(row[2], row[1], row[0]):
                    m.body = row[0]
                # else left paged: reading it back ahead of dispatch finds and reports it
        paged = 0
        for m in islice(r, n, None):
            if m.body is None:
                paged += 1
        r.paged = paged


__all__ = ["DB_NAME", "SCHEMA_VERSION", "PagedReady", "SQLiteStore", "StoreError"]

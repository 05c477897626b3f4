"""The event journal: every event of SPEC section 9 as Parquet files, for the Spark pipeline.

Enabled by ``<journal path="DIR"/>``. A built-in plugin on the same hooks as everyone else, in two
parts so that a broker *without* a journal pays nothing on its hot path:

* this module implements only lifecycle hooks (``broker_startup``, ``broker_shutdown``,
  ``broker_config_reloaded``); with no ``<journal>`` configured it does nothing else;
* when a journal is configured, ``broker_startup`` registers a :class:`Recorder` object with the
  broker's plugin host. The recorder implements the per-event hooks; each of them only appends one
  tuple to an in-memory buffer (a ``collections.deque``; ``append`` is atomic, so the loop thread
  needs no lock) and returns.

A background thread (:class:`Journal`) drains the buffer about once a second, turns the tuples
into Arrow columns, and writes Parquet row groups. Files are rolled at each hour, at
``roll_bytes`` and after ``roll_seconds``; a file being written has a leading dot (Spark and
pyarrow skip such files) and is renamed when it is closed, so a reader never sees half a file and
a crash loses at most the open file (``roll_seconds``, five minutes by default). Files live under
``DIR/date=YYYY-MM-DD/hour=HH/`` (UTC), which Spark reads as partition columns.

The buffer is bounded (``max_buffer`` events). When the writer falls behind, events are dropped
rather than blocking the loop: the count is kept, logged (at most every 10 s) and written into the
journal itself as a ``journal_dropped`` event, so an analysis can tell the data is incomplete.

Cost: the recorder's per-message methods take about 0.35 µs; while it is the only implementation
of a hook, the plugin host calls it directly rather than through pluggy's dispatch (see
``plugbroker.pluginhost._direct``).

The schema is fixed and versioned (:data:`SCHEMA_VERSION`, also a column and file metadata);
``docs/analyze.md`` documents every column and what each event puts in it.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from plugbroker.hookimpl import hookimpl

if TYPE_CHECKING:
    from plugbroker.config import BrokerConfig
    from plugbroker.core.api import BrokerAPI
    from plugbroker.policy import Action

log = logging.getLogger("plugbroker.plugins.journal")

#: Bumped whenever a column changes meaning or type, or events are added. Readers take every
#: version from 1 up to theirs and refuse newer ones. Version 2 added ``enqueued`` and
#: ``removed`` and the message count (``count``) of ``queue_deleted``; a version-1 journal just
#: has none of them. Version 2 also added ``touched`` (a consumer's ``amq.touch``) and the
#: optional ``due_us`` column (a delivery's due time); a file written without that column reads
#: as null there. Version 3 added ``timed_out`` (a delivery's ack clock ran out: ``count`` is
#: the message's timed-out hand-outs). Events and optional columns may be added in later
#: versions; the meaning and type of an existing column never change within the pipeline's
#: supported range.
SCHEMA_VERSION = 3
#: Parquet key-value metadata key holding :data:`SCHEMA_VERSION`.
METADATA_KEY = b"plugbroker.journal.schema_version"

# ------------------------------------------------------------------------------------------ schema

#: Every column, in file order. ``docs/analyze.md`` says what each event puts where.
FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("schema_version", pa.int16()),
    ("ts_us", pa.int64()),  # wall clock, microseconds since the epoch (UTC)
    ("seq", pa.int64()),  # order of the event within its run (hook call order)
    ("run", pa.string()),  # one id per journal start (broker start or reload)
    ("event", pa.string()),
    ("vhost", pa.string()),
    ("queue", pa.string()),
    ("exchange", pa.string()),
    ("routing_key", pa.string()),
    ("consumer_tag", pa.string()),
    ("connection_id", pa.string()),
    ("channel_id", pa.int32()),
    ("message_id", pa.int64()),  # the broker's message.id (same in every queue it went to)
    ("delivery_tag", pa.int64()),
    ("body_size", pa.int64()),
    ("delivery_count", pa.int32()),
    ("redelivered", pa.bool_()),
    ("requeue", pa.bool_()),
    ("no_ack", pa.bool_()),
    ("durable", pa.bool_()),
    ("exclusive", pa.bool_()),
    ("auto_delete", pa.bool_()),
    ("count", pa.int64()),
    ("code", pa.int32()),
    ("reason", pa.string()),
    ("detail", pa.string()),
    ("policy", pa.string()),
    ("action", pa.string()),
    ("threshold", pa.string()),
    ("configured", pa.float64()),
    ("measured", pa.float64()),
    ("outcome", pa.string()),
    # delivered: when the message said it was due (its ETA header), if later than the delivery;
    # wall clock, microseconds since the epoch; null otherwise and in older journals
    ("due_us", pa.int64()),
)
SCHEMA = pa.schema(
    [pa.field(n, t) for n, t in FIELDS], metadata={METADATA_KEY: str(SCHEMA_VERSION).encode()}
)
_TYPES = dict(FIELDS)

# Event kinds: the small int the hot path stores, the event name, and the columns that follow
# ``(kind, time)`` in the buffered tuple. ``published`` is expanded to one row per queue.
PUBLISHED, DELIVERED, ACKED, REJECTED, REDELIVERED, DEAD_LETTERED, EXPIRED, DROPPED = range(8)
(
    CONSUMER_ADDED,
    CONSUMER_REMOVED,
    CONSUMER_ISOLATED,
    CONSUMER_RELEASED,
    POLICY_ACTION,
    QUEUE_DECLARED,
    QUEUE_DELETED,
    QUEUE_BOUND,
    QUEUE_UNBOUND,
    CONNECTION_OPENED,
    CONNECTION_CLOSED,
    JOURNAL_STARTED,
    JOURNAL_STOPPED,
    JOURNAL_DROPPED,
    ENQUEUED,
    REMOVED,
    DELIVERY_TOUCHED,
    TIMED_OUT,
) = range(8, 26)

LAYOUTS: dict[int, tuple[str, tuple[str, ...]]] = {
    PUBLISHED: (
        "published",
        ("vhost", "exchange", "routing_key", "message_id", "body_size", "queue", "reason"),
    ),
    DELIVERED: (
        "delivered",
        (
            "vhost",
            "queue",
            "consumer_tag",
            "connection_id",
            "channel_id",
            "delivery_tag",
            "message_id",
            "body_size",
            "delivery_count",
            "redelivered",
            "no_ack",
            "due_us",
        ),
    ),
    ACKED: (
        "acked",
        (
            "vhost",
            "queue",
            "consumer_tag",
            "connection_id",
            "channel_id",
            "message_id",
            "body_size",
            "delivery_count",
        ),
    ),
    REJECTED: (
        "rejected",
        (
            "vhost",
            "queue",
            "consumer_tag",
            "connection_id",
            "channel_id",
            "message_id",
            "body_size",
            "delivery_count",
            "requeue",
        ),
    ),
    REDELIVERED: (
        "redelivered",
        ("vhost", "queue", "message_id", "body_size", "delivery_count", "reason"),
    ),
    DEAD_LETTERED: (
        "dead_lettered",
        (
            "vhost",
            "queue",
            "message_id",
            "body_size",
            "delivery_count",
            "reason",
            "exchange",
            "routing_key",
        ),
    ),
    EXPIRED: ("expired", ("vhost", "queue", "message_id", "body_size", "delivery_count")),
    DROPPED: ("dropped", ("vhost", "queue", "message_id", "body_size", "delivery_count", "reason")),
    CONSUMER_ADDED: (
        "consumer_added",
        (
            "vhost",
            "queue",
            "consumer_tag",
            "connection_id",
            "channel_id",
            "no_ack",
            "count",
            "exclusive",
            "reason",
        ),
    ),
    CONSUMER_REMOVED: (
        "consumer_removed",
        ("vhost", "queue", "consumer_tag", "connection_id", "channel_id", "reason"),
    ),
    CONSUMER_ISOLATED: (
        "consumer_isolated",
        ("vhost", "queue", "consumer_tag", "connection_id", "measured", "count"),
    ),
    CONSUMER_RELEASED: (
        "consumer_released",
        ("vhost", "queue", "consumer_tag", "connection_id", "reason"),
    ),
    POLICY_ACTION: (
        "policy_action",
        (
            "vhost",
            "queue",
            "policy",
            "action",
            "reason",
            "threshold",
            "configured",
            "measured",
            "outcome",
            "consumer_tag",
            "connection_id",
            "code",
        ),
    ),
    QUEUE_DECLARED: (
        "queue_declared",
        ("vhost", "queue", "durable", "exclusive", "auto_delete", "detail", "reason"),
    ),
    QUEUE_DELETED: ("queue_deleted", ("vhost", "queue", "reason", "count")),
    ENQUEUED: (
        "enqueued",
        (
            "vhost",
            "queue",
            "message_id",
            "body_size",
            "delivery_count",
            "reason",
            "exchange",
            "routing_key",
        ),
    ),
    REMOVED: ("removed", ("vhost", "queue", "message_id", "body_size", "delivery_count", "reason")),
    QUEUE_BOUND: ("queue_bound", ("vhost", "queue", "exchange", "routing_key", "detail", "reason")),
    QUEUE_UNBOUND: ("queue_unbound", ("vhost", "queue", "exchange", "routing_key")),
    CONNECTION_OPENED: ("connection_opened", ("connection_id", "detail", "reason", "vhost")),
    CONNECTION_CLOSED: ("connection_closed", ("connection_id", "code", "reason")),
    JOURNAL_STARTED: ("journal_started", ("detail", "count")),
    JOURNAL_STOPPED: ("journal_stopped", ("count", "detail")),
    JOURNAL_DROPPED: ("journal_dropped", ("count",)),
    DELIVERY_TOUCHED: (
        "touched",
        (
            "vhost",
            "queue",
            "consumer_tag",
            "connection_id",
            "channel_id",
            "delivery_tag",
            "message_id",
        ),
    ),
    TIMED_OUT: (
        "timed_out",
        (
            "vhost",
            "queue",
            "consumer_tag",
            "connection_id",
            "message_id",
            "body_size",
            "delivery_count",
            "count",
        ),
    ),
}
#: every event name the journal writes
EVENTS: tuple[str, ...] = tuple(name for name, _ in LAYOUTS.values())

_HOUR_US = 3_600_000_000


# ------------------------------------------------------------------------------------------ writer


class Journal:
    """The buffer and the background writer of one journal directory.

    :param path: the journal directory (created if missing).
    :param clock: wall-clock seconds (``plugbroker.clock.time``); the hot path calls it per event.
    :param max_buffer: events held in memory before new ones are dropped (counted, logged).
    :param batch_rows: rows gathered before a Parquet row group is written.
    :param flush_interval: seconds between drains of the buffer by the writer thread; a row group
        is also written when the oldest pending row is older than ``5 * flush_interval``.
    :param roll_bytes: a file is closed (and a new one started) past this size.
    :param roll_seconds: a file is closed after being open this long (bounds crash loss).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        max_buffer: int = 1_000_000,
        batch_rows: int = 65_536,
        flush_interval: float = 1.0,
        roll_bytes: int = 64 * 1024 * 1024,
        roll_seconds: float = 300.0,
        compression: str = "zstd",
    ) -> None:
        self.path = Path(path)
        self.clock = clock
        self.max_buffer = max_buffer
        self.batch_rows = batch_rows
        self.flush_interval = flush_interval
        self.roll_bytes = roll_bytes
        self.roll_seconds = roll_seconds
        self.compression = compression
        self.run = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        #: the hot path appends here; only the writer thread pops
        self.buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        #: events dropped because the buffer was full (only the loop thread increments it)
        self.dropped = 0
        self.written = 0
        self.files: list[Path] = []
        self._dropped_reported = 0
        self._last_drop_log = 0.0
        self._seq = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_since: float | None = None
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None
        self._file_hidden: Path | None = None
        self._file_final: Path | None = None
        self._file_hour: int | None = None
        self._file_opened = 0.0
        self._file_counter = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()  # serialises drain/close between the thread and close()

    # -- hot path ---------------------------------------------------------------------------------

    def append(self, item: tuple[Any, ...]) -> None:
        """Buffer one event tuple ``(kind, time, *fields)``; drop (and count) when full."""
        buf = self.buffer
        if len(buf) < self.max_buffer:
            buf.append(item)
        else:
            self.dropped += 1

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Journal:
        self.path.mkdir(parents=True, exist_ok=True)
        leftovers = [p for p in self.path.rglob(".*.parquet")]
        if leftovers:
            log.warning(
                "journal %s: %d hidden file(s) left by a broker that did not shut down "
                "cleanly (unreadable, ignored by readers): %s",
                self.path,
                len(leftovers),
                ", ".join(str(p) for p in leftovers[:5]),
            )
        self.buffer.append((JOURNAL_STARTED, self.clock(), f"pid={os.getpid()}", SCHEMA_VERSION))
        self._thread = threading.Thread(
            target=self._run, name=f"journal-writer-{self.run}", daemon=True
        )
        self._thread.start()
        _OPEN.add(self)
        log.info(
            "journal writing to %s (run %s, schema version %d)", self.path, self.run, SCHEMA_VERSION
        )
        return self

    def position(self) -> int:
        """The ``seq`` the next event will get. Call it on the broker's loop (where the hooks
        append), so that no event comes in between."""
        with self._lock:
            return self._seq + len(self.buffer)

    def flush(self) -> None:
        """Drain the buffer and write every pending row now (the open file stays open)."""
        with self._lock:
            self._drain()
            self._write_pending()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the writer, write everything buffered, close and publish the open file."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            self.buffer.append(
                (
                    JOURNAL_STOPPED,
                    self.clock(),
                    self.dropped,
                    f"written={self.written + len(self.buffer) + self._pending_rows}",
                )
            )
            self._drain()
            self._write_pending()
            self._close_file()
        _OPEN.discard(self)
        log.info(
            "journal %s closed: %d events written, %d dropped, %d file(s)",
            self.path,
            self.written,
            self.dropped,
            len(self.files),
        )

    # -- the writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                with self._lock:
                    self._drain()
                    now = time.monotonic()
                    if self._pending_rows and (
                        self._pending_rows >= self.batch_rows
                        or (
                            self._pending_since is not None
                            and now - self._pending_since >= 5 * self.flush_interval
                        )
                    ):
                        self._write_pending()
                    if self._writer is not None and now - self._file_opened >= self.roll_seconds:
                        self._write_pending()
                        self._close_file()
            except Exception:  # never let the writer die silently
                log.exception(
                    "journal %s: writing failed; retrying in %gs", self.path, self.flush_interval
                )

    def _drain(self) -> None:
        buf = self.buffer
        n = len(buf)
        dropped = self.dropped
        if dropped != self._dropped_reported:
            lost = dropped - self._dropped_reported
            self._dropped_reported = dropped
            now = time.monotonic()
            if now - self._last_drop_log >= 10.0 or self._stop.is_set():
                self._last_drop_log = now
                log.warning(
                    "journal %s: the writer fell behind, %d event(s) dropped (%d in all); "
                    "the buffer holds at most %d",
                    self.path,
                    lost,
                    dropped,
                    self.max_buffer,
                )
            buf.append((JOURNAL_DROPPED, self.clock(), lost))
            n += 1
        if not n:
            return
        pop = buf.popleft
        rows = [pop() for _ in range(n)]
        table = self._to_table(rows, self._seq)
        self._seq += n
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        self._pending.append(table)
        self._pending_rows += table.num_rows

    def _to_table(self, rows: Sequence[tuple[Any, ...]], seq0: int) -> pa.Table:
        """Columns from event tuples: grouped by kind, converted, then put back in order."""
        by_kind: dict[int, list[tuple[Any, ...]]] = {}
        seqs: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            k = row[0]
            got = by_kind.get(k)
            if got is None:
                by_kind[k] = [row]
                seqs[k] = [seq0 + i]
            else:
                got.append(row)
                seqs[k].append(seq0 + i)
        tables = []
        for kind, krows in by_kind.items():
            name, layout = LAYOUTS[kind]
            kseq = seqs[kind]
            if kind == PUBLISHED:
                krows, kseq = _expand_published(krows, kseq)
            tables.append(self._kind_table(name, layout, krows, kseq))
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        if len(tables) > 1:
            table = table.take(pc.sort_indices(table.column("seq")))
        return table

    def _kind_table(
        self, name: str, layout: tuple[str, ...], rows: Sequence[tuple[Any, ...]], seq: list[int]
    ) -> pa.Table:
        n = len(rows)
        # one column at a time (zip(*rows) costs several times more on large batches)
        given = {name: list(map(itemgetter(i), rows)) for i, name in enumerate(layout, start=2)}
        t = pa.array(list(map(itemgetter(1), rows)), pa.float64())
        arrays: list[pa.Array] = []
        for fname, ftype in FIELDS:
            if fname == "schema_version":
                arrays.append(pa.repeat(pa.scalar(SCHEMA_VERSION, ftype), n))
            elif fname == "ts_us":
                arrays.append(pc.cast(pc.round(pc.multiply(t, 1e6)), pa.int64()))
            elif fname == "seq":
                arrays.append(pa.array(seq, pa.int64()))
            elif fname == "run":
                arrays.append(pa.repeat(pa.scalar(self.run, pa.string()), n))
            elif fname == "event":
                arrays.append(pa.repeat(pa.scalar(name, pa.string()), n))
            elif fname in given:
                arrays.append(pa.array(given[fname], ftype))
            else:
                arrays.append(pa.nulls(n, ftype))
        return pa.Table.from_arrays(arrays, schema=SCHEMA)

    def _write_pending(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending = []
        self._pending_rows = 0
        self._pending_since = None
        hours = pc.divide(table.column("ts_us"), pa.scalar(_HOUR_US, pa.int64()))
        first, last = pc.min_max(hours).values()
        if first.as_py() == last.as_py():
            self._write_hour(int(first.as_py()), table)
            return
        for hour in sorted(set(hours.to_pylist())):
            part = table.filter(pc.equal(hours, hour))
            self._write_hour(int(hour), part)

    def _write_hour(self, hour: int, table: pa.Table) -> None:
        if self._writer is not None and hour != self._file_hour:
            self._close_file()
        if self._writer is None:
            self._open_file(hour)
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=max(self.batch_rows, table.num_rows))
        self.written += table.num_rows
        if self._sink.tell() >= self.roll_bytes:
            self._close_file()

    def _open_file(self, hour: int) -> None:
        when = datetime.fromtimestamp(hour * 3600, tz=UTC)
        folder = self.path / f"date={when:%Y-%m-%d}" / f"hour={when:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        self._file_counter += 1
        name = f"events-{self.run}-{self._file_counter:05d}.parquet"
        self._file_final = folder / name
        self._file_hidden = folder / f".{name}"
        self._sink = pa.OSFile(str(self._file_hidden), "wb")
        self._writer = pq.ParquetWriter(self._sink, SCHEMA, compression=self.compression)
        self._file_hour = hour
        self._file_opened = time.monotonic()

    def _close_file(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._sink.close()
        assert self._file_hidden is not None and self._file_final is not None
        os.replace(self._file_hidden, self._file_final)
        self.files.append(self._file_final)
        self._writer = None
        self._sink = None
        self._file_hour = None


def _expand_published(
    rows: Sequence[tuple[Any, ...]], seqs: Sequence[int]
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """One row per queue a message was routed to (one row with no queue if unroutable)."""
    out: list[tuple[Any, ...]] = []
    out_seq: list[int] = []
    for row, s in zip(rows, seqs):
        queues = row[7]
        if len(queues) == 1:
            out.append(row[:7] + (queues[0], row[8]))
            out_seq.append(s)
        elif not queues:
            out.append(row[:7] + (None, "unroutable"))
            out_seq.append(s)
        else:
            head = row[:7]
            for q in queues:
                out.append(head + (q, row[8]))
                out_seq.append(s)
    return out, out_seq


#: journals still open; closed at interpreter exit if the broker was not shut down
_OPEN: weakref.WeakSet[Journal] = weakref.WeakSet()


@atexit.register
def _close_open_journals() -> None:
    for j in list(_OPEN):
        try:
            j.close(timeout=5.0)
        except Exception:  # pragma: no cover - best effort at exit
            log.exception("journal %s: closing at exit failed", j.path)


# ---------------------------------------------------------------------------------------- recorder


class Recorder:
    """The per-event hook implementations of one broker's journal.

    Registered with the broker's plugin host only while a journal is configured. Each hook
    builds one tuple and appends it to the journal's buffer: no I/O, no locking, no formatting.
    """

    def __init__(self, broker: BrokerAPI, journal: Journal) -> None:
        self.journal = journal
        self._api = broker
        self._buf = journal.buffer
        self._max = journal.max_buffer
        self._now = journal.clock

    def _put_message(self, kind: int, vhost: str, queue: str, message: Any, *rest: Any) -> None:
        """Journal one message event: kind, time, where, the message's id, size and delivery
        count, then the event's own fields (``rest``)."""
        self._put(
            (
                kind,
                self._now(),
                vhost,
                queue,
                message.id,
                message.body_size,
                message.delivery_count,
                *rest,
            )
        )

    def _put(self, item: tuple[Any, ...]) -> None:
        if len(self._buf) < self._max:
            self._buf.append(item)
        else:
            self.journal.dropped += 1

    # -- per message (hot path: every method is one append) ----------------------------------------

    @hookimpl(trylast=True)
    def broker_message_published(
        self, vhost: str, exchange: str, routing_key: str, message: Any, queues: tuple[str, ...]
    ) -> None:
        buf = self._buf
        if len(buf) < self._max:
            buf.append(
                (
                    PUBLISHED,
                    self._now(),
                    vhost,
                    exchange,
                    routing_key,
                    message.id,
                    message.body_size,
                    queues,
                    None,
                )
            )
        else:
            self.journal.dropped += 1

    @hookimpl(trylast=True)
    def broker_message_delivered(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str | None,
        connection_id: str,
        channel_id: int,
        delivery_tag: int,
        message: Any,
        redelivered: bool,
        no_ack: bool,
        due: float | None,
    ) -> None:
        buf = self._buf
        if len(buf) < self._max:
            buf.append(
                (
                    DELIVERED,
                    self._now(),
                    vhost,
                    queue,
                    consumer_tag,
                    connection_id,
                    channel_id,
                    delivery_tag,
                    message.id,
                    message.body_size,
                    message.delivery_count,
                    redelivered,
                    no_ack,
                    None if due is None else round(due * 1e6),
                )
            )
        else:
            self.journal.dropped += 1

    @hookimpl(trylast=True)
    def broker_delivery_touched(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str,
        connection_id: str,
        channel_id: int,
        delivery_tag: int,
        message: Any,
    ) -> None:
        self._put(
            (
                DELIVERY_TOUCHED,
                self._now(),
                vhost,
                queue,
                consumer_tag,
                connection_id,
                channel_id,
                delivery_tag,
                message.id,
            )
        )

    @hookimpl(trylast=True)
    def broker_message_acked(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str | None,
        connection_id: str,
        channel_id: int,
        message: Any,
    ) -> None:
        buf = self._buf
        if len(buf) < self._max:
            buf.append(
                (
                    ACKED,
                    self._now(),
                    vhost,
                    queue,
                    consumer_tag,
                    connection_id,
                    channel_id,
                    message.id,
                    message.body_size,
                    message.delivery_count,
                )
            )
        else:
            self.journal.dropped += 1

    @hookimpl(trylast=True)
    def broker_message_rejected(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str | None,
        connection_id: str,
        channel_id: int,
        message: Any,
        requeue: bool,
    ) -> None:
        self._put(
            (
                REJECTED,
                self._now(),
                vhost,
                queue,
                consumer_tag,
                connection_id,
                channel_id,
                message.id,
                message.body_size,
                message.delivery_count,
                requeue,
            )
        )

    @hookimpl(trylast=True)
    def broker_message_redelivered(
        self, vhost: str, queue: str, message: Any, delivery_count: int, reason: str
    ) -> None:
        self._put(
            (
                REDELIVERED,
                self._now(),
                vhost,
                queue,
                message.id,
                message.body_size,
                delivery_count,
                reason,
            )
        )

    @hookimpl(trylast=True)
    def broker_message_timed_out(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str,
        connection_id: str,
        message: Any,
        timeouts: int,
    ) -> None:
        self._put(
            (
                TIMED_OUT,
                self._now(),
                vhost,
                queue,
                consumer_tag,
                connection_id,
                message.id,
                message.body_size,
                message.delivery_count,
                timeouts,
            )
        )

    @hookimpl(trylast=True)
    def broker_message_dead_lettered(
        self, vhost: str, queue: str, message: Any, reason: str, exchange: str, routing_key: str
    ) -> None:
        self._put_message(DEAD_LETTERED, vhost, queue, message, reason, exchange, routing_key)

    @hookimpl(trylast=True)
    def broker_message_enqueued(self, vhost: str, queue: str, message: Any, reason: str) -> None:
        self._put_message(
            ENQUEUED, vhost, queue, message, reason, message.exchange, message.routing_key
        )

    @hookimpl(trylast=True)
    def broker_message_removed(self, vhost: str, queue: str, message: Any, reason: str) -> None:
        self._put_message(REMOVED, vhost, queue, message, reason)

    @hookimpl(trylast=True)
    def broker_message_expired(self, vhost: str, queue: str, message: Any) -> None:
        self._put_message(EXPIRED, vhost, queue, message)

    @hookimpl(trylast=True)
    def broker_message_dropped(self, vhost: str, queue: str, message: Any, reason: str) -> None:
        self._put_message(DROPPED, vhost, queue, message, reason)

    # -- consumers, queues, connections, policies ---------------------------------------------

    @hookimpl(trylast=True)
    def broker_consumer_added(
        self, vhost: str, queue: str, consumer_tag: str, connection_id: str, channel_id: int
    ) -> None:
        c = self._consumer(vhost, queue, consumer_tag, connection_id)
        self._put(
            (
                CONSUMER_ADDED,
                self._now(),
                vhost,
                queue,
                consumer_tag,
                connection_id,
                channel_id,
                getattr(c, "no_ack", None),
                getattr(c, "prefetch", None),
                getattr(c, "exclusive", None),
                None,
            )
        )

    @hookimpl(trylast=True)
    def broker_consumer_removed(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str,
        connection_id: str,
        channel_id: int,
        reason: str,
    ) -> None:
        self._put(
            (
                CONSUMER_REMOVED,
                self._now(),
                vhost,
                queue,
                consumer_tag,
                connection_id,
                channel_id,
                reason,
            )
        )

    @hookimpl(trylast=True)
    def broker_consumer_isolated(
        self,
        vhost: str,
        queue: str,
        consumer_tag: str,
        connection_id: str,
        last_ack_age: float,
        moved: int,
    ) -> None:
        self._put(
            (
                CONSUMER_ISOLATED,
                self._now(),
                vhost,
                queue,
                consumer_tag,
                connection_id,
                float(last_ack_age),
                moved,
            )
        )

    @hookimpl(trylast=True)
    def broker_consumer_released(
        self, vhost: str, queue: str, consumer_tag: str, connection_id: str, reason: str
    ) -> None:
        self._put(
            (CONSUMER_RELEASED, self._now(), vhost, queue, consumer_tag, connection_id, reason)
        )

    @hookimpl(trylast=True)
    def broker_policy_action(self, action: Action, outcome: str) -> None:
        self._put(action_event(self._now(), action, outcome))

    @hookimpl(trylast=True)
    def broker_queue_declared(
        self, vhost: str, queue: str, durable: bool, arguments: dict[str, Any]
    ) -> None:
        self._put(self._declared(vhost, queue, durable, None))

    @hookimpl(trylast=True)
    def broker_queue_deleted(self, vhost: str, queue: str, reason: str, messages: int) -> None:
        self._put((QUEUE_DELETED, self._now(), vhost, queue, reason, messages))

    @hookimpl(trylast=True)
    def broker_queue_bound(self, vhost: str, queue: str, exchange: str, routing_key: str) -> None:
        self._put(
            (
                QUEUE_BOUND,
                self._now(),
                vhost,
                queue,
                exchange,
                routing_key,
                self._exchange_type(vhost, exchange),
                None,
            )
        )

    @hookimpl(trylast=True)
    def broker_queue_unbound(self, vhost: str, queue: str, exchange: str, routing_key: str) -> None:
        self._put((QUEUE_UNBOUND, self._now(), vhost, queue, exchange, routing_key))

    @hookimpl(trylast=True)
    def broker_connection_opened(
        self, connection_id: str, peer: str, user: str, vhost: str
    ) -> None:
        self._put((CONNECTION_OPENED, self._now(), connection_id, peer, user, vhost))

    @hookimpl(trylast=True)
    def broker_connection_closed(self, connection_id: str, code: int, text: str) -> None:
        self._put((CONNECTION_CLOSED, self._now(), connection_id, code, text))

    # -- helpers (off the per-message path) ---------------------------------------------------

    def _consumer(self, vhost: str, queue: str, tag: str, connection_id: str) -> Any:
        return self._api.consumer(vhost, queue, tag, connection_id)

    def _declared(
        self, vhost: str, queue: str, durable: bool, reason: str | None
    ) -> tuple[Any, ...]:
        q = self._api.queue(vhost, queue)
        return (
            QUEUE_DECLARED,
            self._now(),
            vhost,
            queue,
            durable,
            q.exclusive if q is not None else None,
            q.auto_delete if q is not None else None,
            q.subscription_type if q is not None else None,
            reason,
        )

    def _exchange_type(self, vhost: str, exchange: str) -> str | None:
        """The exchange's effective type (the inner type of an x-delayed-message exchange), which
        is what policy resolution matches ``<topic>`` against."""
        ex = self._api.exchange(vhost, exchange)
        return ex.effective_type if ex is not None else None

    def sync(self) -> None:
        """Record what exists when the journal starts (queues, bindings, consumers, messages), so a
        journal that starts on a running or restored broker can still be replayed."""
        api = self._api
        now_wall = self._now()
        now_mono = api.clock.monotonic()
        for q in api.queues():
            vname = q.vhost
            self._put(self._declared(vname, q.name, q.durable, "existing"))
            for ex_name, ex_type, key in q.bindings:
                etype = self._exchange_type(vname, ex_name) or ex_type
                self._put((QUEUE_BOUND, now_wall, vname, q.name, ex_name, key, etype, "existing"))
            for m in api.messages(vname, q.name, ready_only=False):
                arrival = now_wall - max(0.0, now_mono - m.arrival)
                self._put(
                    (
                        PUBLISHED,
                        arrival,
                        vname,
                        m.exchange,
                        m.routing_key,
                        m.id,
                        m.size,
                        (q.name,),
                        "existing",
                    )
                )
            for c in api.consumers(vname, q.name):
                self._put(
                    (
                        CONSUMER_ADDED,
                        now_wall,
                        vname,
                        q.name,
                        c.tag,
                        c.connection_id,
                        c.channel_id,
                        c.no_ack,
                        c.prefetch,
                        c.exclusive,
                        "existing",
                    )
                )
        for d in api.deliveries():
            m = d.message
            self._put(
                (
                    DELIVERED,
                    now_wall,
                    d.vhost,
                    d.queue,
                    d.consumer_tag,
                    d.connection_id,
                    d.channel_id,
                    d.delivery_tag,
                    m.id,
                    m.size,
                    m.delivery_count,
                    m.redelivered,
                    False,
                )
            )


def action_event(now: float, action: Any, outcome: str) -> tuple[Any, ...]:
    """The journal tuple of a policy action (also used by the backtest for its own actions)."""
    return (
        POLICY_ACTION,
        now,
        action.vhost,
        action.queue,
        action.policy,
        type(action).__name__,
        action.reason,
        action.threshold or None,
        _float(action.configured),
        _float(action.measured),
        outcome,
        getattr(action, "consumer_tag", None) or None,
        getattr(action, "connection_id", None) or None,
        getattr(action, "code", None),
    )


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


# ------------------------------------------------------------------------------- lifecycle hooks

#: broker -> its recorder (several brokers may run in one process, e.g. in the tests)
_RECORDERS: weakref.WeakKeyDictionary[Any, Recorder] = weakref.WeakKeyDictionary()

#: tuning knobs for tests and benchmarks; production uses the defaults
OPTIONS: dict[str, Any] = {}


def start_recording(broker: BrokerAPI, path: Path) -> Recorder:
    """Open a journal at ``path`` and register its recorder with the broker's plugin host."""
    journal = Journal(path, clock=broker.clock.time, **OPTIONS).start()
    rec = Recorder(broker, journal)
    rec.sync()
    broker.register_plugin(rec, f"journal-recorder-{journal.run}")
    _RECORDERS[broker] = rec
    return rec


def stop_recording(broker: BrokerAPI) -> None:
    """Unregister the recorder of ``broker`` (if any), then flush and close its journal."""
    rec = _RECORDERS.pop(broker, None)
    if rec is None:
        return
    try:
        broker.unregister_plugin(f"journal-recorder-{rec.journal.run}")
    except Exception:  # the host may already be torn down
        log.debug("journal recorder was not registered", exc_info=True)
    rec.journal.close()


def journal_of(broker: BrokerAPI) -> Journal | None:
    """The open journal of ``broker``, or ``None``."""
    rec = _RECORDERS.get(broker)
    return rec.journal if rec is not None else None


@hookimpl(trylast=True)
def broker_startup(broker: BrokerAPI) -> None:
    path = broker.config.journal_path
    if path is not None and broker not in _RECORDERS:
        start_recording(broker, Path(path))


@hookimpl(trylast=True)
def broker_config_reloaded(broker: BrokerAPI, config: BrokerConfig) -> None:
    rec = _RECORDERS.get(broker)
    current = rec.journal.path if rec is not None else None
    wanted = Path(config.journal_path) if config.journal_path is not None else None
    if current == wanted:
        return
    if rec is not None:
        stop_recording(broker)
    if wanted is not None:
        start_recording(broker, wanted)


@hookimpl(trylast=True)
def broker_shutdown(broker: BrokerAPI) -> None:
    stop_recording(broker)


def read_journal(path: str | Path, columns: Iterable[str] | None = None) -> pa.Table:
    """Every closed file of a journal as one Arrow table in event order (tests, small journals)."""
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(path), format="parquet", partitioning="hive", schema=None)
    table = dataset.to_table(columns=list(columns) if columns is not None else None)
    if table.num_rows and "ts_us" in table.column_names and "seq" in table.column_names:
        table = table.sort_by([("run", "ascending"), ("seq", "ascending")])
    return table

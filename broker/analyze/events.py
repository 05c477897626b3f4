"""Reading a journal into Spark, and the frames every job builds on.

* :func:`read_events`: the journal's closed files as one DataFrame, schema version checked, with
  ``ts`` (seconds, double) added;
* :func:`message_facts`: one row per message per queue, from the one big shuffle of a report;
  queues there are a 64-bit key (:func:`queue_key`, mapped back by :func:`queue_names`);
* :func:`lifecycles`: from those, when each message arrived (published, or put there by the
  broker: a dead letter, a delayed release, a retry or redrive copy) and when it left (acked,
  dead-lettered, dropped, expired, settled at a no-ack delivery, purged, gone back from a retry
  or dead-letter queue, or gone with its queue or with the broker run that held it);
* :func:`settlements`: one row per ack or reject, paired with the delivery it settles, so
  ``latency`` is the consumer's processing time (delivery to ack);
* :func:`backlog_deltas` and :func:`queue_bucket_counts`: per queue and time bucket, the
  backlog's steps and the event counts; from them :func:`backlog_series`, on the driver (they
  are small), the messages held, bytes held and the age of the oldest message at the end of
  each bucket.

Everything over the events is built from Spark SQL functions (no Python UDFs), so it runs at
JVM speed and scales out on a cluster; aggregates carry numbers, not strings, so they stay
hash-based.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugbroker.plugins.journal import METADATA_KEY, SCHEMA_VERSION

if TYPE_CHECKING:
    import pyarrow as pa

#: events that concern one message in one queue
MESSAGE_EVENTS = (
    "published",
    "delivered",
    "acked",
    "rejected",
    "redelivered",
    "dead_lettered",
    "expired",
    "dropped",
    "enqueued",  # schema version 2
    "removed",  # schema version 2
)
#: events that concern one queue (replayed by the backtest)
QUEUE_EVENTS = MESSAGE_EVENTS + (
    "consumer_added",
    "consumer_removed",
    "consumer_isolated",
    "consumer_released",
    "queue_declared",
    "queue_deleted",
    "queue_bound",
    "queue_unbound",
    "policy_action",
    "touched",
    "timed_out",  # schema version 3
)
#: processing-time histogram bucket bounds, seconds (a value v falls in the first bucket whose
#: upper bound is greater than v)
LATENCY_BOUNDS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
#: "never": the end of a message that is still held when the journal ends
NEVER = 1e18


class JournalError(Exception):
    """The journal cannot be read (missing, empty, or a schema version this code does not know)."""


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


#: up to how many files of a local journal the driver reads the footers of (schemas, time span)
FOOTERS_READ = 500


def local_files(path: str) -> list[Path] | None:
    """The closed files of a local journal as Spark reads them (not hidden, not ``_``-named),
    sorted; ``None`` for a journal on another file system."""
    if not _is_local(path):
        return None
    root = Path(path.removeprefix("file://"))
    return sorted(p for p in root.rglob("*.parquet") if not p.name.startswith((".", "_")))


def check_local_journal(path: str) -> None:
    """Fail early, with a message a person understands, on a local journal that cannot be read."""
    if not _is_local(path):
        return
    root = Path(path.removeprefix("file://"))
    if not root.is_dir():
        raise JournalError(f"{root}: no such journal directory")
    files = local_files(path) or []
    if not files:
        hidden = list(root.rglob(".*.parquet"))
        extra = (
            (
                f" ({len(hidden)} file(s) still being written or left by a crash; a file "
                "becomes readable when the broker closes it)"
            )
            if hidden
            else ""
        )
        raise JournalError(f"{root}: no closed journal files{extra}")
    import pyarrow.parquet as pq

    for f in files[:1] + files[-1:]:
        meta = pq.read_schema(f).metadata or {}
        version = int(meta.get(METADATA_KEY, b"0"))
        if version > SCHEMA_VERSION or version < 1:
            raise JournalError(
                f"{f}: journal schema version {version}; this pipeline reads "
                f"version {SCHEMA_VERSION}"
            )


def read_events(spark: Any, journal: str | Path) -> Any:
    """The journal at ``journal`` (a directory, local or any Hadoop path) as a DataFrame."""
    from pyspark.sql import functions as F

    path = str(journal)
    check_local_journal(path)
    # mergeSchema: without it Spark takes the columns of one file, and a directory mixing files
    # written without the optional ``due_us`` (schema version 1, or version 2 before the column)
    # and files with it would lose the column silently when that file lacks it. When the driver
    # sees in the footers that every file has the same columns, it gives Spark that schema:
    # no merge, and no Spark job to infer it (a second saved at a cold start)
    shared = _one_schema(path)
    reader = spark.read.option("basePath", path)
    if shared is None:
        reader = reader.option("mergeSchema", "true")
    else:
        from pyspark.sql.pandas.types import from_arrow_schema

        reader = reader.schema(from_arrow_schema(shared))
    df = reader.parquet(path)
    if "schema_version" not in df.columns or "ts_us" not in df.columns:
        raise JournalError(f"{path}: not a plugbroker journal (no schema_version/ts_us columns)")
    df = df.withColumn("ts", F.col("ts_us") / F.lit(1e6))
    # ``due_us`` (a delivery's ETA) is optional: null in files written without it, and a
    # journal with none of them has no such column at all
    due = F.col("due_us") / F.lit(1e6) if "due_us" in df.columns else F.lit(None)
    return df.withColumn("due", due.cast("double"))


def _one_schema(path: str) -> pa.Schema | None:
    """The columns every file of a local journal (of at most :data:`FOOTERS_READ`) has, as
    their footers say; ``None`` if they differ, or for a journal the driver does not read."""
    files = local_files(path)
    if not files or len(files) > FOOTERS_READ:
        return None
    import pyarrow.parquet as pq

    first = pq.read_schema(files[0]).remove_metadata()
    if all(pq.read_schema(f).remove_metadata().equals(first) for f in files[1:]):
        return first
    return None


def _footer_span(path: str) -> tuple[float, float] | None:
    """The first and last ``ts_us`` of a local journal (of at most :data:`FOOTERS_READ` files)
    from its files' column statistics, in seconds; ``None`` when a file has none."""
    got = _footer_stats(path)
    return None if got is None else got[0]


def _footer_stats(
    path: str,
) -> tuple[tuple[float, float], dict[str, tuple[float, float]] | None] | None:
    """From the column statistics of a local journal's files (of at most :data:`FOOTERS_READ`):
    its first and last ``ts_us`` in seconds, and per broker run its first and last (``None``
    when a row group holds more than one run, or has no statistics of ``run``); ``None`` when
    a file has no statistics of ``ts_us``."""
    files = local_files(path)
    if not files or len(files) > FOOTERS_READ:
        return None
    import pyarrow.parquet as pq

    lo: int | None = None
    hi: int | None = None
    per_run: dict[str, tuple[int, int]] | None = {}
    for f in files:
        meta = pq.ParquetFile(f).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        if "ts_us" not in names:
            return None
        col = names.index("ts_us")
        run_col = names.index("run") if "run" in names else None
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if group.num_rows == 0:
                continue
            stats = group.column(col).statistics
            if stats is None or not stats.has_min_max:
                return None
            lo = stats.min if lo is None else min(lo, stats.min)
            hi = stats.max if hi is None else max(hi, stats.max)
            run = None if run_col is None else group.column(run_col).statistics
            if (
                per_run is None
                or run is None
                or not run.has_min_max
                or run.null_count
                or run.min != run.max
            ):
                per_run = None
                continue
            was = per_run.get(run.min)
            per_run[run.min] = (
                (stats.min, stats.max)
                if was is None
                else (min(was[0], stats.min), max(was[1], stats.max))
            )
    if lo is None or hi is None:
        return None
    runs_ = None if per_run is None else {r: (a / 1e6, b / 1e6) for r, (a, b) in per_run.items()}
    return (lo / 1e6, hi / 1e6), runs_


def span(events: Any, journal: str | Path | None = None) -> tuple[float, float]:
    """The journal's first and last event time (seconds): for a local ``journal``, from its
    files' statistics (no Spark job); else from its one numeric ``ts_us`` column (no string is
    decoded: a fraction of a full pass)."""
    from pyspark.sql import functions as F

    if journal is not None:
        got = _footer_span(str(journal))
        if got is not None:
            return got
    row = events.agg(F.min("ts_us"), F.max("ts_us")).collect()[0]
    if row[0] is None:
        raise JournalError("the journal holds no events")
    return row[0] / 1e6, row[1] / 1e6


def runs(events: Any, journal: str | Path | None = None) -> Any:
    """One row per journal run: ``run``, ``run_start``, ``run_end`` (seconds) and ``last``
    (the run that started last). For a local ``journal`` whose row groups each hold one run,
    from its files' statistics (no pass over the events), else from ``events``."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    got = None if journal is None else _footer_stats(str(journal))
    if got is not None and got[1]:
        import pyarrow as pa

        bounds = got[1]
        newest = max(start for start, _ in bounds.values())
        table = pa.table(
            {
                "run": pa.array(list(bounds), pa.string()),
                "run_start": pa.array([b[0] for b in bounds.values()], pa.float64()),
                "run_end": pa.array([b[1] for b in bounds.values()], pa.float64()),
                "last": pa.array([b[0] == newest for b in bounds.values()], pa.bool_()),
            }
        )
        return events.sparkSession.createDataFrame(table)
    per = events.groupBy("run").agg(F.min("ts").alias("run_start"), F.max("ts").alias("run_end"))
    latest = F.max("run_start").over(Window.partitionBy())
    return per.withColumn("last", F.col("run_start") == latest)


def nice_step(span: float, buckets: int = 240) -> float:
    """A bucket width (1, 2, 5 x 10^n seconds, or whole minutes/hours) giving about ``buckets``."""
    raw = max(span / max(buckets, 1), 1e-3)
    steps = [
        0.001,
        0.002,
        0.005,
        0.01,
        0.02,
        0.05,
        0.1,
        0.2,
        0.5,
        1,
        2,
        5,
        10,
        15,
        30,
        60,
        120,
        300,
        600,
        900,
        1800,
        3600,
        7200,
        3 * 3600,
        6 * 3600,
        12 * 3600,
        86400,
    ]
    for s in steps:
        if s >= raw:
            return float(s)
    return float(86400 * math.ceil(raw / 86400))


def consumer_id(conn: Any = "connection_id", tag: Any = "consumer_tag") -> Any:
    """A consumer's identity as one 64-bit number (its connection and tag hashed): aggregates
    then carry a number, not strings, and stay hash-based (no sort) in Spark."""
    from pyspark.sql import functions as F

    return F.xxhash64(
        F.col(conn) if isinstance(conn, str) else conn, F.col(tag) if isinstance(tag, str) else tag
    )


def queue_key(vhost: Any = "vhost", queue: Any = "queue") -> Any:
    """A queue's identity as one 64-bit number (its vhost and name hashed): the per-message
    frames group and join on it, not on two strings, which halves the cost of their one big
    shuffle. :func:`queue_names` maps it back."""
    from pyspark.sql import functions as F

    return F.xxhash64(
        F.col(vhost) if isinstance(vhost, str) else vhost,
        F.col(queue) if isinstance(queue, str) else queue,
    )


def queue_names(df: Any) -> pa.Table:
    """``q`` (:func:`queue_key`), ``vhost`` and ``queue`` of every queue named in ``df`` (the
    journal, or anything smaller with ``vhost`` and ``queue`` columns), on the driver; refused
    if two names share a key (a 64-bit hash: about one chance in 10^11 for a journal of ten
    thousand queues)."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    names = (
        df.where(F.col("queue").isNotNull())
        .select("vhost", "queue")
        .distinct()
        .select(queue_key().alias("q"), "vhost", "queue")
        .toArrow()
    )
    if pc.count_distinct(names.column("q")).as_py() != names.num_rows:
        raise JournalError("two queue names of this journal hash to the same 64-bit key")
    return names


def message_facts(events: Any) -> Any:
    """One row per queue (``q``, :func:`queue_key`) and ``message_id``, from one shuffle of the
    journal, numbers only.

    Carries what the lifecycle needs (arrival, removal, last sighting, size, deliveries) and the
    single delivery and settlement of the common case (delivered once, acked or rejected once on
    that channel), so most processing times come out of this same pass.
    """
    from pyspark.sql import functions as F

    ev = F.col("event")
    ts = F.col("ts")
    removal = (
        ev.isin("acked", "dead_lettered", "dropped", "expired", "removed")
        | ((ev == "delivered") & F.col("no_ack"))
        | ((ev == "rejected") & ~F.col("requeue"))
    )
    delivery = (ev == "delivered") & ~F.coalesce(F.col("no_ack"), F.lit(False))
    settle = ev.isin("acked", "rejected")
    chan = F.xxhash64("connection_id", "channel_id")
    m = events.where(
        ev.isin(*MESSAGE_EVENTS) & F.col("message_id").isNotNull() & F.col("queue").isNotNull()
    )
    return (
        m.groupBy(queue_key().alias("q"), "message_id")
        .agg(
            F.min(F.when(ev.isin("published", "enqueued"), ts)).alias("published_at"),
            F.min(ts).alias("first_seen"),
            F.max(ts).alias("last_seen"),
            F.min(F.when(removal, ts)).alias("removed_at"),
            F.max("body_size").alias("body_size"),
            F.sum(delivery.cast("int")).alias("deliveries"),
            F.sum(settle.cast("int")).alias("settlements"),
            F.max(F.when(delivery, ts)).alias("delivered_at"),
            F.max(F.when(delivery, chan)).alias("delivered_chan"),
            F.max(F.when(settle, ts)).alias("settled_at"),
            F.max(F.when(settle, chan)).alias("settled_chan"),
            F.max(F.when(settle, consumer_id())).alias("settled_by"),
            F.max(F.when(ev == "acked", 2).when(ev == "rejected", 1)).alias("settle_kind"),
        )
        .withColumn("arrival", F.coalesce("published_at", "first_seen"))
    )


def lifecycles(
    facts: Any, events: Any, run_table: Any, deleted: Any = None, keep: tuple[str, ...] = ()
) -> Any:
    """Per message and queue (``q``): ``arrival``, ``end`` (:data:`NEVER` if still held at the
    end).

    A message leaves when it is acked, dead-lettered, dropped, expired, settled at a no-ack
    delivery or rejected without requeue; when its queue is deleted; or, if neither, when the
    broker run it was last seen in ended (unless that is the journal's last run: a message that
    survived a restart reappears in the next run's opening inventory).

    ``deleted``: the journal's ``queue_deleted`` events (``vhost``, ``queue``, ``ts``) if the
    caller already has them (the report reads its rare events in one pass), else read from
    ``events``. ``keep``: more columns of ``facts`` to carry along.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    if deleted is None:
        deleted = events.where(F.col("event") == "queue_deleted")
    dels = deleted.select(queue_key().alias("d_q"), F.col("ts").alias("del"))
    w = Window.partitionBy("d_q").orderBy("del")
    intervals = dels.withColumn("del_from", F.lag("del").over(w)).select(
        "d_q",
        F.coalesce("del_from", F.lit(-1.0)).alias("del_from"),
        F.col("del").alias("deleted_at"),
    )
    joined = facts.join(
        F.broadcast(intervals),
        (F.col("q") == F.col("d_q"))
        & (F.col("arrival") > F.col("del_from"))
        & (F.col("arrival") <= F.col("deleted_at")),
        "left",
    )
    ended_runs = run_table.where(~F.col("last")).select(
        F.col("run_start").alias("r_start"), F.col("run_end").alias("r_end")
    )
    joined = joined.join(
        F.broadcast(ended_runs),
        (F.col("last_seen") >= F.col("r_start")) & (F.col("last_seen") <= F.col("r_end")),
        "left",
    )
    end = F.least(
        F.coalesce("removed_at", F.lit(NEVER)),
        F.coalesce("deleted_at", F.lit(NEVER)),
        F.coalesce("r_end", F.lit(NEVER)),
    )
    return joined.select(
        "q",
        "message_id",
        "arrival",
        end.alias("end"),
        "body_size",
        "deliveries",
        *keep,
    )


def settlements(events: Any, facts: Any) -> Any:
    """Acks and rejects paired with the delivery each settles: ``latency`` = processing time.

    Columns: q (:func:`queue_key`), message_id, consumer (:func:`consumer_id` of the settling
    consumer), kind (``acked``/``rejected``), delivered_at, settled_at, latency (seconds).

    The common case (one delivery and one settlement on the same channel) comes straight from
    :func:`message_facts` (:func:`simple_pair`). Messages delivered more than once on a channel
    (requeued back to the same consumer, as a poison message is) are paired event by event
    (:func:`paired_events`): a settlement settles the latest delivery before it on its channel.
    """
    from pyspark.sql import functions as F

    simple = facts.where(simple_pair()).select(
        "q",
        "message_id",
        F.col("settled_by").alias("consumer"),
        F.when(F.col("settle_kind") == 2, "acked").otherwise("rejected").alias("kind"),
        "delivered_at",
        "settled_at",
        (F.col("settled_at") - F.col("delivered_at")).alias("latency"),
    )
    hard = facts.where(hard_pair()).select("q", "message_id")
    return simple.unionByName(paired_events(events, hard, fits_broadcast(hard)))


def simple_pair() -> Any:
    """On :func:`message_facts`: the message was delivered once and settled once, on the same
    channel (its processing time is ``settled_at - delivered_at``)."""
    from pyspark.sql import functions as F

    return (
        (F.col("deliveries") == 1)
        & (F.col("settlements") == 1)
        & (F.col("delivered_chan") == F.col("settled_chan"))
        & (F.col("settled_at") >= F.col("delivered_at"))
    )


def hard_pair() -> Any:
    """On :func:`message_facts`: delivered and settled, but not :func:`simple_pair`."""
    from pyspark.sql import functions as F

    return ~simple_pair() & (F.col("deliveries") >= 1) & (F.col("settlements") >= 1)


def paired_events(events: Any, hard: Any, broadcast: bool = False) -> Any:
    """The settlements of the messages in ``hard`` (``q``, ``message_id``), each paired with the
    latest delivery before it on its channel: the columns of :func:`settlements`.

    ``broadcast``: ``hard`` is small enough to send to every task (see
    :func:`fits_broadcast`); the events are then first matched on the message id alone (a
    number), so the strings of the events of other messages are never read.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    ev = F.col("event")
    d = events.where(
        ((ev == "delivered") & ~F.coalesce(F.col("no_ack"), F.lit(False)))
        | ev.isin("acked", "rejected")
    ).where(F.col("message_id").isNotNull() & F.col("queue").isNotNull())
    if broadcast:
        d = d.join(F.broadcast(hard.select("message_id")), "message_id", "left_semi")
        hard = F.broadcast(hard)
    d = d.withColumn("q", queue_key()).join(hard, ["q", "message_id"], "left_semi")
    key = ["q", "message_id", "connection_id", "channel_id"]
    w = (
        Window.partitionBy(*key)
        .orderBy("run", "seq")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    paired = d.select(
        *key,
        "event",
        "ts",
        "consumer_tag",
        F.last(F.when(ev == "delivered", F.col("ts")), ignorenulls=True)
        .over(w)
        .alias("delivered_at"),
        F.last(F.when(ev == "delivered", F.col("consumer_tag")), ignorenulls=True)
        .over(w)
        .alias("delivered_tag"),
    )
    return paired.where(ev.isin("acked", "rejected") & F.col("delivered_at").isNotNull()).select(
        "q",
        "message_id",
        consumer_id(F.col("connection_id"), F.coalesce("consumer_tag", "delivered_tag")).alias(
            "consumer"
        ),
        F.col("event").alias("kind"),
        "delivered_at",
        F.col("ts").alias("settled_at"),
        F.greatest(F.col("ts") - F.col("delivered_at"), F.lit(0.0)).alias("latency"),
    )


#: the most rows :func:`fits_broadcast` sends to every task (a few tens of MB of keys)
BROADCAST_ROWS = 1_000_000


def fits_broadcast(df: Any, limit: int = BROADCAST_ROWS) -> bool:
    """Whether ``df`` has at most ``limit`` rows, to be sent to every task of a join (counted:
    Spark's size estimate of a filtered table is its whole input, so it would shuffle both
    sides)."""
    return bool(df.count() <= limit)


def latency_bucket(col: Any) -> Any:
    """Index into :data:`LATENCY_BOUNDS` (``len(LATENCY_BOUNDS)`` for the overflow bucket)."""
    from pyspark.sql import functions as F

    # a chain of comparisons (generated code, no array per row); a missing value is bucket 0
    bucket = F.when(col.isNull() | (col < F.lit(LATENCY_BOUNDS[0])), F.lit(0))
    for i, bound in enumerate(LATENCY_BOUNDS[1:], start=1):
        bucket = bucket.when(col < F.lit(bound), F.lit(i))
    return bucket.otherwise(F.lit(len(LATENCY_BOUNDS)))


#: the fine processing-time scale the report's percentiles come from: code ``i`` holds the
#: latencies in [1 us x FINE_RATIO^i, 1 us x FINE_RATIO^(i+1)), values within 0.2% of each other
FINE_RATIO = 1.002
#: the fine code of a latency of zero (or less)
FINE_ZERO = -(2**30)


def fine_code(col: Any) -> Any:
    """A latency's code on the fine logarithmic scale (:data:`FINE_RATIO`), an int."""
    from pyspark.sql import functions as F

    code = F.floor(F.log(col / F.lit(1e-6)) / F.lit(math.log(FINE_RATIO)))
    return F.when(col > 0, code).otherwise(F.lit(FINE_ZERO)).cast("int")


def latency_label(i: int) -> str:
    """A histogram bucket's label, e.g. ``10-20ms``."""
    from plugbroker.config.units import format_duration

    lo = 0.0 if i == 0 else LATENCY_BOUNDS[i - 1]
    if i >= len(LATENCY_BOUNDS):
        return f">{format_duration(lo)}"
    hi = LATENCY_BOUNDS[i]
    return f"{format_duration(lo) if lo else '0'}-{format_duration(hi)}"


def _bucket(c: Any, t0: float, step: float) -> Any:
    from pyspark.sql import functions as F

    return F.floor((c - F.lit(t0)) / F.lit(step)).cast("long")


def bucket_counts(events: Any, t0: float, step: float, by_reason: tuple[str, ...] = ()) -> Any:
    """Every event of the journal counted per (run, vhost, queue, connection_id, consumer_tag,
    bucket, event) and, for the events in ``by_reason``, their ``reason`` (null for the others),
    in one pass: ``n``, ``requeued`` (rejects with requeue), ``no_ack`` and
    ``prefetch`` (the largest ``no_ack`` and ``count``), ``first_ts``, ``last_ts``, ``dropped``
    (the ``count`` of ``journal_dropped`` events) and ``version`` (the largest schema version).

    Small (runs x queues x consumers x buckets x event kinds), so the overview (counts per run
    and event), :func:`backlog_series` (counts per queue and bucket) and the report's
    per-consumer figures all read it instead of scanning the journal again.
    """
    from pyspark.sql import functions as F

    ev = F.col("event")
    return events.groupBy(
        "run",
        "vhost",
        "queue",
        "connection_id",
        "consumer_tag",
        _bucket(F.col("ts"), t0, step).alias("bucket"),
        "event",
        (F.when(ev.isin(*by_reason), F.col("reason")) if by_reason else F.lit(None))
        .cast("string")
        .alias("reason"),
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when((ev == "rejected") & F.col("requeue"), 1).otherwise(0)).alias("requeued"),
        F.max("no_ack").alias("no_ack"),
        F.max("count").alias("prefetch"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
        F.sum(F.when(ev == "journal_dropped", F.col("count"))).alias("dropped"),
        F.max("schema_version").alias("version"),
    )


#: the bucket of a message still held when the journal ends (after every real bucket)
NEVER_BUCKET = 2**62


def backlog_steps(t0: float, step: float) -> Any:
    """On :func:`lifecycles`: a message's two steps of its queue's backlog, as an array of two
    structs (``bucket``, ``dn``, ``db``, ``arr``): +1 message and +size bytes in its arrival
    bucket, -1 and -size in its end bucket (:data:`NEVER_BUCKET`, and no change, if it is still
    held), where it also brings its arrival (the minimum arrival of the messages ending in a
    bucket gives the oldest message held: see :func:`backlog_series`).

    Both are null for a message that arrives and ends in the same bucket, as most do: it
    changes nothing held at any bucket's end, and its arrival, after the end of every earlier
    bucket, never makes an earlier bucket's oldest message (a message held there arrived
    before it). Skipping them takes most of the rows out of the aggregation that sums them.
    """
    from pyspark.sql import functions as F

    big = F.lit(NEVER_BUCKET).cast("long")
    ended = F.col("end") < F.lit(NEVER)
    arrives = _bucket(F.col("arrival"), t0, step)
    ends = F.when(ended, _bucket(F.col("end"), t0, step)).otherwise(big)
    moves = arrives != ends
    return F.array(
        F.when(
            moves,
            F.struct(
                arrives.alias("bucket"),
                F.lit(1).alias("dn"),
                F.col("body_size").alias("db"),
                F.lit(None).cast("double").alias("arr"),
            ),
        ),
        F.when(
            moves,
            F.struct(
                ends.alias("bucket"),
                F.when(ended, -1).otherwise(0).alias("dn"),
                F.when(ended, -F.col("body_size")).otherwise(0).alias("db"),
                F.col("arrival").alias("arr"),
            ),
        ),
    )


def backlog_deltas(life: Any, t0: float, step: float) -> Any:
    """On :func:`lifecycles`: per queue (``q``) and bucket, the backlog's steps summed
    (:func:`backlog_steps`): ``dn``, ``db`` and ``min_arrival_ending``, the earliest arrival of
    the messages that end in the bucket (a DataFrame)."""
    from pyspark.sql import functions as F

    return (
        life.select("q", F.explode(backlog_steps(t0, step)).alias("s"))
        .where(F.col("s").isNotNull())
        .select("q", "s.*")
        .groupBy("q", "bucket")
        .agg(
            F.sum("dn").alias("dn"),
            F.sum("db").alias("db"),
            F.min("arr").alias("min_arrival_ending"),
        )
    )


def queue_bucket_counts(
    events: Any = None, t0: float = 0.0, step: float = 1.0, counts: Any = None
) -> Any:
    """Per queue (``q``) and bucket, how many of each of :data:`MESSAGE_EVENTS` happened (a
    DataFrame, a column per event): from :func:`bucket_counts` for the same ``t0`` and ``step``
    when given as ``counts``, else from a pass over ``events``."""
    from pyspark.sql import functions as F

    ev = F.col("event")
    if counts is None:
        return (
            events.where(F.col("queue").isNotNull() & ev.isin(*MESSAGE_EVENTS))
            .groupBy(queue_key().alias("q"), _bucket(F.col("ts"), t0, step).alias("bucket"))
            .agg(*[F.sum((ev == e).cast("long")).alias(e) for e in MESSAGE_EVENTS])
        )
    return (
        counts.where(F.col("queue").isNotNull() & ev.isin(*MESSAGE_EVENTS))
        .groupBy(queue_key().alias("q"), "bucket")
        .agg(*[F.sum(F.when(ev == e, F.col("n")).otherwise(0)).alias(e) for e in MESSAGE_EVENTS])
    )


def backlog_series(deltas: pa.Table, counts: pa.Table, t0: float, step: float) -> pa.Table:
    """Per queue (``q``) and bucket: the counts of each event in the bucket, and at the
    bucket's end (``t``) the messages and bytes held and the age of the oldest
    (``oldest_age``). Sparse: only buckets where something happened to the queue appear (the
    figures carry over unchanged in between, except the age, which grows).

    On the driver, from two small tables, each per queue and bucket: ``deltas``
    (:func:`backlog_deltas`) and ``counts`` (:func:`queue_bucket_counts`). A running sum per
    queue gives what is held; the oldest message held at the end of bucket b is the earliest
    arrival among the messages that end after b (if that arrival is after the bucket's end,
    nothing is held).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = deltas.join(counts, ["q", "bucket"], join_type="full outer", use_threads=False)
    rows = rows.sort_by([("q", "ascending"), ("bucket", "ascending")])
    q = rows.column("q").to_numpy()
    bucket = rows.column("bucket").to_numpy()
    n = len(q)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]]) if n else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], n].astype(np.int64)

    def filled(name: str) -> Any:
        return pc.fill_null(rows.column(name), 0).to_numpy().astype(np.int64)

    def running_sum(values: Any) -> Any:
        total = np.cumsum(values)
        before = np.r_[0, total[starts[1:] - 1]] if n else total
        return total - np.repeat(before, ends - starts)

    arrival = pc.fill_null(rows.column("min_arrival_ending"), np.inf).to_numpy()
    oldest = np.full(n, np.inf)
    for s, e in zip(starts, ends):  # per queue: the earliest arrival among the later buckets
        if e - s > 1:
            oldest[s : e - 1] = np.minimum.accumulate(arrival[s + 1 : e][::-1])[::-1]
    messages = running_sum(filled("dn"))
    t = t0 + (bucket + 1).astype(np.float64) * step
    held = (oldest <= t) & (messages > 0)  # (an infinite arrival is never held)
    age = np.where(held, t - np.where(held, oldest, 0.0), 0.0)
    keep = bucket < NEVER_BUCKET
    columns = {
        "q": q,
        "bucket": bucket,
        **{e: filled(e) for e in MESSAGE_EVENTS},
        "messages": messages,
        "bytes": running_sum(filled("db")),
        "t": t,
        "oldest_age": age,
    }
    return pa.table({k: pa.array(v[keep]) for k, v in columns.items()})

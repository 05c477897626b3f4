"""``plugbroker analyze backtest``: what a candidate configuration would have done to this traffic.

The journal's queue events are partitioned by queue across Spark tasks, sorted in journal order
within each task, and replayed by :class:`plugbroker.analyze.replay.Replayer`, which rebuilds the
snapshots the broker's housekeeping would have taken at each check and hands them to the policy
jobs the candidate's plugins registered, built-in or third-party, found through the registry
(the snapshot pattern: the same functions, not a second implementation).

The result lists, per action the candidate's policies would have asked for, when (first and last
check, for a ``Log``/``Spared`` streak), on which queue and consumer, and with which threshold,
configured and measured value; beside it, the actions the running broker really took (the
journal's ``policy_action`` events), so the two can be compared.

Cluster note: each Spark task loads the candidate's plugins again, so the workers import
``plugbroker`` (with ``plugbroker.plugins``) and any plugin module the candidate names: install
them on the workers or ship them with ``spark-submit --py-files`` (``SparkContext.addPyFile`` from Python).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any

from plugbroker.analyze.events import QUEUE_EVENTS, read_events
from plugbroker.analyze.replay import COLUMNS, load_candidate, policy_checks, replay_partition
from plugbroker.analyze.spark import Progress, arrow_batches_by_rows, get_spark

ACTION_COLUMNS = (
    "at",
    "until",
    "checks",
    "job",
    "policy",
    "action",
    "vhost",
    "queue",
    "consumer_tag",
    "connection_id",
    "threshold",
    "configured",
    "measured",
    "measured_max",
    "reason",
    "outcome",
)
ACTUAL_COLUMNS = (
    "ts",
    "policy",
    "action",
    "vhost",
    "queue",
    "consumer_tag",
    "connection_id",
    "threshold",
    "configured",
    "measured",
    "outcome",
    "reason",
)


@dataclass
class BacktestResult:
    """The candidate's would-be actions and the broker's real ones, each sorted by time."""

    config: str
    periods: dict[str, float]
    actions: list[dict[str, Any]] = field(default_factory=list)
    actual: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    seconds: float = 0.0

    def disruptive(self) -> list[dict[str, Any]]:
        """The actions that would have touched a client (not ``Log``/``Spared``)."""
        return [a for a in self.actions if a["outcome"] == "applied"]

    def summary(self) -> str:
        """A text table for people: one line per would-be action, then the real ones."""
        from plugbroker.analyze.htmlreport import fmt_time

        lines = [
            f"backtest of {self.config} over {self.events:,} queue events; checks every "
            + ", ".join(f"{k} {v:g}s" for k, v in self.periods.items())
        ]
        if not self.actions:
            lines.append("the candidate's policies would have taken no action")
        else:
            lines.append(f"{len(self.actions)} action(s) the candidate would have taken:")
        for a in self.actions:
            who = f" consumer {a['consumer_tag']}" if a["consumer_tag"] else ""
            streak = (
                f" (every check until {fmt_time(a['until'])}, {a['checks']} checks)"
                if a["checks"] > 1
                else ""
            )
            measured = (
                ""
                if a["measured"] is None
                else (
                    f": {a['threshold']} measured {a['measured']:g} > configured "
                    f"{a['configured']:g}"
                )
            )
            lines.append(
                f"  {fmt_time(a['at'], True)}  {a['policy']:<10} {a['action']:<22} "
                f"{a['vhost']} {a['queue']}{who}{measured} [{a['outcome']}]{streak}"
            )
        lines.append(f"{len(self.actual)} action(s) the running broker took (from the journal)")
        for a in self.actual:
            who = f" consumer {a['consumer_tag']}" if a["consumer_tag"] else ""
            measured = (
                ""
                if a["measured"] is None
                else (
                    f": {a['threshold']} measured {a['measured']:g} > configured "
                    f"{a['configured']:g}"
                )
            )
            lines.append(
                f"  {fmt_time(a['ts'], True)}  {a['policy']:<10} {a['action']:<22} "
                f"{a['vhost']} {a['queue']}{who}{measured} [{a['outcome']}]"
            )
        return "\n".join(lines)


def backtest(
    journal: str | Path,
    config: str | Path,
    *,
    spark: Any = None,
    master: str | None = None,
    every: float | None = None,
    out: str | Path | None = None,
    partitions: int | None = None,
    quiet: bool = False,
) -> BacktestResult:
    """Replay ``journal`` against the candidate configuration file ``config``.

    :param every: check period in seconds for every policy job, instead of the periods the
        candidate configures (useful on a short recorded run).
    :param out: also write ``actions`` and ``actual`` tables (Parquet and CSV) and
        ``backtest.txt`` there.
    :param partitions: Spark tasks to spread the queues over (default: twice the parallelism).
    """
    from pyspark.sql import functions as F

    spark = spark or get_spark(master)
    progress = Progress("backtest", 4, spark=spark, quiet=quiet)
    config_path = Path(config)
    text = config_path.read_text(encoding="utf-8")

    progress.step(f"checking {config_path}")
    cfg, plugins = load_candidate(text, str(config_path))  # refuses a bad file now, located
    periods = {c.name: c.period for c in policy_checks(cfg, plugins, every)}

    progress.step(f"reading {journal}")
    events = read_events(spark, journal)
    names = Names.of(events)
    run_rows = names.runs
    if not run_rows:
        return BacktestResult(str(config_path), periods)
    start = min(r[1] for r in run_rows)
    end = max(r[2] for r in run_rows)
    sel = events.where(
        F.col("event").isin(*QUEUE_EVENTS)
        & F.col("queue").isNotNull()
        & (F.col("event") != "policy_action")
    ).select(*names.narrow_columns())
    n = partitions or max(2, spark.sparkContext.defaultParallelism * 2)
    # each queue to the task with the fewest events so far, the busiest queues first: hashing
    # the queues instead gave one task of four 57% of the events on a Zipf-like journal
    # (from Arrow: a list of tuples would become a Python RDD, and start Python workers for it)
    import pyarrow as pa

    keys = names.task_keys(spark, n)
    tasks = spark.createDataFrame(
        pa.table(
            {"q": pa.array(list(keys), pa.int64()), "p": pa.array(list(keys.values()), pa.int64())}
        )
    )
    # one 64-bit sort key (run order, then seq): Spark sorts it by radix, without comparing rows
    parted = (
        sel.join(F.broadcast(tasks), "q").repartition(n, "p").drop("p").sortWithinPartitions("k")
    )

    progress.step(f"replaying the queues in {n} task(s) against the candidate's policies")
    fn = partial(
        _replay_arrow,
        names=names,
        config_text=text,
        config_name=str(config_path),
        every=every,
        runs=run_rows,
        start=start,
        end=end,
    )
    # Arrow batches into the Python workers and JSON lines back: several times cheaper than
    # pickled Rows (the replay itself is then most of the Python time)
    with arrow_batches_by_rows(spark):
        out_rows = _collect_with_progress(spark, parted.mapInArrow(fn, "json string"), progress)
    rows = [json.loads(r["json"]) for r in out_rows]
    replayed = sum(r["events"] for r in rows if "_stats" in r)
    actions = sorted(
        (r for r in rows if "_stats" not in r),
        key=lambda a: (a["at"], a["vhost"], a["queue"], a["action"]),
    )

    progress.step("the actions the broker really took")
    actual_rows = (
        events.where(F.col("event") == "policy_action")
        .orderBy("run", "seq")
        .select(*ACTUAL_COLUMNS)
        .collect()
    )
    result = BacktestResult(str(config_path), periods, actions, [r.asDict() for r in actual_rows])
    result.events = replayed
    result.seconds = progress.elapsed
    if out is not None:
        _write(spark, result, Path(out))
    progress.say(
        f"backtest done: {len(actions)} would-be action(s), {len(result.actual)} real one(s)"
    )
    return result


#: bits of the sort key ``k`` below the run's index: the event's ``seq`` in its run
SEQ_BITS = 40
#: the columns sent to the replay as they are: the numbers the common message events carry
PLAIN_COLUMNS = ("ts", "channel_id", "message_id", "body_size", "no_ack", "due")
#: the common message events: every other event also carries :data:`EXTRA_COLUMNS`
HOT_EVENTS = ("published", "delivered", "acked")
#: the columns the other events carry, sent as one JSON text per event (``x``)
EXTRA_COLUMNS = (
    "exchange",
    "routing_key",
    "reason",
    "detail",
    "durable",
    "exclusive",
    "auto_delete",
    "count",
    "requeue",
)
#: the columns of the journal the replay never reads, sent as ``None``
UNREAD_COLUMNS = ("delivery_count",)


@dataclass
class Names:
    """The strings of every event the replay reads, sent once instead of once per event.

    Spark hands the replay's Python tasks each event as Arrow columns, at a cost per column and
    row: with the journal's 23 columns, most of the backtest's time. So the run, event, vhost,
    queue, connection and consumer tag, strings on every event, go as numbers: ``k`` (the run's
    index in time order, shifted, plus the event's ``seq``: also the one sort key), ``e`` (the
    index in ``QUEUE_EVENTS``), ``q`` (:func:`~plugbroker.analyze.events.queue_key`) and ``c``
    (:func:`~plugbroker.analyze.events.consumer_id`); the columns only the rarer events carry go
    as one JSON text (``x``, null on the common message events); and the tasks turn them back
    into the tuples :class:`~plugbroker.analyze.replay.Replayer` reads, with the tables kept
    here. ``delivery_count``, which the replay does not read, is not sent.
    """

    runs: list[tuple[str, float, float]]
    queues: dict[int, tuple[str | None, str]]
    consumers: dict[int, tuple[str | None, str | None]]
    #: events per queue key
    sizes: dict[int, int] = field(default_factory=dict)

    def task_keys(self, spark: Any, n: int) -> dict[int, int]:
        """Per queue key, the value of a partitioning column that sends the queue to one of
        ``n`` tasks (``repartition(n, column)``), so that the tasks get about as many events
        each: the busiest queue first, each to the task with the fewest events so far.

        Spark's hash partitioning puts value ``v`` in task ``pmod(hash(v), n)``; the value for
        each task is found by asking Spark that of a few small integers.
        """
        from pyspark.sql import functions as F

        found: dict[int, int] = {}
        for row in (
            spark.range(0, 64 * n + 64)
            .select("id", F.expr(f"pmod(hash(id), {n})").alias("task"))
            .collect()
        ):
            found.setdefault(row["task"], row["id"])
        load = [0] * n
        keys: dict[int, int] = {}
        for q in sorted(self.queues, key=lambda q: (-self.sizes.get(q, 0), q)):
            task = min(range(n), key=lambda t: (load[t], t not in found))
            if task not in found:  # not one of n values (never seen): let Spark hash the queue
                return {q: q for q in self.queues}
            load[task] += self.sizes.get(q, 0)
            keys[q] = found[task]
        return keys

    @classmethod
    def of(cls, events: Any) -> Names:
        """The runs (``(run, start, end)`` in time order), queues and consumers of the journal,
        in one pass over it."""
        from pyspark.sql import functions as F

        from plugbroker.analyze.events import JournalError, consumer_id, queue_key

        rows = (
            events.groupBy("run", "vhost", "queue", "connection_id", "consumer_tag")
            .agg(
                F.min("ts").alias("first"), F.max("ts").alias("last"), F.count(F.lit(1)).alias("n")
            )
            .select(
                "*",
                queue_key().alias("q"),
                consumer_id().alias("c"),
            )
            .collect()
        )
        runs: dict[str, list[float]] = {}
        queues: dict[int, tuple[str | None, str]] = {}
        consumers: dict[int, tuple[str | None, str | None]] = {}
        sizes: dict[int, int] = {}
        for r in rows:
            span = runs.setdefault(r["run"], [r["first"], r["last"]])
            span[0], span[1] = min(span[0], r["first"]), max(span[1], r["last"])
            if r["queue"] is not None:
                if queues.setdefault(r["q"], (r["vhost"], r["queue"])) != (r["vhost"], r["queue"]):
                    raise JournalError("two queue names of this journal hash to the same key")
                sizes[r["q"]] = sizes.get(r["q"], 0) + r["n"]
                who = (r["connection_id"], r["consumer_tag"])
                if consumers.setdefault(r["c"], who) != who:
                    raise JournalError("two consumers of this journal hash to the same key")
        ordered = sorted(((k, v[0], v[1]) for k, v in runs.items()), key=lambda r: r[1])
        return cls(ordered, queues, consumers, sizes)

    def narrow_columns(self) -> list[Any]:
        """The columns to select from the journal's queue events for the replay."""
        from pyspark.sql import functions as F

        from plugbroker.analyze.events import consumer_id, queue_key

        index = F.create_map(
            *[x for i, (run, _, _) in enumerate(self.runs) for x in (F.lit(run), F.lit(i))]
        )
        key = F.shiftleft(index[F.col("run")].cast("long"), SEQ_BITS) + F.col("seq")
        event = F.array_position(F.array(*[F.lit(e) for e in QUEUE_EVENTS]), F.col("event"))
        extra = F.when(~F.col("event").isin(*HOT_EVENTS), F.to_json(F.struct(*EXTRA_COLUMNS)))
        return [
            key.alias("k"),
            (event - 1).cast("byte").alias("e"),
            queue_key().alias("q"),
            consumer_id().alias("c"),
            *PLAIN_COLUMNS,
            extra.alias("x"),
        ]

    def rows(self, batches: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        """The events of Arrow record batches of :meth:`narrow_columns` as the tuples the replay
        reads (:data:`~plugbroker.analyze.replay.COLUMNS`), column by column (a column that is
        all null in a batch, as most are for the common message events, costs nothing)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        run_names = [r[0] for r in self.runs]
        qkeys = pa.array(list(self.queues), pa.int64())
        qnames = list(self.queues.values())
        vhosts = [v for v, _ in qnames]
        queues = [q for _, q in qnames]
        ckeys = pa.array(list(self.consumers), pa.int64())
        cnames = list(self.consumers.values())
        conns = [c for c, _ in cnames]
        tags = [t for _, t in cnames]
        mask = (1 << SEQ_BITS) - 1
        for batch in batches:
            n = batch.num_rows
            if not n:
                continue
            got = dict(zip(batch.schema.names, batch.columns))
            cols: dict[str, Iterable[Any]] = {
                name: repeat(None, n) if c.null_count == n else c.to_pylist()
                for name, c in ((name, got[name]) for name in PLAIN_COLUMNS)
            }
            k = got["k"]
            cols["run"] = [run_names[i] for i in pc.shift_right(k, SEQ_BITS).to_pylist()]
            cols["seq"] = pc.bit_wise_and(k, mask).to_pylist()
            cols["event"] = [QUEUE_EVENTS[i] for i in got["e"].to_pylist()]
            qi = pc.index_in(got["q"], value_set=qkeys).to_pylist()
            cols["vhost"] = [vhosts[i] for i in qi]
            cols["queue"] = [queues[i] for i in qi]
            ci = pc.index_in(got["c"], value_set=ckeys).to_pylist()
            cols["connection_id"] = [conns[i] for i in ci]
            cols["consumer_tag"] = [tags[i] for i in ci]
            x = got["x"]
            if x.null_count == n:
                cols.update((name, repeat(None, n)) for name in EXTRA_COLUMNS)
            else:
                extras = {name: [None] * n for name in EXTRA_COLUMNS}
                for i, text in enumerate(x.to_pylist()):
                    if text is not None:
                        for name, value in json.loads(text).items():
                            extras[name][i] = value
                cols.update(extras)
            cols.update((name, repeat(None, n)) for name in UNREAD_COLUMNS)
            yield from zip(*(cols[c] for c in COLUMNS))


def _replay_arrow(batches: Iterable[Any], names: Names, **kw: Any) -> Iterator[Any]:
    """A ``mapInArrow`` function: :func:`replay_partition` over the batches of one task, each
    action (and the closing count) out as one JSON string."""
    import pyarrow as pa

    out = [json.dumps(r, default=str) for r in replay_partition(names.rows(batches), **kw)]
    yield pa.RecordBatch.from_arrays([pa.array(out, pa.string())], names=["json"])


def _collect_with_progress(spark: Any, data: Any, progress: Progress) -> list[dict[str, Any]]:
    """``data.collect()``, printing how many tasks are done every few seconds while it runs."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["rows"] = data.collect()
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=run, name="backtest-collect", daemon=True)
    t.start()
    tracker = spark.sparkContext.statusTracker()
    last = ""
    while t.is_alive():
        t.join(3.0)
        if not t.is_alive():
            break
        stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        stages = [s for s in stages if s is not None]
        if stages:
            done = sum(s.numCompletedTasks for s in stages)
            total = sum(s.numTasks for s in stages)
            line = f"  replay: {done}/{total} task(s) done"
            if line != last:
                progress.say(line)
                last = line
    if "error" in result:
        raise result["error"]
    return list(result.get("rows", []))


def _write(spark: Any, result: BacktestResult, out: Path) -> None:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    out_s = str(out)
    types = {
        "at": DoubleType(),
        "until": DoubleType(),
        "checks": LongType(),
        "configured": DoubleType(),
        "measured": DoubleType(),
        "measured_max": DoubleType(),
        "ts": DoubleType(),
    }
    for name, rows, cols in (
        ("actions", result.actions, ACTION_COLUMNS),
        ("actual", result.actual, ACTUAL_COLUMNS),
    ):
        schema = StructType([StructField(c, types.get(c, StringType())) for c in cols])
        df = spark.createDataFrame(
            [tuple(_num(r.get(c), types.get(c)) for c in cols) for r in rows], schema
        )
        df.coalesce(1).write.mode("overwrite").parquet(f"{out_s}/tables/{name}")
        df.coalesce(1).write.mode("overwrite").option("header", True).csv(f"{out_s}/csv/{name}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "backtest.txt").write_text(result.summary() + "\n", encoding="utf-8")
    (out / "backtest.json").write_text(
        json.dumps(
            {
                "config": result.config,
                "periods": result.periods,
                "actions": result.actions,
                "actual": result.actual,
            },
            indent=1,
            default=str,
        )
        + "\n",
        encoding="utf-8",
    )


def _num(v: Any, t: Any) -> Any:
    if v is None or t is None:
        return v
    from pyspark.sql.types import LongType

    return int(v) if isinstance(t, LongType) else float(v)

"""``plugbroker analyze report``: what the queues and consumers did, as tables and one HTML page.

Output directory layout (on the driver's file system)::

    OUT/report.html            self-contained page (inline SVG plots, no scripts, no downloads)
    OUT/overview.json          event counts, time span, runs, drops, overall percentiles
    OUT/tables/<name>.parquet  each table as Parquet
    OUT/csv/<name>.csv         the same table as CSV with a header

Tables: ``queues`` (per-queue totals, rates, ack latency percentiles, peak backlog and age),
``consumers`` (the same per consumer), ``series`` (per queue and time bucket: event counts,
messages and bytes held, oldest message age), ``processing_time`` (histogram of delivery-to-ack
times per queue), ``dead_letters`` (dead-lettered and dropped messages by reason),
``redeliveries`` (by reason), ``policy_actions`` (every policy action, isolation and release).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from plugbroker.analyze.events import (
    BROADCAST_ROWS,
    LATENCY_BOUNDS,
    MESSAGE_EVENTS,
    backlog_series,
    backlog_steps,
    bucket_counts,
    consumer_id,
    fine_code,
    hard_pair,
    latency_bucket,
    latency_label,
    lifecycles,
    message_facts,
    nice_step,
    paired_events,
    queue_bucket_counts,
    queue_key,
    queue_names,
    read_events,
    runs,
    simple_pair,
    span,
)
from plugbroker.analyze.htmlreport import subscription_label
from plugbroker.analyze.spark import Progress, Scratch, get_spark, run_together

TABLES = (
    "queues",
    "consumers",
    "series",
    "processing_time",
    "dead_letters",
    "redeliveries",
    "policy_actions",
)
STEPS = 10
FATE_EVENTS = ("dead_lettered", "dropped", "redelivered")
FATE_SCHEMA = pa.schema(
    [
        ("vhost", pa.string()),
        ("queue", pa.string()),
        ("event", pa.string()),
        ("reason", pa.string()),
        pa.field("count", pa.int64(), nullable=False),
    ]
)
ACTION_EVENTS = ("policy_action", "consumer_isolated", "consumer_released")
#: the events the report reads row by row, in one pass (the rest it only counts, the fates by
#: reason): so few that Parquet skips, by its dictionaries, the row groups that hold none
RARE_EVENTS = (*ACTION_EVENTS, "queue_bound", "queue_deleted", "consumer_removed")
#: the policy_actions table's columns
ACTION_COLUMNS = (
    "ts",
    "event",
    "vhost",
    "queue",
    "policy",
    "action",
    "consumer_tag",
    "connection_id",
    "threshold",
    "configured",
    "measured",
    "outcome",
    "reason",
    "count",
)


@dataclass
class ReportResult:
    """What :func:`report` produced: where, and the small tables it collected for the page."""

    out: Path
    html: Path
    overview: dict[str, Any]
    queues: list[dict[str, Any]] = field(default_factory=list)
    consumers: list[dict[str, Any]] = field(default_factory=list)
    policy_actions: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def report(
    journal: str | Path,
    out: str | Path,
    *,
    spark: Any = None,
    master: str | None = None,
    top: int = 12,
    buckets: int = 240,
    quiet: bool = False,
    write_csv: bool = True,
    scratch: str | None = None,
) -> ReportResult:
    """Compute every table from the journal at ``journal``, write them and the page to ``out``.

    The heavy lifting (lifecycles, pairing, percentiles, aggregations) runs in Spark; the
    results, which are aggregates, come back to the driver as Arrow tables and are written there
    (``out`` is a directory on the driver's file system).

    :param top: how many of the busiest queues get plots on the page (tables list every queue).
    :param buckets: about how many time buckets the series has (the width is a round number).
    :param scratch: a directory for intermediate results, shared by every executor (see
        :class:`plugbroker.analyze.spark.Scratch`); a temporary one in local mode.
    """
    from pyspark.sql import functions as F

    spark = spark or get_spark(master)
    out = Path(out)
    progress = Progress("report", STEPS, spark=spark, quiet=quiet)

    progress.step(f"reading {journal}")
    events = read_events(spark, journal)
    t0, t1 = span(events, journal)
    step = nice_step(max(t1 - t0, 1e-3), buckets)

    with Scratch(spark, scratch) as work:
        progress.step("following each message; counting events; reading the rare ones")
        # three passes over the journal, run side by side (see run_together), each followed by
        # what needs only its result, so that both cores stay busy until all is done:
        #
        # * everything the report needs of each message (one shuffle: lifecycles, backlog
        #   steps, most processing times), then the messages that need their deliveries and
        #   acks paired event by event. The lifecycles need the runs' bounds (from the footers
        #   of a local journal) and the queue deletions (a narrow pass of their own);
        # * the counts (the overview, the series' event counts, the consumers' figures and the
        #   dead letters, drops and redeliveries by reason all come out of them);
        # * the rare events: bindings, deletions, policy actions, consumer removals (grouped and
        #   sorted here on the driver).
        life = lifecycles(message_facts(events), events, runs(events, journal), keep=PAIR_COLUMNS)

        def follow() -> tuple[pa.Table, pa.Table]:
            one = _per_message(life, t0, step).toArrow()
            hard = one.filter(pc.equal(one.column("tag"), 2)).select(["q", "k1"])
            hard = hard.rename_columns(["q", "message_id"])
            # (a shuffle join when there are too many keys to send every task)
            small = hard.num_rows <= BROADCAST_ROWS
            acked = paired_events(events, spark.createDataFrame(hard), small)
            paired = (
                acked.where(F.col("kind") == "acked")
                .groupBy(
                    "q",
                    "consumer",
                    latency_bucket(F.col("latency")).alias("bucket"),
                    fine_code(F.col("latency")).alias("code"),
                )
                .agg(F.count(F.lit(1)).alias("n"), F.max("latency").alias("vmax"))
                .toArrow()
            )
            return one, paired

        def count() -> tuple[list[Any], pa.Table, pa.Table, pa.Table, pa.Table]:
            counts = work.materialize(bucket_counts(events, t0, step, FATE_EVENTS), "counts")
            rows, names, per_bucket, per_consumer, fates = run_together(
                lambda: _overview_rows(counts),
                lambda: queue_names(counts),
                lambda: queue_bucket_counts(counts=counts).toArrow(),
                lambda: _consumer_counts(counts).toArrow(),
                lambda: (
                    counts.where(F.col("event").isin(*FATE_EVENTS))
                    .groupBy("vhost", "queue", "event", "reason")
                    .agg(F.sum("n").alias("count"))
                    .toArrow()
                ),
            )
            return rows, names, per_bucket, per_consumer, fates

        (one, paired), (overview_rows, names, per_bucket, consumer_counts, fates), rare = (
            run_together(
                follow,
                count,
                lambda: (
                    events.where(F.col("event").isin(*RARE_EVENTS))
                    .select("run", "seq", "exchange", "routing_key", *ACTION_COLUMNS)
                    .toArrow()
                ),
                lead=True,
            )
        )
        overview, run_rows = _overview(overview_rows)
        overview["bucket_seconds"] = step
        progress.say(
            f"  {overview['events']:,} events, {len(run_rows)} run(s), "
            f"{t1 - t0:.1f} s of traffic, buckets of {step:g} s"
        )
        kind = rare.column("event")
        tag = one.column("tag")
        deltas = one.filter(pc.equal(tag, 0)).select(["q", "k1", "dn", "db", "arr"])
        deltas = deltas.rename_columns(["q", "bucket", "dn", "db", "min_arrival_ending"])
        simple = one.filter(pc.equal(tag, 1)).select(["q", "k1", "k2", "k3", "n", "vmax"])
        simple = simple.rename_columns(["q", "consumer", "bucket", "code", "n", "vmax"])

        progress.step("backlog and oldest-message age over time")
        series = backlog_series(deltas, per_bucket, t0, step)
        series = _sorted(_named(series, names), "vhost", "queue", "bucket")
        fine = (
            pa.concat_tables([simple, paired.cast(simple.schema)])
            .group_by(["q", "consumer", "bucket", "code"], use_threads=False)
            .aggregate([("n", "sum"), ("vmax", "max")])
            .rename_columns(["q", "consumer", "bucket", "code", "n", "vmax"])
        )
        lat_q = _named(latency_figures(fine, ["q"]), names)

        progress.step("per-queue figures")
        queues = _queues(series, lat_q, t0, step)

        progress.step("per-consumer figures")
        lat_c = latency_figures(fine, ["q", "consumer"])
        consumers = _consumers(consumer_counts, _removed(rare), lat_c)

        progress.step("processing-time distribution")
        hist = _sorted(_named(_histogram(fine), names), "vhost", "queue", "bucket")
        overview["latency"] = latency_figures(fine, []).to_pylist()[0]

    progress.step("dead letters, drops and redeliveries by reason")
    fate = fates.cast(FATE_SCHEMA)
    # as Spark orders: the most frequent first, then by vhost and queue, a missing one first
    fate = _sorted(fate, ("count", "descending"), "vhost", "queue")
    is_redel = pc.equal(fate.column("event"), "redelivered")
    dead = fate.filter(pc.invert(is_redel)).rename_columns(
        ["vhost", "queue", "outcome", "reason", "count"]
    )
    redel = fate.filter(is_redel).drop_columns(["event"])

    progress.step("policy actions")
    actions = (
        rare.filter(pc.is_in(kind, value_set=pa.array(ACTION_EVENTS)))
        .sort_by([("run", "ascending"), ("seq", "ascending")])
        .select(list(ACTION_COLUMNS))
    )

    # what each queue is bound to: a server-named subscription queue is labelled by it
    bound = rare.filter(pc.and_(pc.equal(kind, "queue_bound"), pc.is_valid(rare.column("queue"))))
    bindings: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for v, q, x, k in sorted(
        set(
            zip(
                *(
                    bound.column(c).to_pylist()
                    for c in ("vhost", "queue", "exchange", "routing_key")
                )
            )
        ),
        key=lambda row: [(c is not None, c or "") for c in row],
    ):
        bindings.setdefault((v, q), []).append((x or "", k or ""))
    queues = queues.append_column(
        "bindings",
        pa.array(
            [
                subscription_label(bindings.get((v, q), [])) or None
                for v, q in zip(
                    queues.column("vhost").to_pylist(), queues.column("queue").to_pylist()
                )
            ],
            pa.string(),
        ),
    )

    progress.step("writing the tables")
    tables = {
        "queues": queues,
        "consumers": consumers,
        "series": series,
        "processing_time": hist,
        "dead_letters": dead,
        "redeliveries": redel,
        "policy_actions": actions,
    }
    for name, tbl in tables.items():
        _write(tbl, out, name, write_csv)

    progress.step("writing the HTML page")
    result = ReportResult(out=out, html=out / "report.html", overview=overview)
    result.queues = queues.to_pylist()
    result.consumers = consumers.slice(0, 2000).to_pylist()
    result.policy_actions = actions.slice(0, 2000).to_pylist()
    result.dead_letters = dead.slice(0, 500).to_pylist()
    overview["queues"] = len(result.queues)
    overview["consumers"] = consumers.num_rows
    busiest = [
        (q["vhost"], q["queue"])
        for q in sorted(
            result.queues, key=lambda q: -((q["published"] or 0) + (q["delivered"] or 0))
        )[:top]
    ]
    wanted = pa.array([f"{v}\u0000{q}" for v, q in busiest], pa.string())

    def pick(tbl: pa.Table) -> list[dict[str, Any]]:
        keys = pc.binary_join_element_wise(tbl.column("vhost"), tbl.column("queue"), "\u0000")
        return tbl.filter(pc.is_in(keys, value_set=wanted)).to_pylist()

    from plugbroker.analyze.htmlreport import render

    html = render(
        journal=str(journal),
        overview=overview,
        queues=result.queues,
        consumers=result.consumers,
        series=pick(series),
        histograms=pick(hist),
        busiest=busiest,
        dead_letters=result.dead_letters,
        redeliveries=redel.slice(0, 500).to_pylist(),
        actions=result.policy_actions,
        step=step,
        t0=t0,
        t1=t1,
        bindings=bindings,
    )
    result.html.write_text(html, encoding="utf-8")
    (out / "overview.json").write_text(json.dumps(overview, indent=2, default=str) + "\n")
    result.seconds = progress.elapsed
    progress.say(f"report written to {out} ({result.html.name}, tables/, csv/)")
    return result


def _queues(series: pa.Table, lat_q: pa.Table, t0: float, step: float) -> pa.Table:
    """Per-queue totals from the series (counts summed, peaks), joined with the latencies."""
    aggs = [(e, "sum") for e in MESSAGE_EVENTS] + [
        ("acked", "max"),
        ("published", "max"),
        ("messages", "max"),
        ("bytes", "max"),
        ("oldest_age", "max"),
        ("bucket", "min"),
        ("bucket", "max"),
    ]
    sums = series.group_by(["vhost", "queue"]).aggregate(aggs).to_pylist()
    lat = {(r["vhost"], r["queue"]): r for r in lat_q.to_pylist()}
    rows = []
    for s in sums:
        active = (s["bucket_max"] - s["bucket_min"] + 1) * step
        la = lat.get((s["vhost"], s["queue"]), {})
        row: dict[str, Any] = {"vhost": s["vhost"], "queue": s["queue"]}
        row.update({e: int(s[f"{e}_sum"] or 0) for e in MESSAGE_EVENTS})
        row.update(
            {
                "ack_rate": row["acked"] / active,
                "peak_ack_rate": (s["acked_max"] or 0) / step,
                "publish_rate": row["published"] / active,
                "latency_p50": la.get("latency_p50"),
                "latency_p95": la.get("latency_p95"),
                "latency_p99": la.get("latency_p99"),
                "latency_max": la.get("latency_max"),
                "max_messages": int(s["messages_max"] or 0),
                "max_bytes": int(s["bytes_max"] or 0),
                "max_oldest_age": float(s["oldest_age_max"] or 0.0),
                "first_ts": t0 + s["bucket_min"] * step,
                "last_ts": t0 + (s["bucket_max"] + 1) * step,
            }
        )
        rows.append(row)
    rows.sort(key=lambda r: (-r["published"], r["vhost"], r["queue"]))
    schema = pa.schema(
        [
            ("vhost", pa.string()),
            ("queue", pa.string()),
            *[(e, pa.int64()) for e in MESSAGE_EVENTS],
            *[
                (c, pa.float64())
                for c in (
                    "ack_rate",
                    "peak_ack_rate",
                    "publish_rate",
                    "latency_p50",
                    "latency_p95",
                    "latency_p99",
                    "latency_max",
                )
            ],
            ("max_messages", pa.int64()),
            ("max_bytes", pa.int64()),
            ("max_oldest_age", pa.float64()),
            ("first_ts", pa.float64()),
            ("last_ts", pa.float64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


#: the percentiles of the latency figures: (column, percent)
PERCENTILES = (("latency_p50", 50), ("latency_p95", 95), ("latency_p99", 99))


def latency_figures(fine: pa.Table, keys: list[str]) -> pa.Table:
    """Per ``keys`` (none: one row for all), ``latency_p50``/``_p95``/``_p99``, ``latency_max``
    and ``latency_n`` from the fine counts (``code``, ``n``, ``vmax`` per key and code; see
    :func:`~plugbroker.analyze.events.fine_code`).

    A percentile p is the longest latency in the fine bucket that holds the ceil(p x n)-th
    smallest one: an observed value, within 0.2% of the exact percentile. The maximum is exact.
    Done here on the driver: the counts are per queue, consumer and fine bucket, not per message.
    """
    if fine.num_rows:
        g = fine.group_by([*keys, "code"], use_threads=False).aggregate(
            [("n", "sum"), ("vmax", "max")]
        )
        g = g.sort_by([(k, "ascending") for k in (*keys, "code")])
    else:
        g = pa.table({k: pa.array([], pa.int64()) for k in (*keys, "n_sum")}).append_column(
            "vmax_max", pa.array([], pa.float64())
        )
    counts = g.column("n_sum").to_numpy()
    values = g.column("vmax_max").to_numpy()
    if keys:
        change = np.zeros(len(counts), dtype=bool)
        for k in keys:
            col = g.column(k).to_numpy()
            change[1:] |= col[1:] != col[:-1]
        starts = [0, *np.flatnonzero(change[1:]) + 1] if len(counts) else []
    else:
        starts = [0]
    rows: dict[str, list[Any]] = {k: [] for k in keys}
    out: dict[str, list[Any]] = {c: [] for c, _ in PERCENTILES}
    out["latency_max"], out["latency_n"] = [], []
    ends = [*starts[1:], len(counts)]
    for s, e in zip(starts, ends):
        for k in keys:
            rows[k].append(g.column(k)[s].as_py())
        cum = np.cumsum(counts[s:e])
        total = int(cum[-1]) if e > s else 0
        for col, pct in PERCENTILES:
            if total == 0:
                out[col].append(None)
                continue
            rank = max(1, -(-total * pct // 100))  # ceil, in integers
            out[col].append(float(values[s + int(np.searchsorted(cum, rank))]))
        out["latency_max"].append(float(values[s:e].max()) if total else None)
        out["latency_n"].append(total)
    return pa.table(
        {
            **{k: pa.array(rows[k], g.schema.field(k).type) for k in keys},
            **{c: pa.array(out[c], pa.float64()) for c, _ in PERCENTILES},
            "latency_max": pa.array(out["latency_max"], pa.float64()),
            "latency_n": pa.array(out["latency_n"], pa.int64()),
        }
    )


def _histogram(fine: pa.Table) -> pa.Table:
    """The processing-time histogram per queue (``q``) from the fine counts."""
    g = fine.group_by(["q", "bucket"], use_threads=False).aggregate([("n", "sum")])
    buckets = g.column("bucket").to_pylist()
    return pa.table(
        {
            "q": g.column("q"),
            "bucket": g.column("bucket").cast(pa.int32()),
            "count": g.column("n_sum").cast(pa.int64()),
            "label": pa.array([latency_label(b) for b in buckets], pa.string()),
            "upper_s": pa.array(
                [float((*LATENCY_BOUNDS, float("inf"))[b]) for b in buckets], pa.float64()
            ),
        }
    )


def _overview_rows(counts: Any) -> list[Any]:
    """Per run and event, from :func:`bucket_counts`: how many, the first and last, the drops
    and the schema version (Spark rows, collected)."""
    from pyspark.sql import functions as F

    return (
        counts.groupBy("run", "event")
        .agg(
            F.sum("n").alias("n"),
            F.min("first_ts").alias("start"),
            F.max("last_ts").alias("end"),
            F.sum("dropped").alias("dropped"),
            F.max("version").alias("version"),
        )
        .collect()
    )


def _overview(rows: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Event counts, time span, drops and runs, from :func:`_overview_rows`."""
    if not rows:
        from plugbroker.analyze.events import JournalError

        raise JournalError("the journal holds no events")
    by_event: dict[str, int] = {}
    per_run: dict[str, dict[str, Any]] = {}
    for r in rows:
        by_event[r["event"]] = by_event.get(r["event"], 0) + r["n"]
        run = per_run.setdefault(
            r["run"], {"run": r["run"], "run_start": r["start"], "run_end": r["end"], "events": 0}
        )
        run["run_start"] = min(run["run_start"], r["start"])
        run["run_end"] = max(run["run_end"], r["end"])
        run["events"] += r["n"]
    runs_ = sorted(per_run.values(), key=lambda r: r["run_start"])
    for r in runs_:
        r["last"] = r is runs_[-1]
    overview = {
        "events": sum(by_event.values()),
        "by_event": dict(sorted(by_event.items(), key=lambda kv: -kv[1])),
        "start": min(r["start"] for r in rows),
        "end": max(r["end"] for r in rows),
        "dropped": int(sum(r["dropped"] or 0 for r in rows)),
        "schema_version": max(r["version"] or 0 for r in rows),
        "runs": runs_,
    }
    return overview, runs_


#: what :func:`_per_message` needs of :func:`~plugbroker.analyze.events.message_facts` beyond
#: the lifecycle
PAIR_COLUMNS = (
    "settlements",
    "delivered_at",
    "delivered_chan",
    "settled_at",
    "settled_chan",
    "settled_by",
    "settle_kind",
)


def _per_message(life: Any, t0: float, step: float) -> Any:
    """Everything the report needs of each message, from one pass over its lifecycle (with
    :data:`PAIR_COLUMNS`), summed in one aggregation: rows tagged

    * 0: per ``q`` and bucket (``k1``), the backlog's steps (``dn``, ``db``, and ``arr``, the
      earliest arrival of the messages ending in the bucket; see
      :func:`~plugbroker.analyze.events.backlog_steps`);
    * 1: per ``q``, consumer (``k1``), histogram bucket (``k2``) and fine code (``k3``), the
      acks of messages delivered and acked once (``n``) and the longest (``vmax``);
    * 2: the messages (``q``, ``k1`` = ``message_id``) delivered or settled more than that,
      paired event by event afterwards (:func:`~plugbroker.analyze.events.paired_events`).

    One aggregation instead of writing the per-message rows out and reading them twice.
    """
    from pyspark.sql import functions as F

    def item(tag: int, k1: Any, k2: Any = None, k3: Any = None, **sums: Any) -> Any:
        return F.struct(
            F.lit(tag).alias("tag"),
            k1.cast("long").alias("k1"),
            (F.lit(None) if k2 is None else k2).cast("int").alias("k2"),
            (F.lit(None) if k3 is None else k3).cast("int").alias("k3"),
            sums.get("dn", F.lit(None)).cast("long").alias("dn"),
            sums.get("db", F.lit(None)).cast("long").alias("db"),
            sums.get("arr", F.lit(None)).cast("double").alias("arr"),
            sums.get("lat", F.lit(None)).cast("double").alias("lat"),
        )

    steps = backlog_steps(t0, step)
    arrive, end = steps[0], steps[1]
    lat = F.col("settled_at") - F.col("delivered_at")
    items = F.array(
        # (none for a message that arrives and ends in the same bucket: see backlog_steps)
        F.when(
            arrive.isNotNull(),
            item(0, arrive["bucket"], dn=arrive["dn"], db=arrive["db"], arr=arrive["arr"]),
        ),
        F.when(end.isNotNull(), item(0, end["bucket"], dn=end["dn"], db=end["db"], arr=end["arr"])),
        F.when(
            simple_pair() & (F.col("settle_kind") == 2),
            item(1, F.col("settled_by"), latency_bucket(lat), fine_code(lat), lat=lat),
        ),
        F.when(hard_pair(), item(2, F.col("message_id"))),
    )
    return (
        life.select("q", F.explode(items).alias("s"))
        .where(F.col("s").isNotNull())
        .select("q", "s.*")
        .groupBy("tag", "q", "k1", "k2", "k3")
        .agg(
            F.sum("dn").alias("dn"),
            F.sum("db").alias("db"),
            F.min("arr").alias("arr"),
            F.count("lat").alias("n"),
            F.max("lat").alias("vmax"),
        )
    )


def _named(tbl: pa.Table, names: pa.Table) -> pa.Table:
    """``tbl`` keyed by ``q`` with the queue's ``vhost`` and ``queue`` in its place (first)."""
    joined = tbl.join(names, "q", join_type="inner")
    return joined.select(["vhost", "queue", *(c for c in tbl.column_names if c != "q")])


def _sorted(tbl: pa.Table, *keys: str | tuple[str, str]) -> pa.Table:
    """``tbl`` sorted by ``keys`` (a name for ascending, or ``(name, "descending")``), a missing
    value first, as Spark's ``orderBy`` does. Small results are sorted here: a Spark sort would
    run its whole plan twice (once to sample the range boundaries)."""
    order: list[tuple[str, str]] = []
    for i, key in enumerate(keys):
        name, direction = (key, "ascending") if isinstance(key, str) else key
        flag = f"_valid{i}"
        tbl = tbl.append_column(flag, pc.is_valid(tbl.column(name)))
        order += [(flag, "ascending"), (name, direction)]
    return tbl.sort_by(order).drop_columns([f"_valid{i}" for i in range(len(keys))])


def _removed(rare: pa.Table) -> pa.Table:
    """Per consumer, when it was last removed and why, from the rare events."""
    key = ["vhost", "queue", "connection_id", "consumer_tag"]
    rem = (
        rare.filter(pc.equal(rare.column("event"), "consumer_removed"))
        .select([*key, "reason", "ts", "run", "seq"])
        .sort_by([("ts", "ascending"), ("run", "ascending"), ("seq", "ascending")])
    )
    last = pc.ScalarAggregateOptions(skip_nulls=False)
    got = rem.group_by(key, use_threads=False).aggregate([("reason", "last", last), ("ts", "max")])
    return pa.table(
        {
            **{k: got.column(k) for k in key},
            "removed_reason": got.column("reason_last"),
            "removed_ts": got.column("ts_max"),
        }
    )


#: a consumer's identity in the tables
CONSUMER_KEY = ["vhost", "queue", "connection_id", "consumer_tag"]


def _consumer_counts(bucketed: Any) -> Any:
    """Per consumer, from :func:`~plugbroker.analyze.events.bucket_counts` (``bucketed``): its
    deliveries, acks, rejects, isolations, settings and times, with its ``q`` and ``consumer``
    keys (a DataFrame)."""
    from pyspark.sql import functions as F

    ev = F.col("event")
    base = bucketed.where(
        F.col("consumer_tag").isNotNull()
        & ev.isin("delivered", "acked", "rejected", "consumer_added", "consumer_isolated")
    )

    def n(e: str) -> Any:
        return F.sum(F.when(ev == e, F.col("n")).otherwise(0))

    return (
        base.groupBy(*CONSUMER_KEY)
        .agg(
            n("delivered").alias("delivered"),
            n("acked").alias("acked"),
            n("rejected").alias("rejected"),
            F.sum("requeued").alias("requeued"),
            n("consumer_isolated").alias("isolated"),
            F.max(F.when(ev == "consumer_added", F.col("no_ack"))).alias("no_ack"),
            F.max(F.when(ev == "consumer_added", F.col("prefetch"))).alias("prefetch"),
            F.min("first_ts").alias("first_ts"),
            F.max("last_ts").alias("last_ts"),
            F.max(F.when(ev.isin("acked", "rejected"), F.col("last_ts"))).alias("last_ack_ts"),
        )
        .withColumn("consumer", consumer_id())
        .withColumn("q", queue_key())
    )


def _consumers(counts: pa.Table, removed: pa.Table, lat: pa.Table) -> pa.Table:
    """The consumers table: :func:`_consumer_counts`, when each consumer was removed
    (:func:`_removed`) and its processing times (:func:`latency_figures` per ``q`` and
    ``consumer``), joined here on the driver (one row per consumer)."""
    lat = lat.select(["q", "consumer", *(c for c, _ in PERCENTILES), "latency_max"])
    table = counts.join(lat, ["q", "consumer"], join_type="left outer", use_threads=False)
    table = table.join(removed, CONSUMER_KEY, join_type="left outer", use_threads=False)
    until = pc.coalesce(table.column("removed_ts"), table.column("last_ts"))
    span = pc.max_element_wise(pc.subtract(until, table.column("first_ts")), 1e-3)
    ack_rate = pc.divide(table.column("acked").cast(pa.float64()), span)
    table = table.append_column("ack_rate", ack_rate)
    table = table.select(
        [
            *CONSUMER_KEY,
            "delivered",
            "acked",
            "rejected",
            "requeued",
            "ack_rate",
            *(c for c, _ in PERCENTILES),
            "latency_max",
            "isolated",
            "no_ack",
            "prefetch",
            "first_ts",
            "last_ts",
            "last_ack_ts",
            "removed_reason",
        ]
    )
    return _sorted(
        table, "vhost", "queue", ("delivered", "descending"), "connection_id", "consumer_tag"
    )


def _write(tbl: pa.Table, out: Path, name: str, write_csv: bool) -> None:
    (out / "tables").mkdir(parents=True, exist_ok=True)
    pq.write_table(tbl, out / "tables" / f"{name}.parquet")
    if write_csv:
        (out / "csv").mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(tbl, out / "csv" / f"{name}.csv")

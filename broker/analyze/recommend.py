"""``plugbroker analyze recommend``: thresholds from what the journal shows, as ready XML.

For each queue with enough traffic:

* ``<isolation><ackTimeout>``, for shared queues that had two or more consumers: well above the
  normal processing time, as the TDMQ design advises ("significantly longer than the standard
  business consumption time ... a minimum of 5 minutes is recommended"):
  ``max(min_ack_timeout, ack_factor x p99.9 of the processing time)``, rounded up;
* ``<consumer>`` thresholds from the backlog it really had: ``depth``, ``messageCount`` and
  ``messageAge`` at ``headroom`` times the largest seen (with floors, so a queue that never held
  anything does not get a hair trigger), rounded up, with ``<policy name="Log"/>``: a dry run,
  to be switched to ``Delete`` once a backtest shows whom it would hit.

Topic subscriptions (server-named, exclusive or auto-delete queues bound to a topic exchange)
are grouped by binding key into one ``<topic key>`` each; other queues get a ``<queue name>``.
The snippet is a ``<virtualhost>`` element per vhost, which validates against
``config/plugbroker.xsd`` when put inside ``<broker>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from broker.analyze.events import (
    backlog_series,
    lifecycles,
    message_facts,
    nice_step,
    read_events,
    runs,
    settlements,
)
from broker.analyze.spark import Progress, Scratch, get_spark
from broker.config import DEFAULT_TOPIC_EXCHANGE
from broker.config.units import format_duration

NICE_DURATIONS = (
    1,
    2,
    5,
    10,
    15,
    20,
    30,
    45,
    60,
    90,
    120,
    180,
    300,
    600,
    900,
    1200,
    1800,
    2700,
    3600,
    7200,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
)


@dataclass
class QueueFigures:
    vhost: str
    queue: str
    acked: int = 0
    p50: float | None = None
    p99: float | None = None
    p999: float | None = None
    latency_max: float | None = None
    max_messages: int = 0
    max_bytes: int = 0
    max_age: float = 0.0
    consumers: int = 0
    subscription: str = "shared"
    exclusive: bool = False
    auto_delete: bool = False
    topic_bindings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def is_subscription(self) -> bool:
        return bool(self.topic_bindings) and (
            self.exclusive or self.auto_delete or self.queue.startswith("amq.gen-")
        )


@dataclass
class Recommendation:
    xml: str
    queues: list[QueueFigures]
    settings: dict[str, Any]

    def __str__(self) -> str:
        return self.xml


def nice_count(v: float, floor: int) -> int:
    v = max(v, floor)
    exp = 10 ** max(0, math.floor(math.log10(v)))
    for m in (1, 2, 5, 10):
        if m * exp >= v:
            return int(m * exp)
    return int(10 * exp)


def nice_seconds(v: float, floor: float) -> float:
    v = max(v, floor)
    for s in NICE_DURATIONS:
        if s >= v:
            return float(s)
    return float(86400 * math.ceil(v / 86400))


def nice_size(v: float, floor: int) -> str:
    v = max(v, floor)
    for unit, scale in (("", 1), ("KB", 1024), ("MB", 1024**2), ("GB", 1024**3)):
        for m in (1, 2, 5, 10, 20, 50, 100, 200, 500):
            if m * scale >= v:
                return f"{m}{unit}"
    return f"{math.ceil(v / 1024**3)}GB"


def recommend(
    journal: str | Path,
    *,
    spark: Any = None,
    master: str | None = None,
    headroom: float = 2.0,
    ack_factor: float = 10.0,
    min_ack_timeout: float = 300.0,
    min_samples: int = 20,
    quiet: bool = False,
    policy: str = "Log",
    scratch: str | None = None,
) -> Recommendation:
    """Propose ``<queue>``/``<topic>`` settings from the journal at ``journal``."""
    from pyspark.sql import functions as F

    spark = spark or get_spark(master)
    progress = Progress("recommend", 4, spark=spark, quiet=quiet)
    progress.step(f"reading {journal}")
    events = read_events(spark, journal)
    run_table = runs(events).cache()
    bounds = run_table.agg(F.min("run_start"), F.max("run_end")).collect()[0]
    t0, t1 = float(bounds[0]), float(bounds[1])
    step = nice_step(max(t1 - t0, 1e-3), 240)

    with Scratch(spark, scratch) as work:
        progress.step("processing times")
        facts = work.materialize(message_facts(events), "facts")
        pairs = settlements(events, facts).where(F.col("kind") == "acked")
        lat = {
            (r["vhost"], r["queue"]): r
            for r in pairs.groupBy("vhost", "queue")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.percentile_approx("latency", [0.5, 0.99, 0.999], 10000).alias("q"),
                F.max("latency").alias("max"),
            )
            .collect()
        }

        progress.step("backlogs")
        life = lifecycles(facts, events, run_table)
        series = backlog_series(events, life, t0, step)
        backlog = {
            (r["vhost"], r["queue"]): r
            for r in series.groupBy("vhost", "queue")
            .agg(
                F.max("messages").alias("messages"),
                F.max("bytes").alias("bytes"),
                F.max("oldest_age").alias("age"),
            )
            .collect()
        }

    progress.step("queues, bindings and consumers")
    ev = F.col("event")
    topo = events.where(
        ev.isin("queue_declared", "queue_bound", "consumer_added") & F.col("queue").isNotNull()
    )
    info = {
        (r["vhost"], r["queue"]): r
        for r in topo.groupBy("vhost", "queue")
        .agg(
            F.max_by(
                F.when(ev == "queue_declared", F.col("detail")),
                F.when(ev == "queue_declared", F.col("ts")),
            ).alias("subscription"),
            F.max(F.when(ev == "queue_declared", F.col("exclusive"))).alias("exclusive"),
            F.max(F.when(ev == "queue_declared", F.col("auto_delete"))).alias("auto_delete"),
            F.countDistinct(
                F.when(ev == "consumer_added", F.concat_ws("|", "connection_id", "consumer_tag"))
            ).alias("consumers"),
            F.collect_set(
                F.when(
                    (ev == "queue_bound") & (F.col("detail") == "topic"),
                    F.struct("exchange", "routing_key"),
                )
            ).alias("topics"),
        )
        .collect()
    }
    run_table.unpersist()

    figures: list[QueueFigures] = []
    for key in sorted(set(lat) | set(backlog) | set(info)):
        la, bl, inf = lat.get(key), backlog.get(key), info.get(key)
        f = QueueFigures(vhost=key[0], queue=key[1])
        if la is not None:
            f.acked = int(la["n"])
            f.p50, f.p99, f.p999 = (float(x) for x in la["q"])
            f.latency_max = float(la["max"])
        if bl is not None:
            f.max_messages = int(bl["messages"] or 0)
            f.max_bytes = int(bl["bytes"] or 0)
            f.max_age = float(bl["age"] or 0.0)
        if inf is not None:
            f.subscription = inf["subscription"] or "shared"
            f.exclusive = bool(inf["exclusive"])
            f.auto_delete = bool(inf["auto_delete"])
            f.consumers = int(inf["consumers"] or 0)
            f.topic_bindings = sorted((t["exchange"], t["routing_key"]) for t in inf["topics"])
        figures.append(f)
    settings = {
        "headroom": headroom,
        "ack_factor": ack_factor,
        "min_ack_timeout": min_ack_timeout,
        "min_samples": min_samples,
        "policy": policy,
        "journal": str(journal),
        "start": t0,
        "end": t1,
    }
    xml = render_xml(figures, settings)
    progress.say(f"recommendations for {len(figures)} queue(s)")
    return Recommendation(xml, figures, settings)


def _consumer_xml(
    max_messages: int, max_bytes: int, max_age: float, headroom: float, policy: str, indent: str
) -> str:
    count = nice_count(headroom * max_messages, 100)
    depth = nice_size(headroom * max_bytes, 1024 * 1024)
    age = format_duration(nice_seconds(headroom * max_age, 60.0))
    return (
        f"{indent}<consumer>\n"
        f"{indent}  <depth>{depth}</depth>\n"
        f"{indent}  <messageAge>{age}</messageAge>\n"
        f"{indent}  <messageCount>{count}</messageCount>\n"
        f"{indent}  <policy name={quoteattr(policy)}/>\n"
        f"{indent}</consumer>\n"
    )


def _ms(v: float | None) -> str:
    from broker.analyze.htmlreport import fmt_dur

    return fmt_dur(v)


def render_xml(figures: list[QueueFigures], settings: dict[str, Any]) -> str:
    from broker.analyze.htmlreport import fmt_time

    headroom = settings["headroom"]
    policy = settings["policy"]
    out = [
        (
            f"<!-- plugbroker analyze recommend: {escape(settings['journal'])}, "
            f"{fmt_time(settings['start'], True)} to {fmt_time(settings['end'], True)}; "
            f"thresholds at {headroom:g}x the largest backlog seen, ackTimeout at "
            f"{settings['ack_factor']:g}x the p99.9 processing time (at least "
            f"{format_duration(settings['min_ack_timeout'])}). policy {policy}: a dry run; "
            f"backtest, then switch to Delete. -->\n"
        )
    ]
    by_vhost: dict[str, list[QueueFigures]] = {}
    for f in figures:
        by_vhost.setdefault(f.vhost, []).append(f)
    for vhost, qs in by_vhost.items():
        out.append(f"<virtualhost name={quoteattr(vhost)}>\n")
        topics: dict[tuple[str, str], list[QueueFigures]] = {}
        for f in qs:
            if f.is_subscription:
                for ex, key in f.topic_bindings:
                    topics.setdefault((ex, key), []).append(f)
                continue
            if f.acked < settings["min_samples"] and not f.max_messages:
                out.append(
                    f"  <!-- {escape(f.queue)}: {f.acked} ack(s), too little traffic "
                    "to recommend anything -->\n"
                )
                continue
            out.append(
                f"  <!-- {escape(f.queue)}: {f.acked:,} acks, processing time p50 "
                f"{_ms(f.p50)} p99 {_ms(f.p99)} p99.9 {_ms(f.p999)} max "
                f"{_ms(f.latency_max)}; largest backlog {f.max_messages:,} messages "
                f"({f.max_bytes:,} bytes), oldest {_ms(f.max_age)}; {f.consumers} "
                f"consumer(s), {escape(f.subscription)} -->\n"
            )
            out.append(f"  <queue name={quoteattr(f.queue)}>\n")
            if (
                f.subscription == "shared"
                and f.consumers >= 2
                and f.p999 is not None
                and f.acked >= settings["min_samples"]
            ):
                timeout = nice_seconds(settings["ack_factor"] * f.p999, settings["min_ack_timeout"])
                out.append(
                    f"    <isolation><ackTimeout>{format_duration(timeout)}</ackTimeout>"
                    "</isolation>\n"
                )
            out.append(
                _consumer_xml(f.max_messages, f.max_bytes, f.max_age, headroom, policy, "    ")
            )
            out.append("  </queue>\n")
        for (ex, key), members in sorted(topics.items()):
            mm = max(m.max_messages for m in members)
            mb = max(m.max_bytes for m in members)
            ma = max(m.max_age for m in members)
            ex_attr = "" if ex == DEFAULT_TOPIC_EXCHANGE else f" exchange={quoteattr(ex)}"
            out.append(
                f"  <!-- topic {escape(key)} on {escape(ex)}: {len(members)} "
                f"subscription queue(s); largest backlog {mm:,} messages ({mb:,} bytes),"
                f" oldest {_ms(ma)} -->\n"
            )
            out.append(f"  <topic key={quoteattr(key)}{ex_attr}>\n")
            out.append(_consumer_xml(mm, mb, ma, headroom, policy, "    "))
            out.append("  </topic>\n")
        out.append("</virtualhost>\n")
    return "".join(out)

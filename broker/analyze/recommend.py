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
are grouped by binding (exchange and key) into one ``<topic key>`` each; other queues get a
``<queue name>``. The snippet is a ``<virtualhost>`` element per vhost, which validates against
``config/plugbroker.xsd`` when put inside ``<broker>``.

Its promises, each kept here rather than left to the reader:

* a queue (or topic group) with fewer than ``min_samples`` acks is listed in a comment only;
* dead-letter queues and retry queues are left out (in a comment): the broker never applies a
  slow-consumer section to them, and their backlog says nothing about a consumer;
* a server-named queue (``amq.gen-...``) that is not a topic subscription gets no
  ``<queue name>`` (the next one will have another name), only a comment;
* no proposed threshold would have missed an action the running broker really took: a
  threshold that the journal shows was passed by an applied action (its measured value) is
  lowered to the running broker's configured value, then the whole snippet is backtested over
  the same journal (:func:`plugbroker.analyze.backtest.backtest`, every check at a short period)
  and each real action must be matched by a would-be one on the same queue (and consumer, for
  isolation), no later; a threshold the backtest still shows missing one is withdrawn. The
  header comment says what the backtest found.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from plugbroker.analyze.events import (
    backlog_deltas,
    backlog_series,
    lifecycles,
    message_facts,
    nice_step,
    queue_bucket_counts,
    queue_names,
    read_events,
    runs,
    settlements,
)
from plugbroker.analyze.spark import Progress, Scratch, get_spark, run_together
from plugbroker.config import DEFAULT_TOPIC_EXCHANGE
from plugbroker.config.units import format_duration, format_size

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
    check: bool = True,
    every: float | None = None,
) -> Recommendation:
    """Propose ``<queue>``/``<topic>`` settings from the journal at ``journal``.

    :param check: backtest the proposal over the same journal (see :func:`verify`) and say
        what it found in the header comment; thresholds it shows missing a real action are
        withdrawn.
    :param every: the backtest's check period (seconds); by default the report's time bucket
        (about 1/240 of the journal), between 0.25 s and 5 s.
    """
    from pyspark.sql import functions as F

    spark = spark or get_spark(master)
    progress = Progress("recommend", 5 if check else 4, spark=spark, quiet=quiet)
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
        known = queue_names(events).to_pylist()
        names = {r["q"]: (r["vhost"], r["queue"]) for r in known}
        lat = {
            names[r["q"]]: r
            for r in pairs.groupBy("q")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.percentile_approx("latency", [0.5, 0.99, 0.999], 10000).alias("pct"),
                F.max("latency").alias("max"),
            )
            .collect()
        }

        progress.step("backlogs")
        life = lifecycles(facts, events, run_table)
        deltas, per_bucket = run_together(
            lambda: backlog_deltas(life, t0, step).toArrow(),
            lambda: queue_bucket_counts(events, t0, step).toArrow(),
        )
        series = backlog_series(deltas, per_bucket, t0, step)
        peaks = series.group_by("q", use_threads=False).aggregate(
            [("messages", "max"), ("bytes", "max"), ("oldest_age", "max")]
        )
        backlog = {
            names[r["q"]]: {
                "messages": r["messages_max"],
                "bytes": r["bytes_max"],
                "age": r["oldest_age_max"],
            }
            for r in peaks.to_pylist()
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
    targets = frozenset(
        (r["vhost"], r["queue"])
        for r in events.where(
            ((ev == "enqueued") & (F.col("reason") == "dead-letter"))
            | ((ev == "removed") & F.col("reason").isin("retry", "redrive"))
            | ((ev == "published") & (F.col("exchange") == "amq.retry"))
        )
        .select("vhost", "queue")
        .union(  # version 1 journals: a dead letter sent through the default exchange
            events.where((ev == "dead_lettered") & (F.col("exchange") == "")).select(
                "vhost", F.col("routing_key").alias("queue")
            )
        )
        .where(F.col("queue").isNotNull())
        .distinct()
        .collect()
    )
    actual = [
        r.asDict()
        for r in events.where(
            (ev == "policy_action")
            & (F.col("outcome") == "applied")
            & F.col("threshold").isNotNull()
        )
        .select("vhost", "queue", "threshold", "configured", "measured")
        .distinct()
        .collect()
    ]

    figures: list[QueueFigures] = []
    for key in sorted(set(lat) | set(backlog) | set(info)):
        la, bl, inf = lat.get(key), backlog.get(key), info.get(key)
        f = QueueFigures(vhost=key[0], queue=key[1])
        if la is not None:
            f.acked = int(la["n"])
            f.p50, f.p99, f.p999 = (float(x) for x in la["pct"])
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
    sections = plan(figures, settings, targets=targets, actual=actual)
    if check:
        progress.step("backtesting the proposal over the same journal")
        period = every if every is not None else min(max(step, 0.25), 5.0)
        settings["backtest"] = verify(journal, sections, settings, spark=spark, every=period)
    else:
        settings["backtest_skipped"] = True
    xml = render_xml(figures, settings, sections)
    progress.say(f"recommendations for {len(figures)} queue(s)")
    return Recommendation(xml, figures, settings)


#: the journal's ``threshold`` names of a ``<consumer>`` section, and of ``<isolation>``
CONSUMER_FAMILY = frozenset({"depth", "messageCount", "messageAge", "consumptionRate"})
ISOLATION_FAMILY = frozenset({"ackTimeout"})


def family(threshold: str | None) -> str:
    """``consumer`` (slow-consumer thresholds), ``isolation`` (ackTimeout) or ``other``."""
    if threshold in CONSUMER_FAMILY:
        return "consumer"
    if threshold in ISOLATION_FAMILY:
        return "isolation"
    return "other"


@dataclass
class Section:
    """One proposed ``<queue name>`` or ``<topic key>`` element, or (no ``values``) a queue or
    group listed in a comment only."""

    vhost: str
    kind: str  # "queue" or "topic"
    name: str  # the queue name, or the binding key
    exchange: str  # the topic exchange ("" for a queue)
    members: list[QueueFigures]
    comment: str
    #: threshold -> value: depth (bytes), messageCount, messageAge and ackTimeout (seconds)
    values: dict[str, float] = field(default_factory=dict)
    #: why a value is not the plain rule's (lowered to keep a real action, withdrawn)
    notes: list[str] = field(default_factory=list)

    @property
    def queues(self) -> set[str]:
        return {m.queue for m in self.members}

    def proposes(self, fam: str) -> bool:
        return any(family(t) == fam for t in self.values)


def fmt_threshold(threshold: str, value: float) -> str:
    """A threshold's value as the XML takes it."""
    if threshold == "depth":
        return format_size(int(value))
    if threshold == "messageCount":
        return str(int(value))
    return format_duration(value)


def _nice_bytes(v: float, floor: int) -> int:
    from plugbroker.config.units import parse_size

    return parse_size(nice_size(v, floor))


def _consumer_values(
    max_messages: int, max_bytes: int, max_age: float, headroom: float
) -> dict[str, float]:
    return {
        "depth": float(_nice_bytes(headroom * max_bytes, 1024 * 1024)),
        "messageAge": nice_seconds(headroom * max_age, 60.0),
        "messageCount": float(nice_count(headroom * max_messages, 100)),
    }


def _ms(v: float | None) -> str:
    from plugbroker.analyze.htmlreport import fmt_dur

    return fmt_dur(v)


def plan(
    figures: list[QueueFigures],
    settings: dict[str, Any],
    *,
    targets: frozenset[tuple[str, str]] = frozenset(),
    actual: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
) -> list[Section]:
    """The sections to propose, by the rules (see the module docstring), before the backtest.

    :param targets: ``(vhost, queue)`` of every dead-letter and retry queue seen.
    :param actual: the running broker's applied policy actions (journal ``policy_action`` rows
        with ``vhost``, ``queue``, ``threshold``, ``configured``, ``measured``).
    """
    headroom = settings["headroom"]
    min_samples = settings["min_samples"]
    sections: list[Section] = []
    topics: dict[tuple[str, str, str], list[QueueFigures]] = {}
    for f in figures:
        if (f.vhost, f.queue) in targets:
            sections.append(
                Section(
                    f.vhost,
                    "queue",
                    f.queue,
                    "",
                    [f],
                    f"{f.queue}: a dead-letter or retry queue; left out (the broker applies no "
                    "slow-consumer section to one)",
                )
            )
            continue
        if f.is_subscription:
            for ex, key in f.topic_bindings:
                topics.setdefault((f.vhost, ex, key), []).append(f)
            continue
        if f.queue.startswith("amq.gen-"):
            sections.append(
                Section(
                    f.vhost,
                    "queue",
                    f.queue,
                    "",
                    [f],
                    f"{f.queue}: server-named and not bound to a topic exchange; the next one "
                    "will have another name, so nothing is proposed for it",
                )
            )
            continue
        summary = (
            f"{f.queue}: {f.acked:,} acks, processing time p50 {_ms(f.p50)} p99 {_ms(f.p99)} "
            f"p99.9 {_ms(f.p999)} max {_ms(f.latency_max)}; largest backlog "
            f"{f.max_messages:,} messages ({f.max_bytes:,} bytes), oldest {_ms(f.max_age)}; "
            f"{f.consumers} consumer(s), {f.subscription}"
        )
        sec = Section(f.vhost, "queue", f.queue, "", [f], summary)
        if f.acked < min_samples:
            sec.comment = (
                f"{f.queue}: {f.acked} ack(s), fewer than {min_samples}: too little traffic "
                f"to recommend anything (largest backlog {f.max_messages:,} messages)"
            )
        else:
            if f.subscription == "shared" and f.consumers >= 2 and f.p999 is not None:
                sec.values["ackTimeout"] = nice_seconds(
                    settings["ack_factor"] * f.p999, settings["min_ack_timeout"]
                )
            sec.values.update(_consumer_values(f.max_messages, f.max_bytes, f.max_age, headroom))
        sections.append(sec)
    for (vhost, ex, key), members in sorted(topics.items()):
        acked = sum(m.acked for m in members)
        mm = max(m.max_messages for m in members)
        mb = max(m.max_bytes for m in members)
        ma = max(m.max_age for m in members)
        sec = Section(
            vhost,
            "topic",
            key,
            ex,
            members,
            f"topic {key} on {ex}: {len(members)} subscription queue(s), {acked:,} acks; "
            f"largest backlog {mm:,} messages ({mb:,} bytes), oldest {_ms(ma)}",
        )
        if acked < min_samples:
            sec.comment = (
                f"topic {key} on {ex}: {len(members)} subscription queue(s), {acked} ack(s), "
                f"fewer than {min_samples}: too little traffic to recommend anything "
                f"(largest backlog {mm:,} messages)"
            )
        else:
            sec.values.update(_consumer_values(mm, mb, ma, headroom))
        sections.append(sec)
    for sec in sections:
        _keep_real_actions(sec, actual)
    return sections


def _keep_real_actions(sec: Section, actual: Any) -> None:
    """Lower each value that an applied action of the running broker passed (its measured
    value was not above it, so the threshold would have missed it) to the running broker's
    configured value, which caught it."""
    for t in list(sec.values):
        real = [
            a
            for a in actual
            if a["vhost"] == sec.vhost
            and a["queue"] in sec.queues
            and a["threshold"] == t
            and a["measured"] is not None
            and a["configured"] is not None
        ]
        if not real:
            continue
        worst = min(real, key=lambda a: a["measured"])
        if sec.values[t] < worst["measured"]:
            continue
        running = min(a["configured"] for a in real)
        sec.notes.append(
            f"{t} {fmt_threshold(t, running)}, not {fmt_threshold(t, sec.values[t])}: the "
            f"running broker's, which acted on {worst['queue']} at {t} "
            f"{fmt_threshold(t, worst['measured'])}"
        )
        sec.values[t] = running


def verify(
    journal: str | Path,
    sections: list[Section],
    settings: dict[str, Any],
    *,
    spark: Any,
    every: float,
) -> dict[str, Any]:
    """Backtest the proposed sections over the same journal; withdraw any threshold that still
    misses an action the broker really took. Returns what the backtest found (for the
    comment): ``every``, ``actions`` (real ones on the proposed queues), ``caught``,
    ``withdrawn`` (descriptions)."""
    from plugbroker.analyze.backtest import backtest

    with tempfile.TemporaryDirectory(prefix="plugbroker-recommend-") as tmp:
        path = Path(tmp) / "recommended.xml"
        path.write_text(f"<broker>\n{render_xml([], settings, sections)}</broker>\n")
        bt = backtest(journal, path, spark=spark, every=every, quiet=True)
    owner: dict[tuple[str, str], Section] = {}
    for sec in sections:
        for q in sec.queues:
            owner[(sec.vhost, q)] = sec
    relevant = []
    for a in bt.actual:
        mine = owner.get((a["vhost"], a["queue"]))
        if a["outcome"] != "applied" or mine is None or not mine.proposes(family(a["threshold"])):
            continue
        relevant.append((a, mine))
    withdrawn: list[str] = []
    caught = 0
    for a, sec in relevant:
        fam = family(a["threshold"])
        hit = any(
            w["vhost"] == a["vhost"]
            and w["queue"] == a["queue"]
            and family(w["threshold"]) == fam
            and (fam != "isolation" or w["consumer_tag"] == a["consumer_tag"])
            and w["at"] <= a["ts"] + every + 1e-6
            for w in bt.actions
        )
        if hit:
            caught += 1
            continue
        if not sec.proposes(fam):
            continue  # withdrawn for an earlier miss
        gone = [t for t in sec.values if family(t) == fam]
        for t in gone:
            del sec.values[t]
        note = (
            f"{', '.join(gone)} withdrawn: the backtest missed the running broker's "
            f"{a['action']} on {a['queue']} ({a['threshold']} {a['measured']:g})"
        )
        sec.notes.append(note)
        withdrawn.append(note)
    return {"every": every, "actions": len(relevant), "caught": caught, "withdrawn": withdrawn}


def _consumer_xml(values: dict[str, float], policy: str, indent: str) -> str:
    lines = [f"{indent}<consumer>\n"]
    for t in ("depth", "messageAge", "messageCount"):
        if t in values:
            lines.append(f"{indent}  <{t}>{fmt_threshold(t, values[t])}</{t}>\n")
    lines.append(f"{indent}  <policy name={quoteattr(policy)}/>\n")
    lines.append(f"{indent}</consumer>\n")
    return "".join(lines)


def _comment(text: str) -> str:
    # "--" may not appear inside an XML comment
    return escape(text).replace("--", "- -")


def render_xml(
    figures: list[QueueFigures],
    settings: dict[str, Any],
    sections: list[Section] | None = None,
) -> str:
    """The snippet: a header comment, then one ``<virtualhost>`` per vhost."""
    from plugbroker.analyze.htmlreport import fmt_time

    if sections is None:
        sections = plan(figures, settings)
    headroom = settings["headroom"]
    policy = settings["policy"]
    header = (
        f"plugbroker analyze recommend: {settings['journal']}, "
        f"{fmt_time(settings['start'], True)} to {fmt_time(settings['end'], True)}; "
        f"thresholds at {headroom:g}x the largest backlog seen, ackTimeout at "
        f"{settings['ack_factor']:g}x the p99.9 processing time (at least "
        f"{format_duration(settings['min_ack_timeout'])}); fewer than "
        f"{settings['min_samples']} acks: a comment only; dead-letter and retry queues left "
        f"out. policy {policy}: a dry run; backtest, then switch to Delete."
    )
    check = settings.get("backtest")
    if check is not None:
        header += (
            f" Backtested over the same journal (every check at {format_duration(check['every'])}"
            f"): these thresholds catch {check['caught']} of the {check['actions']} action(s) "
            "the running broker took on these queues"
        )
        header += (
            f"; {len(check['withdrawn'])} threshold(s) withdrawn." if check["withdrawn"] else "."
        )
    elif settings.get("backtest_skipped"):
        header += " Not backtested (--no-backtest)."
    out = [f"<!-- {_comment(header)} -->\n"]
    by_vhost: dict[str, list[Section]] = {}
    for sec in sections:
        by_vhost.setdefault(sec.vhost, []).append(sec)
    for vhost, secs in by_vhost.items():
        out.append(f"<virtualhost name={quoteattr(vhost)}>\n")
        for sec in secs:
            out.append(f"  <!-- {_comment(sec.comment)} -->\n")
            for note in sec.notes:
                out.append(f"  <!-- {_comment(note)} -->\n")
            if not sec.values:
                continue
            if sec.kind == "queue":
                out.append(f"  <queue name={quoteattr(sec.name)}>\n")
            else:
                ex_attr = (
                    ""
                    if sec.exchange == DEFAULT_TOPIC_EXCHANGE
                    else f" exchange={quoteattr(sec.exchange)}"
                )
                out.append(f"  <topic key={quoteattr(sec.name)}{ex_attr}>\n")
            if "ackTimeout" in sec.values:
                out.append(
                    "    <isolation><ackTimeout>"
                    f"{fmt_threshold('ackTimeout', sec.values['ackTimeout'])}</ackTimeout>"
                    "</isolation>\n"
                )
            if any(family(t) == "consumer" for t in sec.values):
                out.append(_consumer_xml(sec.values, policy, "    "))
            out.append(f"  </{sec.kind}>\n")
        out.append("</virtualhost>\n")
    return "".join(out)

"""The Spark pipeline on a journal recorded from a real broker run (see conftest.record_run):
report, backtest and recommend, in local mode on one shared SparkSession."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from plugbroker.analyze import backtest, recommend
from plugbroker.config import parse_config
from plugbroker.pluginhost import BLOCK_ENV


def table(out: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(out / "tables" / f"{name}.parquet").to_pylist()


# ------------------------------------------------------------------------------------ report


def test_report_per_queue_figures(report_result, recording):
    out = report_result.out
    queues = {q["queue"]: q for q in table(out, "queues")}
    work = queues["work"]
    assert work["published"] == recording.work_published  # 40 and a warm-up message
    assert work["acked"] == recording.work_published - 1  # all but the poison message
    assert work["rejected"] == recording.poison_deliveries == 3
    assert work["dead_lettered"] == 1
    assert work["latency_p50"] is not None and 0 <= work["latency_p50"] < 1.0
    assert work["latency_p50"] <= work["latency_p95"] <= work["latency_p99"]
    # the stalled consumer held 3 messages for over a second: the backlog shows it
    assert work["max_messages"] >= 3 and work["max_oldest_age"] >= 1.0
    slow = queues[recording.slow_queue]
    assert slow["published"] == 20 and slow["max_messages"] == 20
    # the dead-lettered copy reaches work-DLQ without a published event (a core hook gap)


def test_report_per_consumer_figures(report_result, recording):
    consumers = {(c["queue"], c["consumer_tag"]): c for c in table(report_result.out, "consumers")}
    stalled = consumers[("work", "stalled")]
    assert stalled["delivered"] == 3 and stalled["acked"] == 0 and stalled["isolated"] == 1
    good = consumers[("work", "good")]
    assert good["acked"] == recording.work_published - 1 and good["rejected"] == 3
    assert good["requeued"] == 2
    assert good["latency_p99"] is not None and good["latency_p99"] < 1.0


def test_report_dead_letters_redeliveries_and_actions(report_result, recording):
    out = report_result.out
    dead = table(out, "dead_letters")
    assert {(d["queue"], d["outcome"], d["reason"], d["count"]) for d in dead} >= {
        ("work", "dead_lettered", "rejected", 1)
    }
    redel = {(r["queue"], r["reason"]): r["count"] for r in table(out, "redeliveries")}
    assert redel[("work", "rejected")] == 2
    assert redel[("work", "consumer-isolated")] == 3
    actions = table(out, "policy_actions")
    kinds = {(a["event"], a["action"]) for a in actions}
    assert ("policy_action", "IsolateConsumer") in kinds
    assert ("policy_action", "CloseConsumerChannels") in kinds
    assert ("consumer_isolated", None) in kinds
    hist = table(out, "processing_time")
    assert sum(h["count"] for h in hist if h["queue"] == "work") == recording.work_published - 1


def test_report_series_and_csv(report_result, recording):
    out = report_result.out
    series = [s for s in table(out, "series") if s["queue"] == recording.slow_queue]
    assert max(s["messages"] for s in series) == 20
    assert series[-1]["messages"] == 0  # deleted by the policy: its messages left with it
    rows = pacsv.read_csv(out / "csv" / "queues.csv").to_pylist()
    assert any(r["queue"] == "work" for r in rows)


def test_report_html_page_is_self_contained(report_result, recording):
    page = report_result.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<svg") >= 4
    assert "work" in page and "stalled" in page and "IsolateConsumer" in page
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    assert report_result.overview["events"] > 100


# ------------------------------------------------------------------------------------ backtest


def key(a: dict[str, Any]) -> tuple[Any, ...]:
    return (a["vhost"], a["queue"], a["policy"], a["action"], a["threshold"], a["consumer_tag"])


def test_backtest_of_the_running_config_reproduces_the_real_actions(spark, recording):
    every = 0.25
    result = backtest(recording.journal, recording.config, spark=spark, every=every, quiet=True)
    assert result.actual, "the recorded run took actions"
    assert sorted(map(key, result.actions)) == sorted(map(key, result.actual))
    real = {key(a): a for a in result.actual}
    for a in result.actions:
        r = real[key(a)]
        assert a["configured"] == r["configured"]
        # the backtest checks on a grid: it acts no later than the broker's check did
        assert a["at"] <= r["ts"] + 1e-6
        if a["threshold"] == "messageCount":
            assert a["measured"] == r["measured"] == 20
        else:  # ackTimeout: the age at the check, past the timeout in both
            assert a["measured"] > a["configured"] and r["measured"] > r["configured"]
            assert a["measured"] <= a["configured"] + every + 0.05


def test_backtest_of_a_stricter_candidate_lists_more(spark, recording, tmp_path):
    candidate = tmp_path / "candidate.xml"
    candidate.write_text("""<broker><virtualhost name="/">
      <queue name="work"><consumer><messageCount>2</messageCount><policy name="Log"/>
      </consumer></queue>
      <topic key="stocks.#"><consumer><messageCount>3</messageCount><policy name="Delete"/>
      </consumer></topic>
    </virtualhost></broker>""")
    result = backtest(
        recording.journal, candidate, spark=spark, every=0.25, quiet=True, out=tmp_path / "out"
    )
    queues = {(a["queue"], a["action"]) for a in result.actions}
    assert (recording.slow_queue, "DeleteQueue") in queues
    assert ("work", "LogOnly") in queues  # the stalled consumer's 3 held messages
    assert not any(a["action"] == "IsolateConsumer" for a in result.actions)
    assert all(a["measured"] > a["configured"] for a in result.actions)
    logs = [a for a in result.actions if a["action"] == "LogOnly"]
    assert all(a["until"] >= a["at"] and a["checks"] >= 1 for a in logs)
    assert (tmp_path / "out" / "backtest.txt").read_text().startswith("backtest of")
    assert list((tmp_path / "out" / "csv" / "actions").glob("*.csv"))
    assert result.disruptive() and "DeleteQueue" in result.summary()


def test_backtest_replays_a_third_party_policy_like_the_built_ins(
    spark, recording, tmp_path, monkeypatch
):
    """A plugin module from outside the broker, named in the candidate's <plugins>: its policy
    job is found through the registry in every Spark task and replayed with the built-ins."""
    here = Path(__file__).parent
    monkeypatch.syspath_prepend(str(here))  # the driver checks the candidate
    monkeypatch.delenv(BLOCK_ENV, raising=False)
    spark.sparkContext.addPyFile(str(here / "candidate_policy.py"))  # the tasks load it too
    candidate = tmp_path / "third-party.xml"
    candidate.write_text("""<broker>
      <plugins><plugin>candidate_policy</plugin></plugins>
      <virtualhost name="/"><queue name="work">
        <backlogCap><messages>0</messages><prefetch>1</prefetch></backlogCap>
      </queue></virtualhost></broker>""")
    try:
        result = backtest(recording.journal, candidate, spark=spark, every=0.25, quiet=True)
    finally:
        sys.modules.pop("candidate_policy", None)
    assert result.periods == {"slow-consumer": 0.25, "isolation": 0.25, "backlog-cap": 0.25}
    assert {(a["job"], a["policy"], a["action"], a["queue"]) for a in result.actions} == {
        ("backlog-cap", "BacklogCap", "SetPrefetch", "work")
    }
    # each consumer wider than 1 once: the narrowed window counts for the later checks
    assert sorted(a["consumer_tag"] for a in result.actions) == sorted(
        [recording.good_tag, recording.stalled_tag]
    )
    assert all(a["measured"] > a["configured"] == 0 for a in result.actions)


def test_backtest_refuses_a_bad_candidate_with_file_and_line(spark, recording, tmp_path):
    from plugbroker.config import ConfigError

    bad = tmp_path / "bad.xml"
    bad.write_text(
        '<broker><virtualhost name="/">\n<queue name="w"><consumer>'
        '<messageAge>soon</messageAge><policy name="Log"/></consumer></queue>'
        "</virtualhost></broker>"
    )
    with pytest.raises(ConfigError) as err:
        backtest(recording.journal, bad, spark=spark, quiet=True)
    assert "bad.xml:2" in str(err.value)


# ------------------------------------------------------------------------------------ recommend


def test_recommend_prints_a_snippet_that_validates(spark, recording):
    rec = recommend(recording.journal, spark=spark, quiet=True, min_samples=10)
    xml = rec.xml
    cfg = parse_config(f"<broker>{xml}</broker>", "recommended.xml")
    vh = cfg.vhosts["/"]
    work = vh.queues["work"].sections
    iso = work["isolation"]
    # the TDMQ floor (5 minutes) would have missed the stalled consumer the running broker
    # isolated with its 1 s: the running value is proposed, and the comment says why
    assert iso.ack_timeout == 1
    assert "ackTimeout 1s, not 5m: the running broker's" in xml
    assert rec.settings["backtest"]["caught"] == rec.settings["backtest"]["actions"] >= 1
    fig = {f.queue: f for f in rec.queues}["work"]
    consumer = work["consumer"]
    assert consumer.message_count >= 2 * fig.max_messages and consumer.policy.name == "Log"
    assert consumer.message_age >= 2 * fig.max_age
    # the dead-letter queue is left out
    assert "work-DLQ" not in vh.queues
    # the topic subscriptions are grouped by binding; with fewer acks than min_samples (the
    # stalled one never acked, the other acked 5) they are listed in a comment only
    assert "topic stocks.us.ibm on amq.topic: 1 subscription queue(s), 0 ack(s)" in xml
    assert "topic stocks.us.aapl on amq.topic: 1 subscription queue(s), 5 ack(s)" in xml
    assert not vh.topics


def test_the_backtest_hands_its_tasks_every_event_as_the_journal_holds_it(spark, recording):
    """The backtest sends its Python tasks numbers and a JSON text instead of the journal's
    columns (backtest.Names): turned back into tuples, every queue event is what the journal
    holds, in journal order, but for what the replay never reads: delivery_count, and the extra
    columns (exchange, routing key) of the common message events."""
    from pyspark.sql import functions as F

    from plugbroker.analyze.backtest import EXTRA_COLUMNS, HOT_EVENTS, UNREAD_COLUMNS, Names
    from plugbroker.analyze.events import QUEUE_EVENTS, read_events
    from plugbroker.analyze.replay import COLUMNS

    fixture_v1 = Path(__file__).parent / "fixtures" / "journal-v1"
    for journal in (recording.journal, fixture_v1):
        events = read_events(spark, journal)
        sel = events.where(
            F.col("event").isin(*QUEUE_EVENTS)
            & F.col("queue").isNotNull()
            & (F.col("event") != "policy_action")
        )
        names = Names.of(events)
        got = list(
            names.rows(sel.select(*names.narrow_columns()).orderBy("k").toArrow().to_batches())
        )
        runs_in_order = {r[0]: i for i, r in enumerate(names.runs)}

        def unsent(row: Any, c: str) -> bool:
            return c in UNREAD_COLUMNS or (row["event"] in HOT_EVENTS and c in EXTRA_COLUMNS)

        want = [
            tuple(None if unsent(row, c) else row[c] for c in COLUMNS)
            for row in sorted(
                sel.select(*COLUMNS).collect(), key=lambda r: (runs_in_order[r["run"]], r["seq"])
            )
        ]
        assert len(got) == len(want) > 100
        assert {g[COLUMNS.index("event")] for g in got} >= {"published", "delivered", "acked"}
        assert any(g[COLUMNS.index("exchange")] for g in got), "bindings came through"
        assert got == want


def test_the_backtest_spreads_the_queues_over_its_tasks_by_their_events(spark):
    """Zipf-like queue sizes: hashing queues to 4 tasks can give one task most of the events;
    the backtest's partitioning values send each queue to the least loaded task."""
    from pyspark.sql import functions as F

    from plugbroker.analyze.backtest import Names

    sizes = {1000 + i: int(1_000_000 / (i + 1)) for i in range(24)}
    names = Names([("r", 0.0, 1.0)], {q: ("/", f"q{q}") for q in sizes}, {}, sizes)
    keys = names.task_keys(spark, 4)
    rows = spark.createDataFrame([(q, k) for q, k in keys.items()], "q long, p long")
    task_of = {
        r["q"]: r["t"]
        for r in rows.repartition(4, "p").select("q", F.spark_partition_id().alias("t")).collect()
    }
    assert set(task_of) == set(sizes)
    load = [sum(n for q, n in sizes.items() if task_of[q] == t) for t in range(4)]
    # as good as the busiest queue allows: no task above an even share plus the busiest queue
    assert max(load) <= sum(sizes.values()) / 4 + max(sizes.values())
    assert max(load) < 0.3 * sum(sizes.values())


def test_a_local_journals_time_span_and_schema_come_from_its_footers(spark, recording, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from plugbroker.analyze.events import _one_schema, read_events, span

    for journal in (recording.journal, Path(__file__).parent / "fixtures" / "journal-v1"):
        events = read_events(spark, journal)
        assert span(events, journal) == span(events)  # footers, then a Spark job
        shared = _one_schema(str(journal))
        assert shared is not None
        # the schema given to Spark from the footers is the one Spark infers itself
        inferred = spark.read.option("basePath", str(journal)).parquet(str(journal))
        assert events.drop("ts", "due").schema == inferred.schema
    # files with different columns (a journal written across an upgrade): Spark merges them
    pq.write_table(pa.table({"ts_us": [1_000_000], "seq": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"ts_us": [3_000_000], "due_us": [5]}), tmp_path / "b.parquet")
    assert _one_schema(str(tmp_path)) is None
    from plugbroker.analyze.events import _footer_span

    assert _footer_span(str(tmp_path)) == (1.0, 3.0)


def test_the_runs_bounds_come_from_the_footers_as_spark_finds_them(spark, recording, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from plugbroker.analyze.events import _footer_stats, read_events, runs

    for journal in (recording.journal, Path(__file__).parent / "fixtures" / "journal-v1"):
        events = read_events(spark, journal)
        assert _footer_stats(str(journal))[1]  # one run per row group: read from the footers
        footers = sorted(tuple(r) for r in runs(events, journal).collect())
        assert footers == sorted(tuple(r) for r in runs(events).collect())
    # a row group holding two runs: the footers cannot say, Spark counts
    pq.write_table(
        pa.table({"ts_us": [1_000_000, 2_000_000, 4_000_000], "run": ["a", "a", "b"]}),
        tmp_path / "mixed.parquet",
    )
    pq.write_table(pa.table({"ts_us": [3_000_000], "run": ["a"]}), tmp_path / "more.parquet")
    span, per_run = _footer_stats(str(tmp_path))
    assert span == (1.0, 4.0) and per_run is None


def test_arrow_batches_to_python_are_cut_by_rows_only_while_asked(spark):
    from plugbroker.analyze.spark import ARROW_BATCH_BYTES, arrow_batches_by_rows

    before = spark.conf.get(ARROW_BATCH_BYTES)
    with arrow_batches_by_rows(spark):
        assert spark.conf.get(ARROW_BATCH_BYTES) == str(2**31 - 1)
    assert spark.conf.get(ARROW_BATCH_BYTES) == before
    spark.conf.set(ARROW_BATCH_BYTES, "16m")  # somebody's own limit is kept
    try:
        with arrow_batches_by_rows(spark):
            assert spark.conf.get(ARROW_BATCH_BYTES) == "16m"
    finally:
        spark.conf.set(ARROW_BATCH_BYTES, before)


LEAD_PROBE = """
import os, sys
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from plugbroker.analyze.spark import LEAD_POOL, get_spark, run_together
spark = get_spark("local[2]")
sc = spark.sparkContext
assert sc.getConf().get("spark.scheduler.mode") == "FAIR"
def pool():
    spark.range(10).count()
    return sc.getLocalProperty("spark.scheduler.pool")
print(run_together(pool, pool, lead=True), run_together(pool, pool), LEAD_POOL)
spark.stop()
"""


def test_the_lead_pool_serves_the_first_action_of_run_together(spark, tmp_path):
    """A session get_spark starts runs the fair scheduler with the lead pool; run_together puts
    its first action there when asked, and nothing else (``spark``: Java is there)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", LEAD_PROBE],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line == "['plugbroker-lead', None] [None, None] plugbroker-lead"

"""A recorded broker run with every way a message enters and leaves a queue, through the report
and recommend (issue 15: "the pipeline tells the truth").

The run (kombu and py-amqp clients, the journal on) has a retry queue (``work-RETRY``: a copy
held 1 s, then back on ``work``), a dead letter (``work-DLQ``, then redriven back), delayed
messages (an ``x-delayed-message`` exchange), a purge (``stale``), and a topic subscription that
stalls and is deleted by the running broker's ``messageCount`` limit while another subscriber
on the same binding keeps up. The report's per-queue backlog must come back to zero where the
live broker's did; recommend must keep its rules and never propose a threshold that would have
missed the running broker's real action.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import amqp
import kombu
import pyarrow.parquet as pq
import pytest
from brokerutil import BrokerThread, write_config

from plugbroker.analyze.events import JournalError, check_local_journal
from plugbroker.config import parse_config
from plugbroker.plugins.journal import METADATA_KEY, SCHEMA_VERSION
from plugbroker.retry import reconsume_later

HERE = Path(__file__).parent
V1_JOURNAL = HERE / "fixtures" / "journal-v1"

RUNNING = """
    <queue name="work">
      <deadLetter><maxRedeliveries>3</maxRedeliveries><retry><levels>1s</levels></retry>
      </deadLetter>
    </queue>
    <topic key="ticks.*">
      <consumer><messageCount>10</messageCount><policy name="Delete"/></consumer>
    </topic>
"""
NAMED = ("work", "work-RETRY", "work-DLQ", "late", "stale")


@dataclass
class FatesRun:
    journal: Path
    config: Path
    slow_queue: str = ""
    fast_queue: str = ""
    #: the live broker's message count of each named queue at the end
    live: dict[str, int] = field(default_factory=dict)
    #: the most each named queue held, as the test saw it
    seen: dict[str, int] = field(default_factory=dict)


def _connect(b: BrokerThread) -> amqp.Connection:
    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5
    )
    conn.connect()
    return conn


def _until(conns: list[Any], pred: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "the recorded run did not reach its expected state"
        for c in conns:
            try:
                c.drain_events(timeout=0.02)
            except TimeoutError:
                pass


def record_fates(directory: Path) -> FatesRun:
    path = write_config(directory, RUNNING, journal=True, period="600000", name="running.xml")
    b = BrokerThread(path).start()
    run = FatesRun(journal=directory / "journal", config=path)
    api = b.broker.api

    def depth(name: str) -> int:
        info = b.call(lambda: api.queue("/", name))
        return -1 if info is None else info.messages

    try:
        with kombu.Connection(b.url()) as kc:
            jobs = kombu.Exchange("jobs", "direct", durable=False)
            work = kombu.Queue("work", jobs, routing_key="work", durable=True)
            later = kombu.Exchange(
                "later", "x-delayed-message", durable=False, arguments={"x-delayed-type": "direct"}
            )
            late = kombu.Queue("late", later, routing_key="late", durable=False)
            stale = kombu.Queue("stale", routing_key="stale", durable=False)
            producer = kc.Producer()
            for q in (work, late, stale):
                q(kc.default_channel).declare()
            worker = _connect(b)
            ch = worker.channel()
            ch.basic_qos(0, 10, False)
            acked: list[bytes] = []

            def handle(m: amqp.Message) -> None:
                if m.body == b"retry-me" and not (m.headers or {}).get("RECONSUMETIMES"):
                    reconsume_later(m, delay=1)
                elif m.body == b"dead" and not (m.headers or {}).get("x-death"):
                    ch.basic_reject(m.delivery_tag, requeue=False)
                else:
                    ch.basic_ack(m.delivery_tag)
                    acked.append(m.body)

            ch.basic_consume("work", callback=handle)
            ch.basic_consume("late", callback=handle)
            for i in range(30):
                body = b"retry-me" if i == 5 else b"dead" if i == 9 else b"job %d" % i
                producer.publish(body, exchange=jobs, routing_key="work")
            for i in range(3):
                producer.publish(
                    b"late %d" % i, exchange=later, routing_key="late", headers={"x-delay": 200}
                )
            for i in range(5):
                producer.publish(b"stale %d" % i, exchange="", routing_key="stale")
            _until([worker], lambda: len(acked) == 28 + 3 and depth("work-DLQ") == 1)
            run.seen["work-DLQ"] = 1
            run.seen["work-RETRY"] = max(depth("work-RETRY"), 0)
            run.seen["stale"] = depth("stale")
            assert ch.queue_purge("stale") == 5
            # the retry copy comes back after 1 s and is acked; the dead letter is redriven
            _until([worker], lambda: b"retry-me" in acked, timeout=5.0)
            moved = b.call(lambda: api.redrive("/", "work-DLQ"))
            assert moved.moved == {"work": 1}
            _until([worker], lambda: b"dead" in acked)

            # topic subscriptions on one binding: one keeps up, one stalls and is deleted
            fast_conn, slow_conn = _connect(b), _connect(b)
            f = fast_conn.channel()
            run.fast_queue = f.queue_declare("", exclusive=True)[0]
            f.queue_bind(run.fast_queue, "amq.topic", "ticks.ibm")
            fast: list[int] = []
            f.basic_consume(
                run.fast_queue, callback=lambda m: (fast.append(1), f.basic_ack(m.delivery_tag))
            )
            pub = kc.channel()
            for i in range(25):
                pub.basic_publish(amqp.Message(b"tick %d" % i), "amq.topic", "ticks.ibm")
            _until([fast_conn], lambda: len(fast) == 25)
            s = slow_conn.channel()
            run.slow_queue = s.queue_declare("", exclusive=True)[0]
            s.queue_bind(run.slow_queue, "amq.topic", "ticks.ibm")
            s.basic_qos(0, 1, False)
            held: list[Any] = []
            s.basic_consume(run.slow_queue, callback=held.append)
            pub.tx_select()
            for i in range(12):
                pub.basic_publish(amqp.Message(b"tick %d" % (25 + i)), "amq.topic", "ticks.ibm")
            pub.tx_commit()
            _until([fast_conn, slow_conn], lambda: len(fast) == 37 and len(held) == 1)
            assert b.running.housekeeping.run_job("slow-consumer")
            _until([fast_conn], lambda: b.call(lambda: api.queue("/", run.slow_queue)) is None)
            run.live = {name: depth(name) for name in NAMED}
            for c in (worker, fast_conn):
                c.close()
            try:
                slow_conn.close()
            except (OSError, amqp.exceptions.AMQPError):
                pass
    finally:
        b.stop()
    return run


@pytest.fixture(scope="module")
def fates(tmp_path_factory: pytest.TempPathFactory) -> FatesRun:
    return record_fates(tmp_path_factory.mktemp("fates"))


@pytest.fixture(scope="module")
def fates_report(spark: Any, fates: FatesRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from plugbroker.analyze.report import report

    out = tmp_path_factory.mktemp("fates-report")
    report(fates.journal, out, spark=spark, quiet=True)
    return out


def test_the_reports_backlog_returns_to_zero_when_the_brokers_did(fates, fates_report):
    assert fates.live == dict.fromkeys(NAMED, 0)
    series = pq.read_table(fates_report / "tables" / "series.parquet").to_pylist()
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(series, key=lambda r: r["bucket"]):
        by_queue.setdefault(row["queue"], []).append(row)
    for name in (*NAMED, fates.slow_queue):
        rows = by_queue[name]
        assert rows[-1]["messages"] == 0, (name, rows[-1])
        assert rows[-1]["bytes"] == 0, name
    # and it saw them hold something: the retry copy, the dead letter, the purged messages,
    # the stalled subscription's backlog (the delayed messages are taken as they arrive)
    peak = {name: max(r["messages"] for r in rows) for name, rows in by_queue.items()}
    assert peak["work-RETRY"] >= 1 and peak["work-DLQ"] >= 1
    assert peak["stale"] == 5
    assert sum(r["enqueued"] for r in by_queue["late"]) == 3
    assert sum(r["removed"] for r in by_queue["stale"]) == 5
    assert peak[fates.slow_queue] >= 11


def test_recommend_keeps_its_rules_and_the_real_action(spark, fates, tmp_path):
    from plugbroker.analyze.backtest import backtest
    from plugbroker.analyze.recommend import recommend

    rec = recommend(fates.journal, spark=spark, quiet=True)
    xml = rec.xml
    cfg = parse_config(f"<broker>{xml}</broker>", "recommended.xml")
    vh = cfg.vhosts["/"]
    # minimum acks: "stale" (0 acks, a backlog of 5) and "late" (3 acks) only in a comment
    assert set(vh.queues) == {"work"}, xml
    assert "stale: 0 ack(s), fewer than 20" in xml and "late: 3 ack(s), fewer than 20" in xml
    # dead-letter and retry queues left out, server-named queues never by name
    assert "work-DLQ: a dead-letter or retry queue; left out" in xml
    assert "work-RETRY: a dead-letter or retry queue; left out" in xml
    assert "amq.gen-" not in "".join(line for line in xml.splitlines() if "<queue" in line)
    # the subscriptions grouped by their binding; the threshold that would have missed the real
    # stall (12 messages: twice that, floored at 100) lowered to the running broker's 10
    [ticks] = [t for t in vh.topics if t.key == "ticks.ibm"]
    assert ticks.exchange == "amq.topic"
    assert ticks.sections["consumer"].message_count == 10
    assert "messageCount 10, not 100: the running broker's" in xml
    # it ran the backtest and says so
    assert "Backtested over the same journal" in xml
    check = rec.settings["backtest"]
    assert check["actions"] >= 1 and check["caught"] == check["actions"]
    assert not check["withdrawn"]
    # and an independent backtest of the snippet agrees: it acts on the stalled subscription
    candidate = tmp_path / "recommended.xml"
    candidate.write_text(f"<broker>{xml}</broker>")
    bt = backtest(fates.journal, candidate, spark=spark, every=0.25, quiet=True)
    real = [a for a in bt.actual if a["queue"] == fates.slow_queue and a["outcome"] == "applied"]
    assert real
    would = [a for a in bt.actions if a["queue"] == fates.slow_queue]
    assert would and min(a["at"] for a in would) <= min(a["ts"] for a in real) + 0.25
    assert not any(a["queue"] == fates.fast_queue for a in bt.actions)


def test_a_version_1_journal_is_still_read(spark, tmp_path):
    files = list(V1_JOURNAL.rglob("*.parquet"))
    assert files and pq.read_schema(files[0]).metadata[METADATA_KEY] == b"1"
    assert SCHEMA_VERSION == 3
    check_local_journal(str(V1_JOURNAL))  # no error
    from plugbroker.analyze.report import report

    res = report(V1_JOURNAL, tmp_path / "out", spark=spark, quiet=True)
    assert res.overview["schema_version"] == 1
    work = next(q for q in res.queues if q["queue"] == "work")
    assert work["published"] == 41 and work["acked"] >= 37


def test_due_us_is_read_from_a_journal_mixing_files_with_and_without_it(spark, tmp_path):
    """The optional ``due_us`` column: the version-1 fixture has none, a later file has it. Its
    value reaches the events whichever file Spark would have taken the columns from, and the
    rows of the files without it read as null."""
    import shutil

    import pyarrow as pa

    from plugbroker.analyze.events import read_events
    from plugbroker.plugins.journal import SCHEMA

    assert "due_us" not in pq.read_schema(next(V1_JOURNAL.rglob("*.parquet"))).names
    v1_rows = sum(pq.read_metadata(f).num_rows for f in V1_JOURNAL.rglob("*.parquet"))
    t0 = 1_795_500_000_000_000
    rows = []
    for seq, (event, due_us) in enumerate(
        (("delivered", t0 + 30_000_000), ("touched", None), ("delivered", None))
    ):
        row: dict[str, Any] = dict.fromkeys(SCHEMA.names)
        row.update(
            schema_version=SCHEMA_VERSION,
            ts_us=t0 + seq,
            seq=seq,
            run="r-due",
            event=event,
            vhost="/",
            queue="work",
            message_id=seq + 1,
            due_us=due_us,
        )
        rows.append(row)
    new = pa.Table.from_pylist(rows, schema=SCHEMA)
    # the files without the column sort first, then last
    for name, newer, older in (
        ("a", "date=2026-11-24", "date=2026-11-23"),
        ("b", "date=2026-11-22", "date=2026-11-23"),
    ):
        root = tmp_path / name
        shutil.copytree(V1_JOURNAL / "date=2026-11-23", root / older)
        (root / newer / "hour=00").mkdir(parents=True)
        pq.write_table(new, root / newer / "hour=00" / "events-due.parquet")
        check_local_journal(str(root))
        ev = read_events(spark, root)
        assert "due_us" in ev.columns and ev.count() == v1_rows + 3
        got = {
            (r["event"], r["message_id"]): r["due"] for r in ev.filter(ev.run == "r-due").collect()
        }
        assert got == {
            ("delivered", 1): (t0 + 30_000_000) / 1e6,
            ("touched", 2): None,
            ("delivered", 3): None,
        }
        assert ev.filter(ev.run != "r-due").filter(ev.due.isNotNull()).count() == 0


def test_a_newer_journal_is_refused_with_its_version(tmp_path):
    import pyarrow as pa

    from plugbroker.plugins.journal import SCHEMA

    d = tmp_path / "j" / "date=2026-01-01" / "hour=00"
    d.mkdir(parents=True)
    schema = SCHEMA.with_metadata({METADATA_KEY: b"4"})
    pq.write_table(pa.Table.from_pylist([], schema=schema), d / "events-x.parquet")
    with pytest.raises(JournalError, match="schema version 4; this pipeline reads version 3"):
        check_local_journal(str(tmp_path / "j"))


# ------------------------------------------------------------------------------ the page


def _browser_or_skip() -> None:
    from plugbroker.analyze.pagecheck import NoBrowser, find_browser

    try:
        find_browser()
    except NoBrowser as exc:
        pytest.skip(f"the page check needs headless Chromium: {exc}")


def test_the_report_page_labels_subscriptions_and_explains_outcomes(fates, fates_report):
    page = (fates_report / "report.html").read_text()
    # the subscription queues are labelled with their binding, the amq.gen name under it
    assert f"ticks.ibm on amq.topic<span class='sub'>{fates.slow_queue}</span>" in page
    assert f"ticks.ibm on amq.topic<span class='sub'>{fates.fast_queue}</span>" in page
    # a legend for the outcomes and the dead-letter fates
    assert "<dt>stale</dt><dd>the action found nothing to act on" in page
    assert "<dt>deferred</dt>" in page and "<dt>delivery_limit</dt>" in page
    queues = pq.read_table(fates_report / "tables" / "queues.parquet").to_pylist()
    bound = {q["queue"]: q["bindings"] for q in queues}
    assert bound[fates.slow_queue] == "ticks.ibm on amq.topic"
    assert bound["work"] == "work on jobs"


def test_the_report_page_reads_at_1280_px_without_sideways_scrolling(fates_report, tmp_path):
    _browser_or_skip()
    from plugbroker.analyze.pagecheck import check_page

    res = check_page(fates_report / "report.html", width=1280, screenshot=tmp_path / "page.png")
    assert res.ok, res.problems
    assert res.scroll_width <= 1280
    assert res.screenshot is not None and res.screenshot.stat().st_size > 10_000


def test_the_page_check_sees_a_clipped_label_and_a_wide_table(tmp_path):
    _browser_or_skip()
    from plugbroker.analyze.pagecheck import check_page

    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body>"
        '<svg width="200" height="50" aria-label="plot"><text x="-40" y="20">'
        "dead-lettered (delivery_limit)</text></svg>"
        f"<table><tr>{'<td>123456789</td>' * 200}</tr></table></body></html>"
    )
    res = check_page(bad, width=1280)
    assert not res.ok
    assert any("delivery_limit" in p and "cut off" in p for p in res.problems)
    assert any("wide" in p or "ends at" in p for p in res.problems)


def test_the_package_functions_stay_functions_once_their_modules_are_imported():
    import importlib

    for name in ("report", "backtest", "recommend"):
        importlib.import_module(f"plugbroker.analyze.{name}")
    import plugbroker.analyze as pkg
    from plugbroker.analyze import backtest, recommend, report

    assert callable(report) and callable(backtest) and callable(recommend)
    assert pkg.report is report and not isinstance(report, type(pkg))

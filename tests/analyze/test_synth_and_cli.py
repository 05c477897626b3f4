"""The synthetic journal generator, the ``plugbroker analyze`` commands, and the page's plots."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from plugbroker.analyze import backtest
from plugbroker.analyze.events import JournalError, nice_step
from plugbroker.analyze.htmlreport import bar_chart, fmt_dur, line_chart
from plugbroker.analyze.synth import generate
from plugbroker.cli import main
from plugbroker.config import parse_config
from plugbroker.plugins.journal import SCHEMA, read_journal


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "journal"
    generate(out, events=30_000, queues=6, rate=500.0, quiet=True)
    return out


def test_the_generator_writes_the_journal_schema_and_layout(synthetic):
    files = [p for p in synthetic.rglob("*.parquet")]
    assert files and not [p for p in files if p.name.startswith(".")]
    assert all(p.parent.name.startswith("hour=") for p in files)
    table = read_journal(synthetic)
    assert table.select([f.name for f in SCHEMA]).schema.equals(SCHEMA, check_metadata=False)
    assert 25_000 < table.num_rows < 35_000
    seqs = table.column("seq").to_pylist()
    assert seqs == sorted(seqs)
    kinds = set(table.column("event").to_pylist())
    assert {
        "published",
        "delivered",
        "acked",
        "rejected",
        "redelivered",
        "dead_lettered",
        "expired",
        "dropped",
        "consumer_isolated",
        "policy_action",
    } <= kinds


CANDIDATE = """<broker><housekeeping><period>5s</period></housekeeping>
<virtualhost name="/">
  <queue name="work-0"><isolation><ackTimeout>60s</ackTimeout><checkPeriod>10s</checkPeriod>
  </isolation></queue>
  <topic key="stocks.us.*"><consumer><messageCount>50</messageCount><policy name="Delete"/>
  </consumer></topic>
</virtualhost></broker>"""


def test_backtest_finds_the_synthetic_stall_and_slow_subscriber(spark, synthetic, tmp_path):
    cand = tmp_path / "candidate.xml"
    cand.write_text(CANDIDATE)
    result = backtest(synthetic, cand, spark=spark, quiet=True)
    got = {(a["queue"], a["action"], a["consumer_tag"]) for a in result.actions}
    assert got == {
        ("work-0", "IsolateConsumer", "ctag-stalled"),
        ("amq.gen-slowsubscriber", "CloseConsumerChannels", None),
        ("amq.gen-slowsubscriber", "DeleteQueue", None),
    }
    real = {a["action"]: a for a in result.actual}
    for a in result.actions:
        assert a["at"] <= real[a["action"]]["ts"]
    assert result.periods == {"slow-consumer": 5.0, "isolation": 10.0}


def test_cli_report_backtest_and_recommend(spark, synthetic, tmp_path, capsys):
    out = tmp_path / "report"
    assert (
        main(
            [
                "analyze",
                "report",
                "--journal",
                str(synthetic),
                "--out",
                str(out),
                "--top",
                "3",
                "--quiet",
            ]
        )
        == 0
    )
    assert (out / "report.html").exists() and (out / "csv" / "consumers.csv").exists()
    assert capsys.readouterr().out.strip().endswith("report.html")

    cand = tmp_path / "candidate.xml"
    cand.write_text(CANDIDATE)
    assert (
        main(
            [
                "analyze",
                "backtest",
                "--journal",
                str(synthetic),
                "--config",
                str(cand),
                "--every",
                "5s",
                "--quiet",
                "--fail-on-action",
            ]
        )
        == 3
    )
    text = capsys.readouterr().out
    assert "IsolateConsumer" in text and "ctag-stalled" in text
    assert re.search(r"ackTimeout measured \d+(\.\d+)? > configured 60", text)

    assert main(["analyze", "recommend", "--journal", str(synthetic), "--quiet"]) == 0
    xml = capsys.readouterr().out
    cfg = parse_config(f"<broker>{xml}</broker>")
    assert "work-0" in cfg.vhosts["/"].queues


def test_cli_says_what_is_wrong_with_the_journal(spark, tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / ".events-open.parquet").write_bytes(b"PAR1")
    assert main(["analyze", "recommend", "--journal", str(empty), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no closed journal files" in err and "still being written" in err
    assert (
        main(
            [
                "analyze",
                "report",
                "--journal",
                str(tmp_path / "missing"),
                "--out",
                str(tmp_path / "o"),
                "--quiet",
            ]
        )
        == 2
    )
    assert "no such journal directory" in capsys.readouterr().err


def test_the_analyze_help_names_the_three_commands(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    text = capsys.readouterr().out
    assert all(c in text for c in ("report", "backtest", "recommend"))


# ------------------------------------------------------------------------------------ plots


def test_plots_are_svg_with_axes_and_legend():
    svg = line_chart(
        "throughput", [0.0, 1.0, 2.0], [("published", [1.0, 5.0, 2.0]), ("acked", [0.0, 4.0, 3.0])]
    )
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2 and "published" in svg and "acked" in svg
    bars = bar_chart("hist", ["a", "b"], [3.0, 0.0])
    assert bars.count("<rect") == 3  # background and two bars
    assert "no data" in line_chart("empty", [], [("x", [])])


@pytest.mark.parametrize(
    "v,text",
    [(0, "0"), (0.0004, "400µs"), (0.012, "12ms"), (3.4, "3.4s"), (312, "5m12s"), (7500, "2h05m")],
)
def test_durations_read_like_a_person_writes_them(v: Any, text: str):
    assert fmt_dur(v) == text


def test_bucket_width_is_a_round_number():
    assert nice_step(1655, 240) == 10.0
    assert nice_step(3.1, 240) == 0.02
    assert nice_step(7 * 86400, 240) == 3600.0


def test_a_journal_error_is_an_exception_with_the_path(tmp_path):
    from plugbroker.analyze.events import check_local_journal

    with pytest.raises(JournalError, match="no such journal directory"):
        check_local_journal(str(tmp_path / "x"))

"""``report`` over a large synthetic journal, in local mode: the pipeline's scale benchmark.

    python3 bench/analyze_bench.py [--events 10000000] [--dir /tmp/plugbroker-bench-journal]
        [--reuse] [--backtest] [--driver-memory 4g] [--master local[*]]

Generates the journal with ``plugbroker.analyze.synth`` (timed separately; ``--reuse`` keeps one
already there), then runs ``plugbroker analyze report`` on it and prints both times and the
rate in events per second. The target is 10 million events in under 90 s on a 2-core machine.
With ``--backtest`` it also times a backtest of a candidate config over the same journal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CANDIDATE = """<broker>
  <housekeeping><period>30s</period></housekeeping>
  <virtualhost name="/">
    <queue name="work-0"><isolation><ackTimeout>60s</ackTimeout><checkPeriod>30s</checkPeriod>
    </isolation></queue>
    <consumer><messageAge>20s</messageAge><policy name="Log"/></consumer>
    <topic key="stocks.us.*"><consumer><messageCount>50</messageCount><policy name="Delete"/>
    </consumer></topic>
  </virtualhost>
</broker>
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=float, default=1e7)
    ap.add_argument(
        "--dir", default=os.path.join(tempfile.gettempdir(), "plugbroker-bench-journal")
    )
    ap.add_argument("--reuse", action="store_true", help="keep an existing journal in --dir")
    ap.add_argument("--backtest", action="store_true", help="also time a backtest")
    ap.add_argument("--master", default=None)
    ap.add_argument("--driver-memory", default="4g")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    journal = Path(args.dir)
    gen_s = None
    if not (args.reuse and journal.exists()):
        from plugbroker.analyze.synth import generate

        shutil.rmtree(journal, ignore_errors=True)
        t = time.monotonic()
        summary = generate(journal, events=int(args.events))
        gen_s = time.monotonic() - t
        print(
            f"generated {summary['events']:,} events in {gen_s:.1f} s "
            f"({summary['files']} files, {_size(journal) / 1e6:.0f} MB)",
            flush=True,
        )
    from plugbroker.analyze import report
    from plugbroker.analyze.spark import get_spark

    t = time.monotonic()
    spark = get_spark(args.master, {"spark.driver.memory": args.driver_memory})
    start_s = time.monotonic() - t
    out = Path(tempfile.mkdtemp(prefix="plugbroker-bench-report-"))
    t = time.monotonic()
    result = report(journal, out, spark=spark)
    report_s = time.monotonic() - t
    n = result.overview["events"]
    print(
        f"\nreport: {n:,} events in {report_s:.1f} s ({n / report_s:,.0f} events/s) on "
        f"{spark.sparkContext.master} with {os.cpu_count()} cores; Spark start "
        f"{start_s:.1f} s not included; output {out}"
    )
    if gen_s is not None:
        print(f"generation: {gen_s:.1f} s")
    if args.backtest:
        from plugbroker.analyze import backtest

        cand = out / "candidate.xml"
        cand.write_text(CANDIDATE)
        t = time.monotonic()
        bt = backtest(journal, cand, spark=spark)
        print(
            f"backtest: {bt.events:,} queue events in {time.monotonic() - t:.1f} s, "
            f"{len(bt.actions)} would-be actions"
        )
    spark.stop()


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.parquet"))


if __name__ == "__main__":
    main()

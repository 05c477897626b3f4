"""Soak: the kill -9 cycle of tests/e2e/test_durability.py, many times.

Each run: a fresh store; a publisher process (persistent messages, publisher confirms collected
asynchronously) and a consumer process (acks each message) against a broker subprocess;
SIGKILL at a seeded random moment; restart on the same store; drain. A run fails if a
confirmed, unacked message is missing (lost), if a drained message was never published, or if
one is drained twice. Duplicates (drained messages the consumer had already received: their
ack had not reached the disk) are counted, and allowed.

Run: ``python3 bench/soak_kill9.py --runs 200 [--seed 0] [--sync NORMAL|FULL]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "store"))

from kill9cycle import run_cycle  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="first seed (run i uses seed + i)")
    ap.add_argument("--sync", default="NORMAL", help="SQLite synchronous: NORMAL or FULL")
    ap.add_argument("--kill-min", type=float, default=0.05)
    ap.add_argument("--kill-max", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="soak-kill9-"))
    t0 = time.monotonic()
    totals = dict(
        runs=0,
        failed=0,
        sent=0,
        confirmed=0,
        acked=0,
        drained=0,
        lost=0,
        phantom=0,
        drained_twice=0,
        duplicates=0,
        acked_reappeared=0,
        unconfirmed_kept=0,
    )
    restarts = []
    try:
        for i in range(args.runs):
            seed = args.seed + i
            d = work / f"run{i}"
            r = run_cycle(
                seed,
                d,
                kill_between=(args.kill_min, args.kill_max),
                env={"PLUGBROKER_STORE_SYNC": args.sync},
            )
            totals["runs"] += 1
            totals["failed"] += not r.ok
            for k in (
                "sent",
                "confirmed",
                "acked",
                "drained",
                "duplicates",
                "acked_reappeared",
                "unconfirmed_kept",
            ):
                totals[k] += getattr(r, k)
            totals["lost"] += len(r.lost)
            totals["phantom"] += len(r.phantom)
            totals["drained_twice"] += len(r.drained_twice)
            restarts.append(r.restart_s)
            status = "ok" if r.ok else "FAIL"
            print(
                f"run {i:3d} seed {seed:3d} {status}: killed after {r.killed_after:.2f} s, "
                f"sent {r.sent}, confirmed {r.confirmed}, acked {r.acked}, drained "
                f"{r.drained}, lost {len(r.lost)}, duplicates {r.duplicates}"
                + (f", notes {r.notes}" if r.notes else "")
                + (f", lost ids {r.lost[:10]}" if r.lost else ""),
                flush=True,
            )
            if r.ok and not args.keep:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        elapsed = time.monotonic() - t0
        print(
            f"\n{totals['runs']} runs in {elapsed:.0f} s (sync {args.sync}): "
            + ", ".join(f"{k} {v}" for k, v in totals.items() if k != "runs")
        )
        if restarts:
            print(
                f"restart time: median {sorted(restarts)[len(restarts) // 2]:.2f} s, "
                f"max {max(restarts):.2f} s"
            )
        if not args.keep and totals["failed"] == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directories kept in {work}")
    return 1 if totals["failed"] or totals["lost"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Durable store benchmark: persistent publishes with confirms against a broker subprocess.

Modes:

* ``publish`` (default): ``--publishers`` py-amqp processes, one connection and channel each,
  in confirm mode, publish ``--count`` persistent messages of ``--size`` bytes in total to one
  durable queue. Confirms are collected asynchronously: each publisher keeps up to
  ``--window`` unconfirmed messages in flight (``channel.events['basic_ack']`` callback,
  ``connection.drain_events``), so the figure is throughput, not one round trip per message.
  With ``--consumers N`` the same number of messages is also consumed and acked meanwhile.
* ``fill``: publish ``--count`` messages with nobody consuming, then read the broker's RSS
  (VmRSS, VmHWM) from /proc; ``--restart`` then stops it (SIGTERM), starts it again on the same
  store and reports recovery time and RSS; ``--drain`` consumes everything at the end.

* ``--baseline-python PY``: the ``publish`` mode on two brokers, this tree's and the one
  ``PY`` imports (e.g. another checkout's virtualenv: the parent commit), ``--repeat`` rounds
  interleaved so that load from elsewhere falls on both alike; prints each median and the
  ratios this/baseline (throughput, and broker CPU per message: the store's per-message work,
  such as the body checksum, shows in the second).

``--sync FULL|NORMAL`` picks SQLite's synchronous mode (env PLUGBROKER_STORE_SYNC);
``--no-store`` runs the same load on a broker without a store (the ceiling of the broker itself).

Run: ``python3 bench/store_bench.py --count 200000 --publishers 2``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "store"))
sys.path.insert(0, str(ROOT))

from procutil import BrokerProcess, write_config  # noqa: E402

QUEUE = "bench"


def _connect(port: int) -> Any:
    import amqp

    conn = amqp.Connection(f"127.0.0.1:{port}", heartbeat=0)
    conn.connect()
    return conn


def publisher(
    port: int, n: int, size: int, window: int, persistent: bool, start: Any, result: Any
) -> None:
    import amqp

    conn = _connect(port)
    ch = conn.channel()
    ch.confirm_select()
    state = {"acked": 0, "nacked": 0}

    def on_ack(tag: int, multiple: bool) -> None:
        state["acked"] = tag if multiple else state["acked"] + 1

    def on_nack(tag: int, multiple: bool) -> None:
        state["nacked"] += 1
        state["acked"] = tag if multiple else state["acked"] + 1

    ch.events["basic_ack"].add(on_ack)
    ch.events["basic_nack"].add(on_nack)
    body = b"x" * size
    msg = amqp.Message(body, delivery_mode=2 if persistent else 1)
    start.wait()
    t0 = time.perf_counter()
    c0 = time.process_time()
    sent = 0
    while state["acked"] < n:
        while sent < n and sent - state["acked"] < window:
            ch.basic_publish(msg, "", QUEUE)
            sent += 1
        conn.drain_events(timeout=30)
    result.put(
        (time.perf_counter() - t0, state["acked"], state["nacked"], time.process_time() - c0)
    )
    conn.close()


def consumer(port: int, n: int, prefetch: int, result: Any) -> None:
    conn = _connect(port)
    ch = conn.channel()
    ch.basic_qos(0, prefetch, False)
    got = [0]

    def on_msg(m: Any) -> None:
        got[0] += 1
        if got[0] % 50 == 0 or got[0] == n:
            ch.basic_ack(m.delivery_tag, multiple=True)

    ch.basic_consume(QUEUE, callback=on_msg)
    t0 = time.perf_counter()
    while got[0] < n:
        conn.drain_events(timeout=60)
    result.put((time.perf_counter() - t0, got[0]))
    conn.close()


def declare(port: int) -> None:
    conn = _connect(port)
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True, auto_delete=False)
    conn.close()


def queue_depth(port: int) -> int:
    conn = _connect(port)
    ch = conn.channel()
    _, count, _ = ch.queue_declare(QUEUE, passive=True)
    conn.close()
    return int(count)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def run_publish(port: int, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    start = ctx.Event()
    results: Any = ctx.Queue()
    per = args.count // args.publishers
    procs = [
        ctx.Process(
            target=publisher,
            args=(port, per, args.size, args.window, not args.transient, start, results),
        )
        for _ in range(args.publishers)
    ]
    cons = [
        ctx.Process(
            target=consumer,
            args=(port, per * args.publishers // args.consumers, args.prefetch, results),
        )
        for _ in range(args.consumers)
    ]
    for p in procs + cons:
        p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    cpu0 = cpu_seconds(pid)
    busy0, total0 = machine_busy()
    start.set()
    outs = [results.get(timeout=600) for _ in procs + cons]
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    busy1, total1 = machine_busy()
    import os

    ncpu = os.cpu_count() or 1
    for p in procs + cons:
        p.join(30)
    pubs = [o for o in outs if len(o) == 4]
    acked = sum(o[1] for o in pubs)
    nacked = sum(o[2] for o in pubs)
    client_cpu = sum(o[3] for o in pubs)
    return {
        "published_confirmed": acked,
        "nacked": nacked,
        "seconds": round(wall, 2),
        "msg_per_s": round(acked / wall),
        "broker_cpu_pct": round(100 * cpu / wall),
        "broker_cpu_us_per_msg": round(1e6 * cpu / max(acked, 1), 1),
        "publishers_cpu_pct": round(100 * client_cpu / wall),
        "publisher_cpu_us_per_msg": round(1e6 * client_cpu / max(acked, 1), 1),
        # all CPUs together, everything on the machine (other users' load included)
        "machine_busy_pct": round(100 * ncpu * (busy1 - busy0) / max(total1 - total0, 1)),
    }


def compare(args: Any) -> int:
    """This tree's broker against ``--baseline-python``'s, rounds interleaved (publish mode)."""
    brokers = {"this": sys.executable, "baseline": args.baseline_python}
    figures: dict[str, dict[str, list[float]]] = {k: {"rate": [], "cpu": []} for k in brokers}
    ratios: dict[str, list[float]] = {"rate": [], "cpu": []}
    for r in range(args.repeat):
        row: dict[str, tuple[float, float]] = {}
        for label, python in brokers.items():
            work = Path(tempfile.mkdtemp(prefix=f"store-bench-{label}-"))
            try:
                cfg = write_config(work, work / "store")
                env = {"PLUGBROKER_STORE_SYNC": args.sync}
                b = BrokerProcess(
                    cfg, log=work / "broker.log", env=env, log_level="INFO", python=python
                ).start()
                try:
                    declare(b.port)
                    out = run_publish(b.port, args, b.pid)
                finally:
                    b.stop()
            finally:
                shutil.rmtree(work, ignore_errors=True)
            row[label] = (out["msg_per_s"], out["broker_cpu_us_per_msg"])
            figures[label]["rate"].append(out["msg_per_s"])
            figures[label]["cpu"].append(out["broker_cpu_us_per_msg"])
        ratios["rate"].append(row["this"][0] / row["baseline"][0])
        ratios["cpu"].append(row["this"][1] / row["baseline"][1])
        print(
            f"round {r + 1}: this {row['this'][0]:.0f} msg/s {row['this'][1]:.1f} us/msg, "
            f"baseline {row['baseline'][0]:.0f} msg/s {row['baseline'][1]:.1f} us/msg"
        )
    med = statistics.median
    for label in brokers:
        print(
            f"{label:>10}: {med(figures[label]['rate']):.0f} msg/s, "
            f"broker {med(figures[label]['cpu']):.1f} us CPU per message (median)"
        )
    print(
        f"ratio this/baseline: throughput {med(ratios['rate']):.3f}, "
        f"broker CPU per message {med(ratios['cpu']):.3f} (median of per-round ratios)"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("publish", "fill"), default="publish")
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=0)
    ap.add_argument("--prefetch", type=int, default=500)
    ap.add_argument(
        "--window", type=int, default=1000, help="unconfirmed messages in flight per publisher"
    )
    ap.add_argument("--sync", default="NORMAL", help="SQLite synchronous: NORMAL or FULL")
    ap.add_argument("--no-store", action="store_true")
    ap.add_argument("--transient", action="store_true", help="delivery_mode 1")
    ap.add_argument("--restart", action="store_true", help="fill: restart and measure recovery")
    ap.add_argument("--drain", action="store_true", help="fill: consume everything at the end")
    ap.add_argument(
        "--no-paging",
        action="store_true",
        help="keep every body in memory (PLUGBROKER_STORE_RESIDENT_BYTES huge)",
    )
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    ap.add_argument("--baseline-python", help="compare with the broker this interpreter runs")
    ap.add_argument("--repeat", type=int, default=3, help="rounds with --baseline-python")
    args = ap.parse_args()
    if args.baseline_python:
        return compare(args)

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="store-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    cfg = write_config(work, store)
    if args.no_store:
        text = cfg.read_text().replace(f'<store path="{store}"/>', "")
        cfg.write_text(text)
    env = {"PLUGBROKER_STORE_SYNC": args.sync}
    if args.no_paging:
        env["PLUGBROKER_STORE_RESIDENT_BYTES"] = str(1 << 62)
    report: dict[str, Any] = {
        "mode": args.mode,
        "count": args.count,
        "size": args.size,
        "publishers": args.publishers,
        "consumers": args.consumers,
        "window": args.window,
        "sync": args.sync,
        "paging": not args.no_paging,
        "store": not args.no_store,
    }
    b = BrokerProcess(cfg, log=work / "broker.log", env=env, log_level="INFO").start()
    try:
        declare(b.port)
        report.update(run_publish(b.port, args, b.pid))
        if args.mode == "fill":
            report["depth"] = queue_depth(b.port)
            st = b.status()
            report["rss_mib"] = round(st["VmRSS"] / 1024)
            report["peak_rss_mib"] = round(st["VmHWM"] / 1024)
            db = store / "plugbroker.db"
            if db.exists():
                report["db_mib"] = round(db.stat().st_size / 2**20)
            if args.restart:
                t0 = time.perf_counter()
                b.stop()
                report["stop_s"] = round(time.perf_counter() - t0, 2)
                b = BrokerProcess(cfg, log=work / "broker.log", env=env, log_level="INFO").start(
                    timeout=600
                )
                report["restart_s"] = round(b.started_in, 2)
                report["depth_after_restart"] = queue_depth(b.port)
                st = b.status()
                report["rss_after_restart_mib"] = round(st["VmRSS"] / 1024)
                report["peak_rss_after_restart_mib"] = round(st["VmHWM"] / 1024)
            if args.drain:
                ctx = mp.get_context("fork")
                results: Any = ctx.Queue()
                n = report.get("depth_after_restart", report["depth"])
                p = ctx.Process(target=consumer, args=(b.port, n, args.prefetch, results))
                p.start()
                secs, got = results.get(timeout=1200)
                p.join(30)
                report["drained"] = got
                report["drain_msg_per_s"] = round(got / secs)
                report["peak_rss_drain_mib"] = round(b.status()["VmHWM"] / 1024)
    finally:
        b.stop()
        for line in (work / "broker.log").read_text(errors="replace").splitlines():
            if "batches," in line and "operations written" in line:
                # "store ... closed (N batches, M operations written)"
                nums = [
                    int(w.strip("(,;"))
                    for w in line.split("closed", 1)[1].split()
                    if w.strip("(,;").isdigit()
                ]
                if len(nums) >= 4 and nums[0]:
                    report["store_batches"] = nums[0]
                    report["ops_per_batch"] = round(nums[1] / nums[0], 1)
                    report["rows_inserted"] = nums[2]
                    report["rows_deleted"] = nums[3]
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    for k, v in report.items():
        print(f"{k:>28}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

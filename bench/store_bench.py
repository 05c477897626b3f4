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

``--sync FULL|NORMAL`` picks SQLite's synchronous mode (env PLUGBROKER_STORE_SYNC);
``--no-store`` runs the same load on a broker without a store (the ceiling of the broker itself).

Run: ``python3 bench/store_bench.py --count 200000 --publishers 2``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
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
    args = ap.parse_args()

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

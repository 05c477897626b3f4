"""End-to-end throughput with the event journal on and off.

    python3 bench/journal_bench.py [--messages 100000] [--rounds 3] [--size 100]
        [--prefetch 500] [--ack-every 1]

Starts the broker as a subprocess (``python3 -m plugbroker run``) on a free loopback port, once with
``<journal path=...>`` and once without, alternating for ``--rounds`` rounds, and drives it with
two py-amqp client processes: a publisher (no confirms, the broker's flow control paces it) and a
consumer (prefetch ``--prefetch``, a manual ack per message, or a ``multiple`` ack every
``--ack-every``). Throughput is messages consumed divided by the time from the first publish to
the last delivery. Prints each round and the medians; the target is journal-on at least 85% of
journal-off. With the journal on it also checks that every message is in the journal.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="{port}"/>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  {journal}
  <virtualhost name="/"/>
</broker>
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(workdir: Path, journal: bool) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    jel = f'<journal path="{workdir / "journal"}"/>' if journal else ""
    cfg = workdir / "bench.xml"
    cfg.write_text(CONFIG.format(port=port, journal=jel))
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugbroker", "--log-level", "WARNING", "run", "--config", str(cfg)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(
        f"broker did not start: {proc.stdout.read().decode() if proc.stdout else ''}"
    )


def stop_broker(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def publisher(port: int, n: int, size: int, ready: Any, go: Any, started: Any) -> None:
    import amqp

    with amqp.Connection(host=f"127.0.0.1:{port}") as conn:
        ch = conn.channel()
        body = b"x" * size
        ready.set()
        go.wait()
        started.value = time.time()
        for _ in range(n):
            ch.basic_publish(amqp.Message(body), "", "bench")


def consumer(port: int, n: int, prefetch: int, ack_every: int, ready: Any, done: Any) -> None:
    import amqp

    with amqp.Connection(host=f"127.0.0.1:{port}") as conn:
        ch = conn.channel()
        ch.basic_qos(0, prefetch, False)
        got = [0]

        def on(m: amqp.Message) -> None:
            got[0] += 1
            if got[0] % ack_every == 0 or got[0] == n:
                ch.basic_ack(m.delivery_tag, multiple=ack_every > 1)

        ch.basic_consume("bench", callback=on)
        ready.set()
        while got[0] < n:
            conn.drain_events(timeout=30)
        done.value = time.time()


def one_round(journal: bool, args: argparse.Namespace) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="plugbroker-jbench-"))
    proc, port = start_broker(workdir, journal)
    try:
        import amqp

        with amqp.Connection(host=f"127.0.0.1:{port}") as conn:
            conn.channel().queue_declare("bench", auto_delete=False)
        ctx = mp.get_context("spawn")
        c_ready, p_ready, go = ctx.Event(), ctx.Event(), ctx.Event()
        started, done = ctx.Value("d", 0.0), ctx.Value("d", 0.0)
        c = ctx.Process(
            target=consumer,
            args=(port, args.messages, args.prefetch, args.ack_every, c_ready, done),
        )
        p = ctx.Process(
            target=publisher, args=(port, args.messages, args.size, p_ready, go, started)
        )
        c.start()
        p.start()
        c_ready.wait(30)
        p_ready.wait(30)
        go.set()
        p.join(600)
        c.join(600)
        rate = args.messages / (done.value - started.value)
    finally:
        stop_broker(proc)
    if journal:
        from plugbroker.plugins.journal import read_journal

        t = read_journal(workdir / "journal", columns=["event", "queue"])
        events = t.column("event").to_pylist()
        for kind in ("published", "delivered", "acked"):
            assert events.count(kind) == args.messages, (kind, events.count(kind))
        dropped = events.count("journal_dropped")
        assert not dropped, "the journal dropped events"
    shutil.rmtree(workdir, ignore_errors=True)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--prefetch", type=int, default=500)
    ap.add_argument("--ack-every", type=int, default=1)
    args = ap.parse_args()
    off: list[float] = []
    on: list[float] = []
    for i in range(args.rounds):
        for journal, bucket in ((False, off), (True, on)):
            rate = one_round(journal, args)
            bucket.append(rate)
            print(
                f"round {i + 1}: journal {'on ' if journal else 'off'} {rate:,.0f} msg/s",
                flush=True,
            )
    m_off, m_on = statistics.median(off), statistics.median(on)
    paired = statistics.median(b / a for a, b in zip(off, on))
    print(
        f"\n{args.messages:,} messages of {args.size} B, prefetch {args.prefetch}, "
        f"ack every {args.ack_every}, {os.cpu_count()} cores"
    )
    print(f"journal off: {m_off:,.0f} msg/s (median of {len(off)})")
    print(f"journal on:  {m_on:,.0f} msg/s (median of {len(on)})")
    print(
        f"on/off: {m_on / m_off:.1%} of the medians, {paired:.1%} median of the paired "
        "rounds (target >= 85%)"
    )


if __name__ == "__main__":
    main()

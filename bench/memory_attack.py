"""The memory phases of bench/attack_bench.py: a broker's resident size against its memory
watermark while one tenant floods it, each phase on a broker of its own.

    python3 bench/attack_bench.py --only "header-heavy flood;150,000-queue declares"
    python3 bench/memory_attack.py [--broker-python PATH] [--watermark-mb 300]

- ``header-heavy flood``: a tenant (its own vhost) publishes transient one-byte messages whose
  headers hold 120 KB to a queue nobody consumes, up to 10,000 of them (1.2 GB) or until its
  writes block; then another connection of the tenant purges the queue.
- ``150,000-queue declares``: the tenant declares 150,000 empty queues (pipelined, a round trip
  every 1,000), with ``maxQueuesPerVhost`` lifted (0) so that the memory alarm is what stops
  it; then another connection deletes them.

Meanwhile a bystander in vhost ``/`` publishes persistent messages with confirms. Printed per
phase: the broker's peak resident size (``VmHWM``) as a multiple of the watermark, whether the
tenant was sent connection.blocked, what it did, the bystander's publishes and worst wait, and
the resident size before the phase and after the purge (or the deletes). ``--broker-python``
runs another tree's broker (a virtualenv whose ``plugbroker`` is that tree), to put a figure
before a change beside the one after.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import amqp

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  <users><user name="guest" password="guest" vhosts="/ tenant"/></users>
  <limits>
    <memoryHighWatermark>{watermark}MB</memoryHighWatermark>
    <maxQueuesPerVhost>0</maxQueuesPerVhost>
  </limits>
  <virtualhost name="/"/>
  <virtualhost name="tenant"/>
</broker>
"""

HEADER_BYTES = 120_000
FLOOD_MESSAGES = 10_000
QUEUES = 150_000
MB = 1024 * 1024


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _connect(port: int, vhost: str, **kw: Any) -> amqp.Connection:
    c = amqp.Connection(
        f"127.0.0.1:{port}", userid="guest", password="guest", virtual_host=vhost, **kw
    )
    c.connect()
    return c


def _flood(port: int, out: Any) -> None:
    blocked: list[float] = []
    sent = 0
    conn = _connect(port, "tenant", on_blocked=lambda _r: blocked.append(1))
    conn.sock.settimeout(5)
    ch = conn.channel()
    ch.queue_declare("flood", auto_delete=False)
    headers = {"h": "x" * HEADER_BYTES}
    try:
        for _ in range(FLOOD_MESSAGES):
            ch.basic_publish(amqp.Message(b"1", application_headers=headers), "", "flood")
            sent += 1
            if sent % 100 == 0:
                try:
                    conn.drain_events(timeout=0.001)
                except TimeoutError:
                    pass
    except (OSError, amqp.exceptions.AMQPError):
        # its writes blocked: the broker stopped reading from it; connection.blocked may
        # still sit unread in the socket
        try:
            conn.drain_events(timeout=2)
        except Exception:
            pass
    out.put({"published": sent, "blocked": bool(blocked)})


def _declares(port: int, out: Any) -> None:
    blocked: list[float] = []
    made = 0
    conn = _connect(port, "tenant", on_blocked=lambda _r: blocked.append(1))
    conn.sock.settimeout(10)
    ch = conn.channel()
    outcome = "all declared"
    try:
        while made < QUEUES:
            for _ in range(999):
                ch.queue_declare(f"tenant-q{made:06d}", auto_delete=False, nowait=True)
                made += 1
            made += 1
            ch.queue_declare(f"tenant-q{made - 1:06d}", auto_delete=False)
    except Exception as exc:  # no declare-ok: the broker stopped reading from it
        outcome = type(exc).__name__
    out.put({"declares sent": made, "blocked": bool(blocked), "outcome": outcome})


def _bystander(port: int, stop: threading.Event, res: dict[str, Any]) -> None:
    conn = _connect(port, "/", confirm_publish=True, on_blocked=lambda _r: res.update(blocked=1))
    ch = conn.channel()
    # bounded: what it holds stays small, so the alarm never takes it for a heavy tenant
    ch.queue_declare("bystander", durable=True, auto_delete=False, arguments={"x-max-length": 1000})
    worst, n = 0.0, 0
    while not stop.is_set():
        t = time.perf_counter()
        ch.basic_publish(amqp.Message(b"b" * 256, delivery_mode=2), "", "bystander", timeout=300)
        worst = max(worst, time.perf_counter() - t)
        n += 1
    res.update(publishes=n, worst_ms=worst * 1000, held=ch.queue_purge("bystander"))
    conn.close()


def _cleanup(port: int, phase: str, made: int) -> None:
    conn = _connect(port, "tenant")
    ch = conn.channel()
    if phase == "header-heavy flood":
        ch.queue_purge("flood")
    else:
        for i in range(made):
            ch.queue_delete(f"tenant-q{i:06d}", nowait=True)
        ch.queue_declare("sync", auto_delete=True)  # a round trip after the deletes
    conn.close()


def _settled_rss(pid: int, seconds: float = 5.0) -> int:
    """The resident size once it stops falling (a bench may wait on the clock)."""
    last = _status(pid, "VmRSS")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _status(pid, "VmRSS")
        if now >= last - MB:
            return now
        last = now
    return last


def run_phase(phase: str, python: str, watermark_mb: int) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="memory-attack-"))
    cfg = tmp / "broker.xml"
    cfg.write_text(CONFIG.format(watermark=watermark_mb))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = open(tmp / "broker.log", "ab")  # closed below
    proc = subprocess.Popen(
        [python, "-m", "plugbroker", "--log-level", "WARNING", "run", "--config", str(cfg)]
        + ["--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=log,
        env=dict(os.environ, PYTHONPATH=""),
        cwd=str(tmp),
    )
    try:
        assert proc.stdout is not None
        if b"listening" not in proc.stdout.readline():
            raise SystemExit("broker did not start")
        before = _status(proc.pid, "VmRSS")
        stop = threading.Event()
        by: dict[str, Any] = {}
        t = threading.Thread(target=_bystander, args=(port, stop, by), daemon=True)
        t.start()
        spawn = mp.get_context("spawn")  # a fork beside the bystander's thread may deadlock
        out: Any = spawn.Queue()
        attacker = spawn.Process(
            target=_flood if phase == "header-heavy flood" else _declares, args=(port, out)
        )
        attacker.start()
        try:
            res = out.get(timeout=180)
        except Exception:  # its writes hang: the broker stopped reading from it
            res = {"result": "no answer within 180 s"}
        attacker.terminate()
        attacker.join(30)
        if proc.poll() is not None:
            return f"{phase:24} the broker exited ({proc.returncode}); see {tmp / 'broker.log'}"
        peak = _status(proc.pid, "VmHWM")
        made = int(res.get("declares sent", 0))
        _cleanup(port, phase, made)
        after = _settled_rss(proc.pid)
        stop.set()
        t.join(60)
        watermark = watermark_mb * MB
        return (
            f"{phase:24} peak RSS {peak / MB:7.0f} MB = {peak / watermark:5.2f}x the "
            f"{watermark_mb} MB watermark; tenant {res}; bystander {by.get('publishes')} "
            f"confirmed, worst {by.get('worst_ms', 0):.1f} ms, blocked "
            f"{'yes' if by.get('blocked') else 'no'}; RSS {before / MB:.0f} MB before, "
            f"{after / MB:.0f} MB after the {'purge' if 'flood' in phase else 'deletes'}"
        )
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


PHASES = ("header-heavy flood", "150,000-queue declares")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker-python", default=sys.executable)
    ap.add_argument("--watermark-mb", type=int, default=300)
    ap.add_argument("--only", default="", help="the phases, separated by ';' (default: both)")
    args = ap.parse_args()
    for phase in PHASES:
        if not args.only or phase in args.only:
            print(run_phase(phase, args.broker_python, args.watermark_mb), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

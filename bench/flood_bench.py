"""Memory alarm and flow control under a flood: broker RSS against memoryHighWatermark.

Two scenarios against a plugbroker subprocess (``<memoryHighWatermark>`` 300MB by default):

* ``flood``: one py-amqp publisher sends 1 KiB transient messages into a queue with no consumer
  for ``--seconds`` (default 180). A well-behaved client: it publishes in batches of 100 and
  stops when it hears connection.blocked. Then a consumer drains the queue. Printed: the
  broker's largest RSS against the watermark, the time from the alarm being raised (the
  broker's log line, written by the check that saw the crossing) to the publisher hearing
  connection.blocked, and from the alarm being cleared (memory below the low mark) to the
  publisher hearing connection.unblocked.
* ``stalled``: ``--stalled`` connections (default 30) each send ``--partial-mib`` (100) MiB of a
  127 MiB body and stop. Printed: RSS before, the largest RSS while they stall, and RSS after
  the broker closed them (``<bodyStallTimeout>``, 5 s here) and they disconnected.

* ``idle``: ``--idle`` connections (default 10,000) open (handshake done, one channel) and
  idle. Printed: RSS before and after, and per connection.

RSS is read from ``/proc/PID/status`` every 50 ms. Linux only.

    python3 bench/flood_bench.py                       # both, 180 s flood
    python3 bench/flood_bench.py --seconds 30 --only flood
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import amqp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from rawclient import RawClient, body_frame, header_frame, method_frame  # noqa: E402

CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <limits>
    <memoryHighWatermark>{watermark}</memoryHighWatermark>
    <bodyStallTimeout>{stall}</bodyStallTimeout>
  </limits>
  <virtualhost name="/"/>
</broker>
"""

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    """The broker's RSS every 50 ms; ``peak`` since the last :meth:`reset`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.last = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.last = rss(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, self.last)

    def reset(self) -> None:
        self.peak = self.last


class Broker:
    def __init__(self, watermark: str, stall: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="plugbroker-flood-"))
        config = self.tmp / "flood.xml"
        config.write_text(CONFIG.format(watermark=watermark, stall=stall))
        self.port = free_port()
        self.log_path = self.tmp / "broker.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "plugbroker", "run", "--config", str(config)]
            + ["--port", str(self.port)],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the broker did not listen in time")

    def wait_log(self, needle: str, timeout: float) -> float | None:
        """time.time() when ``needle`` appeared in the log (polled every 5 ms), else None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log_path.read_text():
                return time.time()
            time.sleep(0.005)
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def flood(seconds: float, watermark: str) -> dict[str, float | None]:
    b = Broker(watermark, "30s")
    sampler = Sampler(b.proc.pid)
    sampler.start()
    base = rss(b.proc.pid)
    state: dict[str, float | None] = {"blocked": None, "unblocked": None}
    pub = amqp.Connection(
        f"127.0.0.1:{b.port}",
        userid="guest",
        password="guest",
        on_blocked=lambda reason: state.__setitem__("blocked", time.time()),
        on_unblocked=lambda: state.__setitem__("unblocked", time.time()),
    )
    pub.connect()
    ch = pub.channel()
    ch.queue_declare("flood", auto_delete=False)
    body = b"f" * 1024
    raised_at: list[float | None] = [None]
    watcher = threading.Thread(
        target=lambda: raised_at.__setitem__(0, b.wait_log("resource alarm raised", seconds)),
        daemon=True,
    )
    watcher.start()
    sent = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            if state["blocked"] is None:
                for _ in range(100):
                    ch.basic_publish(amqp.Message(body), routing_key="flood")
                sent += 100
            try:
                pub.drain_events(timeout=0.001 if state["blocked"] is None else 0.2)
            except (TimeoutError, BlockingIOError):
                pass
        watcher.join(1)
        peak_flood = sampler.peak
        # drain with a consumer on its own connection until the publisher hears unblocked
        cleared_at: list[float | None] = [None]
        w2 = threading.Thread(
            target=lambda: cleared_at.__setitem__(0, b.wait_log("resource alarm cleared", 120)),
            daemon=True,
        )
        w2.start()
        consumer = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
        consumer.connect()
        cch = consumer.channel()
        cch.basic_qos(0, 1000, False)
        got = [0]

        def on_message(m: amqp.Message) -> None:
            got[0] += 1
            if got[0] % 500 == 0:
                cch.basic_ack(m.delivery_tag, multiple=True)

        cch.basic_consume("flood", callback=on_message)
        deadline = time.monotonic() + 120
        while state["unblocked"] is None and time.monotonic() < deadline:
            for _ in range(1000):  # py-amqp handles one frame per drain_events
                try:
                    consumer.drain_events(timeout=0.05)
                except TimeoutError:
                    break
            try:
                pub.drain_events(timeout=0.001)
            except (TimeoutError, BlockingIOError):
                pass
        w2.join(1)
        print(f"  consumed {got[0]} messages to clear the alarm", file=sys.stderr)
        for c in (consumer, pub):
            try:
                c.close()
            except OSError as exc:
                print(f"  closing a client: {exc!r}", file=sys.stderr)
    finally:
        sampler.stop.set()
        b.stop()
    out: dict[str, float | None] = {
        "rss_start_mb": base / MIB,
        "rss_peak_mb": peak_flood / MIB,
        "published": float(sent),
        "alarm_to_blocked_ms": (
            (state["blocked"] - raised_at[0]) * 1000 if state["blocked"] and raised_at[0] else None
        ),
        "cleared_to_unblocked_ms": (
            (state["unblocked"] - cleared_at[0]) * 1000
            if state["unblocked"] and cleared_at[0]
            else None
        ),
    }
    return out


def stalled(n: int, partial_mib: int, watermark: str) -> dict[str, float]:
    b = Broker(watermark, "5s")
    sampler = Sampler(b.proc.pid)
    sampler.start()
    time.sleep(0.2)
    before = rss(b.proc.pid)
    clients: list[RawClient] = []
    chunk = b"s" * (131072 - 8)
    frame = body_frame(1, chunk)
    per = partial_mib * MIB // len(chunk)

    def send(raw: RawClient) -> None:
        raw.sock.settimeout(2.0)
        try:
            raw.send(method_frame(1, "basic.publish", 0, "", "nowhere", False, False))
            raw.send(header_frame(1, 127 * MIB))
            for _ in range(per):
                raw.sock.sendall(frame)
        except OSError:
            pass  # the broker stopped reading (memory alarm) or closed it

    try:
        threads = []
        for _ in range(n):
            raw = RawClient(b.port)
            raw.handshake()
            clients.append(raw)
            t = threading.Thread(target=send, args=(raw,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(120)
        # they stall now; the broker closes them after bodyStallTimeout
        deadline = time.monotonic() + 30
        closed = 0
        for raw in clients:
            if raw.wait_closed(timeout=max(0.1, deadline - time.monotonic())):
                closed += 1
        for raw in clients:
            raw.close()
        time.sleep(2.0)
        after = rss(b.proc.pid)
    finally:
        sampler.stop.set()
        b.stop()
    return {
        "rss_before_mb": before / MIB,
        "rss_peak_mb": sampler.peak / MIB,
        "rss_after_mb": after / MIB,
        "closed_by_broker": float(closed),
    }


def idle(n: int, watermark: str) -> dict[str, float]:
    b = Broker(watermark, "30s")
    time.sleep(0.5)
    before = rss(b.proc.pid)
    clients: list[RawClient] = []
    try:
        started = time.monotonic()
        for _ in range(n):
            raw = RawClient(b.port, timeout=30)
            raw.handshake()
            clients.append(raw)
        opened_s = time.monotonic() - started
        time.sleep(2.0)
        after = rss(b.proc.pid)
        # the broker still answers a new client while holding them
        t0 = time.monotonic()
        probe = RawClient(b.port)
        probe.handshake()
        probe.close()
        probe_ms = (time.monotonic() - t0) * 1000
    finally:
        for raw in clients:
            raw.close()
        b.stop()
    return {
        "connections": float(len(clients)),
        "open_seconds": opened_s,
        "rss_before_mb": before / MIB,
        "rss_after_mb": after / MIB,
        "kib_per_connection": (after - before) / 1024 / max(1, len(clients)),
        "new_client_handshake_ms": probe_ms,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=180.0, help="flood duration (default 180)")
    ap.add_argument("--watermark", default="300MB")
    ap.add_argument("--stalled", type=int, default=30)
    ap.add_argument("--partial-mib", type=int, default=100)
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--only", choices=("flood", "stalled", "idle"))
    args = ap.parse_args()
    wm = args.watermark
    m = re.fullmatch(r"(\d+)MB", wm)
    wm_mb = int(m.group(1)) if m else None
    if args.only in (None, "flood"):
        r = flood(args.seconds, wm)
        print(f"flood: {args.seconds:.0f} s of 1 KiB transient messages, watermark {wm}")
        for k, v in r.items():
            print(f"  {k:26} {'-' if v is None else f'{v:.1f}'}")
        if wm_mb and r["rss_peak_mb"] is not None:
            print(f"  peak RSS / watermark        {r['rss_peak_mb'] / wm_mb:.2f}")
    if args.only in (None, "stalled"):
        r2 = stalled(args.stalled, args.partial_mib, wm)
        print(
            f"stalled: {args.stalled} connections x {args.partial_mib} MiB of a 127 MiB body, "
            f"watermark {wm}, bodyStallTimeout 5s"
        )
        for k, v in r2.items():
            print(f"  {k:26} {v:.1f}")
    if args.only in (None, "idle"):
        r3 = idle(args.idle, wm)
        print(f"idle: {args.idle} connections, handshake done, one channel each")
        for k, v in r3.items():
            print(f"  {k:26} {v:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

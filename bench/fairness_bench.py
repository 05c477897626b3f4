"""Fairness: a bystander's publish+get latency while another client does heavy work.

A bystander (py-amqp, confirm mode) publishes one 1 KiB message and fetches it back with
basic.get, over and over; each round trip is one sample. Phases, each ``--seconds`` long:

* ``idle``: nobody else.
* ``flood``: another connection pipelines 1 KiB basic.publish (no confirms) into a queue nobody
  consumes, as fast as the socket takes them (raw frames, no client library in the way).
* ``declare``: another connection pipelines ``--queues`` queue.declare (nowait) on its own
  names, 100,000 by default.
* ``purge``: another connection fills a queue with ``--purge-messages`` messages (not timed),
  then purges it while the bystander runs.
* ``admin-purge``, ``admin-delete``: the same queue, purged or deleted through the admin API
  (``POST /api/queues/%2F/fair-purge/purge`` or ``.../delete``).
* ``admin-redrive``: a dead-letter queue of ``--purge-messages`` messages (each names its
  origin queue in ``REAL_TOPIC``) redriven through the admin API, without a rate.

The admin phases report, besides the bystander's round trips, how long the admin call took
(``admin ms``).

The heavy client runs in a separate process, so the bystander competes with it only inside
the broker. ``--root`` runs the same phases against another tree in the same run (before /
after a change), e.g. ``--root /path/to/main``.

Run: ``python3 bench/fairness_bench.py [--seconds 5] [--queues 100000] [--root DIR ...]
[--python PY ...]``; with the package installed in a venv, another tree needs its own venv's
interpreter (``--python``), or its broker would import this one.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import amqp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import ROOT, OwnBroker

PHASES = ("idle", "flood", "declare", "purge", "admin-purge", "admin-delete", "admin-redrive")
ADMIN_PHASES = ("admin-purge", "admin-delete", "admin-redrive")

# ------------------------------------------------------------------ raw frames (the heavy client)


def _shortstr(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def _longstr(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def _method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    return _frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


EMPTY_TABLE = b"\x00\x00\x00\x00"


def _publish(queue: str, body: bytes, origin: str | None = None) -> bytes:
    """basic.publish to ``queue``; with ``origin``, a ``REAL_TOPIC`` header naming it (a dead
    letter whose origin queue a redrive reads)."""
    method = _method(1, 60, 40, b"\x00\x00" + _shortstr("") + _shortstr(queue) + b"\x00")
    if origin is None:
        props = struct.pack(">H", 0)
    else:
        table = _shortstr("REAL_TOPIC") + b"S" + _longstr(origin.encode())
        props = struct.pack(">H", 0x2000) + _longstr(table)
    header = _frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + props)
    return method + header + _frame(3, 1, body)


def _declare(name: str, nowait: bool = True) -> bytes:
    bits = 0x10 if nowait else 0
    return _method(1, 50, 10, b"\x00\x00" + _shortstr(name) + bytes([bits]) + EMPTY_TABLE)


def _raw_connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    _read_method(s)  # connection.start
    s.sendall(
        _method(
            0,
            10,
            11,
            EMPTY_TABLE + _shortstr("PLAIN") + _longstr(b"\x00guest\x00guest") + _shortstr("en_US"),
        )
    )
    _read_method(s)  # connection.tune
    s.sendall(_method(0, 10, 31, struct.pack(">HIH", 2047, 131072, 0)))
    s.sendall(_method(0, 10, 40, _shortstr("/") + _shortstr("") + b"\x00"))
    _read_method(s)  # open-ok
    s.sendall(_method(1, 20, 10, _shortstr("")))
    _read_method(s)  # channel.open-ok
    return s


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _read_method(s: socket.socket) -> tuple[int, int]:
    kind, _ch, size = struct.unpack(">BHI", _read_exact(s, 7))
    payload = _read_exact(s, size + 1)[:-1]
    return struct.unpack(">HH", payload[:4]) if kind == 1 else (0, 0)


def _drain(s: socket.socket, stop: threading.Event) -> None:
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            if not s.recv(65536):
                return
        except TimeoutError:
            continue
        except OSError:
            return


def _fill(s: socket.socket, queue: str, n: int, body: bytes, origin: str | None = None) -> None:
    """Publish ``n`` messages into ``queue`` and wait until they are all in."""
    s.sendall(_declare(queue, nowait=False))
    _read_method(s)
    batch = _publish(queue, body, origin) * 1000
    for _ in range(n // 1000):
        s.sendall(batch)
    # wait until they are all in: a passive declare answers with the count
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        s.sendall(_method(1, 50, 10, b"\x00\x00" + _shortstr(queue) + b"\x01" + EMPTY_TABLE))
        while True:
            kind, _ch, size = struct.unpack(">BHI", _read_exact(s, 7))
            payload = _read_exact(s, size + 1)[:-1]
            if kind == 1 and payload[:4] == struct.pack(">HH", 50, 11):
                count = payload[4 + 1 + payload[4] :][:4]
                break
        if struct.unpack(">I", count)[0] >= n // 1000 * 1000:
            return
        time.sleep(0.2)


def _admin_post(admin_port: int, path: str, took: Any) -> None:
    import base64
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=600)
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    t0 = time.perf_counter()
    c.request("POST", path, headers={"Authorization": auth, "Content-Length": "0"})
    resp = c.getresponse()
    body = resp.read()
    took.value = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"POST {path}: {resp.status} {body[:200]!r}")
    c.close()


def heavy(
    port: int,
    phase: str,
    queues: int,
    purge_messages: int,
    ready: Any,
    go: Any,
    admin_port: int | None = None,
    took: Any = None,
) -> None:
    """The heavy client: runs ``phase`` until its work is done or the parent stops it."""
    s = _raw_connect(port)
    stop = threading.Event()
    body = b"x" * 1024
    if phase == "flood":
        s.sendall(_declare("fair-flood", nowait=False))
        _read_method(s)
        batch = _publish("fair-flood", body) * 200
        threading.Thread(target=_drain, args=(s, stop), daemon=True).start()
        ready.set()
        go.wait()
        try:
            while True:
                s.sendall(batch)
        except OSError:
            return
    elif phase == "declare":
        threading.Thread(target=_drain, args=(s, stop), daemon=True).start()
        ready.set()
        go.wait()
        try:
            for start in range(0, queues, 1000):
                s.sendall(b"".join(_declare(f"fair-q-{i}") for i in range(start, start + 1000)))
        except OSError:
            return
    elif phase == "purge":
        _fill(s, "fair-purge", purge_messages, body)
        ready.set()
        go.wait()
        s.sendall(_method(1, 50, 30, b"\x00\x00" + _shortstr("fair-purge") + b"\x00"))
        _read_method(s)
    elif phase in ADMIN_PHASES:
        assert admin_port is not None
        if phase == "admin-redrive":
            s.sendall(_declare("fair-origin", nowait=False))
            _read_method(s)
            _fill(s, "fair-dlq", purge_messages, body, origin="fair-origin")
            path = "/api/queues/%2F/fair-dlq/redrive"
        else:
            _fill(s, "fair-purge", purge_messages, body)
            path = "/api/queues/%2F/fair-purge/" + phase.removeprefix("admin-")
        ready.set()
        go.wait()
        time.sleep(0.5)  # the bystander is in its loop by then
        _admin_post(admin_port, path, took)
    stop.set()
    s.close()


# ------------------------------------------------------------------ the bystander


def bystander(url_port: int, seconds: float) -> list[float]:
    c = amqp.Connection(f"127.0.0.1:{url_port}", userid="guest", password="guest")
    c.connect()
    ch = c.channel()
    ch.confirm_select()
    ch.queue_declare("fair-bystander", auto_delete=False)
    body = b"b" * 1024
    lat: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        ch.basic_publish(amqp.Message(body), routing_key="fair-bystander")
        got = ch.basic_get("fair-bystander", no_ack=True)
        lat.append(time.perf_counter() - t0)
        assert got is not None
    c.close()
    return lat


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def run(
    root: Path,
    phases: list[str],
    seconds: float,
    queues: int,
    purge: int,
    python: str | None = None,
) -> list[str]:
    rows = []
    for phase in phases:
        b = OwnBroker(root=root, admin=phase in ADMIN_PHASES, python=python)
        try:
            ctx = mp.get_context("spawn")
            ready, go = ctx.Event(), ctx.Event()
            took = ctx.Value("d", float("nan"))
            proc = None
            if phase != "idle":
                proc = ctx.Process(
                    target=heavy,
                    args=(b.port, phase, queues, purge, ready, go, b.admin_port, took),
                )
                proc.start()
                if not ready.wait(180):
                    raise RuntimeError(f"{phase}: the heavy client did not get ready")
            go.set()
            t0 = time.monotonic()
            lat = bystander(b.port, seconds)
            took_s = time.monotonic() - t0
            if proc is not None:
                if phase in ADMIN_PHASES:
                    proc.join(600)  # the admin call's answer
                proc.terminate()
                proc.join(10)
            rows.append(
                f"| {root.name or root} | {phase} | {len(lat)} | {len(lat) / took_s:.0f} | "
                f"{pct(lat, 0.5):.2f} | {pct(lat, 0.99):.2f} | {max(lat) * 1000:.1f} | "
                f"{took.value * 1000:.0f} |"
            )
            print(rows[-1], flush=True)
        finally:
            b.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="bystander time per phase")
    ap.add_argument("--queues", type=int, default=100_000, help="queues the declare phase makes")
    ap.add_argument("--purge-messages", type=int, default=200_000)
    ap.add_argument("--phase", choices=PHASES, nargs="+", default=list(PHASES))
    ap.add_argument(
        "--root", type=Path, nargs="+", default=[ROOT], help="trees to run (default: this one)"
    )
    ap.add_argument(
        "--python",
        nargs="+",
        default=[],
        help="the interpreter of each --root, in order (a venv with that tree installed; "
        "default: this one, which imports its own installed tree)",
    )
    args = ap.parse_args(argv)
    print("| tree | phase | samples | round trips/s | p50 ms | p99 ms | max ms | admin ms |")
    print("|---|---|---|---|---|---|---|---|")
    for i, root in enumerate(args.root):
        python = args.python[i] if i < len(args.python) else None
        run(root, args.phase, args.seconds, args.queues, args.purge_messages, python)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bystander's confirmed persistent publish latency while another client attacks.

    python3 bench/attack_bench.py [--seconds 10] [--attackers 2]

Starts plugbroker as a subprocess on a free loopback port with a temporary SQLite store, and a
bystander connection (py-amqp, ``confirm_publish``) that publishes persistent messages into its
own durable queue, one at a time, timing each publish until its confirm. Three phases:

- ``baseline``: nobody else;
- ``names``: attackers declare durable queues and exchanges and bind with names holding a lone
  surrogate (as py-amqp sends them) or bytes that are not UTF-8, reconnecting after each 502;
- ``deep headers``: attackers publish persistent messages whose headers nest 700 levels (502)
  and, on another connection, messages at the bound (100 levels) rejected with requeue and
  redelivered (x-delivery-count re-encoded) over and over.

Each attacker runs in its own process. Prints p50 / p99 / max of the bystander's latency per
phase, and what the attackers did. The broker, the bystander and the attackers share the
machine's cores: on a small machine part of what the attack phases show is CPU contention.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import amqp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from rawclient import RawClient, deep_header_properties, publish_frames  # noqa: E402

CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  <store path="{store}"/>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <virtualhost name="/"/>
</broker>
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect(port: int, **kw: object) -> amqp.Connection:
    c = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest", **kw)
    c.connect()
    return c


def bystander(port: int, seconds: float) -> list[float]:
    conn = connect(port, confirm_publish=True)
    try:
        ch = conn.channel()
        ch.queue_declare("bystander", durable=True, auto_delete=False)
        lat: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end and len(lat) < 1_000_000:
            t = time.perf_counter()
            ch.basic_publish(amqp.Message(b"x" * 256, delivery_mode=2), "", "bystander", timeout=5)
            lat.append(time.perf_counter() - t)
        ch.queue_purge("bystander")
        return lat
    finally:
        conn.close()


def name_attack(port: int, stop: Any, counts: dict[str, int]) -> None:
    bad = ["poison-\ud800", "poison-\udfff-x"]
    i = 0
    while not stop.is_set():
        i += 1
        try:
            c = connect(port)
            ch = c.channel()
            kind = i % 3
            if kind == 0:
                ch.queue_declare(bad[i % 2], durable=True, auto_delete=False)
            elif kind == 1:
                ch.exchange_declare(bad[i % 2], "topic", durable=True, auto_delete=False)
            else:
                ch.queue_bind("bystander", "amq.topic", "k." + bad[i % 2])
        except amqp.exceptions.AMQPError:
            counts["refused"] = counts.get("refused", 0) + 1
        except OSError:
            counts["dropped"] = counts.get("dropped", 0) + 1
        finally:
            try:
                c.collect()
            except Exception:
                pass


def deep_attack(port: int, stop: Any, counts: dict[str, int]) -> None:
    deep = publish_frames(1, "", "bystander", b"deep", deep_header_properties(700))
    while not stop.is_set():
        try:
            with RawClient(port, timeout=2) as raw:
                raw.handshake()
                raw.send(deep)
                code = raw.expect_connection_close()[0]
                counts[f"closed {code}"] = counts.get(f"closed {code}", 0) + 1
        except (OSError, AssertionError):
            counts["dropped"] = counts.get("dropped", 0) + 1


def redelivery_loop(port: int, stop: Any, counts: dict[str, int]) -> None:
    conn = connect(port)
    try:
        ch = conn.channel()
        ch.queue_declare("at-bound", durable=True, auto_delete=False)
        with RawClient(port, timeout=2) as raw:
            raw.handshake()
            raw.send(publish_frames(1, "", "at-bound", b"bound", deep_header_properties(100)))

            def on_msg(m: amqp.Message) -> None:
                counts["redelivered"] = counts.get("redelivered", 0) + 1
                ch.basic_reject(m.delivery_tag, requeue=True)

            ch.basic_consume("at-bound", callback=on_msg)
            while not stop.is_set():
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
    finally:
        conn.close()


def _attacker(fn: Callable[..., None], port: int, stop: Any, results: Any) -> None:
    """One attacker in its own process (the bystander's timings do not wait for its GIL)."""
    counts: dict[str, int] = {}
    try:
        fn(port, stop, counts)
    finally:
        results.put(counts)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--attackers", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attack-bench-"))
    cfg = tmp / "broker.xml"
    cfg.write_text(CONFIG.format(store=tmp / "store"))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugbroker",
            "--log-level",
            "ERROR",
            "run",
            "--config",
            str(cfg),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )
    try:
        assert proc.stdout is not None
        if b"listening" not in proc.stdout.readline():
            raise SystemExit("broker did not start")
        print(
            f"bystander: confirmed persistent publishes, {args.seconds:.0f} s per phase, "
            f"{args.attackers} attacker(s); SQLite store, sync=normal"
        )
        print(f"{'phase':14} {'publishes':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  attackers")
        phases = [
            ("baseline", []),
            ("names", [name_attack] * args.attackers),
            ("deep headers", [deep_attack] * args.attackers + [redelivery_loop]),
        ]
        for name, attackers in phases:
            stop = mp.Event()
            results: Any = mp.Queue()
            procs = [
                mp.Process(target=_attacker, args=(a, port, stop, results), daemon=True)
                for a in attackers
            ]
            for p in procs:
                p.start()
            time.sleep(0.5 if procs else 0)
            lat = bystander(port, args.seconds)
            stop.set()
            counts: dict[str, int] = {}
            for _ in procs:
                for k, v in results.get(timeout=30).items():
                    counts[k] = counts.get(k, 0) + v
            for p in procs:
                p.join(10)
            print(
                f"{name:14} {len(lat):9d} {pct(lat, 0.5):8.2f} {pct(lat, 0.99):8.2f} "
                f"{max(lat) * 1000:8.2f}  {dict(sorted(counts.items())) or '-'}"
            )
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()

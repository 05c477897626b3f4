"""A bystander's confirmed persistent publish latency while another client attacks.

    python3 bench/attack_bench.py [--seconds 10] [--attackers 2]

Starts plugbroker as a subprocess on a free loopback port with a temporary SQLite store, and a
bystander connection (py-amqp, ``confirm_publish``) that publishes persistent messages into its
own durable queue, one at a time, timing each publish until its confirm. The phases:

- ``baseline``: nobody else;
- ``names``: attackers declare durable queues and exchanges and bind with names holding a lone
  surrogate (as py-amqp sends them) or bytes that are not UTF-8, reconnecting after each 502;
- ``deep headers``: attackers publish persistent messages whose headers nest 700 levels (502)
  and, on another connection, messages at the bound (100 levels) rejected with requeue and
  redelivered (x-delivery-count re-encoded) over and over;
- ``topic trie``: one attacker holds 2,000 bindings ``#.#.(120 times).xNNNNN`` on its own
  topic exchange and publishes ten messages with fresh 120-word routing keys (never cached) in
  one write, then waits for a round trip, over and over;
- ``header-heavy flood`` and ``150,000-queue declares`` (bench/memory_attack.py, each on a
  broker of its own with a 300 MB watermark): the broker's peak RSS against the watermark while
  a tenant publishes one-byte messages with 120 KB headers, or declares 150,000 queues, and
  its RSS after the purge or the deletes;
- ``sleepy hook``: a plugin's ``broker_message_published`` sleeps 2 s for each message to the
  queue ``sleepy``, which an attacker publishes to every 3 s (the bystander waits; the hook
  watchdog names the plugin in the log, counted here).

Each attacker runs in its own process. Prints p50 / p99 / max of the bystander's latency per
phase, the max as a multiple of the baseline's max in the same run, and what the attackers did.
Then two timings: 15,000 bindings declared to one queue (one client, each bind waiting for its
bind-ok), and the routing of one uncached 120-word key through 2,000 such bindings measured in
this process (no broker). The broker, the bystander and the attackers share the machine's
cores: on a small machine part of what the attack phases show is CPU contention.
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

sys.path.insert(0, str(ROOT / "bench"))
import memory_attack  # noqa: E402

CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  <store path="{store}"/>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <plugins><plugin>bench_sleepy_plugin</plugin></plugins>
  <virtualhost name="/"/>
</broker>
"""

#: the plugin of the ``sleepy hook`` phase (written beside the configuration)
SLEEPY_PLUGIN = """
import time

from plugbroker.hookimpl import hookimpl


@hookimpl
def broker_message_published(queues):
    if "sleepy" in queues:
        time.sleep(2.0)
"""

#: the pathological topic bindings: 120 ``#`` words, then one distinguishing word
TRIE_BINDINGS = 2000


def trie_pattern(i: int) -> str:
    return ".".join(["#"] * 120 + [f"x{i:05d}"])


def trie_key(rnd: Any) -> str:
    """A 120-word routing key (under 255 bytes) that no cache has seen; half of them reach a
    binding."""
    words = [rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(119)]
    last = f"x{rnd.randrange(TRIE_BINDINGS):05d}" if rnd.random() < 0.5 else "nomatch"
    return ".".join(words + [last])


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
            # a long timeout: a stalled broker shows as one long wait, not as a crash
            ch.basic_publish(
                amqp.Message(b"x" * 256, delivery_mode=2), "", "bystander", timeout=300
            )
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


def trie_attack(port: int, stop: Any, counts: dict[str, int]) -> None:
    import random

    rnd = random.Random(os.getpid())
    conn = connect(port)
    try:
        ch = conn.channel()
        ch.exchange_declare("tenant-topics", "topic", auto_delete=False)
        ch.queue_declare("tenant-sink", arguments={"x-max-length": 1000})
        for i in range(TRIE_BINDINGS):
            ch.queue_bind("tenant-sink", "tenant-topics", trie_pattern(i))
        counts["bindings"] = TRIE_BINDINGS
        while not stop.is_set():
            for _ in range(10):  # pipelined: py-amqp does not wait after a publish
                ch.basic_publish(amqp.Message(b"t"), "tenant-topics", trie_key(rnd))
            ch.exchange_declare("tenant-topics", "topic", passive=True)  # a round trip
            counts["published"] = counts.get("published", 0) + 10
    finally:
        conn.close()


def sleepy_attack(port: int, stop: Any, counts: dict[str, int]) -> None:
    conn = connect(port)
    try:
        ch = conn.channel()
        ch.queue_declare("sleepy", arguments={"x-max-length": 10})
        while not stop.is_set():
            ch.basic_publish(amqp.Message(b"z"), "", "sleepy")
            ch.queue_declare("sleepy", passive=True)  # returns once the hook let go
            counts["published"] = counts.get("published", 0) + 1
            stop.wait(3.0)
    finally:
        conn.close()


def time_binds(port: int, n: int = 15_000) -> float:
    """Seconds to declare ``n`` bindings of one queue to a topic exchange, one client, each
    bind waiting for its bind-ok."""
    conn = connect(port)
    try:
        ch = conn.channel()
        ch.exchange_declare("many-binds", "topic", auto_delete=False)
        ch.queue_declare("many-binds")
        t = time.perf_counter()
        for i in range(n):
            ch.queue_bind("many-binds", "many-binds", f"orders.k{i}.#")
        took = time.perf_counter() - t
        ch.queue_delete("many-binds")
        return took
    finally:
        conn.close()


def time_routing() -> str:
    """One uncached 120-word key routed through 2,000 pathological bindings, in this process."""
    import random

    from plugbroker.clock import ManualClock
    from plugbroker.codec import properties
    from plugbroker.domain.message import Message
    from plugbroker.domain.timers import Timers
    from plugbroker.domain.vhost import VirtualHost

    clock = ManualClock()
    vh = VirtualHost("/", clock=clock, timers=Timers(clock))
    ex = vh.declare_exchange("t", "topic")
    q, _ = vh.declare_queue("q")
    for i in range(TRIE_BINDINGS):
        vh.bind(ex, q, trie_pattern(i), {})
    rnd = random.Random(1)
    props = properties.encode({})
    times = []
    for _ in range(5 if getattr(ex, "last_steps", None) is None else 200):
        msg = Message.from_publish(vh.ids.next(), "t", trie_key(rnd), props, b"", 0, 0.0, 0.0)
        t = time.perf_counter()
        vh.route(ex, msg)
        times.append(time.perf_counter() - t)
    steps = getattr(ex, "last_steps", None)
    return (
        f"routing one uncached 120-word key through {TRIE_BINDINGS} bindings: "
        f"median {pct(times, 0.5):.3f} ms, max {max(times) * 1000:.3f} ms over {len(times)} keys"
        + (f" ({steps} trie steps for the last)" if steps is not None else "")
    )


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
    ap.add_argument(
        "--only",
        default="",
        help="the phases to run after the baseline (default: all), e.g. 'topic trie;header-heavy flood'",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attack-bench-"))
    cfg = tmp / "broker.xml"
    cfg.write_text(CONFIG.format(store=tmp / "store"))
    (tmp / "bench_sleepy_plugin.py").write_text(SLEEPY_PLUGIN)
    port = free_port()
    path = os.pathsep.join([str(ROOT), str(tmp), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    log = tmp / "broker.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugbroker",
            "--log-level",
            "WARNING",
            "run",
            "--config",
            str(cfg),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
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
        print(
            f"{'phase':14} {'publishes':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
            f"{'x base':>7}  attackers"
        )
        phases = [
            ("baseline", []),
            ("names", [name_attack] * args.attackers),
            ("deep headers", [deep_attack] * args.attackers + [redelivery_loop]),
            ("topic trie", [trie_attack]),
            ("sleepy hook", [sleepy_attack]),
        ]
        only = args.only  # phase names in it, separated as you like (a name may hold a comma)
        phases = [(n, a) for n, a in phases if n == "baseline" or not only or n in only]
        base_max = 0.0
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
            if name == "topic trie":  # the attacker binds first: wait for its 2,000 bindings
                time.sleep(3.0)
            lat = bystander(port, args.seconds)
            stop.set()
            counts: dict[str, int] = {}
            for _ in procs:
                for k, v in results.get(timeout=300).items():
                    counts[k] = counts.get(k, 0) + v
            for p in procs:
                p.join(10)
            if name == "baseline":
                base_max = max(lat)
            if name == "sleepy hook":
                counts["watchdog lines"] = log.read_text().count("held the event loop")
            print(
                f"{name:14} {len(lat):9d} {pct(lat, 0.5):8.2f} {pct(lat, 0.99):8.2f} "
                f"{max(lat) * 1000:8.2f} {max(lat) / base_max:7.1f}  "
                f"{dict(sorted(counts.items())) or '-'}"
            )
        print(f"15,000 bindings declared to one queue: {time_binds(port):.2f} s")
        print(time_routing())
    finally:
        proc.terminate()
        proc.wait(30)
    # each on a broker of its own, with a 300 MB watermark (bench/memory_attack.py)
    for phase in memory_attack.PHASES:
        if not args.only or phase in args.only:
            print(memory_attack.run_phase(phase, sys.executable, 300))


if __name__ == "__main__":
    main()

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
  watchdog names the plugin in the log, counted here);
- ``admin scrape``: with ``--queues`` (100,000 by default) empty queues in the vhost
  ``tenant``, an administrator repeats ``GET /api/queues`` and a monitor ``GET /metrics``;
- ``per-object``: the same with ``GET /metrics/per-object`` (a 404 on a broker without it);
- ``empty vhost``: a management user whose vhost is empty sends four requests in parallel
  (``/api/queues``, ``/api/overview``, ``/api/consumers``, ``/api/connections``), over and over;
- ``half-sent http``: one address (127.0.0.1) holds 80 sockets with half-sent requests,
  reopening each the server closes, while operators on 127.0.0.1 and 127.0.0.2 ask
  ``GET /api/overview`` every 0.2 s (counted by answer).

The admin phases declare their queues once, before the first of them (pipelined declares).
``--python`` runs the broker with another interpreter: the same bench against another version
(a worktree of an older commit with its own environment) shows before and after side by side.

Each attacker runs in its own process. Prints p50 / p99 / max of the bystander's latency per
phase, the max as a multiple of the baseline's max in the same run, and what the attackers did.
Then two timings: 15,000 bindings declared to one queue (one client, each bind waiting for its
bind-ok), and the routing of one uncached 120-word key through 2,000 such bindings measured in
this process (no broker), and the seconds a disk alarm takes to clear once a filled store is
drained (a broker of its own on a small tmpfs; needs root). The broker, the bystander and the
attackers share the machine's cores: on a small machine part of what the attack phases show is
CPU contention.
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
  <admin host="127.0.0.1" port="{admin}"/>
  <users>
    <user name="guest" password="guest" vhosts="/ tenant empty" tags="administrator"/>
    <user name="small" password="small" vhosts="empty" tags="management"/>
  </users>
  <plugins><plugin>bench_sleepy_plugin</plugin></plugins>
  <virtualhost name="/"/>
  <virtualhost name="tenant"/>
  <virtualhost name="empty"/>
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


DISK_CONFIG = """<?xml version="1.0"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  <store path="{store}"/>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <limits><diskFreeLimit>{limit}MB</diskFreeLimit></limits>
  <virtualhost name="/"/>
</broker>
"""


def time_disk_recovery(fs_mb: int = 48, limit_mb: int = 16) -> str:
    """A broker of its own with its store on a tmpfs of ``fs_mb`` MiB: a publisher fills it
    (64 KiB persistent messages, paced so that the once-a-second disk check sees the limit
    before the filesystem is full) until ``connection.blocked``; a consumer drains the queue;
    the seconds from the empty queue to ``connection.unblocked``. Needs root (mount)."""
    sys.path.insert(0, str(ROOT / "tests" / "store"))
    from procutil import BrokerProcess, tmpfs

    mnt = Path(tempfile.mkdtemp(prefix="attack-disk-"))
    store = mnt / "store"
    with tmpfs(store, fs_mb * 2**20) as why:
        if why is not None:
            return f"disk recovery: not measured ({why})"
        cfg = mnt / "broker.xml"
        cfg.write_text(DISK_CONFIG.format(store=store, limit=limit_mb))
        b = BrokerProcess(cfg, log=mnt / "broker.log").start()
        try:
            events: list[bool] = []
            pub = connect(
                b.port,
                confirm_publish=True,
                on_blocked=lambda reason: events.append(True),
                on_unblocked=lambda: events.append(False),
            )
            ch = pub.channel()
            ch.queue_declare("fill", durable=True, auto_delete=False)
            body = b"x" * 65536
            sent = 0
            while not events and sent < fs_mb * 16:
                ch.basic_publish(amqp.Message(body, delivery_mode=2), routing_key="fill")
                sent += 1
                try:
                    pub.drain_events(timeout=0.02)  # paces the publisher at about 3 MB/s
                except TimeoutError:
                    pass
            if not events:
                return "disk recovery: the disk alarm was never raised"
            drainer = connect(b.port)
            dch = drainer.channel()
            while dch.basic_get("fill", no_ack=True) is not None:
                pass
            t0 = time.perf_counter()
            deadline = t0 + 120
            while events[-1] and time.perf_counter() < deadline:
                try:
                    pub.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
            took = time.perf_counter() - t0
            st = os.statvfs(store)
            free = st.f_bavail * st.f_frsize / 2**20
            drainer.close()
            if events[-1]:  # still blocked: the broker reads nothing from it, not even a close
                pub.collect()
            else:
                pub.close()
        finally:
            b.stop()
    if events[-1]:
        return f"disk alarm NOT cleared within 120 s of draining ({sent * 64 // 1024} MiB)"
    return (
        f"disk alarm cleared {took:.2f} s after draining a filled store, no restart "
        f"({sent * 64 // 1024} MiB published on a {fs_mb} MiB tmpfs, diskFreeLimit "
        f"{limit_mb} MiB; {free:.1f} MiB free after)"
    )


#: the admin server's port (set in main before the attackers start)
ADMIN_PORT = 0


def http_get(path: str, user: str = "guest", source: str = "127.0.0.1", port: int = 0) -> int:
    """One GET to the admin server read to its end: the status (0: no answer)."""
    import base64
    import http.client

    conn = http.client.HTTPConnection(
        "127.0.0.1", port or ADMIN_PORT, timeout=300, source_address=(source, 0)
    )
    try:
        auth = base64.b64encode(f"{user}:{user}".encode()).decode()
        conn.request("GET", path, headers={"Authorization": f"Basic {auth}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return 0
    finally:
        conn.close()


def gc_pauses(admin: int) -> str:
    """The broker's longest cycle collection per generation, from its /metrics."""
    import base64
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{admin}/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=300) as resp:
        text = resp.read().decode()
    found = [
        line.split("{")[1].replace('"}', "").replace('generation="', "gen ")
        for line in text.splitlines()
        if line.startswith("plugbroker_gc_pause_seconds_max{")
    ]
    return "broker's longest cycle collections (s): " + (", ".join(found) or "not timed")


def declare_queues(port: int, n: int) -> float:
    """``n`` empty queues in the vhost ``tenant``, declared pipelined (nowait); seconds."""
    t = time.perf_counter()
    c = amqp.Connection(
        f"127.0.0.1:{port}", userid="guest", password="guest", virtual_host="tenant"
    )
    c.connect()
    try:
        ch = c.channel()
        for i in range(n):
            ch.queue_declare(f"tenant-{i:06d}", auto_delete=False, nowait=True)
            if i % 5000 == 4999:
                ch.queue_declare(f"tenant-{i:06d}", passive=True)  # a round trip now and then
        ch.queue_declare(f"tenant-{n - 1:06d}", passive=True)
    finally:
        c.close()
    return time.perf_counter() - t


def scrape_attack(paths: tuple[str, ...], user: str = "guest") -> Callable[..., None]:
    def attack(port: int, stop: Any, counts: dict[str, int]) -> None:
        while not stop.is_set():
            for path in paths:
                status = http_get(path, user)
                counts[f"{path} {status}"] = counts.get(f"{path} {status}", 0) + 1

    return attack


def parallel_small_user(port: int, stop: Any, counts: dict[str, int]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    paths = ("/api/queues", "/api/overview", "/api/consumers", "/api/connections")
    with ThreadPoolExecutor(4) as pool:
        while not stop.is_set():
            for status in pool.map(lambda p: http_get(p, "small"), paths):
                counts[str(status)] = counts.get(str(status), 0) + 1


def half_sent_attack(port: int, stop: Any, counts: dict[str, int]) -> None:
    import selectors

    sel = selectors.DefaultSelector()

    def open_one() -> None:
        try:
            s = socket.create_connection(("127.0.0.1", ADMIN_PORT), timeout=5)
            s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n")
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            counts["opened"] = counts.get("opened", 0) + 1
        except OSError:
            counts["refused"] = counts.get("refused", 0) + 1

    for _ in range(80):
        open_one()
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data or b"503" in data[:12]:
                sel.unregister(s)
                s.close()
                counts["closed by server"] = counts.get("closed by server", 0) + 1
                open_one()


def operators(port: int, stop: Any, counts: dict[str, int]) -> None:
    while not stop.is_set():
        for source in ("127.0.0.1", "127.0.0.2"):
            status = http_get("/api/overview", source=source)
            counts[f"op {source} {status}"] = counts.get(f"op {source} {status}", 0) + 1
        stop.wait(0.2)


def _attacker(fn: Callable[..., None], port: int, stop: Any, results: Any, admin: int) -> None:
    """One attacker in its own process (the bystander's timings do not wait for its GIL)."""
    global ADMIN_PORT
    ADMIN_PORT = admin
    counts: dict[str, int] = {}
    try:
        fn(port, stop, counts)
    finally:
        results.put(counts)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


ADMIN_PHASES = {"admin scrape", "per-object", "empty vhost", "half-sent http"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--attackers", type=int, default=2)
    ap.add_argument(
        "--only",
        default="",
        help="the phases to run after the baseline (default: all), e.g. 'topic trie;header-heavy flood'",
    )
    ap.add_argument("--queues", type=int, default=100_000, help="queues of the admin phases")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the broker")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attack-bench-"))
    cfg = tmp / "broker.xml"
    admin = free_port()
    cfg.write_text(CONFIG.format(store=tmp / "store", admin=admin))
    (tmp / "bench_sleepy_plugin.py").write_text(SLEEPY_PLUGIN)
    port = free_port()
    path = os.pathsep.join([str(ROOT), str(tmp), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    log = tmp / "broker.log"
    proc = subprocess.Popen(
        [
            args.python,
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
            ("admin scrape", [scrape_attack(("/api/queues",)), scrape_attack(("/metrics",))]),
            ("per-object", [scrape_attack(("/metrics/per-object",))]),
            ("empty vhost", [parallel_small_user]),
            ("half-sent http", [half_sent_attack, operators]),
        ]
        only = args.only  # phase names in it, separated as you like (a name may hold a comma)
        phases = [(n, a) for n, a in phases if n == "baseline" or not only or n in only]
        base_max = 0.0
        declared = False
        for name, attackers in phases:
            if name in ADMIN_PHASES and not declared:
                took = declare_queues(port, args.queues)
                print(f"({args.queues:,} queues declared in vhost 'tenant' in {took:.1f} s)")
                declared = True
            stop = mp.Event()
            results: Any = mp.Queue()
            procs = [
                mp.Process(target=_attacker, args=(a, port, stop, results, admin), daemon=True)
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
        if declared:
            print(gc_pauses(admin))
        if not only or not only <= ADMIN_PHASES:
            print(f"15,000 bindings declared to one queue: {time_binds(port):.2f} s")
            print(time_routing())
            print(time_disk_recovery())
    finally:
        proc.terminate()
        proc.wait(30)
    # each on a broker of its own, with a 300 MB watermark (bench/memory_attack.py)
    for phase in memory_attack.PHASES:
        if not args.only or phase in args.only:
            print(memory_attack.run_phase(phase, sys.executable, 300))


if __name__ == "__main__":
    main()

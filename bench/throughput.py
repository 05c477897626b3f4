"""Broker throughput, latency and broker CPU per message, measured with py-amqp clients.

Phases (``--mode``), each run for every body size (``--size``, default 64 and 1024 bytes):

* ``publish``: one publisher, no confirms, into a queue nobody consumes; timed until the broker
  reports all ``--count`` messages in the queue.
* ``publish-confirm``: the same in confirm mode; py-amqp waits for each confirm, so the latency
  columns are the per-publish round trip.
* ``consume``: the queue is pre-filled (not timed), then one consumer with prefetch 100 and a
  manual ack per message drains it.
* ``pubsub``: one producer process and one consumer process (multiprocessing) at once; the
  producer publishes as fast as it can (no confirms) and puts ``time.monotonic()`` in the body,
  the consumer (prefetch 100, manual ack) reports publish->deliver latency. With a producer
  faster than the broker this is latency under saturation (queueing included).

Broker CPU is read from ``/proc/<pid>/stat`` (utime + stime, all threads) before and after each
phase. Without ``--url`` the script starts plugbroker itself (``python3 -m plugbroker run`` on a free
port with a temporary config whose housekeeping section is the default one) and knows its pid;
with ``--url`` pass ``--broker-pid`` (e.g. RabbitMQ's ``beam.smp``) to get the CPU column.

``--tls`` runs every phase twice in the same run against the same broker process: over plain
AMQP and over amqps (the broker gets a ``<tls>`` listener with a certificate made by ``trustme``;
the clients verify it), so the two rows compare TLS with plaintext on equal terms. An
``amqps://`` ``--url`` takes the CA file as ``?cacert=PATH``.

Run: ``python3 bench/throughput.py [--url URL] [--broker-pid PID] [--size 64 1024]
[--count N] [--mode publish|publish-confirm|consume|pubsub|all] [--tls]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlparse

import amqp

ROOT = Path(__file__).resolve().parent.parent
MODES = ("publish", "publish-confirm", "consume", "pubsub")
PHASE_LIMIT = 180.0  # seconds; a phase that takes longer is cut short and marked

#: for --permissioned: a user whose every operation is checked (only then in the configuration,
#: so that compare.py's older trees, which do not know <permission>, still start)
PERMISSIONED_USER = r"""
    <user name="bencher" password="bencher">
      <permission vhost="/" configure="^bench-" write="^amq\.default$" read="^bench-"/>
    </user>"""

CONFIG = r"""<?xml version="1.0" encoding="UTF-8"?>
<broker>
  <listen host="127.0.0.1" port="0"/>
  {tls}
  <store path="{store}"/>
  <users>
    <user name="guest" password="guest" vhosts="/"{guest_tags}/>{permissioned}
  </users>
  <housekeeping><threads>4</threads><period>30000</period></housekeeping>
  {plugins}
  {admin}
  <virtualhost name="/"/>
</broker>
"""


# ------------------------------------------------------------------ broker process


class Cpu(NamedTuple):
    """CPU seconds of a process: in user mode (its Python, the interpreter, libraries) and in
    the kernel on its behalf (system calls: reads, writes, epoll; page faults)."""

    user: float
    system: float

    @property
    def total(self) -> float:
        return self.user + self.system


def cpu_seconds(pid: int | None) -> Cpu | None:
    """utime and stime of a process (all its threads), in seconds; None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return Cpu(int(fields[11]) / tick, int(fields[12]) / tick)


def delta(before: Cpu | None, after: Cpu | None) -> Cpu | None:
    if before is None or after is None:
        return None
    return Cpu(after.user - before.user, after.system - before.system)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree_module(root: Path) -> str:
    """What ``python -m`` runs for another tree on ``PYTHONPATH``: its ``plugbroker/`` package,
    or the ``broker`` package of a tree from before the one namespace (issue 16). A checkout
    after it keeps ``plugbroker`` in ``broker/`` and is importable only installed: ``-m
    plugbroker`` would silently run whatever plugbroker this interpreter has, so it is refused."""
    if (root / "plugbroker" / "__main__.py").is_file():
        return "plugbroker"
    main = root / "broker" / "__main__.py"
    if main.is_file() and "plugbroker" not in main.read_text():
        return "broker"
    raise SystemExit(
        f"{root}: not runnable from PYTHONPATH (its package is installed as plugbroker); "
        "install it in a venv and pass that venv's python (compare.py --python)"
    )


class OwnBroker:
    """plugbroker in a subprocess on a free loopback port."""

    def __init__(
        self,
        plugins: list[str] | None = None,
        user: str = "guest",
        *,
        tls: bool = False,
        loop: str | None = None,
        root: Path = ROOT,
        admin: bool = False,
        python: str | None = None,
    ) -> None:
        self.user = user
        #: the admin interface's port (``admin=True``; guest is then an administrator)
        self.admin_port: int | None = free_port() if admin else None
        self.tmp = Path(tempfile.mkdtemp(prefix="plugbroker-bench-"))
        self.config = self.tmp / "bench.xml"
        plugin_xml = (
            ("<plugins>" + "".join(f"<plugin>{p}</plugin>" for p in plugins) + "</plugins>")
            if plugins
            else ""
        )
        tls_xml = ""
        self.tls_port: int | None = None
        if tls:
            import trustme  # the test extra

            ca = trustme.CA()
            ca.cert_pem.write_to_path(str(self.tmp / "ca.pem"))
            cert = ca.issue_cert("127.0.0.1")
            cert.private_key_pem.write_to_path(str(self.tmp / "server.key"))
            cert.cert_chain_pems[0].write_to_path(str(self.tmp / "server.pem"))
            self.tls_port = free_port()
            tls_xml = (
                f'<tls host="127.0.0.1" port="{self.tls_port}" cert="{self.tmp / "server.pem"}" '
                f'key="{self.tmp / "server.key"}"/>'
            )
        self.config.write_text(
            CONFIG.format(
                store=self.tmp / "store",
                plugins=plugin_xml,
                tls=tls_xml,
                permissioned=PERMISSIONED_USER if user == "bencher" else "",
                guest_tags=' tags="administrator"' if admin else "",
                admin=f'<admin host="127.0.0.1" port="{self.admin_port}"/>' if admin else "",
            )
        )
        self.port = free_port()
        # with its own interpreter a tree is the one installed there; without, PYTHONPATH picks it
        module = _tree_module(root) if root != ROOT and python is None else "plugbroker"
        self.log = open(self.tmp / "broker.log", "w+")
        env = dict(os.environ, PYTHONPATH=str(root))
        if loop is not None:
            env["PLUGBROKER_LOOP"] = loop  # read by `plugbroker run` (an older tree ignores it)
        self.proc = subprocess.Popen(
            [
                # an installed tree is imported by its venv's interpreter whatever PYTHONPATH
                # says (the editable install's finder): another tree needs its own
                python or sys.executable,
                "-m",
                module,
                "run",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
            ],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"plugbroker exited: {self._log_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"plugbroker did not listen in time: {self._log_text()}")

    def _log_text(self) -> str:
        self.log.flush()
        return (self.tmp / "broker.log").read_text()[-2000:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.user}@127.0.0.1:{self.port}//"

    @property
    def tls_url(self) -> str:
        assert self.tls_port is not None
        return (
            f"amqps://{self.user}:{self.user}@127.0.0.1:{self.tls_port}//"
            f"?cacert={self.tmp / 'ca.pem'}"
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------ clients


def connect(url: str) -> amqp.Connection:
    u = urlparse(url)
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    tls: dict[str, Any] | bool = False
    if u.scheme == "amqps":
        import ssl

        cafile = parse_qs(u.query).get("cacert", [None])[0]
        tls = {"cert_reqs": ssl.CERT_REQUIRED, "server_hostname": u.hostname}
        if cafile:
            tls["ca_certs"] = cafile
    conn = amqp.Connection(
        host=f"{u.hostname or '127.0.0.1'}:{u.port or (5671 if tls else 5672)}",
        userid=unquote(u.username or "guest"),
        password=unquote(u.password or "guest"),
        virtual_host=vhost or "/",
        heartbeat=0,
        ssl=tls,
    )
    conn.connect()
    return conn


def fresh_queue(ch: Any, name: str) -> None:
    ch.queue_declare(name, durable=False, auto_delete=False)
    ch.queue_purge(name)


def queue_depth(ch: Any, name: str) -> int:
    return int(ch.queue_declare(name, passive=True)[1])


def wait_depth(ch: Any, name: str, n: int, deadline: float) -> bool:
    while queue_depth(ch, name) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def publish_many(ch: Any, queue: str, body: bytes, n: int, deadline: float) -> int:
    publish = ch.basic_publish
    for i in range(n):
        publish(amqp.Message(body), exchange="", routing_key=queue)
        if not i % 1000 and time.monotonic() > deadline:
            return i + 1
    return n


@dataclass
class Result:
    mode: str
    size: int
    count: int
    seconds: float
    cpu_split: Cpu | None
    latencies: list[float] | None = None
    note: str = ""

    @property
    def cpu(self) -> float | None:
        """Broker CPU seconds over the phase, user + system."""
        return None if self.cpu_split is None else self.cpu_split.total

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def cpu_us(self) -> str:
        return "-" if self.cpu is None or not self.count else f"{self.cpu / self.count * 1e6:.1f}"

    def split_us(self) -> str:
        """user/system µs per message."""
        if self.cpu_split is None or not self.count:
            return "-"
        u, s = (x / self.count * 1e6 for x in self.cpu_split)
        return f"{u:.1f}/{s:.1f}"

    def pct(self, q: float) -> str:
        if not self.latencies:
            return "-"
        s = sorted(self.latencies)
        return f"{s[min(len(s) - 1, int(q * len(s)))] * 1e3:.2f}"


def run_publish(url: str, pid: int | None, size: int, count: int) -> Result:
    conn = connect(url)
    ch = conn.channel()
    q = f"bench-publish-{size}-{os.getpid()}"
    fresh_queue(ch, q)
    body = b"x" * size
    deadline = time.monotonic() + PHASE_LIMIT
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    sent = publish_many(ch, q, body, count, deadline)
    done = wait_depth(ch, q, sent, deadline)
    t1, c1 = time.perf_counter(), cpu_seconds(pid)
    ch.queue_delete(q)
    conn.close()
    return Result(
        "publish",
        size,
        sent,
        t1 - t0,
        delta(c0, c1),
        note="" if done and sent == count else "cut short",
    )


def run_publish_confirm(url: str, pid: int | None, size: int, count: int) -> Result:
    conn = connect(url)
    ch = conn.channel()
    q = f"bench-confirm-{size}-{os.getpid()}"
    fresh_queue(ch, q)
    ch.confirm_select()
    ch._confirm_selected = True  # so basic_publish_confirm does not select again
    body = b"x" * size
    lat: list[float] = []
    deadline = time.monotonic() + PHASE_LIMIT
    publish = ch.basic_publish_confirm
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    for i in range(count):
        s = time.perf_counter()
        publish(amqp.Message(body), exchange="", routing_key=q)
        lat.append(time.perf_counter() - s)
        if not i % 1000 and time.monotonic() > deadline:
            break
    t1, c1 = time.perf_counter(), cpu_seconds(pid)
    ch.queue_delete(q)
    conn.close()
    return Result(
        "publish-confirm",
        size,
        len(lat),
        t1 - t0,
        delta(c0, c1),
        lat,
        note="" if len(lat) == count else "cut short",
    )


def _consume(
    ch: Any, conn: amqp.Connection, q: str, n: int, deadline: float, lat: list[float] | None
) -> int:
    got = 0

    def on_message(msg: amqp.Message) -> None:
        nonlocal got
        got += 1
        if lat is not None:
            lat.append(time.monotonic() - struct.unpack_from(">d", msg.body)[0])
        ch.basic_ack(msg.delivery_tag)

    ch.basic_qos(0, 100, False)
    tag = ch.basic_consume(q, callback=on_message, no_ack=False)
    while got < n and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=1)
        except TimeoutError:
            pass
    ch.basic_cancel(tag)
    return got


def run_consume(url: str, pid: int | None, size: int, count: int) -> Result:
    conn = connect(url)
    ch = conn.channel()
    q = f"bench-consume-{size}-{os.getpid()}"
    fresh_queue(ch, q)
    deadline = time.monotonic() + PHASE_LIMIT
    publish_many(ch, q, b"x" * size, count, deadline)
    wait_depth(ch, q, count, deadline)
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    got = _consume(ch, conn, q, count, deadline, None)
    queue_depth(ch, q)  # a round trip: every ack has been handled
    t1, c1 = time.perf_counter(), cpu_seconds(pid)
    ch.queue_delete(q)
    conn.close()
    return Result(
        "consume", size, got, t1 - t0, delta(c0, c1), note="" if got == count else "cut short"
    )


def _pubsub_consumer(url: str, q: str, n: int, ready: Any, out: Any) -> None:
    conn = connect(url)
    ch = conn.channel()
    ready.set()
    lat: list[float] = []
    got = _consume(ch, conn, q, n, time.monotonic() + PHASE_LIMIT, lat)
    out.put((got, time.perf_counter(), lat))
    conn.close()


def _pubsub_producer(url: str, q: str, size: int, n: int, go: Any) -> None:
    conn = connect(url)
    ch = conn.channel()
    pad = b"x" * max(0, size - 8)
    publish = ch.basic_publish
    go.wait()
    deadline = time.monotonic() + PHASE_LIMIT
    for i in range(n):
        publish(amqp.Message(struct.pack(">d", time.monotonic()) + pad), exchange="", routing_key=q)
        if not i % 1000 and time.monotonic() > deadline:
            break
    conn.close()


def run_pubsub(url: str, pid: int | None, size: int, count: int) -> Result:
    conn = connect(url)
    ch = conn.channel()
    q = f"bench-pubsub-{size}-{os.getpid()}"
    fresh_queue(ch, q)
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=_pubsub_consumer, args=(url, q, count, ready, out))
    producer = ctx.Process(target=_pubsub_producer, args=(url, q, size, count, go))
    consumer.start()
    producer.start()
    ready.wait(30)
    time.sleep(0.2)  # let the consumer's basic.consume land
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    go.set()
    got, t1, lat = out.get(timeout=PHASE_LIMIT + 30)
    c1 = cpu_seconds(pid)
    producer.join(30)
    consumer.join(30)
    ch.queue_delete(q)
    conn.close()
    return Result(
        "pubsub", size, got, t1 - t0, delta(c0, c1), lat, note="" if got == count else "cut short"
    )


RUNNERS = {
    "publish": run_publish,
    "publish-confirm": run_publish_confirm,
    "consume": run_consume,
    "pubsub": run_pubsub,
}


# ------------------------------------------------------------------ main


def warm_up(url: str) -> None:
    """First connection, queue and publish: not part of any phase."""
    warm = connect(url)
    wch = warm.channel()
    fresh_queue(wch, "bench-warmup")
    publish_many(wch, "bench-warmup", b"w", 200, time.monotonic() + 30)
    wch.queue_delete("bench-warmup")
    warm.close()


def print_table(title: str, results: list[Result]) -> None:
    print(f"\n{title}")
    print(
        "| mode | body | messages | msg/s | broker CPU µs/msg | user/system µs/msg "
        "| p50 ms | p99 ms | note |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r.mode} | {r.size} B | {r.count} | {r.rate:,.0f} | {r.cpu_us()} | "
            f"{r.split_us()} | "
            f"{r.pct(0.50)} | {r.pct(0.99)} | {r.note} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running broker (default: start plugbroker here)")
    ap.add_argument("--broker-pid", type=int, help="pid whose CPU time to read (with --url)")
    ap.add_argument("--size", type=int, nargs="+", default=[64, 1024], help="body bytes")
    ap.add_argument("--count", type=int, default=20000, help="messages per phase")
    ap.add_argument("--mode", choices=MODES + ("all",), default="all")
    ap.add_argument("--title", help="table title")
    ap.add_argument(
        "--tls",
        action="store_true",
        help="run every phase over plain AMQP and over amqps (same broker, same run)",
    )
    ap.add_argument(
        "--plugin",
        action="append",
        default=[],
        help="a plugin module to load into the broker (repeatable), e.g. "
        "bench.trivial_plugin to measure what one listening plugin costs",
    )
    ap.add_argument(
        "--permissioned",
        action="store_true",
        help="connect as a user with RabbitMQ-style patterns (configure/read ^bench-, write "
        "^amq\\.default$) instead of guest's full access: what the permission checks cost",
    )
    ap.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        help="event loop of the plugbroker it starts (PLUGBROKER_LOOP; default: auto, "
        "uvloop when installed)",
    )
    args = ap.parse_args(argv)

    own = None
    if args.url:
        url, pid = args.url, args.broker_pid
    else:
        own = OwnBroker(
            args.plugin,
            "bencher" if args.permissioned else "guest",
            tls=args.tls,
            loop=args.loop,
        )
        url, pid = own.url, own.pid
    targets = [("", url)]
    if args.tls:
        if own is None:
            ap.error("--tls starts its own broker; leave --url out")
        targets.append((" (amqps)", own.tls_url))
    modes = MODES if args.mode == "all" else (args.mode,)
    results: list[Result] = []
    try:
        for _, target in targets:
            warm_up(target)
        for size in args.size:
            for mode in modes:
                for suffix, target in targets:
                    r = RUNNERS[mode](target, pid, size, args.count)
                    r.mode += suffix
                    results.append(r)
                    print(
                        f"  {r.mode:24s} {size:5d} B  {r.rate:10,.0f} msg/s  "
                        f"cpu {r.cpu_us():>7s} µs/msg ({r.split_us()} user/sys)  "
                        f"p50 {r.pct(0.5)} p99 {r.pct(0.99)} ms  {r.note}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if own is not None:
            own.stop()
    who = f"plugbroker (own subprocess, loop {args.loop or 'auto'})" if own else url
    title = args.title or (
        f"{who}, {os.cpu_count()} CPUs, py-amqp {amqp.__version__}, {args.count} messages per phase"
    )
    print_table(title, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

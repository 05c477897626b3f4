"""Policy precision: do isolation and the slow-consumer check catch every fault and touch nothing
healthy? Real broker, real clients, a scenario matrix, one table.

    python3 bench/policy_precision.py [--duration 6] [--only steady,stalled] [--no-celery]

Starts the broker in-process (``tests/brokerutil.BrokerThread``, a free 127.0.0.1 port) under
the configuration the docs recommend, with every time scaled down (printed in the output):
isolation on every shared queue of the vhost (ackTimeout 1 s, checkPeriod 200 ms) and a
slow-consumer ``<consumer>`` with the ``Delete`` policy on the topic subscriptions ``pp.sub.#``
(messageAge, messageCount and a consumptionRate floor, checked every housekeeping period of
500 ms). All scenarios run at once, each on its own queues, with py-amqp (and kombu, Celery)
clients in threads or a subprocess.

What the policies did is observed from inside the broker: a listener registered through the core
API (``BrokerAPI.register_plugin``, run on the broker's loop with ``BrokerThread.call``) notes,
with the time, every isolation, timed-out hand-out, policy action, policy deletion,
policy-caused redelivery and poison or delivery-limit dead letter. Then, per scenario:

* **false positives**: a healthy scenario's queue or consumer touched (isolated, a policy action,
  a 506, deleted, a message redelivered because of a policy); for a faulty scenario, a bystander
  consumer isolated or timed out, or what its driver saw (a dead-letter queue deleted). Must be 0.
* **missed**: a fault the policies did not catch before the scenario ended. Must be 0.
* **endless loops**, **dead letters lost**: see ``bench/precision_tries.py``. Must be 0.
* **latency**: from the moment the threshold was crossed to the detection. For isolation the
  broker's own figure, time on the ack clock minus ackTimeout; for the rate floor, from when
  the queue had a backlog and a consumer acking below the floor; for bounded tries, from when
  the message's ``poisonDeliveries``-th timeout was due. Expected within one check period
  (200 ms for isolation, 500 ms for the slow-consumer check).

Every loop is bounded in count and time; no traffic leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

if __name__ == "__main__":
    # run the module bench.policy_precision: the one copy that bench.precision_tries imports
    from bench.policy_precision import main

    sys.exit(main())

import amqp  # noqa: E402
import kombu  # noqa: E402
from brokerutil import BrokerThread, write_config  # noqa: E402

import plugbroker.policy  # noqa: E402
from plugbroker.hookimpl import hookimpl  # noqa: E402

#: the scaled configuration; the docs recommend ackTimeout >= 5 min, checks every 30 s
ACK_TIMEOUT = 1.0
ISOLATION_CHECK = 0.2
SLOW_CHECK = 0.5
RATE_FLOOR = 10.0
MESSAGE_AGE = 3.0
MESSAGE_COUNT = 500

VHOST = f"""
    <isolation>
      <ackTimeout>{int(ACK_TIMEOUT * 1000)}</ackTimeout>
      <checkPeriod>{int(ISOLATION_CHECK * 1000)}</checkPeriod>
    </isolation>
    <topic key="pp.sub.#">
      <consumer>
        <messageAge>{int(MESSAGE_AGE * 1000)}</messageAge>
        <messageCount>{MESSAGE_COUNT}</messageCount>
        <consumptionRate>{RATE_FLOOR:g}</consumptionRate>
        <policy name="Delete"/>
      </consumer>
    </topic>"""

SCALE = (
    f"scale: isolation ackTimeout {ACK_TIMEOUT:g} s, checkPeriod {ISOLATION_CHECK * 1000:g} ms; "
    f"slow-consumer on topic pp.sub.# (Delete) messageAge {MESSAGE_AGE:g} s, messageCount "
    f"{MESSAGE_COUNT}, consumptionRate {RATE_FLOOR:g}/s, checked every {SLOW_CHECK * 1000:g} ms "
    f"(docs: ackTimeout >= 5 min, checks every 30 s)"
)


# ------------------------------------------------------------------------------------ observing


@dataclass(frozen=True)
class Event:
    at: float  # time.monotonic() on the broker's loop
    kind: str  # isolated, timed_out, action, deleted, redelivered, poison, delivery_limit, dropped
    queue: str
    tag: str = ""
    detail: str = ""
    #: for an isolation, seconds on the consumer's ack clock
    clock: float = 0.0


class Recorder:
    """Hook implementations that note what the policies did (registered on the running broker)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    @hookimpl
    def broker_consumer_isolated(
        self, queue: str, consumer_tag: str, last_ack_age: float, moved: int
    ) -> None:
        self.events.append(
            Event(time.monotonic(), "isolated", queue, consumer_tag, f"moved {moved}", last_ack_age)
        )

    @hookimpl
    def broker_message_timed_out(self, queue: str, consumer_tag: str, timeouts: int) -> None:
        self.events.append(
            Event(time.monotonic(), "timed_out", queue, consumer_tag, f"count {timeouts}")
        )

    @hookimpl
    def broker_policy_action(self, action: plugbroker.policy.Action, outcome: str) -> None:
        tag = str(getattr(action, "consumer_tag", ""))
        what = f"{type(action).__name__} {outcome} ({action.threshold or action.reason})"
        self.events.append(Event(time.monotonic(), "action", action.queue, tag, what))

    @hookimpl
    def broker_queue_deleted(self, queue: str, reason: str) -> None:
        if reason.startswith("policy"):
            self.events.append(Event(time.monotonic(), "deleted", queue, detail=reason))

    @hookimpl
    def broker_message_redelivered(self, queue: str, reason: str) -> None:
        if reason == "consumer-isolated":
            self.events.append(Event(time.monotonic(), "redelivered", queue, detail=reason))

    @hookimpl
    def broker_message_dead_lettered(self, queue: str, reason: str) -> None:
        if reason in BOUNDS:
            self.events.append(Event(time.monotonic(), reason, queue, detail=reason))

    @hookimpl
    def broker_message_dropped(self, queue: str, reason: str) -> None:
        if reason in BOUNDS:  # a bounded message lost: no dead-letter queue took it
            self.events.append(Event(time.monotonic(), "dropped", queue, detail=reason))


#: the dead-letter reasons of a message that was handed out as often as the broker allows
BOUNDS = ("poison", "delivery_limit")


# -------------------------------------------------------------------------------------- clients


class Consumer(threading.Thread):
    """A py-amqp consumer on its own connection, in a thread, until ``stop`` is set.

    ``work(body)`` returns the seconds a message takes; ``crash(body)`` says whether the consumer
    dies on it once that work is done (its socket closed without a word, then it reconnects
    ``reconnect`` s later); ``hang(body)``: it never settles that message (a task running on,
    longer than the scenario) and goes on with the others; ``stall_after`` messages in, it stops
    acking and sleeps; ``read`` False: it stops reading its socket after ``basic.consume``.
    ``handed`` notes every delivery: when, to which consumer tag, the body and its
    ``x-ack-timeout-count``.
    """

    def __init__(
        self,
        port: int,
        queue: str,
        tag: str,
        stop: threading.Event,
        *,
        prefetch: int = 10,
        no_ack: bool = False,
        work: Callable[[bytes], float] = lambda b: 0.0,
        crash: Callable[[bytes], bool] = lambda b: False,
        hang: Callable[[bytes], bool] = lambda b: False,
        crash_every: int = 0,
        reconnect: float = 0.1,
        stall_after: int | None = None,
        read: bool = True,
    ) -> None:
        super().__init__(name=f"consumer-{tag}", daemon=True)
        self.port, self.queue, self.base_tag, self.stop = port, queue, tag, stop
        self.prefetch, self.no_ack, self.work, self.crash = prefetch, no_ack, work, crash
        self.crash_every, self.reconnect, self.hang = crash_every, reconnect, hang
        self.stall_after, self.read = stall_after, read
        self.tags: list[str] = []  # one per connection it made
        self.acked = 0
        self.received = 0
        self.errors: list[str] = []  # channel or connection errors it saw (506 ...)
        self.crashes: list[float] = []  # when it died holding something
        self.first_delivery: float | None = None
        self.handed: list[tuple[float, str, bytes, int]] = []

    def run(self) -> None:
        attempt = 0
        while not self.stop.is_set() and attempt < 200:
            attempt += 1
            tag = f"{self.base_tag}.{attempt}"
            try:
                self._session(tag)
            except _Crash:
                self.crashes.append(time.monotonic())
                self.stop.wait(self.reconnect)
                continue
            except (amqp.exceptions.AMQPError, OSError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            return

    def _session(self, tag: str) -> None:
        conn = amqp.Connection(host=f"127.0.0.1:{self.port}", connect_timeout=5)
        conn.connect()
        crashed = False
        try:
            ch = conn.channel()
            ch.basic_qos(0, self.prefetch, False)
            in_session = 0

            def on_message(msg: amqp.Message) -> None:
                nonlocal in_session
                self.received += 1
                in_session += 1
                if self.first_delivery is None:
                    self.first_delivery = time.monotonic()
                body = msg.body if isinstance(msg.body, bytes) else str(msg.body).encode()
                count = (msg.headers or {}).get("x-ack-timeout-count", 0)
                self.handed.append((time.monotonic(), tag, body, count))
                if self.stall_after is not None and self.received > self.stall_after:
                    self.stop.wait(60)  # stuck: no ack until the scenario ends
                    return
                pause = self.work(body)
                if pause:
                    time.sleep(pause)
                if self.crash(body) or (self.crash_every and in_session >= self.crash_every):
                    raise _Crash
                if self.hang(body):
                    return  # it runs on: never settled
                if not self.no_ack:
                    ch.basic_ack(msg.delivery_tag)
                    self.acked += 1

            self.tags.append(tag)
            ch.basic_consume(self.queue, consumer_tag=tag, callback=on_message, no_ack=self.no_ack)
            if not self.read:
                self.stop.wait(60)  # holds the socket open, reads nothing
                return
            while not self.stop.is_set():
                try:
                    conn.drain_events(timeout=0.05)
                except TimeoutError:
                    pass
        except _Crash:
            crashed = True
            _hard_close(conn)
            raise
        finally:
            if not crashed:
                try:
                    conn.close()
                except Exception:  # already closed by the broker or the scenario's end
                    pass


class _Crash(Exception):
    """A consumer process dying in its handler."""


def _hard_close(conn: amqp.Connection) -> None:
    """Drop the TCP connection without closing AMQP, as a dying process does."""
    sock = conn.transport.sock if conn.transport is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


class Publisher:
    """A py-amqp publishing connection (one per scenario)."""

    def __init__(self, port: int) -> None:
        self.conn = amqp.Connection(host=f"127.0.0.1:{port}", connect_timeout=5)
        self.conn.connect()
        self.ch = self.conn.channel()

    def declare(
        self, queue: str, *, topic_key: str | None = None, arguments: dict[str, Any] | None = None
    ) -> None:
        self.ch.queue_declare(queue, durable=False, auto_delete=False, arguments=arguments or {})
        if topic_key is not None:
            self.ch.queue_bind(queue, "amq.topic", topic_key)

    def send(self, routing_key: str, body: bytes, exchange: str = "") -> None:
        self.ch.basic_publish(amqp.Message(body), exchange=exchange, routing_key=routing_key)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def pace(stop: threading.Event, until: float, rate: float, send: Callable[[int], None]) -> int:
    """Call ``send(i)`` ``rate`` times a second until ``until`` or ``stop``; how many sent."""
    n = 0
    start = time.monotonic()
    while not stop.is_set() and time.monotonic() < until and n < 100_000:
        send(n)
        n += 1
        stop.wait(max(0.0, start + n / rate - time.monotonic()))
    return n


# ------------------------------------------------------------------------------------ scenarios


@dataclass
class Run:
    """What one scenario did while it ran (filled by its driver)."""

    consumers: list[Consumer] = field(default_factory=list)
    #: the consumer-tag prefixes of the faulty consumers (isolating another one is a false positive)
    faulty_tags: tuple[str, ...] = ()
    #: when the threshold was crossed, for the faults the driver times itself
    crossed_at: float | None = None
    note: str = ""
    #: events from brokers the scenario started itself, judged with the others
    events: list[Event] = field(default_factory=list)
    #: what the driver saw itself: false positives (a dead-letter queue deleted) and misses
    wrong: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    #: messages handed out more often than allowed, dead letters lost (None: not judged)
    loops: int | None = None
    lost: int | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    healthy: bool
    expected: str
    #: queues it owns (every event on them is attributed to it)
    queues: tuple[str, ...]
    drive: Callable[[Ctx, Run], None]
    #: what counts as detection for a fault: event kinds
    detect: tuple[str, ...] = ()
    #: the check period the detection latency is judged against
    period: float = ISOLATION_CHECK
    slow: bool = False  # a subprocess or a long start: left out of the small matrix


@dataclass
class Ctx:
    port: int
    url: str
    stop: threading.Event
    until: float  # when publishing ends
    workdir: Path
    recorder: Recorder = field(default_factory=Recorder)  # what the shared broker's policies did


def _start(run: Run, ctx: Ctx, queue: str, tag: str, **kw: Any) -> Consumer:
    c = Consumer(ctx.port, queue, tag, ctx.stop, **kw)
    run.consumers.append(c)
    c.start()
    return c


def steady(ctx: Ctx, run: Run) -> None:
    """kombu: 50 msg/s, two consumers at 5 ms a message (prefetch 10)."""
    with kombu.Connection(ctx.url) as conn:
        q = kombu.Queue("pp.steady", routing_key="pp.steady", durable=False, auto_delete=False)
        q(conn.default_channel).declare()
        for i in range(2):
            _start(run, ctx, "pp.steady", f"steady{i}", work=lambda b: 0.005)
        p = conn.Producer()
        pace(ctx.stop, ctx.until, 50, lambda i: p.publish(i, routing_key="pp.steady"))


def bursty(ctx: Ctx, run: Run) -> None:
    """Bursts of 100 every 1.5 s, two consumers at 5 ms a message (prefetch 20)."""
    pub = Publisher(ctx.port)
    pub.declare("pp.bursty")
    for i in range(2):
        _start(run, ctx, "pp.bursty", f"bursty{i}", prefetch=20, work=lambda b: 0.005)
    for _ in range(20):
        if ctx.stop.is_set() or time.monotonic() >= ctx.until:
            break
        for j in range(100):
            pub.send("pp.bursty", b"%d" % j)
        ctx.stop.wait(1.5)
    pub.close()


def idle_gaps(ctx: Ctx, run: Run) -> None:
    """One message, then 1.5 s (> ackTimeout) of nothing; 300 ms of work per message."""
    pub = Publisher(ctx.port)
    pub.declare("pp.idle")
    _start(run, ctx, "pp.idle", "idle", prefetch=1, work=lambda b: 0.3)
    for _ in range(20):
        if ctx.stop.is_set() or time.monotonic() >= ctx.until:
            break
        pub.send("pp.idle", b"x")
        ctx.stop.wait(1.5)
    pub.close()


def _long_tail(body: bytes) -> float:
    # p50 20 ms; one message in 50 takes 400 ms, so p99.9 is 20x p50 (still < ackTimeout)
    return 0.4 if int(body) % 50 == 49 else 0.02


def long_tail(ctx: Ctx, run: Run) -> None:
    """Two consumers, 20 ms per message and 400 ms for one in 50, 40 msg/s."""
    pub = Publisher(ctx.port)
    pub.declare("pp.longtail")
    for i in range(2):
        _start(run, ctx, "pp.longtail", f"longtail{i}", prefetch=5, work=_long_tail)
    pace(ctx.stop, ctx.until, 40, lambda i: pub.send("pp.longtail", b"%d" % i))
    pub.close()


def _prefetch(n: int) -> Callable[[Ctx, Run], None]:
    def drive(ctx: Ctx, run: Run) -> None:
        q = f"pp.prefetch{n}"
        pub = Publisher(ctx.port)
        pub.declare(q)
        for j in range(300):  # a backlog first: the window fills
            pub.send(q, b"%d" % j)
        _start(run, ctx, q, f"prefetch{n}", prefetch=n, work=lambda b: 0.005)
        pace(ctx.stop, ctx.until, 50, lambda i: pub.send(q, b"%d" % i))
        pub.close()

    drive.__doc__ = f"prefetch {n or 'unlimited'}: a backlog of 300, then 50 msg/s at 5 ms each"
    return drive


def no_ack(ctx: Ctx, run: Run) -> None:
    """A no-ack consumer at 10 ms a message, 50 msg/s."""
    pub = Publisher(ctx.port)
    pub.declare("pp.noack")
    _start(run, ctx, "pp.noack", "noack", no_ack=True, work=lambda b: 0.01)
    pace(ctx.stop, ctx.until, 50, lambda i: pub.send("pp.noack", b"%d" % i))
    pub.close()


def sub_keeps_up(ctx: Ctx, run: Run) -> None:
    """A topic subscriber at 15 ms a message while 40 msg/s are published (4x the floor)."""
    pub = Publisher(ctx.port)
    pub.declare("pp.sub.keepsup", topic_key="pp.sub.keepsup")
    _start(run, ctx, "pp.sub.keepsup", "keepsup", prefetch=10, work=lambda b: 0.015)
    pace(ctx.stop, ctx.until, 40, lambda i: pub.send("pp.sub.keepsup", b"%d" % i, "amq.topic"))
    pub.close()


CELERY_TASKS = """
from celery import Celery

app = Celery("pptasks", broker="{url}")
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_acks_late=True, worker_prefetch_multiplier=4, task_default_queue="pp.celery")


@app.task
def work(seconds):
    import time
    time.sleep(seconds)
"""


#: a task's duration: 30 s tasks under a 5 min ackTimeout are a tenth of it; 150 ms is 15%
CELERY_TASK = 0.15


def celery_worker(ctx: Ctx, run: Run) -> None:
    """A Celery worker (solo pool, late acks, Celery's default prefetch multiplier 4) running
    150 ms tasks, fed one every 195 ms.

    A solo-pool worker's acks reach the broker in bursts, when its event loop next runs, which
    can be after the tasks it already prefetched: the broker sees up to about four task times
    between acks, not one (with 600 ms tasks and ackTimeout 1 s it was flagged).
    """
    d = ctx.workdir / "celery"
    d.mkdir(exist_ok=True)
    (d / "pptasks.py").write_text(CELERY_TASKS.format(url=ctx.url))
    env = dict(os.environ, PYTHONPATH=str(d))
    cmd = [sys.executable, "-m", "celery", "-A", "pptasks", "worker", "--pool=solo"]
    cmd += ["--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    cmd += ["--loglevel=WARNING", "-Q", "pp.celery"]
    worker = subprocess.Popen(
        cmd, cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with kombu.Connection(ctx.url) as conn:
            p = conn.Producer()
            sent = 0
            while not ctx.stop.is_set() and time.monotonic() < ctx.until and sent < 100:
                # the task message as Celery's protocol 2 sends it
                tid = f"pp-{sent}"
                p.publish(
                    [[CELERY_TASK], {}, {"callbacks": None, "errbacks": None, "chain": None}],
                    routing_key="pp.celery",
                    serializer="json",
                    headers={"lang": "py", "task": "pptasks.work", "id": tid, "root_id": tid},
                    declare=[kombu.Queue("pp.celery", routing_key="pp.celery")],
                )
                sent += 1
                ctx.stop.wait(CELERY_TASK * 1.3)
            run.note = f"{sent} tasks of {CELERY_TASK * 1000:.0f} ms"
        ctx.stop.wait(max(0.0, ctx.until - time.monotonic()))
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)


# Celery under isolation: countdown tasks, long tasks touched, a stopped worker

CELERY_ISO_TASKS = """
import os, time
import kombu.messaging as km
from celery import Celery

_prefix = os.environ.get("PP_TAG")
if _prefix:  # a consumer tag that names the worker (Celery's are "None1", "None2", ...)
    _init = km.Consumer.__init__

    def _tagged(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if self.tag_prefix is None:
            self.tag_prefix = _prefix

    km.Consumer.__init__ = _tagged

app = Celery("ppiso", broker="{url}")
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_acks_late=True, worker_prefetch_multiplier=4, task_default_queue="{queue}",
                # scaled as the rest: Celery looks at its ETA schedule every second by default,
                # a tenth of a second here (docs/celery.md)
                worker_timer_precision=0.1)
if os.environ.get("PP_TOUCH"):
    from plugbroker.contrib.celery import install
    install(app)


@app.task
def work(seconds):
    time.sleep(seconds)
"""


class CeleryWorkers:
    """Celery workers (solo pool, late acks) on one queue, in subprocesses; stopped by PID."""

    def __init__(self, ctx: Ctx, queue: str) -> None:
        self.ctx = ctx
        self.queue = queue
        self.dir = ctx.workdir / queue
        self.dir.mkdir(exist_ok=True)
        (self.dir / "ppiso.py").write_text(CELERY_ISO_TASKS.format(url=ctx.url, queue=queue))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sent = 0

    def start(self, tag: str, touch: bool) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.dir), str(ROOT)]), PP_TAG=tag)
        if touch:
            env["PP_TOUCH"] = "1"
        cmd = [sys.executable, "-m", "celery", "-A", "ppiso", "worker", "--pool=solo"]
        cmd += ["--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat"]
        cmd += ["--loglevel=WARNING", "-Q", self.queue, f"--hostname={tag}@%h"]
        p = subprocess.Popen(
            cmd, cwd=self.dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.procs.append(p)
        return p

    def wait_consumers(self, n: int, timeout: float = 30.0) -> None:
        """Until ``n`` workers consume; raises (the scenario proves nothing) if they do not
        before ``timeout`` or the run's end (give Celery scenarios a longer ``--duration``)."""
        with kombu.Connection(self.ctx.url) as conn:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not self.ctx.stop.is_set():
                q = kombu.Queue(self.queue, routing_key=self.queue)
                _, _, consumers = q(conn.default_channel).queue_declare()
                if consumers >= n:
                    return
                self.ctx.stop.wait(0.1)
        raise RuntimeError(f"{n} Celery workers did not start on {self.queue} in time")

    def send(self, conn: kombu.Connection, seconds: float, countdown: float = 0.0) -> None:
        """A task message as Celery's protocol 2 sends it (with its ``eta`` header)."""
        tid = f"{self.queue}-{self.sent}"
        headers = {"lang": "py", "task": "ppiso.work", "id": tid, "root_id": tid}
        if countdown:
            eta = datetime.datetime.now(datetime.UTC)
            headers["eta"] = (eta + datetime.timedelta(seconds=countdown)).isoformat()
        conn.Producer().publish(
            [[seconds], {}, {"callbacks": None, "errbacks": None, "chain": None}],
            routing_key=self.queue,
            serializer="json",
            headers=headers,
            declare=[kombu.Queue(self.queue, routing_key=self.queue)],
        )
        self.sent += 1

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


#: Celery scenarios' task lengths and countdown, against ACK_TIMEOUT (1 s)
CELERY_COUNTDOWN = 2.5
CELERY_LONG_TASK = 1.5


def celery_countdown(ctx: Ctx, run: Run) -> None:
    """Two Celery workers, 8 tasks sent with a 2.5 s countdown (2.5 x ackTimeout): the workers
    hold them unacked until they are due (ETA awareness keeps that off the clock). With touch:
    an idle solo-pool worker writes the ack of a task it ran at its ETA only when its event loop
    next wakes, up to 10 s later (measured, Celery 5.4), which no 1 s ackTimeout survives
    without touch (docs/celery.md)."""
    w = CeleryWorkers(ctx, "pp.celery.eta")
    try:
        w.start("ppeta-a-", touch=True)
        w.start("ppeta-b-", touch=True)
        w.wait_consumers(2)
        with kombu.Connection(ctx.url) as conn:
            for _ in range(8):
                w.send(conn, 0.05, countdown=CELERY_COUNTDOWN)
        run.note = f"8 tasks, countdown {CELERY_COUNTDOWN:g} s, touched"
        ctx.stop.wait(CELERY_COUNTDOWN + 2 * ACK_TIMEOUT + 1.0)
        ctx.stop.wait(max(0.0, ctx.until - time.monotonic()))
    finally:
        w.stop()


def celery_touch(ctx: Ctx, run: Run) -> None:
    """Two Celery workers with the touch integration, 1.5 s tasks (1.5 x ackTimeout)."""
    w = CeleryWorkers(ctx, "pp.celery.touch")
    try:
        w.start("pptouch-a-", touch=True)
        w.start("pptouch-b-", touch=True)
        w.wait_consumers(2)
        with kombu.Connection(ctx.url) as conn:
            for _ in range(6):
                w.send(conn, CELERY_LONG_TASK)
        run.note = f"6 tasks of {CELERY_LONG_TASK:g} s, touched"
        ctx.stop.wait(3 * CELERY_LONG_TASK + ACK_TIMEOUT)
        ctx.stop.wait(max(0.0, ctx.until - time.monotonic()))
    finally:
        w.stop()


def celery_stopped(ctx: Ctx, run: Run) -> None:
    """Two Celery workers with touch; one is stopped (SIGSTOP) with tasks in hand: it touches
    nothing more and must be isolated; the other must not be."""
    w = CeleryWorkers(ctx, "pp.celery.stopped")
    run.faulty_tags = ("ppstop-stuck-",)
    try:
        stuck = w.start("ppstop-stuck-", touch=True)
        w.start("ppstop-ok-", touch=True)
        w.wait_consumers(2)
        os.kill(stuck.pid, signal.SIGSTOP)
        with kombu.Connection(ctx.url) as conn:
            for _ in range(8):
                w.send(conn, 0.2)
        run.note = "8 tasks of 200 ms, one worker SIGSTOPped"
        ctx.stop.wait(2 * ACK_TIMEOUT + 8 * 0.2 + 1.0)
        ctx.stop.wait(max(0.0, ctx.until - time.monotonic()))
    finally:
        w.stop()


# faults


def stalled(ctx: Ctx, run: Run) -> None:
    """Two consumers; one stops acking after 20 messages (its handler hangs)."""
    pub = Publisher(ctx.port)
    pub.declare("pp.stalled")
    run.faulty_tags = ("stalled",)
    _start(run, ctx, "pp.stalled", "stalled", prefetch=5, stall_after=20, work=lambda b: 0.005)
    _start(run, ctx, "pp.stalled", "bystander", prefetch=5, work=lambda b: 0.005)
    pace(ctx.stop, ctx.until, 40, lambda i: pub.send("pp.stalled", b"%d" % i))
    pub.close()


def no_read(ctx: Ctx, run: Run) -> None:
    """Two consumers; one stops reading its socket right after basic.consume."""
    pub = Publisher(ctx.port)
    pub.declare("pp.noread")
    run.faulty_tags = ("noread",)
    _start(run, ctx, "pp.noread", "noread", prefetch=50, read=False)
    _start(run, ctx, "pp.noread", "bystander", prefetch=10, work=lambda b: 0.005)
    pace(ctx.stop, ctx.until, 40, lambda i: pub.send("pp.noread", b"%d" % i))
    pub.close()


def _slow_subscription(ctx: Ctx, run: Run, queue: str, **consumer: Any) -> None:
    pub = Publisher(ctx.port)
    pub.declare(queue, topic_key=queue)
    ctx.stop.wait(2 * SLOW_CHECK)  # the check has seen the queue once: the rate is judged
    for j in range(100):
        pub.send(queue, b"%d" % j, "amq.topic")
    # from here the queue has a backlog and its consumer acks below the floor
    run.crossed_at = time.monotonic()
    run.faulty_tags = (queue,)
    _start(run, ctx, queue, queue, **consumer)
    pace(ctx.stop, ctx.until, 5, lambda i: pub.send(queue, b"%d" % i, "amq.topic"))
    pub.close()


def slower_than_floor(ctx: Ctx, run: Run) -> None:
    """A topic subscriber with a backlog of 100 that acks 3 a second (floor 10/s)."""
    _slow_subscription(ctx, run, "pp.sub.slow", prefetch=5, work=lambda b: 0.33)


def crash_loop(ctx: Ctx, run: Run) -> None:
    """A topic subscriber that takes 10 messages, dies without acking and reconnects, again."""
    _slow_subscription(ctx, run, "pp.sub.crashloop", prefetch=10, crash_every=1, reconnect=0.1)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("steady", True, "untouched", ("pp.steady",), steady),
    Scenario("bursty", True, "untouched", ("pp.bursty",), bursty),
    Scenario("idle gaps > ackTimeout", True, "untouched", ("pp.idle",), idle_gaps),
    Scenario("long tail (p99.9 = 20x p50)", True, "untouched", ("pp.longtail",), long_tail),
    Scenario("prefetch 1", True, "untouched", ("pp.prefetch1",), _prefetch(1)),
    Scenario("prefetch 100", True, "untouched", ("pp.prefetch100",), _prefetch(100)),
    Scenario("prefetch unlimited", True, "untouched", ("pp.prefetch0",), _prefetch(0)),
    Scenario("no-ack", True, "untouched", ("pp.noack",), no_ack),
    Scenario("subscriber keeps up", True, "untouched", ("pp.sub.keepsup",), sub_keeps_up),
    Scenario(
        "Celery worker (long tasks)", True, "untouched", ("pp.celery",), celery_worker, slow=True
    ),
    Scenario(
        "Celery countdown tasks (ETA > ackTimeout) with touch",
        True,
        "untouched",
        ("pp.celery.eta",),
        celery_countdown,
        slow=True,
    ),
    Scenario(
        "Celery tasks > ackTimeout with touch",
        True,
        "untouched",
        ("pp.celery.touch",),
        celery_touch,
        slow=True,
    ),
    Scenario("stalled consumer", False, "isolated", ("pp.stalled",), stalled, ("isolated",)),
    Scenario("stops reading socket", False, "isolated", ("pp.noread",), no_read, ("isolated",)),
    Scenario(
        "slower than rate floor",
        False,
        "506 + deleted",
        ("pp.sub.slow",),
        slower_than_floor,
        ("action",),
        SLOW_CHECK,
    ),
    Scenario(
        "crash-looping subscriber",
        False,
        "506 + deleted",
        ("pp.sub.crashloop",),
        crash_loop,
        ("action", "poison"),
        SLOW_CHECK,
    ),
    Scenario(
        "Celery worker stopped (SIGSTOP)",
        False,
        "isolated",
        ("pp.celery.stopped",),
        celery_stopped,
        ("isolated",),
        slow=True,
    ),
)

from bench import precision_tries  # noqa: E402  (its scenarios run on the parts above)

SCENARIOS += precision_tries.SCENARIOS

#: what the test suite runs: a few of each kind, none that starts a subprocess
SMALL = (
    "steady",
    "idle gaps > ackTimeout",
    "prefetch unlimited",
    "subscriber keeps up",
    "stalled consumer",
    "slower than rate floor",
    *precision_tries.SMALL,
)


# ------------------------------------------------------------------------------------- results


@dataclass
class Result:
    scenario: Scenario
    outcome: str
    false_positives: int
    missed: int
    latency: float | None  # seconds after the threshold was crossed
    touched: list[str]
    note: str = ""
    loops: int | None = None
    lost: int | None = None

    @property
    def within_period(self) -> bool | None:
        if self.latency is None:
            return None
        return self.latency <= self.scenario.period + 0.1  # loop and GIL slack


def _owner(queue: str, scenarios: Sequence[Scenario]) -> Scenario | None:
    for s in scenarios:
        if queue in s.queues:
            return s
    return None


def judge(
    scenarios: Sequence[Scenario], runs: dict[str, Run], events: Sequence[Event]
) -> tuple[list[Result], list[Event]]:
    """Per scenario: what happened, false positives, misses, latency; and the events on queues
    no scenario owns (each one a false positive too)."""
    by: dict[str, list[Event]] = {s.name: [] for s in scenarios}
    stray: list[Event] = []
    for e in events:
        owner = _owner(e.queue, scenarios)
        if owner is None:
            stray.append(e)
        else:
            by[owner.name].append(e)
    results = []
    for s in scenarios:
        run = runs[s.name]
        evs = by[s.name]
        errors = [f"{c.base_tag}: {err}" for c in run.consumers for err in c.errors]
        if s.healthy:
            touched = [f"{e.kind} {e.tag} {e.detail}".strip() for e in evs] + errors + run.wrong
            outcome = "untouched" if not touched else "TOUCHED"
            results.append(Result(s, outcome, len(touched), 0, None, touched, run.note))
            continue
        # a bystander consumer isolated, or its delivery timed out, is a false positive
        faulty = run.faulty_tags
        fps = [
            e
            for e in evs
            if e.kind in ("isolated", "timed_out") and not any(e.tag.startswith(f) for f in faulty)
        ]
        hits = [e for e in evs if e.kind in s.detect and e not in fps]
        missed = (0 if hits else 1) + len(run.misses)
        latency = None
        if hits:
            first = hits[0]
            if first.kind == "isolated":
                latency = first.clock - ACK_TIMEOUT
            elif run.crossed_at is not None:
                latency = first.at - run.crossed_at
        kinds = sorted({e.kind for e in evs})
        saw_506 = any("506" in err for err in errors)
        outcome = ", ".join(kinds) + (" (client saw 506)" if saw_506 else "") if kinds else "-"
        touched = [f"{e.kind} {e.tag} {e.detail}".strip() for e in fps] + run.wrong + run.misses
        fp = len(fps) + len(run.wrong)
        results.append(
            Result(s, outcome, fp, missed, latency, touched, run.note, run.loops, run.lost)
        )
    return results, stray


def table(results: Sequence[Result], stray: Sequence[Event]) -> str:
    rows = [
        "| scenario | kind | expected | what happened | false positives | missed | endless loops "
        "| dead letters lost | latency |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r.scenario
        lat = "-" if r.latency is None else f"{r.latency * 1000:.0f} ms"
        if r.latency is not None and not r.within_period:
            lat += " (over one period)"
        what = r.outcome + (f"; {r.note}" if r.note else "")
        loops, lost = ("-" if n is None else str(n) for n in (r.loops, r.lost))
        rows.append(
            f"| {s.name} | {'healthy' if s.healthy else 'fault'} | {s.expected} | {what} | "
            f"{r.false_positives} | {r.missed} | {loops} | {lost} | {lat} |"
        )
    fp = sum(r.false_positives for r in results) + len(stray)
    missed = sum(r.missed for r in results)
    loops = sum(r.loops or 0 for r in results)
    lost = sum(r.lost or 0 for r in results)
    rows.append("")
    rows.append(
        f"false positives: {fp} (must be 0); missed faults: {missed} (must be 0); endless loops: "
        f"{loops} (must be 0); dead letters lost: {lost} (must be 0)"
    )
    for r in results:
        for t in r.touched:
            rows.append(f"  {r.scenario.name}: {t}")
    for e in stray:
        rows.append(f"  (no scenario) {e.kind} {e.queue} {e.tag} {e.detail}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------- running


@contextmanager
def running_broker(workdir: Path) -> Iterator[BrokerThread]:
    """A broker under the scaled configuration, on a free 127.0.0.1 port."""
    cfg = write_config(workdir, VHOST, period=str(int(SLOW_CHECK * 1000)))
    b = BrokerThread(cfg).start()
    try:
        yield b
    finally:
        b.stop()


def run_matrix(
    b: BrokerThread, scenarios: Sequence[Scenario], workdir: Path, duration: float = 6.0
) -> tuple[list[Result], list[Event]]:
    """Run ``scenarios`` at once on ``b`` for ``duration`` seconds of traffic; judge them."""
    rec = Recorder()
    b.call(lambda: b.broker.api.register_plugin(rec, "policy-precision-recorder"))
    stop = threading.Event()
    ctx = Ctx(b.port, b.url(), stop, time.monotonic() + duration, workdir, rec)
    runs = {s.name: Run() for s in scenarios}
    drivers = []
    failures: dict[str, BaseException] = {}

    def drive(s: Scenario) -> None:
        try:
            s.drive(ctx, runs[s.name])
        except BaseException as exc:  # reported in the table as a note
            failures[s.name] = exc

    try:
        for s in scenarios:
            t = threading.Thread(target=drive, args=(s,), name=f"drive-{s.name}", daemon=True)
            drivers.append(t)
            t.start()
        # let the last messages and the checks after them through; a driver that waits for an
        # outcome (bounded tries) ends when it holds or its own deadline passes; then stop
        time.sleep(max(0.0, ctx.until - time.monotonic()) + ACK_TIMEOUT + 2 * SLOW_CHECK)
        deadline = time.monotonic() + 30.0
        for t in drivers:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        stop.set()
        for t in drivers:
            t.join(30)
        for run in runs.values():
            for c in run.consumers:
                c.join(10)
        b.call(lambda: b.broker.api.unregister_plugin("policy-precision-recorder"))
    for name, exc in failures.items():
        runs[name].note = (runs[name].note + f" driver failed: {exc!r}").strip()
    events = list(rec.events) + [e for run in runs.values() for e in run.events]
    results, stray = judge(scenarios, runs, events)
    for res in results:  # a scenario whose driver failed proves nothing: count it as missed
        if res.scenario.name in failures:
            res.missed = max(res.missed, 1)
    return results, stray


def picked(only: str, scenarios: Sequence[Scenario]) -> list[Scenario]:
    """The scenarios ``only`` names, comma-separated (a name may hold commas itself)."""
    norm = ",".join(p.strip() for p in only.split(","))
    return [s for s in scenarios if f",{s.name.replace(', ', ',')}," in f",{norm},"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=6.0, help="seconds of traffic")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--small", action="store_true", help="the suite's small matrix")
    ap.add_argument("--no-celery", action="store_true")
    args = ap.parse_args(argv)
    chosen = list(SCENARIOS)
    if args.small:
        chosen = [s for s in chosen if s.name in SMALL]
    if args.only:
        chosen = picked(args.only, chosen)
    if args.no_celery:
        chosen = [s for s in chosen if not s.name.startswith("Celery")]
    print(SCALE)
    with tempfile.TemporaryDirectory(prefix="policy-precision-") as tmp:
        with running_broker(Path(tmp)) as b:
            results, stray = run_matrix(b, chosen, Path(tmp), args.duration)
    print(table(results, stray))
    bad = sum(r.false_positives + r.missed + (r.loops or 0) + (r.lost or 0) for r in results)
    bad += len(stray)
    return 1 if bad else 0

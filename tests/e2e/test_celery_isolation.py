"""Celery on a queue under ack-timeout isolation (issue 17), with real worker subprocesses:
countdown tasks run once, long tasks with the touch integration run once and nobody is
isolated, and a stopped worker is isolated and its tasks run on another worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugbroker.hookimpl import hookimpl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = (
    '<queue name="celery" subscription="shared"><isolation><ackTimeout>{ms}'
    "</ackTimeout><checkPeriod>100ms</checkPeriod></isolation></queue>"
)

TASKS = """
import os, time
from celery import Celery

app = Celery("isotasks", broker="{url}")
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_acks_late=True, worker_prefetch_multiplier=4, broker_heartbeat=0,
                worker_timer_precision=0.1)
if os.environ.get("PB_TOUCH"):
    from plugbroker.contrib.celery import install
    install(app)


@app.task(bind=True)
def job(self, n, seconds):
    time.sleep(seconds)
    redelivered = bool((self.request.delivery_info or {{}}).get("redelivered"))
    line = f"{{n}} {{os.getpid()}} {{int(redelivered)}}\\n"
    with open({log!r}, "a") as f:
        f.write(line)


@app.task
def hang(n, seconds):
    # a task longer than the ack timeout: says when it starts, then works
    with open({starts!r}, "a") as f:
        f.write(f"{{n}} {{os.getpid()}}\\n")
    time.sleep(seconds)
"""


class Isolations:
    """Counts isolations on the broker (a plugin registered through the core API)."""

    def __init__(self) -> None:
        self.isolated: list[str] = []

    @hookimpl
    def broker_consumer_isolated(self, queue: str, consumer_tag: str) -> None:
        self.isolated.append(f"{queue}/{consumer_tag}")


class Celery:
    def __init__(self, b: Any, tmp: Path) -> None:
        self.b = b
        self.tmp = tmp
        self.log = tmp / "runs.log"
        self.log.write_text("")
        self.starts = tmp / "starts.log"
        self.starts.write_text("")
        (tmp / "isotasks.py").write_text(
            TASKS.format(url=b.url(), log=str(self.log), starts=str(self.starts))
        )
        self.workers: list[subprocess.Popen] = []
        self.iso = Isolations()
        b.call(lambda: b.broker.api.register_plugin(self.iso, "celery-isolations"))
        sys.path.insert(0, str(tmp))
        import isotasks  # type: ignore[import-not-found]

        self.mod = isotasks

    def start_worker(self, name: str, touch: bool = False) -> subprocess.Popen:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.tmp), root]))
        if touch:
            env["PB_TOUCH"] = "1"
        cmd = [sys.executable, "-m", "celery", "-A", "isotasks", "worker", "--pool=solo"]
        cmd += ["--concurrency=1", "--without-gossip", "--without-mingle"]
        cmd += ["--without-heartbeat", f"--hostname={name}@%h", "--loglevel=WARNING"]
        p = subprocess.Popen(
            cmd,
            cwd=self.tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.workers.append(p)
        return p

    def wait_consumers(self, n: int, timeout: float = 30.0) -> None:
        """Until ``n`` consumers are on queue ``celery`` (the workers are up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.b.call(
                lambda: (
                    len(q.consumers)
                    if (q := self.b.broker.vhosts["/"].queues.get("celery")) is not None
                    else 0
                )
            )
            if got >= n:
                return
            time.sleep(0.1)
        raise AssertionError(f"{n} Celery workers never consumed from queue celery")

    def runs(self) -> list[tuple[int, int, bool]]:
        out = []
        for line in self.log.read_text().splitlines():
            n, pid, red = line.split()
            out.append((int(n), int(pid), red == "1"))
        return out

    def wait_runs(self, count: int, timeout: float) -> list[tuple[int, int, bool]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.runs()
            if len(got) >= count:
                return got
            time.sleep(0.05)
        return self.runs()

    def close(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in self.workers:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        sys.path.remove(str(self.tmp))
        sys.modules.pop("isotasks", None)
        self.b.call(lambda: self.b.broker.api.unregister_plugin("celery-isolations"))


@pytest.fixture
def celery(request, broker_factory, tmp_path: Path) -> Iterator[Celery]:
    marker = request.node.get_closest_marker("ack_timeout_ms")
    b = broker_factory(CONFIG.format(ms=marker.args[0] if marker else 500))
    c = Celery(b, tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_countdown_tasks_under_a_shorter_ack_timeout_run_exactly_once(celery):
    """ETA awareness keeps the wait until the countdown off the clock; touch covers what comes
    after: an idle solo-pool worker writes the ack of a task it ran at its ETA only when its
    event loop next wakes, up to 10 s later, and that counts (docs/celery.md). Celery looks at
    its ETA schedule every ``worker_timer_precision`` (1 s by default, 0.1 s here)."""
    celery.start_worker("w1", touch=True)
    celery.start_worker("w2", touch=True)
    celery.wait_consumers(2)
    # due in 1.5 s, three times the ack timeout: the workers hold them unacked until then
    for n in range(6):
        celery.mod.job.apply_async((n, 0.0), countdown=1.5)
    runs = celery.wait_runs(6, timeout=15)
    # past ackTimeout + checkPeriod after the ETA: an isolation would have moved them by now
    time.sleep(1.0)
    runs = celery.runs()
    assert (sorted(n for n, _, _ in runs), celery.iso.isolated) == (list(range(6)), [])
    assert not any(red for _, _, red in runs)


def test_long_tasks_with_touch_run_once_and_nobody_is_isolated(celery):
    celery.start_worker("w1", touch=True)
    celery.start_worker("w2", touch=True)
    celery.wait_consumers(2)
    # 1.2 s tasks, over twice the ack timeout; a worker holds up to 4 (prefetch)
    for n in range(4):
        celery.mod.job.delay(n, 1.2)
    runs = celery.wait_runs(4, timeout=20)
    time.sleep(0.7)  # past ackTimeout + checkPeriod after the last task
    runs = celery.runs()
    assert sorted(n for n, _, _ in runs) == list(range(4))
    assert not any(red for _, _, red in runs)
    assert celery.iso.isolated == []


def test_a_stopped_worker_is_isolated_and_its_tasks_run_on_another(celery):
    """At-least-once: the stopped worker's tasks run on the other; resumed, it could run them
    too (its late ack is accepted): the teardown resumes it and stops it."""
    stuck = celery.start_worker("stuck", touch=True)
    celery.start_worker("ok", touch=True)
    celery.wait_consumers(2)
    os.kill(stuck.pid, signal.SIGSTOP)  # frozen with its connection open: it touches nothing
    for n in range(6):
        celery.mod.job.delay(n, 0.05)
    runs = celery.wait_runs(6, timeout=15)
    assert sorted(n for n, _, _ in runs) == list(range(6))
    assert {pid for _, pid, _ in runs} == {celery.workers[1].pid}
    assert len(celery.iso.isolated) == 1
    assert any(red for _, _, red in runs)  # what it held came back redelivered


def queue_depth(b: Any, name: str) -> int:
    return int(
        b.call(
            lambda: (
                q.message_count if (q := b.broker.vhosts["/"].queues.get(name)) is not None else 0
            )
        )
    )


@pytest.mark.ack_timeout_ms(2000)
def test_a_task_longer_than_its_ack_timeout_runs_at_most_three_times_without_touch(celery):
    """The misconfiguration: a 20 s acks_late task, an ack timeout of 2 s, no touch. The two
    workers do not isolate each other for ever: each timed-out hand-out counts on the message,
    and at the third it is parked in ``celery-DLQ`` with reason poison; both workers then
    take new tasks."""
    celery.start_worker("w1")
    celery.start_worker("w2")
    celery.wait_consumers(2)
    celery.mod.hang.delay(0, 20.0)
    deadline = time.monotonic() + 40
    while queue_depth(celery.b, "celery-DLQ") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a condition, bounded by the deadline
    assert queue_depth(celery.b, "celery-DLQ") == 1
    starts = [line.split() for line in celery.starts.read_text().splitlines()]
    assert 1 <= len(starts) <= 3  # at most poisonDeliveries runs
    # the dead letter says why
    import kombu

    with kombu.Connection(celery.b.url()) as conn:
        dead = conn.SimpleQueue("celery-DLQ").get(timeout=5)
        assert dead.headers["x-death"][0]["reason"] == "poison"
        assert dead.headers["x-death"][0]["queue"] == "celery"
        dead.ack()
    # both workers take new tasks once they are through the long one (their late acks of it
    # are accepted: no channel error); until then nothing new is handed to them

    def through() -> bool:
        q = celery.b.broker.vhosts["/"].queues["celery"]
        return len(q.consumers) == 2 and not any(c.pardon or c.isolated for c in q.consumers)

    deadline = time.monotonic() + 60
    while not celery.b.call(through) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a condition, bounded by the deadline
    assert celery.b.call(through)
    for n in range(1, 7):
        celery.mod.job.delay(n, 0.0)
    runs = celery.wait_runs(6, timeout=60)
    assert sorted(n for n, _, _ in runs) == list(range(1, 7))
    assert {pid for _, pid, _ in runs} == {w.pid for w in celery.workers}
    assert queue_depth(celery.b, "celery") == 0
    assert len([line for line in celery.starts.read_text().splitlines()]) == len(starts)

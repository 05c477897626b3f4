"""A real Celery app on plugbroker: a worker in a subprocess, tasks, results, remote control."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TASKS = """
from celery import Celery

app = Celery("pbtasks", broker="{url}", backend="rpc://")
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_acks_late=True, worker_prefetch_multiplier=4)


@app.task
def add(x, y):
    return x + y


@app.task
def boom():
    raise ValueError("boom from the worker")
"""


@pytest.fixture
def celery_app(broker, tmp_path: Path):
    (tmp_path / "pbtasks.py").write_text(TASKS.format(url=broker.url()))
    sys.path.insert(0, str(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "pbtasks",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--hostname=pbworker@%h",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import pbtasks  # type: ignore[import-not-found]

        yield pbtasks, worker
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("pbtasks", None)
        if worker.poll() is None:
            worker.terminate()  # SIGTERM: warm shutdown
            try:
                out, _ = worker.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                out, _ = worker.communicate(timeout=5)
            celery_app.worker_output = out  # type: ignore[attr-defined]


def _wait_for_worker(app, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=0.5)
        if replies:
            return replies
    raise AssertionError("the Celery worker never answered ping")


def test_celery_tasks_results_and_remote_control(celery_app):
    mod, worker = celery_app
    app = mod.app
    replies = _wait_for_worker(app)
    assert any("pbworker@" in next(iter(r)) for r in replies)

    results = [mod.add.delay(i, i) for i in range(10)]
    assert [r.get(timeout=20) for r in results] == [2 * i for i in range(10)]

    failing = mod.boom.delay()
    with pytest.raises(ValueError, match="boom from the worker"):
        failing.get(timeout=20)

    # pidbox broadcast (fanout exchange + reply queue): inspect and revoke are answered
    stats = app.control.inspect(timeout=2).stats()
    assert stats and any(k.startswith("pbworker@") for k in stats)
    revoked = app.control.revoke("no-such-task-id", reply=True, timeout=2)
    assert revoked and "pbworker@" in next(iter(revoked[0]))

    # clean shutdown through the broker: the worker exits by itself
    app.control.shutdown(timeout=2)
    assert worker.wait(timeout=30) == 0

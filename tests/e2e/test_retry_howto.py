"""docs/retry-and-dead-letter.md: each sample file runs against a broker started from the
page's own configuration, and the page shows the files verbatim."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLES = DOCS / "examples" / "retry"


@pytest.fixture
def samples():
    sys.path.insert(0, str(EXAMPLES))
    yield lambda name: importlib.import_module(name)
    sys.path.remove(str(EXAMPLES))
    for name in ("reconsume", "custom_names", "negative_ack", "negative_ack_dlq", "celery_tasks"):
        sys.modules.pop(name, None)


@pytest.fixture
def url(broker_factory):
    return broker_factory(config_path=EXAMPLES / "broker.xml").url()


def test_the_page_shows_every_sample_verbatim():
    page = (DOCS / "retry-and-dead-letter.md").read_text()
    blocks = re.findall(r"```(?:python|xml)\n(.*?)```", page, re.S)
    for name in (
        "broker.xml",
        "reconsume.py",
        "custom_names.py",
        "negative_ack.py",
        "negative_ack_dlq.py",
        "celery_tasks.py",
    ):
        assert (EXAMPLES / name).read_text() in blocks, name


@pytest.mark.parametrize("mode", ["delay", "level", "next"])
def test_sample_1_reconsume_later(samples, url, mode):
    assert samples("reconsume").run(url, mode) == [0, 1]


def test_sample_2_custom_names_and_limit(samples, url):
    out = samples("custom_names").run(url)
    assert out["seen"] == [0, 1, 2, 3]  # maxRedeliveries 3, from broker.xml only
    assert out["body"] == {"invoice": 7}
    assert out["headers"]["RECONSUMETIMES"] == 4
    assert out["headers"]["RETRY_TOPIC"] == "invoices-retry"
    assert out["headers"]["x-death"][0]["reason"] == "delivery_limit"


def test_no_sample_passes_a_limit_or_a_queue_name_to_the_client():
    for path in EXAMPLES.glob("*.py"):
        text = path.read_text()
        for word in ("max_reconsume", "retry_queue=", "dead_letter_queue=", "levels="):
            assert word not in text, (path.name, word)


def test_sample_3_negative_ack_with_a_delay(samples, url):
    gaps = samples("negative_ack").run(url)
    assert len(gaps) == 2 and all(0.18 <= g < 0.6 for g in gaps), gaps


def test_sample_4_negative_ack_then_dead_letter(samples, url):
    out = samples("negative_ack_dlq").run(url)
    assert out["counts"] == [0, 1, 2, 3, 4, 5]
    assert out["reason"] == "delivery_limit"
    assert out["headers"]["REAL_TOPIC"] == "payments"


def test_sample_5_reconsume_later_from_a_celery_task(samples, url, monkeypatch):
    monkeypatch.setenv("BROKER_URL", url)
    mod = samples("celery_tasks")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(root)]))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_tasks",
            "worker",
            "--pool=solo",
            "--hostname=retryworker@%h",
            "--without-gossip",
            "--without-mingle",
            "--loglevel=INFO",
        ],
        cwd=EXAMPLES,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        t0 = time.monotonic()
        result = mod.charge.delay(42)
        assert result.get(timeout=30) == {"order": 42, "retries": 1}
        assert time.monotonic() - t0 >= 1.0  # the broker held it for its 1 s delay
    finally:
        worker.terminate()
        try:
            out, _ = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate(timeout=5)
    assert "Traceback" not in out, out

"""The how-to's example plugin, named in the XML, acting on a live broker through a real
APScheduler pool with a sub-second period."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import kombu
import pytest

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


@pytest.fixture
def example_on_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))
    sys.modules.pop("prefetch_policy", None)


def test_prefetch_policy_from_xml_shrinks_a_backlogged_consumers_window(
    broker_factory, example_on_path
):
    import prefetch_policy

    b = broker_factory(plugins="<plugins><plugin>prefetch_policy</plugin></plugins>", period="150")
    assert "prefetch_policy" in b.running.plugins.names()
    assert "reduce-prefetch" in b.running.housekeeping.job_names()
    total = prefetch_policy.THRESHOLD + 100
    held = []
    with kombu.Connection(b.url()) as conn:
        q = kombu.Queue("backlog", routing_key="backlog")
        with conn.Producer() as p:
            for i in range(total):
                p.publish(i, routing_key="backlog", declare=[q])
        consumer = conn.Consumer(q, callbacks=[lambda body, m: held.append(m)], prefetch_count=50)
        with consumer:
            deadline = time.monotonic() + 3
            while len(held) < 50 and time.monotonic() < deadline:
                conn.drain_events(timeout=0.5)
            assert len(held) == 50  # the window the client asked for

            def prefetch():
                [c] = b.broker.vhosts["/"].queues["backlog"].consumers
                return c.prefetch

            deadline = time.monotonic() + 3  # a few 150 ms periods
            while prefetch() != prefetch_policy.PREFETCH and time.monotonic() < deadline:
                time.sleep(0.05)
            assert prefetch() == prefetch_policy.PREFETCH
            # what the client sees: after acking everything it holds, only 10 arrive at a time
            for m in held:
                m.ack()
            held.clear()
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.3)
                except TimeoutError:
                    break
            assert len(held) == prefetch_policy.PREFETCH

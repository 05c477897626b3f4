"""The policy precision matrix, small: healthy consumers untouched, every fault caught.

Runs a few scenarios of ``bench/policy_precision.py`` at once against a real broker with real
py-amqp and kombu clients, under the scaled recommended configuration. Asserts outcomes only
(no false positive, no miss), never a timing: detection latency is the benchmark's business.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from brokerutil import BrokerThread

from bench import policy_precision as pp

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[pp.Result], list[pp.Event]]:
    tmp = tmp_path_factory.mktemp("precision")
    chosen = [s for s in pp.SCENARIOS if s.name in pp.SMALL]
    assert len(chosen) == len(pp.SMALL)
    with pp.running_broker(tmp) as b:
        return pp.run_matrix(b, chosen, tmp, duration=4.0)


def _by_name(results: list[pp.Result]) -> dict[str, pp.Result]:
    return {r.scenario.name: r for r in results}


def test_healthy_consumers_and_queues_are_untouched(matrix) -> None:
    results, stray = matrix
    healthy = [r for r in results if r.scenario.healthy]
    assert len(healthy) == 4
    assert {r.scenario.name: r.touched for r in healthy if r.false_positives} == {}
    assert stray == []  # nothing acted on a queue that no scenario owns


def test_every_fault_is_caught_without_touching_bystanders(matrix) -> None:
    results, _ = matrix
    faults = [r for r in results if not r.scenario.healthy]
    assert {r.scenario.name: r.outcome for r in faults if r.missed} == {}
    assert {r.scenario.name: r.touched for r in faults if r.false_positives} == {}
    got = _by_name(results)
    assert "isolated" in got["stalled consumer"].outcome
    assert "deleted" in got["slower than rate floor"].outcome
    assert got["stalled consumer"].latency is not None


def test_poison_is_detected_or_says_it_is_not_yet(matrix) -> None:
    r = _by_name(matrix[0])["poison message"]
    if pp.poison_detection_available():
        assert r.missed == 0 and "poison" in r.outcome
    else:
        assert r.outcome.startswith("not yet detected") and r.missed == 0


# the judging itself, on made-up events: a miss and a false positive are counted


def _run_with(consumer_tags: tuple[str, ...] = ()) -> pp.Run:
    return pp.Run(faulty_tags=consumer_tags, crossed_at=10.0)


def test_judge_counts_a_touched_healthy_queue_and_a_missed_fault() -> None:
    healthy = pp.Scenario("h", True, "untouched", ("q.h",), lambda c, r: None)
    fault = pp.Scenario("f", False, "isolated", ("q.f",), lambda c, r: None, ("isolated",))
    events = [pp.Event(1.0, "isolated", "q.h", "h.1", clock=1.2)]
    results, stray = pp.judge([healthy, fault], {"h": pp.Run(), "f": _run_with(("f",))}, events)
    got = _by_name(results)
    assert got["h"].false_positives == 1 and got["h"].outcome == "TOUCHED"
    assert got["f"].missed == 1 and got["f"].latency is None
    assert stray == []


def test_judge_latency_and_bystander_isolation() -> None:
    fault = pp.Scenario("f", False, "isolated", ("q.f",), lambda c, r: None, ("isolated",))
    events = [
        pp.Event(11.0, "isolated", "q.f", "bystander.1", clock=1.1),
        pp.Event(11.2, "isolated", "q.f", "f.1", clock=pp.ACK_TIMEOUT + 0.15),
        pp.Event(11.3, "isolated", "q.other", "x.1", clock=1.3),
    ]
    results, stray = pp.judge([fault], {"f": _run_with(("f",))}, events)
    (r,) = results
    assert r.false_positives == 1 and r.missed == 0
    assert r.latency == pytest.approx(0.15)
    assert [e.queue for e in stray] == ["q.other"]


def test_recorder_sees_a_policy_on_the_running_broker(broker_factory) -> None:
    """The listener the benchmark relies on hears the isolation check from the real broker."""
    b: BrokerThread = broker_factory(pp.VHOST, period=str(int(pp.SLOW_CHECK * 1000)))
    rec = pp.Recorder()
    b.call(lambda: b.broker.api.register_plugin(rec, "rec"))
    stop = threading.Event()
    pub = pp.Publisher(b.port)
    pub.declare("pp.t")
    c = pp.Consumer(b.port, "pp.t", "stuck", stop, prefetch=2, stall_after=0)
    c.start()
    try:
        for i in range(3):
            pub.send("pp.t", b"%d" % i)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not rec.events:
            stop.wait(0.05)
    finally:
        stop.set()
        c.join(10)
        pub.close()
    # one consumer: the cap (0.6 x 1) spares it, and the spare is a policy action on its queue
    assert any(e.kind == "action" and e.queue == "pp.t" for e in rec.events)

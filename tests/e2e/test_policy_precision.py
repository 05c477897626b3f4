"""The policy precision matrix, small: healthy consumers untouched, every fault caught.

Runs a few scenarios of ``bench/policy_precision.py`` at once against a real broker with real
py-amqp and kombu clients, under the scaled recommended configuration, with the bounded-tries
scenarios of ``bench/precision_tries.py`` (tasks longer than ackTimeout on one, two and three
consumers, a poison message, a dead-letter queue under a Delete policy across a restart).
Asserts outcomes only (no false positive, no miss, no endless loop, no dead letter lost), never
a timing: detection latency is the benchmark's business.
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
from bench import precision_tries as ptries

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
    assert {r.scenario.name: r.note for r in faults if r.loops or r.lost} == {}
    got = _by_name(results)
    assert "isolated" in got["stalled consumer"].outcome
    assert "deleted" in got["slower than rate floor"].outcome
    assert got["stalled consumer"].latency is not None


def test_a_poison_message_is_dead_lettered_as_poison(matrix) -> None:
    r = _by_name(matrix[0])["poison message"]
    assert (r.missed, r.false_positives, r.loops, r.lost) == (0, 0, 0, 0), r.touched
    assert "poison" in r.outcome


def test_one_that_kills_at_once_is_bounded_by_the_delivery_limit(matrix) -> None:
    r = _by_name(matrix[0])["poison message that kills at once"]
    assert (r.missed, r.false_positives, r.loops, r.lost) == (0, 0, 0, 0), r.touched
    assert "delivery_limit" in r.outcome


@pytest.mark.parametrize("consumers", [1, 2, 3])
def test_a_task_longer_than_ack_timeout_runs_at_most_poison_deliveries_times(
    matrix, consumers
) -> None:
    """No touch, the default cap and poisonDeliveries: handed out at most three times across
    the consumers, then in the queue's DLQ with reason poison; no bystander touched."""
    r = _by_name(matrix[0])[ptries.tries_name(consumers)]
    assert (r.missed, r.false_positives, r.loops, r.lost) == (0, 0, 0, 0), (r.note, r.touched)
    assert "poison" in r.outcome
    # one consumer: the cap (floor(0.6 x 1) = 0) spares it and its hand-out counts each timeout
    assert ("isolated" in r.outcome) == (consumers > 1)


def test_a_dead_letter_queue_survives_a_delete_policy_and_a_restart(matrix) -> None:
    r = _by_name(matrix[0])["DLQ bound to a topic under a vhost Delete policy, across a restart"]
    assert (r.missed, r.false_positives, r.lost) == (0, 0, 0), (r.note, r.touched)
    assert "deleted" in r.outcome  # the control subscription was


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

"""Isolation as a pure function of a snapshot, on a hand-made clock: the seed's scheme."""

from __future__ import annotations

from plugbroker.plugins.isolation import evaluate
from plugbroker.plugins.isolation_config import IsolationConfig
from plugbroker.policy import (
    ConsumerView,
    CountTimeout,
    IsolateConsumer,
    QueueView,
    Snapshot,
    Spared,
)
from plugbroker.registry import Registry

CFG = IsolationConfig(ack_timeout=300.0)
#: isolation names no policy: a lookup with none registered
POLICIES = Registry().policy


def consumer(
    tag: str,
    *,
    unacked: int = 1,
    clock: float | None = 0.0,
    last_ack: float | None = None,
    first: float | None = 0.0,
    isolated: bool = False,
    timed_out: float | None = None,
) -> ConsumerView:
    """A consumer view; ``clock`` is its ack clock (``busy_since``), ``timed_out`` when the
    delivery it works on last counted a timed-out hand-out."""
    return ConsumerView(
        tag, "conn-" + tag, 1, unacked, last_ack, first, isolated, 10, False, clock, timed_out
    )


def queue(
    *consumers: ConsumerView, stype: str = "shared", cfg: IsolationConfig | None = CFG
) -> QueueView:
    return QueueView(
        "/",
        "work",
        True,
        False,
        False,
        stype,
        10,
        100,
        5,
        5,
        0.0,
        0,
        tuple(consumers),
        (),
        {"isolation": cfg} if cfg else {},
    )


def isolated_tags(actions) -> list[str]:
    return [a.consumer_tag for a in actions if isinstance(a, IsolateConsumer)]


def test_scheme_1_consumer_without_ack_past_the_timeout_is_isolated():
    q = queue(
        consumer("stuck", clock=0.0),
        consumer("ok1", clock=299.0),
        consumer("ok2", clock=200.0),
    )
    [a] = evaluate(Snapshot(301.0, (q,)), {}, POLICIES)
    assert isinstance(a, IsolateConsumer) and a.consumer_tag == "stuck"
    assert (a.threshold, a.configured, a.measured) == ("ackTimeout", 300.0, 301.0)


def test_scheme_1_the_clock_starts_when_the_consumer_first_holds_something():
    q = queue(consumer("new", clock=100.0, first=100.0), consumer("ok", clock=390.0))
    assert evaluate(Snapshot(399.0, (q,)), {}, POLICIES) == []
    assert isolated_tags(evaluate(Snapshot(401.0, (q,)), {}, POLICIES)) == ["new"]


def test_a_consumer_back_from_an_idle_spell_is_not_overdue():
    # last ack long ago, first delivery longer ago: it was idle, and took a message at 990
    back = consumer("back", clock=990.0, last_ack=0.0, first=0.0)
    q = queue(back, consumer("ok", clock=999.0))
    assert evaluate(Snapshot(1000.0, (q,)), {}, POLICIES) == []
    # still holding that message without settling anything past ackTimeout: now it is overdue
    [a] = evaluate(Snapshot(1291.0, (q,)), {}, POLICIES)
    assert isinstance(a, IsolateConsumer) and a.consumer_tag == "back"
    assert a.measured == 301.0


def test_the_clock_is_ignored_without_unacked_messages():
    q = queue(consumer("drained", unacked=0, clock=0.0), consumer("ok", clock=999.0))
    assert evaluate(Snapshot(1000.0, (q,)), {}, POLICIES) == []


def test_scheme_2_already_isolated_consumers_are_left_alone():
    q = queue(
        consumer("gone", isolated=True, unacked=0),
        consumer("ok", clock=400.0),
        consumer("ok2", clock=400.0),
    )
    assert evaluate(Snapshot(650.0, (q,)), {}, POLICIES) == []


def test_scheme_4_at_most_sixty_percent_are_isolated_and_the_cap_is_reported():
    two_stuck = queue(consumer("a", clock=0.0), consumer("b", clock=10.0))
    state: dict = {}
    actions = evaluate(Snapshot(1000.0, (two_stuck,)), state, POLICIES)
    assert isolated_tags(actions) == ["a"]  # floor(0.6 x 2) = 1, the longest silent first
    [spared] = [a for a in actions if isinstance(a, Spared)]
    assert "cap held" in spared.reason and "b" in spared.reason
    # the next check says it again (the core tells a run of repeats once), and does not count
    # b's timeout again: its hand-out counted at 1000
    again = queue(
        consumer("a", isolated=True, unacked=0), consumer("b", clock=10.0, timed_out=1000.0)
    )
    assert [type(a) for a in evaluate(Snapshot(1001.0, (again,)), state, POLICIES)] == [Spared]
    five = queue(*(consumer(f"c{i}", clock=0.0) for i in range(5)))
    assert (
        len(isolated_tags(evaluate(Snapshot(1000.0, (five,)), {}, POLICIES))) == 3
    )  # floor(0.6 x 5)


def test_the_ratio_is_configurable():
    cfg = IsolationConfig(ack_timeout=1.0, max_isolated_ratio=1.0)
    q = queue(consumer("a", clock=0.0), consumer("b", clock=0.0), cfg=cfg)
    assert isolated_tags(evaluate(Snapshot(10.0, (q,)), {}, POLICIES)) == ["a", "b"]


def test_consumer_with_nothing_unacked_is_never_isolated():
    q = queue(
        consumer("idle", unacked=0, clock=None, first=None),
        consumer("holding-nothing", unacked=1, clock=None),
        consumer("idle2", unacked=0, clock=0.0),
        consumer("ok", clock=999.0),
    )
    assert evaluate(Snapshot(1000.0, (q,)), {}, POLICIES) == []


def test_only_shared_queues_are_checked():
    for stype in ("key_shared", "exclusive", "failover"):
        q = queue(consumer("a", clock=0.0), consumer("b", clock=0.0), stype=stype)
        assert evaluate(Snapshot(1000.0, (q,)), {}, POLICIES) == []


def test_queues_without_isolation_are_ignored():
    q = queue(consumer("a", clock=0.0), consumer("b", clock=0.0), cfg=None)
    assert evaluate(Snapshot(1000.0, (q,)), {}, POLICIES) == []


def test_a_consumer_the_cap_spares_still_counts_its_timeout_against_the_message():
    # floor(0.6 x 2) = 1 is isolated already: the other overdue consumer is spared, but the
    # delivery it works on counts a timed-out hand-out all the same
    q = queue(
        consumer("isolated", unacked=0, clock=None, isolated=True),
        consumer("spared", clock=0.0),
    )
    assert evaluate(Snapshot(299.0, (q,)), {}, POLICIES) == []  # not over its timeout yet
    actions = evaluate(Snapshot(301.0, (q,)), {}, POLICIES)
    assert [type(a) for a in actions] == [Spared, CountTimeout]
    count = actions[1]
    assert (count.consumer_tag, count.connection_id, count.policy) == (
        "spared",
        "conn-spared",
        "Isolation",
    )
    assert (count.threshold, count.configured, count.measured) == ("ackTimeout", 300.0, 301.0)


def test_a_spared_consumer_counts_again_once_per_ack_timeout():
    state: dict = {}
    spared = [consumer("isolated", unacked=0, clock=None, isolated=True)]
    q = queue(*spared, consumer("s", clock=0.0, timed_out=301.0))
    # counted at 301: not again before 601
    assert not [
        a for a in evaluate(Snapshot(600.0, (q,)), state, POLICIES) if isinstance(a, CountTimeout)
    ]
    [again] = [
        a for a in evaluate(Snapshot(601.0, (q,)), state, POLICIES) if isinstance(a, CountTimeout)
    ]
    assert again.consumer_tag == "s"


def test_one_consumer_alone_is_never_isolated_but_its_timeouts_count():
    # floor(0.6 x 1) = 0: the only consumer is spared, and its delivery's timeouts count, so a
    # message that hangs it is dead-lettered after poisonDeliveries timeouts
    q = queue(consumer("only", clock=0.0))
    actions = evaluate(Snapshot(301.0, (q,)), {}, POLICIES)
    assert isolated_tags(actions) == []
    assert [type(a) for a in actions] == [Spared, CountTimeout]


def test_an_isolated_consumer_counts_through_its_isolation_not_a_separate_action():
    q = queue(consumer("a", clock=0.0), consumer("b", clock=250.0), consumer("c", clock=250.0))
    actions = evaluate(Snapshot(301.0, (q,)), {}, POLICIES)
    assert [type(a) for a in actions] == [IsolateConsumer]
    assert actions[0].configured == 300.0  # the core counts the timeout when it isolates

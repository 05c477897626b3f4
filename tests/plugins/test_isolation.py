"""Isolation as a pure function of a snapshot, on a hand-made clock: the seed's scheme."""

from __future__ import annotations

from plugbroker.plugins.isolation import evaluate
from plugbroker.plugins.isolation_config import IsolationConfig
from plugbroker.policy import (
    ConsumerView,
    DeadLetterPoison,
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
    poison: int = 0,
) -> ConsumerView:
    """A consumer view; ``clock`` is its ack clock (``busy_since``), ``poison`` its
    ``poison_suspects``."""
    return ConsumerView(
        tag, "conn-" + tag, 1, unacked, last_ack, first, isolated, 10, False, clock, poison
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


def test_scheme_4_at_most_sixty_percent_are_isolated_and_the_cap_is_reported_once():
    two_stuck = queue(consumer("a", clock=0.0), consumer("b", clock=10.0))
    state: dict = {}
    actions = evaluate(Snapshot(1000.0, (two_stuck,)), state, POLICIES)
    assert isolated_tags(actions) == ["a"]  # floor(0.6 x 2) = 1, the longest silent first
    [spared] = [a for a in actions if isinstance(a, Spared)]
    assert "cap held" in spared.reason and "b" in spared.reason
    # the next check does not repeat the cap line while nothing changed
    again = queue(consumer("a", isolated=True, unacked=0), consumer("b", clock=10.0))
    assert evaluate(Snapshot(1001.0, (again,)), state, POLICIES) == []
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


def test_an_overdue_consumer_holding_a_suspect_message_is_not_isolated_the_message_is_poison():
    q = queue(
        consumer("first", unacked=0, clock=None, isolated=True),
        consumer("second", unacked=0, clock=None, isolated=True),
        consumer("third", clock=0.0, poison=1),
        consumer("ok", clock=250.0),
    )
    # not yet over its ack timeout: nothing
    assert evaluate(Snapshot(299.0, (q,)), {}, POLICIES) == []
    [a] = evaluate(Snapshot(301.0, (q,)), {}, POLICIES)
    assert isinstance(a, DeadLetterPoison) and a.consumer_tag == "third"
    assert a.connection_id == "conn-third" and a.policy == "Isolation"
    assert (a.threshold, a.configured, a.measured) == ("ackTimeout", 300.0, 301.0)
    assert "poison" in a.reason and "2 other consumer(s)" in a.reason


def test_poison_is_outside_the_cap_and_other_overdue_consumers_are_still_isolated():
    # 0.6 x 3 = 1 may be isolated, and one is: an ordinary overdue consumer is spared, but the
    # poison holder still gets its message dead-lettered (nobody is isolated for it)
    q = queue(
        consumer("isolated", unacked=0, clock=None, isolated=True),
        consumer("holder", clock=0.0, poison=1),
        consumer("stuck", clock=0.0),
    )
    actions = evaluate(Snapshot(301.0, (q,)), {}, POLICIES)
    assert [type(a) for a in actions] == [DeadLetterPoison, Spared]
    assert actions[0].consumer_tag == "holder" and isolated_tags(actions) == []

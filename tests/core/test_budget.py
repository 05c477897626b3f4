"""The blast-radius budget: the window on its own, then where actions are applied (a manual
clock, no sockets)."""

from __future__ import annotations

import logging

import pytest

from plugbroker.app import Broker
from plugbroker.budget import Budget, Budgets, counts
from plugbroker.clock import ManualClock
from plugbroker.config import parse_config
from plugbroker.policy import (
    CancelConsumer,
    CloseConsumerChannels,
    DeleteQueue,
    LogOnly,
    ReleaseConsumer,
    SetPrefetch,
    Spared,
)


def test_actions_over_the_limit_are_refused_until_the_oldest_leaves_the_window() -> None:
    b = Budget(max_actions=2)
    assert b.check(0.0) is None
    b.record(0.0)
    assert b.check(10.0) is None
    b.record(10.0)
    why = b.check(59.9)
    assert why is not None and "maxActionsPerMinute 2" in why
    assert b.check(60.0) is None  # the action at 0 s is a minute old: out of the window
    b.record(60.0)
    assert b.check(69.9) is not None
    assert b.check(70.0) is None


def test_distinct_consumers_are_bounded_and_one_already_hit_is_not_counted_again() -> None:
    b = Budget(max_consumers=2)
    b.record(0.0, [("c1", "a")])
    b.record(1.0, [("c1", "b")])
    assert b.check(2.0, [("c1", "a")]) is None  # already affected in the window
    assert b.check(2.0, []) is None
    why = b.check(2.0, [("c2", "x")])
    assert why is not None and "maxConsumersAffected 2" in why
    # a minute on, c1/a left the window and there is room for one more, not for two
    assert b.check(60.5, [("c2", "x")]) is None
    assert b.check(60.5, [("c2", "x"), ("c2", "y")]) is not None
    assert b.check(61.0, [("c2", "x"), ("c2", "y")]) is None
    assert b.used == (0, 0)


def test_an_action_on_more_consumers_than_are_left_is_refused_whole() -> None:
    b = Budget(max_consumers=3)
    b.record(0.0, [("c", "a")])
    assert b.check(1.0, [("c", "b"), ("c", "c"), ("c", "d")]) is not None
    assert b.check(1.0, [("c", "b"), ("c", "c")]) is None


def test_what_counts() -> None:
    f = dict(vhost="/", queue="q", policy="P", reason="r")
    assert not counts(LogOnly(**f))
    assert not counts(Spared(**f))
    assert not counts(ReleaseConsumer(**f, consumer_tag="t"))
    for a in (
        SetPrefetch(**f, consumer_tag="t", prefetch=1),
        CancelConsumer(**f, consumer_tag="t"),
        CloseConsumerChannels(**f),
        DeleteQueue(**f),
    ):
        assert counts(a)


def test_budgets_per_vhost_keep_history_unless_the_limits_change() -> None:
    bs = Budgets()
    assert bs.get("/", None, None) is None
    one = bs.get("/", 2, None)
    assert one is not None
    one.record(0.0)
    assert bs.get("/", 2, None) is one
    assert bs.get("other", 2, None) is not one
    fresh = bs.get("/", 3, None)
    assert fresh is not one and fresh is not None and fresh.used == (0, 0)


CONFIG = """<broker><virtualhost name="/">
  <blastRadius maxActionsPerMinute="2"/>
</virtualhost><virtualhost name="free"/></broker>"""


@pytest.fixture
def broker() -> Broker:
    return Broker(parse_config(CONFIG), clock=ManualClock())


def delete(queue: str, vhost: str = "/") -> DeleteQueue:
    return DeleteQueue(vhost=vhost, queue=queue, policy="Delete", reason="messageCount 9 (limit 5)")


def test_the_third_action_in_a_minute_is_deferred_and_reported(broker, caplog) -> None:
    vh = broker.vhosts["/"]
    for name in ("a", "b", "c", "d"):
        vh.declare_queue(name)
    reported: list[tuple[str, str]] = []

    class Hooks:
        def __getattr__(self, name: str):
            if name == "policy_action":
                return lambda action, outcome: reported.append((action.queue, outcome))
            return getattr(broker.hooks, name)

    broker.hooks = Hooks()
    log_only = LogOnly(vhost="/", queue="a", policy="Log", reason="dry run")
    with caplog.at_level(logging.INFO, logger="plugbroker.policy"):
        outcomes = broker.apply_actions([log_only, delete("a"), delete("b"), delete("c")])
    assert outcomes == ["logged", "applied", "applied", "deferred"]
    assert "c" in vh.queues and "a" not in vh.queues and "b" not in vh.queues
    assert reported[-1] == ("c", "deferred")
    [line] = [r.getMessage() for r in caplog.records if "deferred" in r.getMessage()]
    assert "blast-radius budget of vhost '/'" in line and "maxActionsPerMinute 2" in line
    assert broker.api.policy_action_counts()[("Delete", "deferred")] == 1

    broker.clock.advance(30)
    assert broker.apply_actions([delete("c")]) == ["deferred"]
    broker.clock.advance(30)  # a minute after the first two
    assert broker.apply_actions([delete("c"), delete("d")]) == ["applied", "applied"]
    assert "c" not in vh.queues and "d" not in vh.queues


def test_stale_actions_use_no_budget_and_other_vhosts_are_unbounded(broker) -> None:
    broker.vhosts["/"].declare_queue("a")
    stale = SetPrefetch(
        vhost="/", queue="a", policy="P", reason="r", consumer_tag="nobody", prefetch=1
    )
    assert broker.apply_actions([stale, stale, stale]) == ["stale"] * 3
    assert broker.apply_actions([delete("gone")]) == ["stale"]
    free = broker.vhosts["free"]
    for name in ("x", "y", "z"):
        free.declare_queue(name)
    assert broker.apply_actions([delete(n, "free") for n in "xyz"]) == ["applied"] * 3


def test_each_policy_action_is_one_info_line(broker, caplog) -> None:
    vh = broker.vhosts["/"]
    for name in ("a", "b"):
        vh.declare_queue(name)
    log_only = LogOnly(vhost="/", queue="b", policy="Log", reason="dry run")
    with caplog.at_level(logging.DEBUG):
        assert broker.apply_actions([delete("a"), log_only]) == ["applied", "logged"]
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [(r.name, r.levelname) for r in lines] == [("plugbroker.policy", "INFO")] * 2, [
        r.getMessage() for r in lines
    ]
    assert "queue deleted" in lines[0].getMessage() and "[log only]" in lines[1].getMessage()

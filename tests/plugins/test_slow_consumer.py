"""The slow-consumer detection and policies as pure functions: no sockets, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from plugbroker.config import PolicyRef
from plugbroker.plugins.slow_consumer import delete_policy, evaluate, log_policy, measure
from plugbroker.plugins.slow_consumer_config import SlowConsumerConfig
from plugbroker.policy import (
    CloseConsumerChannels,
    ConsumerView,
    DeleteQueue,
    LogOnly,
    QueueView,
    Snapshot,
    Spared,
)

POLICIES = {"Delete": delete_policy, "Log": log_policy}


def cfg(
    policy: str = "Delete", options: dict[str, str] | None = None, **kw: Any
) -> SlowConsumerConfig:
    return SlowConsumerConfig(policy=PolicyRef(policy, options or {}), **kw)


def view(
    name: str = "q",
    *,
    count: int = 0,
    size: int = 0,
    ready: int | None = None,
    unacked: int | None = None,
    oldest: float | None = None,
    acks: int = 0,
    durable: bool = False,
    policy: SlowConsumerConfig | None = None,
    consumers: int = 1,
) -> QueueView:
    cs = tuple(
        ConsumerView(f"c{i}", "conn", 1, 0, None, None, False, 0, False) for i in range(consumers)
    )
    return QueueView(
        "/",
        name,
        durable,
        False,
        False,
        "shared",
        count,
        size,
        count if ready is None else ready,
        (count - (count if ready is None else ready)) if unacked is None else unacked,
        oldest,
        acks,
        cs,
        (),
        {"consumer": policy} if policy else {},
    )


def test_thresholds_absent_from_the_element_are_not_checked():
    q = view(count=10**6, size=10**9, oldest=0.0)
    assert measure(cfg(message_count=None), q, 10**6, None) == ()


@pytest.mark.parametrize(
    "kw,q,name",
    [
        ({"message_count": 50}, view(count=51), "messageCount"),
        ({"depth": 1024}, view(count=1, size=1025), "depth"),
        ({"message_age": 600.0}, view(count=1, oldest=0.0), "messageAge"),
    ],
)
def test_each_threshold_alone_triggers_just_above_its_limit(kw, q, name):
    [b] = measure(cfg(**kw), q, 600.5, None)
    assert b.threshold == name


def test_at_the_limit_is_not_over_it():
    assert measure(cfg(message_count=50), view(count=50), 0.0, None) == ()
    assert measure(cfg(depth=1024), view(count=3, size=1024), 0.0, None) == ()


def test_an_empty_queue_has_age_zero():
    assert measure(cfg(message_age=1.0), view(count=0, oldest=None), 10**6, None) == ()


def test_count_and_depth_together_as_in_the_seed():
    both = cfg(message_count=10, depth=1024)
    assert measure(both, view(count=10, size=10 * 100), 0.0, None) == ()  # ten small ones
    [b] = measure(both, view(count=10, size=10 * 200), 0.0, None)  # oversize total
    assert (b.threshold, b.configured, b.measured) == ("depth", 1024, 2000)
    assert [x.threshold for x in measure(both, view(count=11, size=5000), 0.0, None)] == [
        "depth",
        "messageCount",
    ]


def test_rate_is_judged_over_the_last_period_and_only_with_a_backlog():
    c = cfg(consumption_rate=100.0)
    # 500 acks in 10 s = 50/s < 100/s with messages waiting: slow
    [b] = measure(c, view(count=5, acks=1500), 20.0, (1000, 10.0))
    assert (b.threshold, b.measured) == ("consumptionRate", 50.0)
    assert measure(c, view(count=5, acks=3000), 20.0, (1000, 10.0)) == ()  # 200/s: fine
    assert measure(c, view(count=0, acks=1000), 20.0, (1000, 10.0)) == ()  # no backlog
    assert measure(c, view(count=5, acks=1000), 20.0, None) == ()  # first look: no rate yet


def test_the_backlog_is_ready_plus_unacked():
    c = cfg(consumption_rate=100.0)
    # the consumer's prefetch holds all five: nothing ready, five unacked, 1 ack/s
    held = view(count=5, ready=0, unacked=5, acks=1010)
    [b] = measure(c, held, 20.0, (1000, 10.0))
    assert (b.threshold, b.measured) == ("consumptionRate", 1.0)
    state: dict = {"rates": {("/", "q"): (1000, 10.0)}}
    held = view(count=5, ready=0, unacked=5, acks=1010, policy=c)
    actions = evaluate(Snapshot(20.0, (held,)), state, POLICIES.__getitem__)
    assert [type(a) for a in actions] == [CloseConsumerChannels, DeleteQueue]
    # nothing ready and nothing unacked: no backlog, never slow
    idle = view(count=0, ready=0, unacked=0, acks=1000, policy=c)
    state = {"rates": {("/", "q"): (1000, 10.0)}}
    assert evaluate(Snapshot(20.0, (idle,)), state, POLICIES.__getitem__) == []


def test_evaluate_keeps_rate_state_and_forgets_deleted_queues():
    c = cfg(consumption_rate=10.0)
    state: dict = {}
    snap1 = Snapshot(0.0, (view("a", count=5, policy=c), view("b", count=5, policy=c)))
    assert evaluate(snap1, state, POLICIES.__getitem__) == []
    snap2 = Snapshot(1.0, (view("a", count=5, acks=100, policy=c),))
    assert evaluate(snap2, state, POLICIES.__getitem__) == []
    assert set(state["rates"]) == {("/", "a")}
    snap3 = Snapshot(2.0, (view("a", count=5, acks=101, policy=c),))
    actions = evaluate(snap3, state, POLICIES.__getitem__)
    assert [type(a) for a in actions] == [CloseConsumerChannels, DeleteQueue]


def test_delete_closes_channels_with_506_then_deletes():
    q = view(count=51, policy=cfg(message_count=50))
    close, delete = evaluate(Snapshot(0.0, (q,)), {}, POLICIES.__getitem__)
    assert isinstance(close, CloseConsumerChannels) and isinstance(delete, DeleteQueue)
    assert (close.code, close.text) == (506, "Consuming too slow.")
    assert (close.threshold, close.configured, close.measured) == ("messageCount", 50, 51)


def test_durable_queue_is_spared_unless_delete_persistent():
    q = view(count=51, durable=True, policy=cfg(message_count=50))
    [spared] = evaluate(Snapshot(0.0, (q,)), {}, POLICIES.__getitem__)
    assert isinstance(spared, Spared) and "delete-persistent" in spared.reason
    q2 = view(
        count=51, durable=True, policy=cfg(message_count=50, options={"delete-persistent": "true"})
    )
    assert [type(a) for a in evaluate(Snapshot(0.0, (q2,)), {}, POLICIES.__getitem__)] == [
        CloseConsumerChannels,
        DeleteQueue,
    ]


def test_log_policy_only_records():
    q = view(count=51, policy=cfg("Log", message_count=50))
    [a] = evaluate(Snapshot(0.0, (q,)), {}, POLICIES.__getitem__)
    assert isinstance(a, LogOnly) and a.policy == "Log" and "messageCount 51" in a.reason


def test_queues_without_a_consumer_section_are_ignored():
    assert evaluate(Snapshot(0.0, (view(count=10**6),)), {}, POLICIES.__getitem__) == []

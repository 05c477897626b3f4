"""The Graduated policy as a pure function of snapshots and the job's state (a manual clock:
each snapshot carries its own time)."""

from __future__ import annotations

from typing import Any

import pytest

from plugbroker.config import PolicyRef
from plugbroker.plugins.slow_consumer import delete_policy, evaluate, graduated_policy, log_policy
from plugbroker.plugins.slow_consumer_config import SlowConsumerConfig
from plugbroker.policy import (
    DEFERRED,
    Action,
    CancelConsumer,
    CloseConsumerChannels,
    ConsumerView,
    DeleteQueue,
    LogOnly,
    QueueView,
    SetPrefetch,
    Snapshot,
    Spared,
)

POLICIES = {"Delete": delete_policy, "Log": log_policy, "Graduated": graduated_policy}


def cfg(**options: str) -> SlowConsumerConfig:
    return SlowConsumerConfig(message_count=5, policy=PolicyRef("Graduated", options))


def consumer(tag: str = "c1", prefetch: int = 8, unacked: int = 8, no_ack: bool = False):
    return ConsumerView(tag, "conn-1", 1, unacked, None, 0.0, False, prefetch, no_ack)


def view(
    count: int,
    *,
    name: str = "sub",
    durable: bool = False,
    consumers: tuple[ConsumerView, ...] = (),
    policy: SlowConsumerConfig | None = None,
) -> QueueView:
    return QueueView(
        "/",
        name,
        durable,
        False,
        False,
        "shared",
        count,
        count * 10,
        count,
        0,
        0.0 if count else None,
        0,
        consumers,
        (("amq.topic", "topic", "stocks.us.ibm"),),
        {"consumer": policy or cfg()},
    )


class Run:
    """Drives the slow-consumer job check after check, one second apart."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.now = 0.0

    def check(self, *queues: QueueView) -> list[Action]:
        self.now += 1.0
        return evaluate(Snapshot(self.now, queues), self.state, POLICIES.__getitem__)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_one_step_per_check_still_over_threshold() -> None:
    r = Run()
    c = consumer(prefetch=8)
    [log] = r.check(view(9, consumers=(c,)))
    assert isinstance(log, LogOnly) and "Graduated step 1 (log)" in log.reason
    assert log.threshold == "messageCount" and log.measured == 9
    [pf] = r.check(view(9, consumers=(c,)))
    assert isinstance(pf, SetPrefetch)
    assert (pf.consumer_tag, pf.connection_id, pf.prefetch) == ("c1", "conn-1", 4)
    [cancel] = r.check(view(9, consumers=(consumer(prefetch=4),)))
    assert isinstance(cancel, CancelConsumer) and cancel.consumer_tag == "c1"
    # kombu re-consumed on the same channel under a new tag: the queue is still too slow
    [close] = r.check(view(9, consumers=(consumer("c2", prefetch=4),)))
    assert isinstance(close, CloseConsumerChannels)
    assert (close.code, close.text) == (506, "Consuming too slow.")
    [delete] = r.check(view(9))
    assert isinstance(delete, DeleteQueue) and "step 5 (delete)" in delete.reason
    assert r.check() == []  # the queue is gone: its entry drops out
    assert r.state["named"]["Graduated"]["queues"] == {}


def test_each_consumer_gets_its_own_prefetch_halved_with_a_floor_of_one() -> None:
    r = Run()
    cs = (
        consumer("a", prefetch=3),
        consumer("b", prefetch=0, unacked=10),
        consumer("n", 0, 5, True),
    )
    r.check(view(9, consumers=cs))
    actions = r.check(view(9, consumers=cs))
    assert [(a.consumer_tag, a.prefetch) for a in actions] == [("a", 1), ("b", 5)]
    assert all(isinstance(a, SetPrefetch) for a in actions)  # no-ack "n" is not bounded by it


def test_a_step_with_nothing_to_act_on_is_passed_over_in_the_same_check() -> None:
    r = Run()
    at_one = (consumer(prefetch=1),)
    r.check(view(9, consumers=at_one))
    assert kinds(r.check(view(9, consumers=at_one))) == ["CancelConsumer"]
    r2 = Run()
    r2.check(view(9))  # no consumer at all: prefetch and cancel have nothing to act on, and
    # the close step waits for a consumer to come back, three checks by default, then deletes
    assert kinds(r2.check(view(9))) == ["LogOnly"]
    assert kinds(r2.check(view(9))) == ["LogOnly"]
    assert kinds(r2.check(view(9))) == ["DeleteQueue"]


def test_the_close_step_waits_for_a_consumer_to_come_back_then_506_then_delete() -> None:
    r = Run()
    c = (consumer(prefetch=8),)
    for _ in range(3):
        r.check(view(9, consumers=c))  # log, prefetch, cancel
    # the client does not subscribe again at once: the next check does not delete
    [wait] = r.check(view(9))
    assert isinstance(wait, LogOnly) and "waits for a consumer" in wait.reason
    assert "1 of 3" in wait.reason
    # it comes back: 506 at this check, the delete only at the next one
    assert kinds(r.check(view(9, consumers=(consumer(prefetch=4),)))) == ["CloseConsumerChannels"]
    assert kinds(r.check(view(9))) == ["DeleteQueue"]


def test_close_wait_sets_how_long_the_close_step_waits() -> None:
    r = Run()
    one = cfg(**{"close-wait": "1"})
    c = (consumer(prefetch=1),)
    r.check(view(9, consumers=c, policy=one))  # log
    assert kinds(r.check(view(9, consumers=c, policy=one))) == ["CancelConsumer"]
    [delete] = r.check(view(9, policy=one))
    assert isinstance(delete, DeleteQueue) and "no consumer came back in 1 checks" in delete.reason


def test_one_step_back_per_healthy_check() -> None:
    r = Run()
    c = (consumer(prefetch=8),)
    for _ in range(3):
        r.check(view(9, consumers=c))  # log, prefetch, cancel
    levels = r.state["named"]["Graduated"]["queues"]
    assert levels[("/", "sub")] == 3
    assert r.check(view(1, consumers=c)) == []  # healthy: back to 2, nothing undone
    assert levels[("/", "sub")] == 2
    assert kinds(r.check(view(9, consumers=c))) == ["CancelConsumer"]  # over again: step 3
    for expected in (2, 1):
        r.check(view(0, consumers=c))
        assert levels[("/", "sub")] == expected
    r.check(view(0, consumers=c))
    assert ("/", "sub") not in levels  # fully back: forgotten
    assert kinds(r.check(view(9, consumers=c))) == ["LogOnly"]


def test_max_step_caps_the_escalation_and_the_cap_repeats() -> None:
    r = Run()
    capped = cfg(**{"max-step": "cancel"})
    c = (consumer(prefetch=8),)
    seen = [kinds(r.check(view(9, consumers=c, policy=capped))) for _ in range(5)]
    assert seen == [
        ["LogOnly"],
        ["SetPrefetch"],
        ["CancelConsumer"],
        ["CancelConsumer"],
        ["CancelConsumer"],
    ]


def test_prefetch_divisor_option() -> None:
    r = Run()
    quarter = cfg(**{"prefetch-divisor": "4"})
    c = (consumer(prefetch=100),)
    r.check(view(9, consumers=c, policy=quarter))
    [pf] = r.check(view(9, consumers=c, policy=quarter))
    assert isinstance(pf, SetPrefetch) and pf.prefetch == 25


@pytest.mark.parametrize("delete_persistent", [None, "false"])
def test_a_durable_subscription_is_not_disconnected_without_delete_persistent(delete_persistent):
    r = Run()
    opts = {} if delete_persistent is None else {"delete-persistent": delete_persistent}
    c = (consumer(prefetch=2),)
    q = view(9, durable=True, consumers=c, policy=cfg(**opts))
    assert kinds(r.check(q)) == ["LogOnly"]
    assert kinds(r.check(q)) == ["SetPrefetch"]
    [spared] = r.check(view(9, durable=True, consumers=(consumer(prefetch=1),), policy=cfg(**opts)))
    assert isinstance(spared, Spared) and "delete-persistent is not true" in spared.reason


def test_a_durable_subscription_with_delete_persistent_goes_all_the_way() -> None:
    r = Run()
    q = view(9, durable=True, policy=cfg(**{"delete-persistent": "true"}))
    r.check(q)
    for _ in range(2):  # nobody to close: the close step waits (three checks by default)
        assert kinds(r.check(q)) == ["LogOnly"]
    assert kinds(r.check(q)) == ["DeleteQueue"]


def test_a_step_the_budget_deferred_is_asked_for_again_not_passed_over() -> None:
    r = Run()
    c = (consumer(prefetch=8),)
    r.check(view(9, consumers=c))  # log
    [pf] = r.check(view(9, consumers=c))
    r.state[DEFERRED] = [pf]  # what the housekeeping pool writes when the budget held it back
    [again] = r.check(view(9, consumers=c))
    assert isinstance(again, SetPrefetch) and again.prefetch == 4
    [cancel] = r.check(view(9, consumers=(consumer(prefetch=4),)))  # applied: on to step 3
    assert isinstance(cancel, CancelConsumer)


def test_a_deferred_first_step_leaves_no_entry_behind() -> None:
    r = Run()
    [log] = r.check(view(9))
    delete = DeleteQueue(vhost="/", queue="sub", policy="Graduated", reason="r")
    r.state[DEFERRED] = [delete]
    assert r.check(view(0)) == []
    assert r.state["named"]["Graduated"]["queues"] == {}
    assert isinstance(log, LogOnly)


def test_queues_are_escalated_separately() -> None:
    r = Run()
    a = view(9, name="a")
    b = view(9, name="b")
    r.check(a)
    r.check(a)  # a: the close step waits (nobody to close)
    [wait_a, log_b] = r.check(a, b)
    assert "waits for a consumer" in wait_a.reason and "step 1 (log)" in log_b.reason

"""Repeated spared or deferred decisions are told once when they start and once when they end
(the core's apply_actions with a job's Streaks; a manual clock, no sockets)."""

from __future__ import annotations

import logging

import pytest

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.config import parse_config
from plugbroker.policy import DeleteQueue, Spared
from plugbroker.streaks import Streaks

CONFIG = """<broker><virtualhost name="/"><blastRadius maxActionsPerMinute="1"/></virtualhost>
</broker>"""


@pytest.fixture
def broker() -> tuple[Broker, list[tuple[str, str, str]]]:
    b = Broker(parse_config(CONFIG), clock=ManualClock())
    reported: list[tuple[str, str, str]] = []
    inner = b.hooks

    class Hooks:
        def __getattr__(self, name: str):
            if name == "policy_action":
                return lambda action, outcome: reported.append(
                    (action.queue, outcome, action.reason)
                )
            return getattr(inner, name)

    b.hooks = Hooks()
    return b, reported


def spared(queue: str) -> Spared:
    return Spared(vhost="/", queue=queue, policy="Delete", reason="durable queue kept")


def test_a_spared_decision_made_at_every_check_is_told_at_its_start_and_end(broker, caplog) -> None:
    b, reported = broker
    b.vhosts["/"].declare_queue("sub", durable=True)
    streaks = Streaks()
    with caplog.at_level(logging.INFO, logger="plugbroker.policy"):
        for _ in range(5):
            assert b.apply_actions([spared("sub")], streaks) == ["spared"]
        assert b.apply_actions([], streaks) == []  # the check no longer spares it
    lines = [r.getMessage() for r in caplog.records if "sub" in r.getMessage()]
    assert len(lines) == 2
    assert "spared: durable queue kept" in lines[0]
    assert "no longer spared after 5 check(s) in a row" in lines[1]
    assert [(q, o) for q, o, _ in reported] == [("sub", "spared"), ("sub", "spared-ended")]
    assert reported[-1][2].startswith("5 check(s) in a row")
    assert b.api.policy_action_counts()[("Delete", "spared")] == 5  # the metrics count all
    # without a job's streaks (another applier) each one is told
    with caplog.at_level(logging.INFO, logger="plugbroker.policy"):
        b.apply_actions([spared("sub")])
        b.apply_actions([spared("sub")])
    assert [o for _, o, _ in reported].count("spared") == 3


def test_a_repeated_deferral_is_told_once_and_a_dead_letter_target_is_spared(broker) -> None:
    b, reported = broker
    vh = b.vhosts["/"]
    for name in ("a", "b"):
        vh.declare_queue(name)
    dlq, _ = vh.declare_queue("dlq", durable=True)
    vh.mark_dead_letter_target(dlq)
    streaks = Streaks()
    delete = [DeleteQueue(vhost="/", queue=n, policy="Delete", reason="r") for n in "ab"]
    assert b.apply_actions(delete, streaks) == ["applied", "deferred"]  # one a minute
    for _ in range(3):
        assert b.apply_actions(delete[1:], streaks) == ["deferred"]
    # the dead-letter target is never deleted: spared, whatever the budget says
    protect = DeleteQueue(vhost="/", queue="dlq", policy="Delete", reason="r")
    assert b.apply_actions([protect], streaks) == ["spared"]
    assert "dlq" in vh.queues
    outcomes = [(q, o) for q, o, _ in reported]
    assert outcomes == [
        ("a", "applied"),
        ("b", "deferred"),
        ("dlq", "spared"),
        ("b", "deferred-ended"),  # that check did not defer it again
    ]

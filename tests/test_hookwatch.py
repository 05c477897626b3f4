"""The hook watchdog's bookkeeping with a hand-driven timer: calls over the budget are counted
per plugin and hook, the longest is kept, and the log line comes once a minute at most."""

from __future__ import annotations

import logging

import pytest

from plugbroker.hookwatch import LOG_EVERY, HookWatch


def test_slow_calls_are_counted_and_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    watch = HookWatch(0.1, timer=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="broker.plugins")

    def call(plugin: str, hook: str, took: float) -> None:
        t0 = watch.enter(plugin, hook)
        assert watch.current == (plugin, hook, t0)
        now[0] += took
        watch.leave(plugin, hook, t0)
        assert watch.current is None

    call("p", "broker_message_published", 0.05)  # within the budget
    assert watch.slow_calls == {}
    call("p", "broker_message_published", 2.0)
    call("p", "broker_message_published", 0.5)
    call("q", "broker_delivery_limit", 0.2)
    assert watch.slow_calls == {
        ("p", "broker_message_published"): 2,
        ("q", "broker_delivery_limit"): 1,
    }
    assert watch.slowest[("p", "broker_message_published")] == 2.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # one per plugin and hook within the minute
    assert (
        "plugin 'p': its broker_message_published hook held the event loop for 2.000 s" in lines[0]
    )
    now[0] += LOG_EVERY
    call("p", "broker_message_published", 0.3)
    assert "(2 such call(s) since the last line, 3 in all)" in caplog.records[-1].getMessage()


def test_a_zero_budget_watches_nothing() -> None:
    now = [0.0]
    watch = HookWatch(0.0, timer=lambda: now[0])
    t0 = watch.enter("p", "h")
    now[0] += 10
    watch.leave("p", "h", t0)
    assert watch.slow_calls == {}

"""Plugins contained on a live broker: a decision hook that raises gives the default decision
(no connection is closed), and a hook that holds the event loop is named in the log while it
holds it, then logged and counted in /metrics with its plugin and hook."""

from __future__ import annotations

import base64
import logging
import sys
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from brokerutil import ADMIN_GUEST

from plugbroker.hookimpl import hookimpl

pytestmark = pytest.mark.e2e

PLUGIN = "<plugins><plugin>watched_plugin</plugin></plugins>"


@pytest.fixture
def plugin_module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType("watched_plugin")
    sys.modules[mod.__name__] = mod
    try:
        yield mod
    finally:
        sys.modules.pop(mod.__name__, None)


def wait_for(pred: Any, timeout: float) -> Any:
    """Poll ``pred`` until it gives something true (AssertionError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not (got := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.1f} s")
        pause.wait(0.02)
    return got


def connect(b: Any, **kw: Any) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest", **kw)
    conn.connect()
    return conn


def metrics(b: Any) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{b.running.admin.port}/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


def test_raising_decision_hooks_give_the_default_decision(
    broker_factory: Any, plugin_module: types.ModuleType
) -> None:
    @hookimpl
    def broker_delivery_limit(vhost: str, queue: str) -> int | None:
        raise RuntimeError("delivery limit is broken")

    @hookimpl
    def broker_reject_decision(queue: str) -> Any:
        raise RuntimeError("reject decision is broken")

    plugin_module.broker_delivery_limit = broker_delivery_limit  # type: ignore[attr-defined]
    plugin_module.broker_reject_decision = broker_reject_decision  # type: ignore[attr-defined]
    b = broker_factory(plugins=PLUGIN, admin=True, users=ADMIN_GUEST)
    conn = connect(b, confirm_publish=True)
    try:
        ch = conn.channel()
        for i in range(3):  # each declare resolves the queue's policy: no 541
            ch.queue_declare(f"q{i}")
        ch.basic_publish(amqp.Message(b"m"), "", "q0", timeout=5)
        got = ch.basic_get("q0")
        assert got is not None
        ch.basic_reject(got.delivery_tag, requeue=True)  # the default: requeued
        again = wait_for(lambda: ch.basic_get("q0", no_ack=True), timeout=5)
        assert again.body == b"m" and again.delivery_info["redelivered"]
        assert conn.connected
    finally:
        conn.close()
    fails = b.call(lambda: dict(b.broker.api.failures().hook_failures))
    assert fails[("watched_plugin", "broker_delivery_limit")] >= 3
    assert fails[("watched_plugin", "broker_reject_decision")] == 1
    assert (
        'plugbroker_hook_failures_total{plugin="watched_plugin",hook="broker_reject_decision"} 1\n'
        in metrics(b)
    )


def test_a_hook_that_holds_the_loop_is_named_and_counted(
    broker_factory: Any, plugin_module: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    entered = threading.Event()

    @hookimpl
    def broker_message_published(queues: list[str]) -> None:
        if "slow" in queues:
            entered.set()
            release.wait(30)  # holds the loop until the test has seen the watchdog's line

    plugin_module.broker_message_published = broker_message_published  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING, logger="broker.plugins")
    b = broker_factory(
        plugins=PLUGIN,
        admin=True,
        users=ADMIN_GUEST,
        limits="<limits><hookBudget>50ms</hookBudget></limits>",
    )
    conn = connect(b)
    try:
        ch = conn.channel()
        ch.queue_declare("slow")
        ch.basic_publish(amqp.Message(b"m"), "", "slow")
        assert entered.wait(10)

        def watchdog_line() -> bool:
            return any(
                "has held the event loop" in r.getMessage()
                and "'watched_plugin'" in r.getMessage()
                and "broker_message_published" in r.getMessage()
                for r in caplog.records
            )

        try:
            wait_for(watchdog_line, timeout=10)  # logged while the hook still runs
        finally:
            release.set()
        line = 'plugbroker_hook_slow_calls_total{plugin="watched_plugin",hook="broker_message_published"} 1\n'
        wait_for(lambda: line in metrics(b), timeout=10)
        assert any(
            "held the event loop for" in r.getMessage() and "so far" not in r.getMessage()
            for r in caplog.records
        )
        assert ch.queue_declare("slow", passive=True)[1] == 1  # the publish itself went through
    finally:
        release.set()
        conn.close()

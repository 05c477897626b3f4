"""``broker_alarm_changed`` on a live broker: a plugin hears every resource alarm (memory, disk,
store) raised and cleared, once per change; one that raises does not stop the alarm."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import amqp
import pytest
from brokerutil import drain_until

from plugbroker.hookimpl import hookimpl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PLUGIN = "<plugins><plugin>alarm_hook_plugin</plugin></plugins>"


@pytest.fixture
def seen() -> Iterator[list[tuple[str, bool, str]]]:
    events: list[tuple[str, bool, str]] = []
    mod = types.ModuleType("alarm_hook_plugin")

    @hookimpl
    def broker_alarm_changed(name: str, raised: bool, detail: str) -> None:
        events.append((name, raised, detail))
        if name == "memory":
            raise RuntimeError("this plugin's alarm handler is broken")

    mod.broker_alarm_changed = broker_alarm_changed  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        yield events
    finally:
        sys.modules.pop(mod.__name__, None)


def _connect(b: Any, **kw: Any) -> amqp.Connection:
    c = amqp.Connection(
        f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5, **kw
    )
    c.connect()
    return c


def test_alarm_changes_reach_a_plugin(broker_factory: Any, seen: list[Any]) -> None:
    b = broker_factory(
        store=True,
        plugins=PLUGIN,
        limits="<limits><diskFreeLimit>100MB</diskFreeLimit></limits>",
    )
    free = {"bytes": 10 * 1024**3}

    def statvfs(path: str) -> Any:
        return SimpleNamespace(f_bavail=free["bytes"] // 4096, f_frsize=4096)

    b.call(lambda: setattr(b.broker.monitor, "statvfs", statvfs))
    # the memory alarm is raised and cleared by hand below: the monitor's own memory check
    # (every 100 ms) must not clear it in between
    b.call(lambda: setattr(b.broker.monitor, "high_watermark", None))
    blocked: list[Any] = []
    pub = _connect(
        b,
        confirm_publish=True,
        on_blocked=lambda reason: blocked.append(1),
        on_unblocked=lambda: blocked.append(0),
    )
    try:
        ch = pub.channel()
        ch.queue_declare("bystander", durable=True, auto_delete=False)
        ch.basic_publish(amqp.Message("before", delivery_mode=2), "", "bystander", timeout=5)
        # the disk alarm, from the monitor's own check on the store's filesystem
        free["bytes"] = 10 * 1024**2
        drain_until(pub, lambda: blocked == [1], timeout=5)
        assert len(seen) == 1 and seen[0][:2] == ("disk", True) and seen[0][2]
        # raising it again with another detail is no change
        b.call(lambda: b.broker.raise_alarm("disk", "another figure"))
        # the memory alarm (its handler raises: contained) and the store's, then all clear
        b.call(lambda: b.broker.raise_alarm("memory", "used 9 of 8 bytes"))
        b.call(lambda: b.broker.set_alarm("store: disk I/O error"))
        b.call(lambda: b.broker.clear_alarm("memory", "below the low watermark"))
        b.call(lambda: b.broker.set_alarm(None))
        free["bytes"] = 10 * 1024**3
        drain_until(pub, lambda: blocked == [1, 0], timeout=5)
        assert seen[1:] == [
            ("memory", True, "used 9 of 8 bytes"),
            ("store", True, "store: disk I/O error"),
            ("memory", False, "below the low watermark"),
            ("store", False, "store writes succeed again"),
            seen[-1],
        ]
        assert seen[-1][:2] == ("disk", False)
        failures = b.call(lambda: dict(b.broker.api.failures().hook_failures))
        assert failures == {("alarm_hook_plugin", "broker_alarm_changed"): 2}
        # the publisher goes on, confirmed
        for i in range(5):
            ch.basic_publish(amqp.Message(f"after{i}", delivery_mode=2), "", "bystander", timeout=5)
        _, count, _ = ch.queue_declare("bystander", passive=True)
        assert count == 6
    finally:
        deadline = time.monotonic() + 1
        for name in b.call(lambda: list(b.broker.alarms)):  # a failed test leaves none up
            if time.monotonic() < deadline:
                b.call(lambda n=name: b.broker.clear_alarm(n))
        pub.close()

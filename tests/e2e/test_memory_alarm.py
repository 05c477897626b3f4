"""The memory alarm watches what the process holds: headers count, the resident size (an
injected reading here: a test broker shares pytest's process) raises and clears it, and it
blocks the heaviest virtual hosts first, so a tenant in another vhost keeps publishing."""

from __future__ import annotations

import time
from typing import Any

import amqp
import pytest
from brokerutil import close_all, drain_for, drain_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

KB = 1024
MB = 1024 * 1024


def _amqp(b: Any, vhost: str = "/", **kw: Any) -> amqp.Connection:
    c = amqp.Connection(
        f"127.0.0.1:{b.port}",
        userid="guest",
        password="guest",
        virtual_host=vhost,
        connect_timeout=5,
        **kw,
    )
    c.connect()
    return c


def _wait(b: Any, pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not b.call(lambda: pred(b.broker)):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _close(b: Any, *conns: Any) -> None:
    close_all(*conns, broker=b)


class Bystander:
    """A connection in its own vhost publishing persistent messages with confirms; it notes
    whether it was ever told connection.blocked and its worst wait for a confirm."""

    def __init__(self, b: Any, vhost: str, queue: str) -> None:
        self.blocked: list[Any] = []
        self.conn = _amqp(
            b, vhost, confirm_publish=True, on_blocked=lambda _r: self.blocked.append(1)
        )
        self.ch = self.conn.channel()
        self.queue = queue
        self.ch.queue_declare(queue, auto_delete=False)
        self.sent = 0
        self.worst = 0.0

    def publish(self, n: int = 3) -> None:
        for _ in range(n):
            t = time.perf_counter()
            self.ch.basic_publish(
                amqp.Message(f"b{self.sent}", delivery_mode=2), routing_key=self.queue, timeout=10
            )
            self.worst = max(self.worst, time.perf_counter() - t)
            self.sent += 1

    def check(self) -> None:
        assert self.ch.queue_declare(self.queue, passive=True).message_count == self.sent
        assert self.blocked == []


def test_a_header_heavy_flood_raises_the_alarm_and_a_tenant_elsewhere_publishes_on(
    broker_factory: Any,
) -> None:
    b = broker_factory(limits="<limits><memoryHighWatermark>4MB</memoryHighWatermark></limits>")
    events: list[int] = []
    flooder = _amqp(
        b,
        "other",
        on_blocked=lambda reason: events.append(1),
        on_unblocked=lambda: events.append(0),
    )
    bystander = Bystander(b, "/", "bystander-q")
    purger = _amqp(b, "other")
    try:
        ch = flooder.channel()
        ch.queue_declare("flood", auto_delete=False)
        headers = {"h": "x" * (100 * KB)}
        sent = 0
        # transient messages of one byte whose headers hold 100 KB: 80 of them are twice
        # the watermark, counted only if headers count
        for _ in range(80):
            ch.basic_publish(amqp.Message(b"1", application_headers=headers), routing_key="flood")
            sent += 1
            bystander.publish(1)
            drain_for(flooder, 0.01)
            if events:
                break
        drain_until(flooder, lambda: events == [1])
        alarms = b.call(lambda: b.broker.api.alarms())
        assert [a.name for a in alarms] == ["memory"] and "'other'" in alarms[0].detail
        # the flooder is blocked; the bystander's vhost is not
        _wait(b, lambda br: [c.blocked for c in br.connections.values()].count(True) == 1)
        bystander.publish(10)
        bystander.check()
        # a purge in the flooder's vhost (not a publish: not blocked) gives the memory back
        pch = purger.channel()
        assert pch.queue_purge("flood") >= 1
        drain_until(flooder, lambda: events == [1, 0], timeout=10)
        assert b.call(lambda: b.broker.monitor.memory_used()) < 1 * MB
        bystander.publish(3)
        bystander.check()
        print(f"bystander's worst wait for a confirm: {bystander.worst * 1000:.1f} ms")
    finally:
        _close(b, flooder, bystander.conn, purger)


def _fake_rss(b: Any, size: dict[str, int]) -> None:
    b.call(lambda: setattr(b.broker.monitor, "read_rss", lambda: size["rss"]))


def test_the_resident_size_raises_and_clears_the_alarm(broker_factory: Any) -> None:
    b = broker_factory(limits="<limits><memoryHighWatermark>100MB</memoryHighWatermark></limits>")
    size = {"rss": 50 * MB}
    _fake_rss(b, size)
    events: list[Any] = []
    pub = _amqp(b, on_blocked=lambda _r: events.append(1), on_unblocked=lambda: events.append(0))
    try:
        ch = pub.channel()
        ch.queue_declare("q", auto_delete=False)
        ch.basic_publish(amqp.Message("before"), routing_key="q")
        drain_for(pub, 0.2)
        assert events == [] and b.call(lambda: b.broker.api.alarms()) == []
        # what the accounting knows is tiny; the process holds more than the watermark: the
        # alarm goes on, and blocks everyone (nobody is heavier than the rest)
        size["rss"] = 120 * MB
        drain_until(pub, lambda: events == [1])
        assert b.call(lambda: b.broker.memory_scope) is None
        assert b.call(lambda: b.broker.api.resources().memory_used) == 120 * MB
        size["rss"] = 95 * MB  # above the low watermark (90 MB): still raised
        drain_for(pub, 0.3)
        assert events == [1]
        size["rss"] = 80 * MB
        drain_until(pub, lambda: events == [1, 0])
    finally:
        _close(b, pub)


def test_the_alarm_blocks_the_heaviest_vhost_then_everyone(broker_factory: Any) -> None:
    b = broker_factory(limits="<limits><memoryHighWatermark>100MB</memoryHighWatermark></limits>")
    size = {"rss": 50 * MB}
    _fake_rss(b, size)
    heavy_events: list[Any] = []
    heavy = _amqp(b, "other", on_blocked=lambda _r: heavy_events.append(1))
    bystander = Bystander(b, "/", "light-q")
    try:
        ch = heavy.channel()
        ch.queue_declare("big", auto_delete=False)
        for _ in range(12):  # 12 MB held in 'other': more than a tenth of the watermark
            ch.basic_publish(amqp.Message(b"x" * MB), routing_key="big")
        _wait(b, lambda br: br.vhosts["other"].queues["big"].message_count == 12)
        size["rss"] = 105 * MB
        drain_until(heavy, lambda: heavy_events == [1])
        assert b.call(lambda: b.broker.memory_scope) == frozenset({"other"})
        # a new queue in the heavy vhost is the connection's last method read
        declarer = _amqp(b, "other")
        dch = declarer.channel()
        _wait(b, lambda br: sum(c.blocked for c in br.connections.values()) == 1)
        dch.queue_declare("one-more", auto_delete=False)
        _wait(b, lambda br: sum(c.blocked for c in br.connections.values()) == 2)
        bystander.publish(5)
        bystander.check()
        # the process goes on growing: everyone is blocked
        size["rss"] = 112 * MB
        drain_until(bystander.conn, lambda: bystander.blocked == [1])
        assert b.call(lambda: b.broker.memory_scope) is None
        size["rss"] = 60 * MB
        _wait(b, lambda br: not br.alarms and not any(c.blocked for c in br.connections.values()))
        bystander.blocked.clear()
        bystander.publish(2)
        bystander.check()
        declarer.close()
    finally:
        _close(b, heavy, bystander.conn)

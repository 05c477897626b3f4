"""Resource alarms and flow control with real clients: the memory alarm (``memoryHighWatermark``),
the disk alarm (``diskFreeLimit``), a client that does not read its socket, partial bodies
(``partialBodyBudget``, ``bodyStallTimeout``)."""

from __future__ import annotations

import logging
import socket
import time
from types import SimpleNamespace
from typing import Any

import amqp
import kombu
import pika
import pytest
from brokerutil import close_all, drain_for, drain_until
from rawclient import (
    RawClient,
    body_frame,
    header_frame,
    method_frame,
    publish_frames,
)

from plugbroker.admin_metrics import prometheus_text
from plugbroker.server import WRITE_HIGH_WATER

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

KB = 1024


def _amqp(b: Any, **kw: Any) -> amqp.Connection:
    c = amqp.Connection(
        f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5, **kw
    )
    c.connect()
    return c


_close = close_all


def _wait(b: Any, pred: Any, timeout: float = 5.0) -> None:
    """Until ``pred(broker)`` holds on the broker's loop (bounded in time and count)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.02) + 1):
        if b.call(lambda: pred(b.broker)):
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


class Bystander:
    """Another connection publishing persistent messages with confirms."""

    def __init__(self, b: Any, queue: str) -> None:
        self.conn = _amqp(b, confirm_publish=True)
        self.ch = self.conn.channel()
        self.queue = queue
        self.ch.queue_declare(queue, auto_delete=False)
        self.sent = 0

    def publish(self, n: int = 5) -> None:
        for _ in range(n):
            self.ch.basic_publish(
                amqp.Message(f"b{self.sent}", delivery_mode=2), routing_key=self.queue
            )
            self.sent += 1

    def check(self) -> None:
        assert self.ch.queue_declare(self.queue, passive=True).message_count == self.sent


def test_memory_alarm_blocks_a_flooding_publisher_and_a_consumer_drains_it(broker_factory, caplog):
    caplog.set_level(logging.WARNING, logger="broker")
    b = broker_factory(limits="<limits><memoryHighWatermark>2MB</memoryHighWatermark></limits>")
    events: list[Any] = []
    pub = _amqp(
        b, on_blocked=lambda reason: events.append(1), on_unblocked=lambda: events.append(0)
    )
    consumer = _amqp(b)
    try:
        ch = pub.channel()
        ch.queue_declare("flood", auto_delete=False)
        cch = consumer.channel()  # this connection never publishes: it is never blocked
        cch.queue_declare("other", auto_delete=False)
        ch.basic_publish(amqp.Message("for the bystander"), routing_key="other")
        body = b"x" * (64 * KB)
        sent = 0
        # publish until the broker says it is blocked (bounded: 4 MB is twice the watermark)
        for _ in range(64):
            ch.basic_publish(amqp.Message(body), routing_key="flood")
            sent += 1
            drain_for(pub, 0.02)
            if events:
                break
        drain_until(pub, lambda: events == [1])
        alarms = b.call(lambda: b.broker.api.alarms())
        assert [a.name for a in alarms] == ["memory"] and "above the high watermark" in (
            alarms[0].detail
        )
        # blocked: what the publisher sends now is not read
        for _ in range(5):
            ch.basic_publish(amqp.Message(body), routing_key="flood")
            sent += 1
        time.sleep(0.3)
        held = cch.queue_declare("flood", passive=True).message_count
        assert held < sent
        conns = b.call(lambda: b.broker.api.connections())
        assert sum(c.blocked for c in conns) == 1
        metrics = b.call(lambda: prometheus_text(b.broker.api))
        assert 'plugbroker_alarm{alarm="memory"} 1' in metrics
        assert "plugbroker_connections_blocked 1" in metrics
        # a consumer on another connection is served meanwhile, and drains the flood
        got: list[Any] = []
        cch.basic_consume("other", callback=got.append, no_ack=True)
        drain_until(consumer, lambda: len(got) == 1)
        cch.basic_consume("flood", callback=got.append, no_ack=True)
        drain_until(pub, lambda: events == [1, 0], timeout=10)
        drain_until(consumer, lambda: len(got) == 1 + sent, timeout=10)
        assert b.call(lambda: b.broker.api.alarms()) == []
    finally:
        _close(pub, consumer, broker=b)
    raised = [r for r in caplog.records if "resource alarm raised: memory" in r.getMessage()]
    cleared = [r for r in caplog.records if "resource alarm cleared: memory" in r.getMessage()]
    assert len(raised) == 1 and len(cleared) == 1


def test_disk_alarm_from_the_store_filesystem_blocks_and_clears(broker_factory):
    b = broker_factory(store=True, limits="<limits><diskFreeLimit>100MB</diskFreeLimit></limits>")
    free = {"bytes": 10 * 1024**3}

    def statvfs(path: str) -> Any:
        return SimpleNamespace(f_bavail=free["bytes"] // 4096, f_frsize=4096)

    b.call(lambda: setattr(b.broker.monitor, "statvfs", statvfs))
    params = pika.ConnectionParameters(
        host="127.0.0.1", port=b.port, credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    bystander = None
    try:
        seen: list[Any] = []
        conn.add_on_connection_blocked_callback(lambda c, f: seen.append(f.method.reason))
        conn.add_on_connection_unblocked_callback(lambda c, f: seen.append(None))
        ch = conn.channel()
        ch.queue_declare("disk-q", durable=True)
        ch.basic_publish("", "disk-q", b"before")
        free["bytes"] = 10 * 1024**2  # 10 MB left: below the limit
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert seen == ["low on disk"]
        assert b.call(lambda: b.broker.api.resources().disk_free) == 10 * 1024**2
        ch.basic_publish("", "disk-q", b"during")
        conn.process_data_events(time_limit=0.3)
        # a consumer elsewhere is served, and sees only what came before the alarm
        bystander = _amqp(b)
        bch = bystander.channel()
        assert bch.queue_declare("disk-q", passive=True).message_count == 1
        free["bytes"] = 10 * 1024**3
        while len(seen) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert seen == ["low on disk", None]
        drain_until(bystander, lambda: bch.queue_declare("disk-q", passive=True).message_count == 2)
    finally:
        _close(conn)
        if bystander is not None:
            _close(bystander)


def test_a_disk_free_limit_above_the_free_space_blocks_from_the_start_kombu(broker_factory):
    b = broker_factory(
        store=True, limits="<limits><diskFreeLimit>1000000GB</diskFreeLimit></limits>"
    )
    _wait(b, lambda br: "disk" in br.alarms)
    events: list[Any] = []
    conn = kombu.Connection(
        f"amqp://guest:guest@127.0.0.1:{b.port}//",
        transport_options={
            "on_blocked": lambda reason: events.append(1),
            "on_unblocked": lambda: events.append(None),
        },
    )
    try:
        conn.connect()
        deadline = time.monotonic() + 3
        while not events and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.1)
            except TimeoutError:
                pass
        assert events == [1]
        assert b.call(lambda: b.broker.api.alarm) == "low on disk"
        b.call(lambda: b.broker.clear_alarm("disk"))
        b.call(lambda: setattr(b.broker.monitor, "disk_free_limit", 0))
        drain_until(conn, lambda: events == [1, None])
    finally:
        conn.release()


def test_memory_and_disk_alarms_are_raised_and_cleared_independently(broker_factory):
    b = broker_factory()
    events: list[Any] = []
    pub = _amqp(
        b, on_blocked=lambda reason: events.append(1), on_unblocked=lambda: events.append(0)
    )
    try:
        b.call(lambda: b.broker.raise_alarm("memory", "test"))
        b.call(lambda: b.broker.raise_alarm("disk", "test"))
        assert b.call(lambda: b.broker.api.alarm) == "low on memory & disk"
        b.call(lambda: b.broker.clear_alarm("memory"))
        assert b.call(lambda: b.broker.api.alarm) == "low on disk"
        drain_for(pub, 0.2)
        assert events == [1]  # still blocked: no unblocked yet
        b.call(lambda: b.broker.set_alarm("store: disk I/O error"))
        b.call(lambda: b.broker.clear_alarm("disk"))
        drain_for(pub, 0.2)
        assert events == [1]
        b.call(lambda: b.broker.set_alarm(None))
        drain_until(pub, lambda: events == [1, 0])
    finally:
        _close(pub, broker=b)


def test_a_client_that_does_not_read_its_socket_has_bounded_output(broker_factory, caplog):
    caplog.set_level(logging.WARNING, logger="broker")
    b = broker_factory()
    bystander = Bystander(b, "bystander-q")
    raw = RawClient(b.port)
    try:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KB)
        raw.handshake()
        # every mandatory publish to nowhere comes back as a basic.return with its body, which
        # this client never reads
        frames = publish_frames(1, "", "nowhere", b"r" * (256 * KB), mandatory=True)
        raw.sock.settimeout(0.2)
        sent = 0
        stalled = False
        for _ in range(200):  # at most 50 MB
            try:
                raw.sock.sendall(frames)
            except TimeoutError:
                stalled = True
                break
            sent += len(frames)
            if sent % (2 * 1024 * 1024) == 0:
                bystander.publish(1)
        assert stalled, "the broker kept reading from a client that does not read"
        _wait(b, lambda br: any(c.output_paused for c in br.api.connections()))
        unsent = b.call(lambda: max(c.unsent_bytes for c in b.broker.api.connections()))
        assert unsent <= 2 * WRITE_HIGH_WATER
        bystander.publish(20)
        bystander.check()
    finally:
        raw.close()
        _close(bystander.conn)
    lines = [r for r in caplog.records if "is not reading its socket" in r.getMessage()]
    assert len(lines) == 1


def test_a_connection_stalled_mid_body_is_closed_and_its_memory_returned(broker_factory):
    b = broker_factory(
        limits="<limits><bodyStallTimeout>300ms</bodyStallTimeout></limits>",
    )
    bystander = Bystander(b, "bystander-stall")
    raws = [RawClient(b.port) for _ in range(3)]
    try:
        for raw in raws:
            raw.handshake()
            raw.send(method_frame(1, "basic.publish", 0, "", "nowhere", False, False))
            raw.send(header_frame(1, 10 * 1024 * 1024))
            for _ in range(8):  # 1 MB of the 10 MB body, then nothing
                raw.send(body_frame(1, b"p" * (128 * KB - 8)))
        _wait(b, lambda br: sum(c.partial_bytes for c in br.api.connections()) >= 3 * 1000 * KB)
        bystander.publish(5)
        for raw in raws:
            code, text, _c, _m = raw.expect_connection_close(timeout=5)
            assert code == 320 and "message body stalled" in text
        _wait(b, lambda br: len(br.connections) == 1)
        assert b.call(lambda: b.broker.monitor.memory_used()) < 1024 * 1024
        bystander.publish(5)
        bystander.check()
    finally:
        for raw in raws:
            raw.close()
        _close(bystander.conn)


def test_partial_bodies_over_the_connection_budget_fail_that_publish(broker_factory):
    b = broker_factory(limits="<limits><partialBodyBudget>1MB</partialBodyBudget></limits>")
    conn = _amqp(b)
    try:
        ch = conn.channel()
        ch.queue_declare("budget-q", auto_delete=False)
        ch.basic_publish(amqp.Message(b"y" * (2 * 1024 * 1024)), routing_key="budget-q")
        with pytest.raises(amqp.exceptions.ResourceError) as info:
            ch.queue_declare("budget-q", passive=True)
        assert "budget" in str(info.value)
        ch2 = conn.channel()  # the connection is fine; a message within the budget goes
        ch2.basic_publish(amqp.Message(b"z" * (512 * KB)), routing_key="budget-q")
        assert ch2.queue_declare("budget-q", passive=True).message_count == 1
        assert b.call(lambda: [c.partial_bytes for c in b.broker.api.connections()]) == [0]
    finally:
        _close(conn)


def test_partial_bodies_count_for_the_memory_alarm_and_are_returned(broker_factory):
    b = broker_factory(
        limits="<limits><memoryHighWatermark>2MB</memoryHighWatermark>"
        "<bodyStallTimeout>1s</bodyStallTimeout></limits>"
    )
    events: list[Any] = []
    watcher = _amqp(
        b, on_blocked=lambda reason: events.append(1), on_unblocked=lambda: events.append(0)
    )
    raw = RawClient(b.port)
    try:
        raw.handshake()
        raw.send(method_frame(1, "basic.publish", 0, "", "nowhere", False, False))
        raw.send(header_frame(1, 10 * 1024 * 1024))
        for _ in range(20):  # 2.5 MB of the body, then nothing
            raw.send(body_frame(1, b"p" * (128 * KB - 8)))
        drain_until(watcher, lambda: events == [1])
        # the publisher caught mid-body is blocked, and its partial body held
        _wait(b, lambda br: [c.blocked for c in br.api.connections()].count(True) == 1)
        assert b.call(lambda: b.broker.monitor.memory_used()) > 0.9 * 2 * 1024 * KB
        raw.close()  # unseen by the broker, which does not read from it: the stall is
        # ... closed after bodyStallTimeout, its memory returned, the alarm cleared
        drain_until(watcher, lambda: events == [1, 0], timeout=5)
        _wait(b, lambda br: len(br.connections) == 1)
    finally:
        raw.close()
        _close(watcher, broker=b)


ISOLATED_WORK = (
    '<queue name="work"><isolation><ackTimeout>300ms</ackTimeout>'
    "<checkPeriod>100ms</checkPeriod></isolation></queue>"
)


def test_a_consumer_blocked_by_an_alarm_is_not_taken_for_stuck(broker_factory: Any) -> None:
    """A worker that also publishes (a Celery worker touching its tasks, say) is blocked as a
    whole by a resource alarm: the broker stops reading its acks. Its ack clock stands still
    meanwhile and restarts when reading resumes, so isolation does not move its tasks; a
    consumer the broker still hears, holding its delivery past the ack timeout, is isolated
    during the same alarm."""
    b = broker_factory(ISOLATED_WORK)
    producer = _amqp(b)
    pch = producer.channel()
    pch.queue_declare("work", auto_delete=False)
    for i in range(2):
        pch.basic_publish(amqp.Message(f"m{i}"), routing_key="work")

    got: dict[str, list[Any]] = {"pub": [], "quiet": []}
    publisher = _amqp(b)  # consumes and publishes: blocked during the alarm
    ach = publisher.channel()
    ach.basic_qos(0, 1, False)
    ach.basic_publish(amqp.Message("result"), routing_key="results")
    ach.basic_consume("work", consumer_tag="pub", callback=got["pub"].append)
    quiet = _amqp(b)  # consumes only: still read during the alarm
    qch = quiet.channel()
    qch.basic_qos(0, 1, False)
    qch.basic_consume("work", consumer_tag="quiet", callback=got["quiet"].append)
    for conn, key in ((publisher, "pub"), (quiet, "quiet")):
        drain_until(conn, lambda k=key: bool(got[k]), timeout=5)

    def isolated(br: Any, tag: str) -> bool:
        return any(c.isolated for c in br.api.consumers("/", "work") if c.tag == tag)

    try:
        b.call(lambda: b.broker.raise_alarm("memory", "test"))
        _wait(b, lambda br: any(c.blocked for c in br.connections.values()))
        # a consumer the broker hears is still isolated during an alarm
        _wait(b, lambda br: isolated(br, "quiet"))
        time.sleep(0.5)  # more than the ack timeout again, still blocked
        assert not b.call(lambda: isolated(b.broker, "pub"))
        b.call(lambda: b.broker.clear_alarm("memory"))
        _wait(b, lambda br: not any(c.blocked for c in br.connections.values()))
        ach.basic_ack(got["pub"][0].delivery_tag)
        _wait(
            b,
            lambda br: any(
                c.last_ack is not None for c in br.api.consumers("/", "work") if c.tag == "pub"
            ),
        )
        assert not b.call(lambda: isolated(b.broker, "pub"))
    finally:
        _close(producer, publisher, quiet, broker=b)

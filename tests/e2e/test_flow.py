"""Flow control: channel.flow from the client, connection.blocked/unblocked on a resource alarm."""

from __future__ import annotations

import time
from typing import Any

import amqp
import pika
import pytest
from brokerutil import drain_for, drain_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


@pytest.fixture
def connect(broker):
    opened: list[amqp.Connection] = []

    def make(**kw: Any) -> amqp.Connection:
        c = amqp.Connection(
            f"127.0.0.1:{broker.port}", userid="guest", password="guest", connect_timeout=5, **kw
        )
        c.connect()
        opened.append(c)
        return c

    yield make
    broker.call(lambda: broker.broker.set_alarm(None))  # a failed test must not leave it on
    for c in opened:
        try:
            c.close()
        except Exception:
            pass


def test_channel_flow_stops_and_resumes_deliveries(connect):
    conn = connect()
    pub = conn.channel()
    pub.queue_declare("flow-q", auto_delete=False)
    ch = conn.channel()
    got: list[amqp.Message] = []
    ch.basic_consume("flow-q", callback=got.append, no_ack=True)
    pub.basic_publish(amqp.Message("before"), routing_key="flow-q")
    drain_until(conn, lambda: len(got) == 1)
    ch.flow(False)
    for i in range(3):
        pub.basic_publish(amqp.Message(f"paused{i}"), routing_key="flow-q")
    drain_for(conn, 0.5)
    assert [m.body for m in got] == ["before"]
    ok = pub.queue_declare("flow-q", passive=True)
    assert ok.message_count == 3
    # basic.get on another channel is unaffected
    m = pub.basic_get("flow-q", no_ack=True)
    assert m.body == "paused0"
    ch.flow(True)
    drain_until(conn, lambda: len(got) == 3)
    assert [m.body for m in got] == ["before", "paused1", "paused2"]


def test_channel_flow_with_pika(broker):
    params = pika.ConnectionParameters(
        host="127.0.0.1", port=broker.port, credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare("pflow-q")
        got: list[bytes] = []
        ch.basic_consume("pflow-q", lambda c, m, p, b: got.append(b), auto_ack=True)
        assert ch.flow(False) is False
        ch.basic_publish("", "pflow-q", b"held")
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert got == []
        assert ch.flow(True) is True
        deadline = time.monotonic() + 3
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert got == [b"held"]
    finally:
        conn.close()


def test_alarm_blocks_publishers_until_cleared(broker, connect):
    events: list[str] = []
    pub = connect(
        on_blocked=lambda reason: events.append("blocked"),
        on_unblocked=lambda: events.append("unblocked"),
    )
    ch = pub.channel()
    ch.queue_declare("alarm-q", auto_delete=False)
    ch.basic_publish(amqp.Message("pre"), routing_key="alarm-q")
    watcher = connect()
    wch = watcher.channel()
    drain_until(watcher, lambda: wch.queue_declare("alarm-q", passive=True).message_count == 1)

    broker.call(lambda: broker.broker.set_alarm("memory"))
    drain_until(pub, lambda: events == ["blocked"])
    for i in range(3):
        ch.basic_publish(amqp.Message(f"held{i}"), routing_key="alarm-q")
    drain_for(pub, 0.4)
    # the broker stopped reading from the publisher: nothing new was routed
    assert wch.queue_declare("alarm-q", passive=True).message_count == 1
    # a consumer-only connection keeps getting deliveries during the alarm
    got: list[amqp.Message] = []
    wch.basic_consume("alarm-q", callback=got.append, no_ack=True)
    drain_until(watcher, lambda: len(got) == 1)

    broker.call(lambda: broker.broker.set_alarm(None))
    drain_until(pub, lambda: events == ["blocked", "unblocked"])
    drain_until(watcher, lambda: len(got) == 4)
    assert [m.body for m in got] == ["pre", "held0", "held1", "held2"]


def test_blocked_reason_reaches_pika(broker):
    params = pika.ConnectionParameters(
        host="127.0.0.1", port=broker.port, credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    try:
        seen: list[tuple[str, Any]] = []
        conn.add_on_connection_blocked_callback(
            lambda c, frame: seen.append(("blocked", frame.method.reason))
        )
        conn.add_on_connection_unblocked_callback(lambda c, frame: seen.append(("unblocked", None)))
        broker.call(lambda: broker.broker.set_alarm("disk"))
        deadline = time.monotonic() + 3
        while len(seen) < 1 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        broker.call(lambda: broker.broker.set_alarm(None))
        while len(seen) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert seen[0][0] == "blocked" and "disk" in seen[0][1]
        assert seen[1] == ("unblocked", None)
    finally:
        conn.close()


def test_connection_that_first_publishes_during_alarm_is_blocked(broker, connect):
    broker.call(lambda: broker.broker.set_alarm("memory"))
    events: list[str] = []
    pub = connect(
        on_blocked=lambda reason: events.append("blocked"),
        on_unblocked=lambda: events.append("unblocked"),
    )
    drain_until(pub, lambda: events == ["blocked"])
    ch = pub.channel()
    ch.queue_declare("alarm-late-q", auto_delete=False)
    watcher = connect()
    wch = watcher.channel()
    ch.basic_publish(amqp.Message("first"), routing_key="alarm-late-q")
    drain_for(pub, 0.3)
    for i in range(3):
        ch.basic_publish(amqp.Message(f"later{i}"), routing_key="alarm-late-q")
    drain_for(pub, 0.4)
    # at most the publish that revealed the publisher got through
    assert wch.queue_declare("alarm-late-q", passive=True).message_count <= 1
    broker.call(lambda: broker.broker.set_alarm(None))
    drain_until(pub, lambda: events == ["blocked", "unblocked"])
    drain_until(watcher, lambda: wch.queue_declare("alarm-late-q", passive=True).message_count == 4)


def test_blocked_publisher_with_heartbeats_survives_a_long_alarm(broker_factory):
    b = broker_factory(limits="<limits><heartbeat>1s</heartbeat></limits>")
    events: list[str] = []
    pub = amqp.Connection(
        f"127.0.0.1:{b.port}",
        heartbeat=1,
        connect_timeout=5,
        on_blocked=lambda reason: events.append("blocked"),
        on_unblocked=lambda: events.append("unblocked"),
    )
    pub.connect()
    try:
        ch = pub.channel()
        ch.queue_declare("alarm-hb-q", auto_delete=False)
        ch.basic_publish(amqp.Message("pre"), routing_key="alarm-hb-q")
        b.call(lambda: b.broker.set_alarm("memory"))
        ch.basic_publish(amqp.Message("held"), routing_key="alarm-hb-q")
        # the client keeps heartbeating; the broker, not reading it, must not drop it
        deadline = time.monotonic() + 2.8
        while time.monotonic() < deadline:
            pub.heartbeat_tick()
            try:
                pub.drain_events(timeout=0.2)
            except TimeoutError:
                pass
        assert events == ["blocked"]
        b.call(lambda: b.broker.set_alarm(None))
        drain_until(pub, lambda: events == ["blocked", "unblocked"])
        drain_until(pub, lambda: ch.queue_declare("alarm-hb-q", passive=True).message_count == 2)
    finally:
        try:
            pub.close()
        except Exception:
            pass

"""Publisher confirms with many publishes in flight, as real clients see them.

Confirms of one channel that fall due in the same loop turn go out as one ``basic.ack`` with
``multiple=true`` (as RabbitMQ does). Every client here keeps many publishes in flight and
checks that each sequence number is confirmed exactly once, and that coalescing happened: fewer
ack frames than publishes, some with ``multiple`` set. Transient messages, and persistent ones
that confirm once the store's batch is on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import amqp
import pika
import pytest
from brokerutil import BrokerThread, drain_until
from rawclient import RawClient, method_frame, properties_bytes, publish_frames

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


class Confirms:
    """What a publisher learns from ack/nack frames, multiple expanded."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.nacked: list[int] = []
        self.frames = 0
        self.multiple = 0
        self._done = 0  # every seq up to here is settled (the broker confirms in order)

    def on(self, tag: int, multiple: bool, ack: bool = True) -> None:
        self.frames += 1
        self.multiple += bool(multiple)
        into = self.acked if ack else self.nacked
        into.extend(range(self._done + 1, tag + 1) if multiple else [tag])
        self._done = max(self._done, tag)

    def settled(self) -> int:
        return len(self.acked) + len(self.nacked)


def test_raw_client_pipelining_100_publishes_gets_each_confirmed_once(broker: BrokerThread) -> None:
    with RawClient(broker.port) as c:
        c.handshake()
        c.method(1, "queue.declare", 0, "cf-raw", False, False, False, False, False, {})
        c.expect("queue.declare_ok")
        c.method(1, "confirm.select", False)
        c.expect("confirm.select_ok")
        c.send(b"".join(publish_frames(1, "", "cf-raw", b"m%d" % i) for i in range(100)))
        got = Confirms()
        while got.settled() < 100:
            _ch, name, args = c.read_method()
            assert name == "basic.ack", (name, args)
            got.on(*args)
        assert got.acked == list(range(1, 101))
        assert got.frames < 100 and got.multiple >= 1
        c.method(1, "queue.declare", 0, "cf-raw", True, False, False, False, False, {})
        assert c.expect("queue.declare_ok")[1][1] == 100  # nothing else was confirmed


def test_raw_client_nack_in_a_pipelined_run(broker: BrokerThread) -> None:
    with RawClient(broker.port) as c:
        c.handshake()
        args = {"x-max-length": 10, "x-overflow": "reject-publish"}
        c.method(1, "queue.declare", 0, "cf-full", False, False, False, False, False, args)
        c.expect("queue.declare_ok")
        c.method(1, "queue.declare", 0, "cf-open", False, False, False, False, False, {})
        c.expect("queue.declare_ok")
        c.method(1, "confirm.select", False)
        c.expect("confirm.select_ok")
        # 30 publishes: every third to the queue that takes only 10
        targets = ["cf-full" if i % 3 == 2 else "cf-open" for i in range(30)]
        c.send(b"".join(publish_frames(1, "", t, b"x") for t in targets))
        got = Confirms()
        while got.settled() < 30:
            _ch, name, (tag, multiple, *_) = c.read_method()
            got.on(tag, multiple, name == "basic.ack")
        assert got.acked == list(range(1, 31))  # 10 fit in cf-full: all acked
        c.send(b"".join(publish_frames(1, "", t, b"x") for t in targets))
        while got.settled() < 60:
            _ch, name, (tag, multiple, *_) = c.read_method()
            got.on(tag, multiple, name == "basic.ack")
        # now cf-full is full: its publishes (seq 33, 36, ...) are nacked, each on its own
        assert got.nacked == list(range(33, 61, 3))
        assert sorted(got.acked + got.nacked) == list(range(1, 61))


def _py_amqp_pipelined(port: int, queue: str, n: int, props: dict[str, Any]) -> Confirms:
    conn = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest")
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, auto_delete=False)
        got = Confirms()
        ch.events["basic_ack"].add(lambda tag, multiple: got.on(tag, multiple))
        ch.events["basic_nack"].add(lambda tag, multiple: got.on(tag, multiple, ack=False))
        ch.confirm_select()
        for i in range(n):
            ch.basic_publish(amqp.Message(f"m{i}", **props), exchange="", routing_key=queue)
        drain_until(conn, lambda: got.settled() >= n, timeout=20)
        assert ch.queue_declare(queue, passive=True).message_count == n
        return got
    finally:
        conn.close()


def test_py_amqp_many_in_flight_transient(broker: BrokerThread) -> None:
    got = _py_amqp_pipelined(broker.port, "cf-pyamqp", 2000, {})
    assert got.acked == list(range(1, 2001)) and not got.nacked
    assert got.frames < 2000 and got.multiple >= 1


def test_py_amqp_many_in_flight_persistent_confirm_per_store_batch(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory(store=True)
    got = _py_amqp_pipelined(b.port, "cf-durable", 2000, {"delivery_mode": 2})
    assert got.acked == list(range(1, 2001)) and not got.nacked
    # one ack per store batch (a batch holds what reached the store meanwhile), not per message
    assert got.frames < 2000 and got.multiple >= 1


def test_pika_async_publisher_with_confirms(broker: BrokerThread) -> None:
    """pika's SelectConnection keeps all 500 publishes in flight and settles its deliveries
    from the (multiple) acks."""
    n = 500
    got = Confirms()
    state: dict[str, Any] = {"error": None}
    params = pika.ConnectionParameters(
        host="127.0.0.1",
        port=broker.port,
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
    )

    def on_open(conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=lambda ch: on_channel(conn, ch))

    def on_channel(conn: pika.SelectConnection, ch: Any) -> None:
        def on_confirm(frame: Any) -> None:
            m = frame.method
            got.on(m.delivery_tag, m.multiple, isinstance(m, pika.spec.Basic.Ack))
            if got.settled() >= n:
                conn.close()

        def on_declared(_frame: Any) -> None:
            ch.confirm_delivery(ack_nack_callback=on_confirm, callback=on_selected)

        def on_selected(_frame: Any) -> None:
            for i in range(n):
                ch.basic_publish("", "cf-pika", f"m{i}".encode())

        ch.queue_declare("cf-pika", callback=on_declared)

    def on_error(_conn: Any, err: Any) -> None:
        state["error"] = err
        _conn.ioloop.stop()

    conn = pika.SelectConnection(
        params,
        on_open_callback=on_open,
        on_open_error_callback=on_error,
        on_close_callback=lambda c, _reason: c.ioloop.stop(),
    )
    conn.ioloop.call_later(20, conn.ioloop.stop)
    conn.ioloop.start()
    assert state["error"] is None
    assert got.acked == list(range(1, n + 1)) and not got.nacked
    assert got.frames < n and got.multiple >= 1


def test_kombu_style_waiting_publisher_sees_single_acks(broker: BrokerThread) -> None:
    """A publisher that waits for each confirm (py-amqp's confirm_publish, as kombu uses it)
    gets one ack per publish, never multiple."""
    with RawClient(broker.port) as c:
        c.handshake()
        c.method(1, "queue.declare", 0, "cf-wait", False, False, False, False, False, {})
        c.expect("queue.declare_ok")
        c.method(1, "confirm.select", False)
        c.expect("confirm.select_ok")
        for seq in range(1, 21):
            c.send(publish_frames(1, "", "cf-wait", b"x", properties_bytes(delivery_mode=1)))
            assert c.expect("basic.ack")[1] == (seq, False)
        c.send(method_frame(1, "channel.close", 200, "", 0, 0))
        c.expect("channel.close_ok")

"""AMQP 0-9-1 protocol contract (SPEC section 3) as a pika user sees it.

Returns, confirms, qos (per consumer and global), get/get-empty, cancel notification,
exclusive queues, channel errors and transactions, all with pika's BlockingConnection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions as pex
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


@pytest.fixture
def connect(broker):
    opened: list[pika.BlockingConnection] = []

    def make(**kw: Any) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            host="127.0.0.1",
            port=broker.port,
            virtual_host="/",
            credentials=pika.PlainCredentials("guest", "guest"),
            socket_timeout=5,
            connection_attempts=1,
            **kw,
        )
        c = pika.BlockingConnection(params)
        opened.append(c)
        return c

    yield make
    for c in opened:
        try:
            if c.is_open:
                c.close()
        except Exception:
            pass


def pump_until(
    conn: pika.BlockingConnection, pred: Callable[[], bool], timeout: float = 3.0
) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"condition not met within {timeout:.1f} s")
        conn.process_data_events(time_limit=min(left, 0.1))


def pump_for(conn: pika.BlockingConnection, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        conn.process_data_events(time_limit=min(left, 0.1))


def test_mandatory_return_312_to_on_return_callback(connect):
    conn = connect()
    ch = conn.channel()
    returned: list[tuple[Any, Any, bytes]] = []
    ch.add_on_return_callback(lambda c, method, props, body: returned.append((method, props, body)))
    ch.basic_publish(
        "amq.topic",
        "no.such.route",
        b"lost",
        pika.BasicProperties(message_id="m-1", headers={"k": "v"}),
        mandatory=True,
    )
    pump_until(conn, lambda: bool(returned))
    method, props, body = returned[0]
    assert method.reply_code == 312
    assert method.reply_text == "NO_ROUTE"
    assert (method.exchange, method.routing_key) == ("amq.topic", "no.such.route")
    assert body == b"lost"
    assert props.message_id == "m-1" and props.headers == {"k": "v"}


def test_confirm_delivery_unroutable_and_nack(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pk-conf", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", "pk-conf", b"first")  # acked: returns normally
    with pytest.raises(pex.NackError):
        ch.basic_publish("", "pk-conf", b"second")
    with pytest.raises(pex.UnroutableError):
        ch.basic_publish("", "pk-nowhere", b"lost", mandatory=True)
    ch.basic_publish("", "pk-nowhere", b"dropped")  # not mandatory: just acked
    assert ch.queue_declare("pk-conf", passive=True).method.message_count == 1


def test_basic_get_and_get_empty(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pk-get")
    ch.basic_publish("", "pk-get", b"one")
    method, _props, body = ch.basic_get("pk-get")
    assert body == b"one" and method.message_count == 0 and not method.redelivered
    assert ch.basic_get("pk-get") == (None, None, None)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get("pk-get", auto_ack=True)
    assert body == b"one" and method.redelivered


def test_qos_prefetch_per_consumer(connect):
    conn = connect()
    ch = conn.channel()
    for q in ("pk-qa", "pk-qb"):
        ch.queue_declare(q)
        for i in range(6):
            ch.basic_publish("", q, f"{q}{i}".encode())
    ch.basic_qos(prefetch_count=2)  # global_qos=False: per consumer
    got: dict[str, list[int]] = {"pk-qa": [], "pk-qb": []}
    for q in got:
        ch.basic_consume(q, lambda c, m, p, b, q=q: got[q].append(m.delivery_tag))
    pump_until(conn, lambda: len(got["pk-qa"]) >= 2 and len(got["pk-qb"]) >= 2)
    pump_for(conn, 0.3)
    assert [len(v) for v in got.values()] == [2, 2]
    for tag in got["pk-qb"]:  # tags are per channel: ack just this consumer's two
        ch.basic_ack(tag)
    pump_until(conn, lambda: len(got["pk-qb"]) >= 4)
    pump_for(conn, 0.2)
    assert [len(v) for v in got.values()] == [2, 4]


def test_qos_prefetch_global_per_channel(connect):
    conn = connect()
    ch = conn.channel()
    for q in ("pk-ga", "pk-gb"):
        ch.queue_declare(q)
        for i in range(6):
            ch.basic_publish("", q, f"{q}{i}".encode())
    ch.basic_qos(prefetch_count=3, global_qos=True)
    tags: list[int] = []
    for q in ("pk-ga", "pk-gb"):
        ch.basic_consume(q, lambda c, m, p, b: tags.append(m.delivery_tag))
    pump_until(conn, lambda: len(tags) >= 3)
    pump_for(conn, 0.3)
    assert len(tags) == 3
    ch.basic_ack(tags[0])
    pump_until(conn, lambda: len(tags) >= 4)
    pump_for(conn, 0.2)
    assert len(tags) == 4
    # both limits at once: per consumer 1, per channel 3
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=3, global_qos=True)
    ch2.basic_qos(prefetch_count=1, global_qos=False)
    tags2: dict[str, int] = {}
    for q in ("pk-ga", "pk-gb"):
        ch2.queue_declare(q, passive=True)
        ch2.basic_consume(q, lambda c, m, p, b, q=q: tags2.__setitem__(q, tags2.get(q, 0) + 1))
    pump_until(conn, lambda: len(tags2) == 2)
    pump_for(conn, 0.3)
    assert tags2 == {"pk-ga": 1, "pk-gb": 1}


def test_consumer_cancel_notification(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pk-cancel")
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume("pk-cancel", lambda *a: None)
    other = connect()
    other.channel().queue_delete("pk-cancel")
    pump_until(conn, lambda: bool(cancelled))
    assert cancelled == [tag]
    assert tag not in ch.consumer_tags


def test_exclusive_queue_405_and_channel_error_keeps_connection(connect):
    owner = connect()
    owner.channel().queue_declare("pk-excl", exclusive=True)
    other = connect()
    ch = other.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare("pk-excl", passive=True)
    assert info.value.reply_code == 405
    assert "RESOURCE_LOCKED" in info.value.reply_text
    ch2 = other.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch2.queue_declare("pk-missing", passive=True)
    assert info.value.reply_code == 404
    assert other.is_open
    ch3 = other.channel()
    ch3.queue_declare("pk-fine")
    owner.close()
    pump_for(other, 0.1)
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch3.queue_declare("pk-excl", passive=True)
    assert info.value.reply_code == 404


def test_delete_if_unused_and_if_empty(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pk-del")
    ch.basic_publish("", "pk-del", b"x")
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_delete("pk-del", if_empty=True)
    assert info.value.reply_code == 406
    ch = conn.channel()
    ch.basic_consume("pk-del", lambda *a: None, auto_ack=True)
    pump_for(conn, 0.1)
    ch2 = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch2.queue_delete("pk-del", if_unused=True)
    assert info.value.reply_code == 406
    ch.close()
    ch3 = conn.channel()
    ch3.basic_publish("", "pk-del", b"y")
    ch3.basic_publish("", "pk-del", b"z")
    assert ch3.queue_delete("pk-del").method.message_count == 2


def test_tx_commit_rollback(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pk-tx")
    ch.tx_select()
    ch.basic_publish("", "pk-tx", b"a")
    watch = connect().channel()
    assert watch.queue_declare("pk-tx", passive=True).method.message_count == 0
    ch.tx_rollback()
    ch.tx_commit()
    assert watch.queue_declare("pk-tx", passive=True).method.message_count == 0
    ch.basic_publish("", "pk-tx", b"b")
    ch.tx_commit()
    assert watch.queue_declare("pk-tx", passive=True).method.message_count == 1
    method, _, body = ch.basic_get("pk-tx")
    assert body == b"b"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()  # the ack is undone: message still unacked on ch
    assert watch.queue_declare("pk-tx", passive=True).method.message_count == 0
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    ch.close()
    assert watch.queue_declare("pk-tx", passive=True).method.message_count == 0


def test_recover_redelivers(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pk-rec")
    ch.basic_publish("", "pk-rec", b"r")
    seen: list[bool] = []
    ch.basic_consume("pk-rec", lambda c, m, p, b: seen.append(m.redelivered))
    pump_until(conn, lambda: len(seen) == 1)
    ch.basic_recover(requeue=True)
    pump_until(conn, lambda: len(seen) == 2)
    assert seen == [False, True]


def test_server_properties_capabilities(connect):
    conn = connect()
    props = conn._impl.server_properties
    caps = props["capabilities"]
    for cap in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert caps.get(cap) is True, cap
    assert props["product"]


def test_auth_failure_pika(broker):
    params = pika.ConnectionParameters(
        host="127.0.0.1",
        port=broker.port,
        credentials=pika.PlainCredentials("guest", "bad"),
        connection_attempts=1,
        socket_timeout=5,
    )
    with pytest.raises(pex.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    assert "ACCESS_REFUSED" in str(info.value)

"""AMQP 0-9-1 protocol contract (SPEC section 3) as a kombu user sees it.

Exchange types and the standard exchanges, exchange-to-exchange bindings, x-delayed-message,
publisher confirms through transport_options, kombu's nowait consume habit, channel reuse
after a broker-side channel close, and consumer cancel notification.
"""

from __future__ import annotations

import time
from typing import Any

import amqp
import kombu
import pytest
from amqp import exceptions as ex
from brokerutil import drain_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


@pytest.fixture
def conn(broker):
    with kombu.Connection(broker.url(), connect_timeout=5) as c:
        c.connect()
        yield c


def bodies(conn: kombu.Connection, queue: str, limit: int = 50) -> list[Any]:
    q = kombu.Queue(queue, no_declare=True)(conn.default_channel)
    out = []
    for _ in range(limit):
        m = q.get(no_ack=True)
        if m is None:
            break
        out.append(m.payload)
    return sorted(out, key=repr)


def bind(
    conn: kombu.Connection, name: str, exchange: kombu.Exchange, routing_key: str = "", **kw: Any
) -> kombu.Queue:
    q = kombu.Queue(name, exchange, routing_key=routing_key, auto_delete=False, **kw)
    q(conn.default_channel).declare()
    return q


def send(
    conn: kombu.Connection, body: Any, exchange: Any, routing_key: str = "", **kw: Any
) -> None:
    conn.Producer().publish(body, exchange=exchange, routing_key=routing_key, **kw)


# ------------------------------------------------------------------ exchange types


def test_direct_exchange(conn):
    dx = kombu.Exchange("k-direct", "direct")
    bind(conn, "kd-a", dx, "a")
    bind(conn, "kd-b", dx, "b")
    bind(conn, "kd-ab", dx, "a")
    send(conn, "to-a", dx, "a")
    send(conn, "to-b", dx, "b")
    send(conn, "to-c", dx, "c")
    assert bodies(conn, "kd-a") == ["to-a"]
    assert bodies(conn, "kd-b") == ["to-b"]
    assert bodies(conn, "kd-ab") == ["to-a"]


def test_fanout_exchange(conn):
    fx = kombu.Exchange("k-fanout", "fanout")
    for name in ("kf-1", "kf-2", "kf-3"):
        bind(conn, name, fx, "ignored-" + name)
    send(conn, {"all": True}, fx, "whatever")
    for name in ("kf-1", "kf-2", "kf-3"):
        assert bodies(conn, name) == [{"all": True}]


def test_topic_exchange_wildcards(conn):
    tx = kombu.Exchange("k-topic", "topic")
    bind(conn, "kt-star", tx, "stocks.*.nyse")
    bind(conn, "kt-hash", tx, "stocks.#")
    bind(conn, "kt-mid", tx, "#.nyse")
    bind(conn, "kt-exact", tx, "stocks.us.nyse")
    for key in ("stocks.us.nyse", "stocks.nyse", "stocks.us.east.nyse", "bonds.us.nyse", "stocks"):
        send(conn, key, tx, key)
    assert bodies(conn, "kt-star") == ["stocks.us.nyse"]
    assert bodies(conn, "kt-hash") == sorted(
        ["stocks.us.nyse", "stocks.nyse", "stocks.us.east.nyse", "stocks"]
    )
    assert bodies(conn, "kt-mid") == sorted(
        ["stocks.us.nyse", "stocks.nyse", "stocks.us.east.nyse", "bonds.us.nyse"]
    )
    assert bodies(conn, "kt-exact") == ["stocks.us.nyse"]


def test_headers_exchange_all_and_any(conn):
    hx = kombu.Exchange("k-headers", "headers")
    bind(conn, "kh-all", hx, binding_arguments={"x-match": "all", "fmt": "pdf", "type": "report"})
    bind(conn, "kh-any", hx, binding_arguments={"x-match": "any", "fmt": "pdf", "type": "report"})
    send(conn, "both", hx, headers={"fmt": "pdf", "type": "report", "extra": 1})
    send(conn, "fmt-only", hx, headers={"fmt": "pdf"})
    send(conn, "wrong-value", hx, headers={"fmt": "zip", "type": "log"})
    send(conn, "none", hx)
    assert bodies(conn, "kh-all") == ["both"]
    assert bodies(conn, "kh-any") == ["both", "fmt-only"]


def test_default_exchange_routes_by_queue_name(conn):
    ch = conn.default_channel
    kombu.Queue("k-default", auto_delete=False)(ch).declare()
    send(conn, "direct-to-queue", "", "k-default")
    assert bodies(conn, "k-default") == ["direct-to-queue"]
    # binding to the default exchange is not allowed (403)
    with pytest.raises(ex.AccessRefused):
        ch.queue_bind("k-default", "", "other-key")


def test_standard_amq_exchanges(conn):
    ch = conn.default_channel
    for name, type_ in (
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ):
        ch.exchange_declare(name, type_, passive=True)
        ch.exchange_declare(name, type_, durable=True)  # same type: fine
    bind(conn, "k-amq-topic", kombu.Exchange("amq.topic", "topic"), "a.#")
    send(conn, "via-amq-topic", "amq.topic", "a.b.c")
    assert bodies(conn, "k-amq-topic") == ["via-amq-topic"]

    # another type for an existing amq.* exchange: 406 inequivalent type (as RabbitMQ)
    with pytest.raises(ex.PreconditionFailed) as info:
        ch.exchange_declare("amq.direct", "fanout", durable=True)
    assert "type" in info.value.reply_text
    # a new amq.* name is reserved: 403
    with pytest.raises(ex.AccessRefused):
        ch.exchange_declare("amq.mine", "direct")
    # the standard exchanges cannot be deleted: 403
    for name in ("amq.direct", "amq.topic", ""):
        with pytest.raises(ex.AccessRefused) as info:
            ch.exchange_delete(name)
        assert info.value.reply_code == 403
    ch.exchange_declare("amq.direct", "direct", passive=True)  # still there
    # passive declare of a missing exchange: 404
    with pytest.raises(ex.NotFound):
        ch.exchange_declare("no-such-exchange", "direct", passive=True)
    # publishing to a missing exchange closes the channel with 404
    with pytest.raises(ex.NotFound):
        ch.basic_publish(amqp.Message("x"), exchange="no-such-exchange", routing_key="k")
        ch.queue_declare("k-after-404", auto_delete=False)
    ch.queue_declare("k-after-404", auto_delete=False)


def test_exchange_to_exchange_binding(conn):
    ch = conn.default_channel
    ch.exchange_declare("k-e2e-src", "topic", durable=True, auto_delete=False)
    ch.exchange_declare("k-e2e-dst", "fanout", durable=True, auto_delete=False)
    ch.exchange_declare("k-e2e-dst2", "direct", durable=True, auto_delete=False)
    ch.exchange_bind(destination="k-e2e-dst", source="k-e2e-src", routing_key="orders.*")
    ch.exchange_bind(destination="k-e2e-dst2", source="k-e2e-dst", routing_key="")
    bind(conn, "k-e2e-q", kombu.Exchange("k-e2e-dst", "fanout"))
    bind(conn, "k-e2e-q2", kombu.Exchange("k-e2e-dst2", "direct"), "orders.new")
    send(conn, "o1", "k-e2e-src", "orders.new")
    send(conn, "x1", "k-e2e-src", "other.new")
    assert bodies(conn, "k-e2e-q") == ["o1"]
    assert bodies(conn, "k-e2e-q2") == ["o1"]  # two hops, the routing key travels along
    ch.exchange_unbind(destination="k-e2e-dst", source="k-e2e-src", routing_key="orders.*")
    send(conn, "o2", "k-e2e-src", "orders.new")
    assert bodies(conn, "k-e2e-q") == []
    # a message reaching a queue along two paths is delivered once
    ch.exchange_bind(destination="k-e2e-dst", source="k-e2e-src", routing_key="#")
    ch.queue_bind("k-e2e-q", "k-e2e-src", "orders.#")
    send(conn, "o3", "k-e2e-src", "orders.new")
    assert bodies(conn, "k-e2e-q") == ["o3"]


def test_delayed_message_exchange(conn):
    ch = conn.default_channel
    dx = kombu.Exchange("k-delayed", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    bind(conn, "k-delayed-q", dx, "later")
    q = kombu.Queue("k-delayed-q", no_declare=True)(ch)
    sent = time.monotonic()
    send(conn, "late", dx, "later", headers={"x-delay": 800})
    send(conn, "now", dx, "later")  # no x-delay: routed at once
    m = q.get(no_ack=True)
    assert m is not None and m.payload == "now"
    arrived = None
    deadline = sent + 3
    while time.monotonic() < deadline:
        m = q.get(no_ack=True)
        if m is not None:
            arrived = time.monotonic() - sent
            assert m.payload == "late"
            assert m.headers.get("x-delay") == 800
            break
        time.sleep(0.02)
    assert arrived is not None, "delayed message never arrived"
    assert 0.7 <= arrived <= 1.6, arrived
    # x-delayed-type is required
    with pytest.raises(ex.PreconditionFailed):
        ch.exchange_declare("k-delayed-bad", "x-delayed-message")


# ------------------------------------------------------------------ confirms


def test_confirm_publish_transport_option_and_nack(broker):
    with kombu.Connection(
        broker.url(), transport_options={"confirm_publish": True}, connect_timeout=5
    ) as conn:
        q = kombu.Queue(
            "k-conf",
            auto_delete=False,
            queue_arguments={"x-max-length": 2, "x-overflow": "reject-publish"},
        )
        producer = conn.Producer()
        producer.publish("a", routing_key="k-conf", declare=[q])
        producer.publish("b", routing_key="k-conf")
        with pytest.raises(ex.MessageNacked):
            producer.publish("c", routing_key="k-conf")
        assert bodies(conn, "k-conf") == ["a", "b"]


# ------------------------------------------------------------------ consumer habits


def test_consumer_on_several_queues_uses_nowait_consume(conn):
    queues = [kombu.Queue(f"k-multi-{i}", auto_delete=False) for i in range(4)]
    for q in queues:
        q(conn.default_channel).declare()
    got: list[tuple[str, Any]] = []

    def on_message(body: Any, message: Any) -> None:
        got.append((message.delivery_info["routing_key"], body))
        message.ack()

    with conn.Consumer(queues, callbacks=[on_message]) as consumer:
        # all but the last basic.consume went with nowait=1; each consumer still works
        assert len(consumer._active_tags) == 4
        for i, q in enumerate(queues):
            send(conn, f"m{i}", "", q.name)
        drain_until(conn, lambda: len(got) == 4)
    assert sorted(got) == [(f"k-multi-{i}", f"m{i}") for i in range(4)]
    # cancelled: no consumers left, nothing more is delivered
    send(conn, "after", "", "k-multi-0")
    ch = conn.default_channel
    ok = ch.queue_declare("k-multi-0", passive=True)
    assert (ok.message_count, ok.consumer_count) == (1, 0)


def test_default_channel_reused_after_broker_closes_it(conn):
    ch = conn.default_channel
    for i in range(5):
        with pytest.raises(ex.NotFound):
            kombu.Queue(f"k-missing-{i}")(conn.default_channel).queue_declare(passive=True)
        assert conn.default_channel is ch
        # py-amqp re-opened the same channel id at once: the channel works on
        kombu.Queue(f"k-present-{i}", auto_delete=False)(conn.default_channel).declare()
        send(conn, i, "", f"k-present-{i}")
    for i in range(5):
        assert bodies(conn, f"k-present-{i}") == [i]


def test_kombu_consumer_cancelled_when_queue_deleted(conn, broker):
    q = kombu.Queue("k-cancel", auto_delete=False)
    q(conn.default_channel).declare()
    with conn.Consumer([q], callbacks=[lambda body, m: m.ack()]) as consumer:
        tag = consumer._active_tags["k-cancel"]
        with kombu.Connection(broker.url()) as other:
            other.default_channel.queue_delete("k-cancel")
        with pytest.raises(ex.ConsumerCancelled) as info:
            drain_until(conn, lambda: False, timeout=3)
        assert tag in str(info.value.args)


def test_kombu_simple_queue_round_trip_with_ack_and_requeue(conn):
    sq = conn.SimpleQueue("k-simple")
    sq.put({"n": 1})
    m = sq.get(timeout=2)
    assert m.payload == {"n": 1}
    m.requeue()
    m = sq.get(timeout=2)
    assert m.payload == {"n": 1} and m.delivery_info["redelivered"] is True
    m.ack()
    assert sq.qsize() == 0
    sq.close()


def test_exchange_delete_if_unused_and_auto_delete(conn):
    ch = conn.default_channel
    ch.exchange_declare("k-used", "direct", durable=True, auto_delete=False)
    bind(conn, "k-used-q", kombu.Exchange("k-used", "direct"), "k")
    with pytest.raises(ex.PreconditionFailed) as info:
        ch.exchange_delete("k-used", if_unused=True)
    assert info.value.reply_code == 406
    ch.exchange_declare("k-used", "direct", passive=True)
    ch.exchange_delete("k-used")
    with pytest.raises(ex.NotFound):
        ch.exchange_declare("k-used", "direct", passive=True)
    # an auto-delete exchange goes when its last binding goes
    ch.exchange_declare("k-auto", "fanout", durable=False, auto_delete=True)
    ch.queue_bind("k-used-q", "k-auto", "")
    ch.exchange_declare("k-auto", "fanout", passive=True)
    ch.queue_unbind("k-used-q", "k-auto", "")
    with pytest.raises(ex.NotFound):
        ch.exchange_declare("k-auto", "fanout", passive=True)

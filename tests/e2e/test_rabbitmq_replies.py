"""Where clients match RabbitMQ's behaviour and reply texts (SPEC section 3), checked with
py-amqp and kombu: ``immediate=true``, requeue to the original position, and the order of
queue.delete-ok and basic.cancel on the deleting channel."""

from __future__ import annotations

from typing import Any

import amqp
import kombu
import pytest
from amqp import exceptions as ex
from brokerutil import drain_for, drain_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


@pytest.fixture
def connect(broker):
    opened: list[amqp.Connection] = []

    def make(**kw: Any) -> amqp.Connection:
        kw.setdefault("confirm_publish", False)
        c = amqp.Connection(
            f"127.0.0.1:{broker.port}", userid="guest", password="guest", connect_timeout=5, **kw
        )
        c.connect()
        opened.append(c)
        return c

    yield make
    for c in opened:
        try:
            c.close()
        except Exception:
            pass


def test_immediate_true_closes_the_connection_with_rabbitmqs_540(connect):
    bystander = connect(confirm_publish=True)
    bch = bystander.channel()
    bch.queue_declare("by-immediate")
    bch.basic_publish(amqp.Message("before"), routing_key="by-immediate")
    conn = connect(confirm_publish=True)
    ch = conn.channel()
    ch.queue_declare("immediate-q")
    with pytest.raises(ex.AMQPNotImplementedError) as exc:
        ch.basic_publish(amqp.Message("x"), routing_key="immediate-q", immediate=True)
    assert exc.value.reply_code == 540
    assert exc.value.reply_text == "NOT_IMPLEMENTED - immediate=true"
    assert exc.value.method_name == "Basic.publish"
    # the bystander's publishes are confirmed all along, and nothing of theirs is lost
    bch.basic_publish(amqp.Message("after"), routing_key="by-immediate")
    assert bch.queue_declare("by-immediate", passive=True).message_count == 2


def test_queue_delete_ok_comes_before_the_cancel_of_the_channels_own_consumer(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("del-own", auto_delete=False)
    ch.basic_publish(amqp.Message("a"), routing_key="del-own")
    cancelled: list[str] = []
    got: list[amqp.Message] = []
    ch.basic_qos(0, 1, False)  # "b" stays ready while "a" is unacked
    tag = ch.basic_consume("del-own", callback=got.append, on_cancel=cancelled.append, no_ack=False)
    drain_until(conn, lambda: bool(got))
    ch.basic_publish(amqp.Message("b"), routing_key="del-own")
    # py-amqp raises ConsumerCancelled from queue_delete if basic.cancel comes first
    assert ch.queue_delete("del-own") == 1
    drain_until(conn, lambda: bool(cancelled))
    assert cancelled == [tag]
    assert tag not in ch.callbacks
    ch.queue_declare("del-own-2")  # the channel stays usable


def _reject_one_by_one_and_collect(broker: Any, queue: kombu.Queue, bodies: list[str]) -> list[str]:
    with kombu.Connection(broker.url()) as conn:
        producer = conn.Producer()
        for i, body in enumerate(bodies):
            producer.publish(
                body,
                routing_key=queue.routing_key,
                declare=[queue],
                priority=(i % 2) * 5,
                serializer="json",
            )
        first: list[kombu.Message] = []
        consumer = conn.Consumer(queue, callbacks=[lambda b, m: first.append(m)])
        with consumer:
            drain_until(conn, lambda: len(first) == len(bodies))
        # rejected one by one in delivery order, after the consumer is gone
        for m in first:
            m.requeue()
        again: list[str] = []
        with conn.Consumer(queue, callbacks=[lambda b, m: (again.append(b), m.ack())]):
            drain_until(conn, lambda: len(again) == len(bodies))
            drain_for(conn, 0.05)
        return again


@pytest.mark.parametrize("max_priority", [None, 10], ids=["fifo", "priority"])
def test_requeued_messages_come_back_in_their_original_order(broker, max_priority):
    name = f"requeue-order-{max_priority}"
    q = kombu.Queue(name, routing_key=name, max_priority=max_priority)
    bodies = [f"m{i}" for i in range(6)]
    again = _reject_one_by_one_and_collect(broker, q, bodies)
    if max_priority is None:
        assert again == bodies
    else:  # the odd ones have priority 5: first, each level in publish order
        assert again == bodies[1::2] + bodies[0::2]

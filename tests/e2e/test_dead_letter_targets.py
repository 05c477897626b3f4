"""Dead-letter queues are never deleted by a policy: before their first dead letter, after one,
and after a restart with dead letters in them.

A dead-letter queue bound to a topic exchange looks like a topic subscription to the
slow-consumer policy; the one named by ``<deadLetter><queue>`` is known as a dead-letter target
from its declaration, and the mark is stored with it. A plain subscription bound the same way
is the control: the same check deletes it. Checks run on demand (``run_job``).
"""

from __future__ import annotations

from typing import Any

import amqp
import pytest

pytestmark = pytest.mark.e2e

#: a vhost-wide Delete policy that reaches durable topic subscriptions, and a queue whose
#: dead-letter queue is named in the configuration
CONFIG = (
    "<consumer><messageCount>1</messageCount>"
    '<policy name="Delete"><options><option name="delete-persistent" value="true"/></options>'
    "</policy></consumer>"
    '<queue name="work"><deadLetter><queue>work-dead</queue></deadLetter></queue>'
)


def connect(b: Any) -> amqp.Connection:
    conn = amqp.Connection(host=f"127.0.0.1:{b.port}", userid="guest", password="guest")
    conn.connect()
    return conn


def check(b: Any) -> None:
    assert b.running.housekeeping.run_job("slow-consumer") is True


def queues(b: Any) -> dict[str, int]:
    return b.call(lambda: {n: q.message_count for n, q in b.broker.vhosts["/"].queues.items()})


def subscribe(ch: Any, name: str) -> None:
    ch.queue_declare(name, durable=True, auto_delete=False)
    ch.queue_bind(name, "amq.topic", "dead.#")


def publish_topic(ch: Any, n: int) -> None:
    for _ in range(n):
        ch.basic_publish_confirm(amqp.Message(b"t", delivery_mode=2), "amq.topic", "dead.x")


def test_a_dead_letter_queue_bound_to_a_topic_survives_a_vhost_delete_policy(broker_factory):
    b = broker_factory(CONFIG, store=True, period="1h")
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_select()
        subscribe(ch, "work-dead")  # declared by a client, before any dead letter
        subscribe(ch, "sub")  # the control
        publish_topic(ch, 2)
        assert queues(b)["work-dead"] == 2 and queues(b)["sub"] == 2
        check(b)
        got = queues(b)
        assert "sub" not in got  # the policy is on: the control subscription is deleted
        assert got["work-dead"] == 2  # before its first dead letter
        # a dead letter arrives
        ch.queue_declare("work", durable=True, auto_delete=False)
        ch.basic_publish_confirm(amqp.Message(b"bad", delivery_mode=2), "", "work")
        m = ch.basic_get("work")
        ch.basic_reject(m.delivery_tag, requeue=False)
        assert queues(b)["work-dead"] == 3
        subscribe(ch, "sub")
        publish_topic(ch, 2)
        check(b)
        got = queues(b)
        assert "sub" not in got and got["work-dead"] == 5  # after one
    path = b.config_path
    b.stop()
    # a restart: the mark comes back with the queue, before anything names it again
    b = broker_factory(config_path=path)
    assert b.call(lambda: b.broker.vhosts["/"].queues["work-dead"].dead_letter_target)
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_select()
        subscribe(ch, "sub")
        publish_topic(ch, 2)
        check(b)
        got = queues(b)
        assert "sub" not in got and got["work-dead"] == 7
        dead = [ch.basic_get("work-dead", no_ack=True) for _ in range(7)]
        reasons = [
            m.headers["x-death"][0]["reason"] for m in dead if m.headers and "x-death" in m.headers
        ]
        assert reasons == ["rejected"]  # the dead letter is still there, with its reason


def test_a_queue_only_the_store_knows_as_a_target_keeps_its_mark(broker_factory, tmp_path):
    """A dead-letter queue reached through an ``x-dead-letter-exchange`` route: after a restart
    where nothing names it any more (its source is gone), the stored mark still spares it."""
    b = broker_factory(CONFIG, store=True, period="1h")
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_select()
        subscribe(ch, "routed-dlq")
        ch.queue_declare(
            "src",
            durable=True,
            auto_delete=False,
            arguments={
                "x-dead-letter-exchange": "amq.topic",
                "x-dead-letter-routing-key": "dead.s",
            },
        )
        ch.queue_delete("src")  # the route goes; the mark stays
        publish_topic(ch, 2)
    path = b.config_path
    b.stop()
    b = broker_factory(config_path=path)
    check(b)
    assert queues(b)["routed-dlq"] == 2

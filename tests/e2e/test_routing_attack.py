"""A tenant's bindings cannot stall the broker: pathological topic bindings route in steps
bounded by the routing key while a bystander publishes with confirms, and the binding limits
refuse with 406 on the binding's channel only."""

from __future__ import annotations

import base64
import random
import time
import urllib.request
from typing import Any

import amqp
import pytest
from brokerutil import ADMIN_GUEST

pytestmark = pytest.mark.e2e

BINDINGS = 2000
WORDS = 120


def connect(b: Any, **kw: Any) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest", **kw)
    conn.connect()
    return conn


class Bystander:
    """Publishes persistent messages with confirms into its own queue, timing each."""

    def __init__(self, b: Any) -> None:
        self.conn = connect(b, confirm_publish=True)
        self.ch = self.conn.channel()
        self.ch.queue_declare("bystander", durable=True, auto_delete=False)
        self.waits: list[float] = []

    def publish(self, n: int) -> float:
        """``n`` confirmed publishes; the worst wait among them, seconds."""
        worst = 0.0
        for _ in range(n):
            t = time.perf_counter()
            self.ch.basic_publish(amqp.Message(b"b", delivery_mode=2), "", "bystander", timeout=60)
            worst = max(worst, time.perf_counter() - t)
        self.ch.queue_purge("bystander")
        return worst


def _key(rnd: random.Random, last: str) -> str:
    return ".".join([rnd.choice("abcdefgh") for _ in range(WORDS - 1)] + [last])


def test_pathological_topic_bindings_route_in_steps_bounded_by_the_key(broker_factory: Any) -> None:
    b = broker_factory()
    by = Bystander(b)
    baseline = by.publish(50)
    tenant = connect(b)
    rnd = random.Random(9)
    try:
        ch = tenant.channel()
        ch.exchange_declare("mine", "topic", auto_delete=False)
        ch.queue_declare("sink")
        for i in range(BINDINGS):
            ch.queue_bind("sink", "mine", ".".join(["#"] * WORDS + [f"x{i:05d}"]))
        worst = 0.0
        for _round in range(3):
            # ten uncached 120-word keys, pipelined (py-amqp does not wait after a publish)
            for i in range(10):
                ch.basic_publish(amqp.Message(b"t"), "mine", _key(rnd, f"x{i:05d}"))
            worst = max(worst, by.publish(5))
            ch.exchange_declare("mine", "topic", passive=True)  # the ten are routed
        assert ch.queue_declare("sink", passive=True)[1] == 30  # every one reached its binding

        def steps() -> int:
            return int(b.broker.vhosts["/"].exchanges["mine"].last_steps)

        # the structural bound: one walk of the trie per key, a few steps per key word
        assert b.call(steps) <= 3 * (WORDS + 1)
        # and the bystander was not held by the routing (a generous multiple of its own
        # quiet worst in this run: a walk over every binding took about a second a publish)
        assert worst < 50 * max(baseline, 0.01), (worst, baseline)
    finally:
        tenant.close()
    by.conn.close()


def _metrics(b: Any) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{b.running.admin.port}/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


def test_binding_limits_refuse_with_406_on_that_channel_only(broker_factory: Any) -> None:
    b = broker_factory(
        admin=True,
        users=ADMIN_GUEST,
        limits="<limits><maxBindingsPerExchange>3</maxBindingsPerExchange>"
        "<maxBindingsPerVhost>5</maxBindingsPerVhost></limits>",
    )
    by = Bystander(b)
    conn = connect(b)
    try:
        ch = conn.channel()
        ch.exchange_declare("t", "topic", auto_delete=False)
        ch.queue_declare("q")
        for k in ("a", "b", "c"):
            ch.queue_bind("q", "t", k)
        ch.queue_bind("q", "t", "a")  # binding again an existing binding is fine
        with pytest.raises(amqp.exceptions.PreconditionFailed) as e:
            ch.queue_bind("q", "t", "d")
        assert e.value.reply_code == 406
        assert (
            "PRECONDITION_FAILED - cannot bind queue 'q' to exchange 't': binding limit of "
            "exchange 't' in vhost '/' (3) is reached" in str(e.value)
        )
        by.publish(3)
        ch = conn.channel()  # the connection is still open
        ch.queue_bind("q", "amq.topic", "x")
        ch.exchange_bind("amq.fanout", "amq.topic", "y")
        with pytest.raises(amqp.exceptions.PreconditionFailed) as e:
            ch.queue_bind("q", "amq.direct", "z")
        assert "binding limit in vhost '/' (5) is reached" in str(e.value)
        ch = conn.channel()
        ch.queue_unbind("q", "t", "a")
        ch.queue_bind("q", "amq.direct", "z")  # a place was freed
        metrics = _metrics(b)
        assert 'plugbroker_limit_refusals_total{limit="maxBindingsPerExchange"} 1' in metrics
        assert 'plugbroker_limit_refusals_total{limit="maxBindingsPerVhost"} 1' in metrics
    finally:
        conn.close()
    by.publish(3)
    by.conn.close()

"""Fault containment on a live broker: what one client or one plugin does wrong stays with it.

Every test keeps a bystander on another connection publishing persistent messages with
confirms (py-amqp's ``confirm_publish``: each publish waits for its ack) and checks them.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import types
import urllib.request
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from brokerutil import ADMIN_GUEST, drain_until
from rawclient import RawClient, deep_header_properties, publish_frames

from plugbroker.codec.tables import MAX_DEPTH
from plugbroker.hookimpl import hookimpl


def connect(b: Any, **kw: Any) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest", **kw)
    conn.connect()
    return conn


class Bystander:
    """Another connection publishing persistent messages with confirms into its own queue."""

    def __init__(self, b: Any, queue: str = "bystander") -> None:
        self.conn = connect(b, confirm_publish=True)
        self.ch = self.conn.channel()
        self.ch.queue_declare(queue, durable=True, auto_delete=False)
        self.queue = queue
        self.sent = 0

    def publish(self, n: int = 5) -> None:
        for _ in range(n):
            # confirm_publish: returns once the broker acked it, raises on a nack or a close
            self.ch.basic_publish(
                amqp.Message(f"b{self.sent}", delivery_mode=2), "", self.queue, timeout=5
            )
            self.sent += 1

    def check(self) -> None:
        self.publish()
        _, count, _ = self.ch.queue_declare(self.queue, passive=True)
        assert count == self.sent

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def plugin_module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType("containment_plugin")
    sys.modules[mod.__name__] = mod
    try:
        yield mod
    finally:
        sys.modules.pop(mod.__name__, None)


PLUGIN = "<plugins><plugin>containment_plugin</plugin></plugins>"


def _admin(b: Any, path: str) -> Any:
    """GET ``path`` from the broker's admin interface as guest (an administrator)."""
    req = urllib.request.Request(f"http://127.0.0.1:{b.running.admin.port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read().decode()
        return json.loads(body) if path.startswith("/api/") else body


def _records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def test_a_raising_notification_hook_is_contained(
    broker_factory: Any, plugin_module: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    calls = {"delivered": 0, "acked": 0, "published": 0}

    @hookimpl
    def broker_message_published(queues: list[str]) -> None:
        calls["published"] += 1
        raise RuntimeError("published hook is broken")

    @hookimpl
    def broker_message_delivered(delivery_tag: int) -> None:
        calls["delivered"] += 1
        raise RuntimeError("delivered hook is broken")

    @hookimpl
    def broker_message_acked(message: Any) -> None:
        calls["acked"] += 1
        raise RuntimeError("acked hook is broken")

    for fn in (broker_message_published, broker_message_delivered, broker_message_acked):
        setattr(plugin_module, fn.__name__, fn)
    caplog.set_level(logging.WARNING)
    b = broker_factory(plugins=PLUGIN, store=True, admin=True, users=ADMIN_GUEST)
    by = Bystander(b)
    conn = connect(b, confirm_publish=True)
    try:
        ch = conn.channel()
        ch.queue_declare("work", durable=True, auto_delete=False)
        for i in range(20):
            ch.basic_publish(amqp.Message(f"m{i}", delivery_mode=2), "", "work", timeout=5)
        got: list[amqp.Message] = []
        ch.basic_qos(0, 5, False)
        ch.basic_consume("work", callback=lambda m: (got.append(m), ch.basic_ack(m.delivery_tag)))
        drain_until(conn, lambda: len(got) == 20, timeout=10)
        by.check()
    finally:
        conn.close()
    check = connect(b)
    try:
        _, count, consumers = check.channel().queue_declare("work", passive=True)
        assert (count, consumers) == (0, 0)  # every delivery settled although the hooks raised
    finally:
        check.close()
    by.check()
    by.close()
    assert calls["published"] >= 20 and calls["delivered"] == 20 and calls["acked"] == 20
    for hook in ("message_published", "message_delivered", "message_acked"):
        logged = _records(caplog, f"broker_{hook} hook raised")
        assert len(logged) == 1, hook  # once, however often it raised
        assert "containment_plugin" in logged[0].getMessage()
    failures = b.call(lambda: dict(b.broker.hooks.hook_failures))
    assert failures[("containment_plugin", "broker_message_delivered")] == 20
    # the admin's overview and metrics count them too
    shown = _admin(b, "/api/overview")["failures"]
    assert shown["hook_failures"] == sum(failures.values())
    assert {
        "plugin": "containment_plugin",
        "hook": "broker_message_delivered",
        "count": 20,
    } in shown["hook_failures_by_plugin"]
    assert shown["store_records_failed"] == 0 and shown["dispatch_failures"] == 0
    metrics = _admin(b, "/metrics")
    assert (
        'plugbroker_hook_failures_total{plugin="containment_plugin",'
        'hook="broker_message_delivered"} 20\n'
    ) in metrics
    assert "plugbroker_store_records_failed_total 0\n" in metrics


def test_a_queue_whose_dispatch_raises_does_not_stall_the_others(
    broker_factory: Any, plugin_module: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    def select_consumer(**kw: Any) -> Any:
        if kw["queue"] == "bad":
            raise RecursionError("maximum recursion depth exceeded")  # like the deep headers
        return None

    caplog.set_level(logging.WARNING)
    b = broker_factory(plugins=PLUGIN, store=True, admin=True, users=ADMIN_GUEST)
    # a plugin's hook is contained (a raise is its "no answer"): the failure is put in the
    # dispatch itself, as a bug in the core would be, bypassing the plugin host's containment
    b.call(lambda: setattr(b.broker.hooks, "select_consumer", select_consumer))
    by = Bystander(b)
    consumer = connect(b)
    try:
        ch = consumer.channel()
        good: list[amqp.Message] = []
        for q in ("bad", "good"):
            ch.queue_declare(q)
        ch.basic_consume("bad", callback=lambda m: None, no_ack=True)
        ch.basic_consume("good", callback=good.append, no_ack=True)
        ch.basic_consume("good", callback=good.append, no_ack=True)
        with RawClient(b.port) as raw:
            raw.handshake()
            # both queues become dirty in the same loop turn: one write, both publishes
            for _ in range(5):
                raw.send(publish_frames(1, "", "bad", b"x") + publish_frames(1, "", "good", b"y"))
            drain_until(consumer, lambda: len(good) == 5, timeout=5)
            # the publisher's connection was not dropped, and a new consumer gets messages too
            raw.send(publish_frames(1, "", "good", b"z"))
            drain_until(consumer, lambda: len(good) == 6, timeout=5)
            by.check()
        fails = b.call(lambda: dict(b.broker.dispatch_failures))
        assert fails.get(("/", "bad"), 0) >= 1 and ("/", "good") not in fails
        assert len(_records(caplog, "queue 'bad' in vhost '/': dispatch failed")) == 1
        shown = _admin(b, "/api/overview")["failures"]
        assert shown["dispatch_failures"] == fails[("/", "bad")]
        assert shown["dispatch_failures_by_queue"] == [
            {"vhost": "/", "queue": "bad", "count": fails[("/", "bad")]}
        ]
        metrics = _admin(b, "/metrics")
        assert (
            f'plugbroker_dispatch_failures_total{{vhost="/",queue="bad"}} {fails[("/", "bad")]}\n'
            in metrics
        )
    finally:
        consumer.close()
    by.check()
    by.close()


def test_deep_headers_are_refused_and_a_redelivery_at_the_bound_works(broker_factory: Any) -> None:
    b = broker_factory(store=True)
    by = Bystander(b)
    tenant = connect(b)
    try:
        ch = tenant.channel()
        ch.queue_declare("tenant")
        with RawClient(b.port) as raw:
            raw.handshake()
            # at the bound: accepted, rejected with requeue, redelivered with x-delivery-count
            raw.send(publish_frames(1, "", "tenant", b"ok", deep_header_properties(MAX_DEPTH)))
            seen: list[amqp.Message] = []

            def on_msg(m: amqp.Message) -> None:
                seen.append(m)
                if len(seen) == 1:
                    ch.basic_reject(m.delivery_tag, requeue=True)
                else:
                    ch.basic_ack(m.delivery_tag)

            ch.basic_consume("tenant", callback=on_msg)
            drain_until(tenant, lambda: len(seen) == 2, timeout=5)
            assert seen[1].headers["x-delivery-count"] == 1
            by.check()
            # past it: the publisher's connection is closed with 502, nothing else is touched
            raw.send(publish_frames(1, "", "tenant", b"no", deep_header_properties(700)))
            code, text, class_id, method_id = raw.expect_connection_close()
            assert code == 502 and f"deeper than {MAX_DEPTH}" in text
            assert (class_id, method_id) == (60, 40)
        by.check()
        ch.basic_publish(amqp.Message("after"), "", "tenant")
        drain_until(tenant, lambda: len(seen) == 3, timeout=5)
    finally:
        tenant.close()
    by.close()


@pytest.mark.parametrize("kind", ["queue", "exchange", "binding"])
def test_a_name_with_a_lone_surrogate_is_refused_and_blocks_nobody(
    broker_factory: Any, kind: str
) -> None:
    b = broker_factory(store=True)
    by = Bystander(b)
    attacker = connect(b)
    ch = attacker.channel()
    ch.queue_declare("fine", durable=True, auto_delete=False)
    with pytest.raises(amqp.exceptions.FrameSyntaxError) as info:
        if kind == "queue":
            ch.queue_declare("poison-\ud800", durable=True)
        elif kind == "exchange":
            ch.exchange_declare("poison-\udfff", "topic", durable=True)
        else:
            ch.queue_bind("fine", "amq.topic", "key.\ud800")
    assert info.value.reply_code == 502 and "UTF-8" in str(info.value)
    by.check()
    assert b.call(lambda: b.broker.alarm) is None
    by.check()
    by.close()

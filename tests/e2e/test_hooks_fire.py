"""Every hook in broker/hookspecs.py is called by the core: a recording plugin on a live broker,
one scenario with real clients, and a check that each hook fired with sensible arguments."""

from __future__ import annotations

import sys
import time
import types
from collections import defaultdict
from typing import Any

import amqp
import kombu
import pytest

from plugbroker.hookimpl import hookimpl
from plugbroker.pluginhost import hookspec_names

pytestmark = pytest.mark.e2e

CONFIG = """
<queue name="iso"><isolation><ackTimeout>150ms</ackTimeout><checkPeriod>100ms</checkPeriod>
</isolation></queue>
<queue name="dl"><deadLetter><maxRedeliveries>1</maxRedeliveries></deadLetter></queue>
"""


def recorder() -> tuple[types.ModuleType, dict[str, list[dict[str, Any]]]]:
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    mod = types.ModuleType("hook_recorder")
    for name in hookspec_names():
        if name in ("broker_register",):
            continue

        def make(hook: str):  # one function per hook, taking exactly its arguments
            import inspect

            from plugbroker import hookspecs

            params = list(inspect.signature(getattr(hookspecs, hook)).parameters)
            src = (
                f"def {hook}({', '.join(params)}):\n"
                f"    calls[{hook!r}].append(dict({', '.join(f'{p}={p}' for p in params)}))\n"
            )
            ns: dict[str, Any] = {"calls": calls}
            exec(src, ns)
            return hookimpl(ns[hook])

        setattr(mod, name, make(name))

    @hookimpl
    def broker_register(registry):
        calls["broker_register"].append({"registry": registry})

    mod.broker_register = broker_register  # type: ignore[attr-defined]
    return mod, calls


def test_every_hook_is_called_by_the_core(broker_factory):
    mod, calls = recorder()
    sys.modules["hook_recorder"] = mod
    try:
        b = broker_factory(CONFIG, plugins="<plugins><plugin>hook_recorder</plugin></plugins>")
        scenario(b)
        b.running.reload()  # broker_config_reloaded
        b.call(lambda: b.broker.raise_alarm("memory", "test"))  # broker_alarm_changed
        b.call(lambda: b.broker.clear_alarm("memory"))
        b.stop()  # broker_shutdown, connection closed
    finally:
        sys.modules.pop("hook_recorder", None)
    missing = [n for n in hookspec_names() if not calls.get(n)]
    assert missing == []
    assert [(c["name"], c["raised"]) for c in calls["broker_alarm_changed"]] == [
        ("memory", True),
        ("memory", False),
    ]
    # a few arguments, to be sure they are the right ones
    published = calls["broker_message_published"]
    assert any(c["exchange"] == "" and c["queues"] == ("plain",) for c in published)
    assert any(c["reason"] == "delivery_limit" for c in calls["broker_message_dead_lettered"])
    assert any(c["reason"] == "maxlen" for c in calls["broker_message_dropped"])
    [iso] = calls["broker_consumer_isolated"][:1]
    assert iso["queue"] == "iso" and iso["moved"] >= 1
    assert {c["outcome"] for c in calls["broker_policy_action"]} >= {"applied"}
    assert any(c["queue"] == "dl" for c in calls["broker_delivery_limit"])
    assert any(
        c["queue"] == "plain" and c["reason"] == "purged" for c in calls["broker_message_removed"]
    )
    assert any(c["reason"] == "dead-letter" for c in calls["broker_message_enqueued"])
    assert all(isinstance(c["messages"], int) for c in calls["broker_queue_deleted"])


def scenario(b) -> None:
    with kombu.Connection(b.url()) as conn:
        ch = conn.default_channel
        # declared, bound, unbound; published, delivered, acked
        ch.queue_declare("plain", durable=False, auto_delete=False)
        ch.queue_bind("plain", "amq.topic", "a.b")
        ch.queue_unbind("plain", "amq.topic", "a.b")
        ch.basic_publish(amqp.Message("hello"), "", "plain")
        m = ch.basic_get("plain")
        ch.basic_ack(m.delivery_tag)
        # purged (removed)
        ch.basic_publish(amqp.Message("purge me"), "", "plain")
        assert ch.queue_purge("plain") == 1
        # rejected with requeue (redelivered, redelivery delay, reject decision), then past the
        # delivery limit (dead-lettered to a DLQ chosen by the dead-letter target hook)
        ch.queue_declare("dl", durable=False, auto_delete=False)
        ch.basic_publish(amqp.Message("poison"), "", "dl")
        for _ in range(2):
            m = ch.basic_get("dl")
            ch.basic_reject(m.delivery_tag, True)
        # expired and dropped (no dead-letter target)
        ch.queue_declare(
            "short",
            durable=False,
            auto_delete=False,
            arguments={"x-message-ttl": 10, "x-max-length": 1},
        )
        ch.basic_publish(amqp.Message("a"), "", "short")
        ch.basic_publish(amqp.Message("b"), "", "short")  # drops "a" (maxlen)
        time.sleep(0.05)
        ch.basic_get("short")  # "b" has expired by now
        # consumers: added, select_consumer on a shared queue, isolated, released, removed
        ch.queue_declare("iso", durable=False, auto_delete=False)
        stuck = conn.channel()
        stuck.basic_qos(0, 1, False)
        held: list = []
        stuck.basic_consume("iso", callback=held.append)
        ok = conn.channel()
        ok.basic_consume("iso", callback=lambda msg: ok.basic_ack(msg.delivery_tag))
        for i in range(4):
            ch.basic_publish(amqp.Message(str(i)), "", "iso")
        # delivery touched: the stuck consumer touches its delivery once (amq.touch)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not held:
            try:
                conn.drain_events(timeout=0.05)
            except TimeoutError:
                pass
        stuck.basic_publish(
            amqp.Message(b"", application_headers={"x-touch-tag": held[0].delivery_tag}),
            "amq.touch",
        )
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not b.call(
            lambda: any(c.isolated for c in b.broker.vhosts["/"].queues["iso"].consumers)
        ):
            try:
                conn.drain_events(timeout=0.05)
            except TimeoutError:
                pass
        stuck.basic_ack(held[0].delivery_tag)  # a late ack releases it
        stuck.close()
        # deleted
        ch.queue_delete("plain")

"""Policy resolution follows bindings one at a time: the answer equals a resolution from every
binding, and a bind does not walk the queue's other bindings (n binds cost O(n), not O(n²))."""

from __future__ import annotations

import random

import pytest

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.config import parse_config
from plugbroker.config.model import VhostConfig
from plugbroker.core.policyindex import BindingPolicyIndex
from plugbroker.errors import ChannelError

CONFIG = """<broker><virtualhost name="/">
  <exchange name="orders" type="topic"/>
  <consumer><messageAge>1m</messageAge><policy name="Log"/></consumer>
  <topic key="stocks.us.*">
    <consumer><messageCount>50</messageCount><policy name="Delete"/></consumer>
  </topic>
  <topic key="orders.#" exchange="orders">
    <consumer><depth>1KB</depth><policy name="Log"/></consumer>
  </topic>
  <topic key="#" exchange="later">
    <consumer><depth>2KB</depth><policy name="Log"/></consumer>
  </topic>
</virtualhost></broker>"""


def _full(broker: Broker, q) -> dict:
    """The policy as resolved from scratch from every binding of ``q``."""
    vh = q.vhost
    vc = broker.config.vhosts[vh.name]
    bindings = []
    for b in q.bound.values():
        inner = getattr(b.source, "inner", None)
        bindings.append((b.source.name, inner.type if inner else b.source.type, b.routing_key))
    p = vc.resolve(q.name, bindings, dead_letter_target=vh.is_dead_letter_target(q))
    return {"items": dict(p.items()), "source": dict(p.source)}


def _now(q) -> dict:
    return {"items": dict(q.policy.items()), "source": dict(q.policy.source)}


def test_incremental_resolution_agrees_with_a_full_one() -> None:
    rnd = random.Random(3)
    broker = Broker(parse_config(CONFIG), clock=ManualClock())
    vh = broker.vhosts["/"]
    vh.declare_exchange("later", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    vh.declare_exchange("dlx", "topic")
    exchanges = [vh.exchanges[n] for n in ("amq.topic", "orders", "later", "amq.direct", "dlx")]
    keys = ["stocks.us.ibm", "stocks.eu.x", "orders.eu", "orders", "dead.x", "a"]
    queues = [vh.declare_queue(f"q{i}")[0] for i in range(4)]
    held: list[tuple] = []
    for step in range(600):
        q = rnd.choice(queues)
        if held and rnd.random() < 0.4:
            ex, q, key = held.pop(rnd.randrange(len(held)))
            vh.unbind(ex, q, key, {})
        else:
            ex, key = rnd.choice(exchanges), rnd.choice(keys)
            vh.bind(ex, q, key, {})
            held.append((ex, q, key))
        if step == 200:  # a dead-letter route appears: its targets stop being subscriptions
            vh.declare_queue(
                "source",
                arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead.x"},
            )
        if step == 400:
            vh.delete_queue(vh.queues["source"])
        for qq in queues:
            assert _now(qq) == _full(broker, qq), (step, qq.name)


def test_many_binds_to_one_queue_do_not_walk_its_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker(parse_config(CONFIG), clock=ManualClock())
    vh = broker.vhosts["/"]
    q, _ = vh.declare_queue("sub")
    resolved = []
    built = []
    real_resolve = VhostConfig.resolve_matched
    real_init = BindingPolicyIndex.__init__

    def counting_resolve(self, *a, **kw):
        resolved.append(1)
        return real_resolve(self, *a, **kw)

    def counting_init(self, *a, **kw):
        built.append(1)
        real_init(self, *a, **kw)

    monkeypatch.setattr(VhostConfig, "resolve_matched", counting_resolve)
    monkeypatch.setattr(BindingPolicyIndex, "__init__", counting_init)
    topic = vh.exchanges["amq.topic"]
    for i in range(3000):
        vh.bind(topic, q, f"stocks.us.k{i}" if i % 2 else f"other.{i}", {})
    assert q.policy["consumer"].message_count == 50
    # the first topic binding and the first matching one change the answer; nothing else does
    assert len(resolved) <= 2 and not built
    for i in range(3000):
        vh.unbind(topic, q, f"stocks.us.k{i}" if i % 2 else f"other.{i}", {})
    assert len(resolved) <= 4 and not built
    # no binding left: not a topic subscription, so not even the vhost's <consumer> reaches it
    assert q.policy.get("consumer") is None


def test_binding_limits_refuse_with_406_and_count() -> None:
    cfg = CONFIG.replace(
        "<broker>",
        "<broker><limits><maxBindingsPerExchange>3</maxBindingsPerExchange>"
        "<maxBindingsPerVhost>5</maxBindingsPerVhost></limits>",
    )
    broker = Broker(parse_config(cfg), clock=ManualClock())
    vh = broker.vhosts["/"]
    q, _ = vh.declare_queue("q")
    topic, orders = vh.exchanges["amq.topic"], vh.exchanges["orders"]
    for k in ("a", "b", "c"):
        vh.bind(topic, q, k, {})
    vh.bind(topic, q, "a", {})  # an existing binding again is fine
    with pytest.raises(ChannelError) as e:
        vh.bind(topic, q, "d", {})
    assert e.value.code == 406
    assert e.value.text == (
        "cannot bind queue 'q' to exchange 'amq.topic': binding limit of "
        "exchange 'amq.topic' in vhost '/' (3) is reached"
    )
    vh.bind(orders, q, "a", {})
    vh.bind(orders, q, "b", {})
    with pytest.raises(ChannelError) as e:
        vh.bind(orders, vh.exchanges["amq.fanout"], "c", {})
    assert e.value.text == (
        "cannot bind exchange 'amq.fanout' to exchange 'orders': binding "
        "limit in vhost '/' (5) is reached"
    )
    assert broker.refusals == {"maxBindingsPerExchange": 1, "maxBindingsPerVhost": 1}
    vh.unbind(topic, q, "a", {})
    vh.bind(orders, q, "c", {})  # a place was freed
    vh.delete_queue(q)  # its bindings go with it
    assert vh.binding_count == 0
    vh.bind(topic, vh.declare_queue("q2")[0], "x", {}, limited=False)
    assert vh.binding_count == 1

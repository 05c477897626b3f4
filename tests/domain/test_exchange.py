from __future__ import annotations

import pytest

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.domain.exchange import headers_match, topic_matches
from plugbroker.domain.message import Message
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import VirtualHost


@pytest.mark.parametrize(
    "pattern,key,ok",
    [
        ("stocks.us.*", "stocks.us.ibm", True),
        ("stocks.us.*", "stocks.us", False),
        ("stocks.us.*", "stocks.us.ibm.x", False),
        ("stocks.#", "stocks", True),
        ("stocks.#", "stocks.us.ibm", True),
        ("#", "", True),
        ("#.ibm", "ibm", True),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
        ("a.#.z", "a.b.c", False),
        ("*.*", "a.b", True),
        ("*", "", True),
    ],
)
def test_topic_matching(pattern, key, ok):
    assert topic_matches(pattern, key) is ok


def test_headers_matching():
    assert headers_match({"x-match": "all", "a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3})
    assert not headers_match({"x-match": "all", "a": 1, "b": 2}, {"a": 1})
    assert headers_match({"x-match": "any", "a": 1, "b": 2}, {"b": 2})
    assert not headers_match({"x-match": "any", "a": 1}, {"a": 2})


def _msg(vh, rk, headers=None):
    raw = P.encode({"application_headers": headers} if headers else {})
    return Message.from_publish(vh.ids.next(), "", rk, raw, b"", 0, 0.0, 0.0)


def test_routing_through_exchange_to_exchange_bindings_without_duplicates():
    clock = ManualClock()
    vh = VirtualHost("/", clock=clock, timers=Timers(clock))
    a = vh.declare_exchange("a", "topic")
    b = vh.declare_exchange("b", "fanout")
    q, _ = vh.declare_queue("q")
    vh.bind(a, b, "x.#", {})
    vh.bind(b, a, "", {})  # a cycle of exchanges must not loop
    vh.bind(b, q, "", {})
    vh.bind(a, q, "x.y", {})
    assert vh.route(a, _msg(vh, "x.y")) == [q]
    assert vh.route(a, _msg(vh, "z")) == []


def test_topic_cache_is_invalidated_on_unbind():
    clock = ManualClock()
    vh = VirtualHost("/", clock=clock, timers=Timers(clock))
    t = vh.exchanges["amq.topic"]
    q, _ = vh.declare_queue("q")
    vh.bind(t, q, "a.*", {})
    assert vh.route(t, _msg(vh, "a.b")) == [q]
    vh.unbind(t, q, "a.*", {})
    assert vh.route(t, _msg(vh, "a.b")) == []


def test_alternate_exchange_takes_unroutable_messages():
    clock = ManualClock()
    vh = VirtualHost("/", clock=clock, timers=Timers(clock))
    vh.declare_exchange("ae", "fanout")
    main = vh.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    q, _ = vh.declare_queue("unrouted")
    vh.bind(vh.exchanges["ae"], q, "", {})
    assert vh.route(main, _msg(vh, "nowhere")) == [q]

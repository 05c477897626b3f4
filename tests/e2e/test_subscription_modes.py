"""Subscription modes end to end: shared, exclusive, failover, key_shared, and a plugin's own
dispatch through the broker_select_consumer hook."""

from __future__ import annotations

import sys
import time
import types
from collections import Counter

import amqp
import pytest
from amqp.exceptions import AccessRefused

pytestmark = pytest.mark.e2e


def connect(b) -> amqp.Connection:
    conn = amqp.Connection(host=f"127.0.0.1:{b.port}", connect_timeout=5)
    conn.connect()
    return conn


def declare(ch: amqp.Channel, name: str, **args) -> None:
    ch.queue_declare(name, durable=False, auto_delete=False, arguments=args or None)


def consume(ch: amqp.Channel, queue: str, sink: list, tag: str = "") -> str:
    return ch.basic_consume(queue, consumer_tag=tag, no_ack=True, callback=lambda m: sink.append(m))


def publish(
    ch: amqp.Channel, queue: str, n: int, key_header: str | None = None, start: int = 0
) -> None:
    for i in range(start, start + n):
        headers = {"x-key": key_header.format(i=i)} if key_header else None
        ch.basic_publish(amqp.Message(str(i), application_headers=headers), "", queue)


def pump(conn: amqp.Connection, cond, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.1)
        except TimeoutError:
            pass


def test_shared_is_round_robin_by_default(broker):
    with connect(broker) as conn:
        ch = conn.channel()
        declare(ch, "rr")
        sinks = [[], [], []]
        for s in sinks:
            consume(ch, "rr", s)
        publish(ch, "rr", 30)
        pump(conn, lambda: sum(map(len, sinks)) == 30)
        assert [len(s) for s in sinks] == [10, 10, 10]


def test_exclusive_subscription_refuses_a_second_consumer_with_403(broker):
    with connect(broker) as conn:
        ch = conn.channel()
        declare(ch, "solo", **{"x-subscription-type": "exclusive"})
        consume(ch, "solo", [])
        ch2 = conn.channel()
        with pytest.raises(AccessRefused) as err:
            consume(ch2, "solo", [])
        assert err.value.reply_code == 403 and "exclusive" in err.value.reply_text
        assert conn.channel().queue_declare("solo", passive=True)  # connection still fine


@pytest.mark.parametrize(
    "args", [{"x-subscription-type": "failover"}, {"x-single-active-consumer": True}]
)
def test_failover_delivers_to_one_and_hands_over_in_subscription_order(broker, args):
    with connect(broker) as conn:
        ch = conn.channel()
        declare(ch, "fo", **args)
        a, b, c = [], [], []
        tag_a = consume(ch, "fo", a)
        ch_b = conn.channel()
        consume(ch_b, "fo", b)
        consume(ch, "fo", c)
        publish(ch, "fo", 5)
        pump(conn, lambda: len(a) == 5)
        assert (len(a), len(b), len(c)) == (5, 0, 0)
        ch.basic_cancel(tag_a)  # the next in order of subscription takes over
        publish(ch, "fo", 5, start=5)
        pump(conn, lambda: len(b) == 5)
        assert (len(b), len(c)) == (5, 0)
        ch_b.close()  # and on channel close/disconnect, the next again
        publish(ch, "fo", 5, start=10)
        pump(conn, lambda: len(c) == 5)
        assert [m.body for m in c] == [str(i) for i in range(10, 15)]


def test_failover_from_xml(broker_factory):
    b = broker_factory('<queue name="xml-fo" subscription="failover"/>')
    with connect(b) as conn:
        ch = conn.channel()
        declare(ch, "xml-fo")
        a, b2 = [], []
        consume(ch, "xml-fo", a)
        consume(ch, "xml-fo", b2)
        publish(ch, "xml-fo", 4)
        pump(conn, lambda: len(a) == 4)
        assert (len(a), len(b2)) == (4, 0)


def test_key_shared_keeps_keys_on_one_consumer_spreads_them_and_hands_them_over(broker):
    with connect(broker) as conn:
        ch = conn.channel()
        declare(ch, "ks", **{"x-subscription-type": "key_shared"})
        sinks: dict[str, list] = {t: [] for t in ("t0", "t1", "t2")}
        for t, s in sinks.items():
            consume(ch, "ks", s, tag=t)
        publish(ch, "ks", 300, key_header="key-{i}")
        pump(conn, lambda: sum(map(len, sinks.values())) == 300)
        keys = {t: {int(m.body) % 1000 for m in s} for t, s in sinks.items()}
        owner = {}
        for t, s in sinks.items():
            for m in s:
                owner[m.application_headers["x-key"]] = t
        assert sum(map(len, keys.values())) == 300
        assert min(len(s) for s in sinks.values()) >= 60  # spread evenly: 100 each +- noise
        # the same key again goes to the same consumer while the set is unchanged
        for s in sinks.values():
            s.clear()
        publish(ch, "ks", 300, key_header="key-{i}")
        pump(conn, lambda: sum(map(len, sinks.values())) == 300)
        for t, s in sinks.items():
            assert all(owner[m.application_headers["x-key"]] == t for m in s)
        # t0 leaves: its keys go to the others, the others keep theirs
        ch.basic_cancel("t0")
        for s in sinks.values():
            s.clear()
        publish(ch, "ks", 300, key_header="key-{i}")
        pump(conn, lambda: len(sinks["t1"]) + len(sinks["t2"]) == 300)
        for t in ("t1", "t2"):
            for m in sinks[t]:
                prev = owner[m.application_headers["x-key"]]
                assert prev in (t, "t0")


def test_key_shared_uses_the_routing_key_without_x_key(broker):
    with connect(broker) as conn:
        ch = conn.channel()
        declare(ch, "ks-rk", **{"x-subscription-type": "key_shared"})
        ch.queue_bind("ks-rk", "amq.topic", "orders.#")
        sinks = {t: [] for t in ("a", "b")}
        for t, s in sinks.items():
            consume(ch, "ks-rk", s, tag=t)
        for i in range(60):
            ch.basic_publish(amqp.Message(str(i)), "amq.topic", f"orders.{i % 6}")
        pump(conn, lambda: sum(map(len, sinks.values())) == 60)
        by_key = {}
        for t, s in sinks.items():
            for m in s:
                by_key.setdefault(m.delivery_info["routing_key"], set()).add(t)
        assert all(len(v) == 1 for v in by_key.values()) and len(by_key) == 6


def test_a_plugin_supplies_dispatch_through_the_firstresult_hook(broker_factory):
    """A plugin that always picks the consumer with the fewest deliveries so far wins over the
    core's round-robin (the hook is firstresult)."""
    from plugbroker.hookimpl import hookimpl

    mod = types.ModuleType("pick_last_plugin")
    picks: Counter[str] = Counter()

    @hookimpl
    def broker_select_consumer(vhost, queue, message, consumers):
        if queue != "picky":
            return None  # the core decides for other queues
        chosen = consumers[-1]  # always the most recent subscriber that can take one
        picks[chosen.tag] += 1
        return chosen

    mod.broker_select_consumer = broker_select_consumer  # type: ignore[attr-defined]
    sys.modules["pick_last_plugin"] = mod
    try:
        b = broker_factory(plugins="<plugins><plugin>pick_last_plugin</plugin></plugins>")
        with connect(b) as conn:
            ch = conn.channel()
            declare(ch, "picky")
            declare(ch, "plain")
            first, last, p1, p2 = [], [], [], []
            consume(ch, "picky", first, tag="first")
            consume(ch, "picky", last, tag="last")
            consume(ch, "plain", p1)
            consume(ch, "plain", p2)
            publish(ch, "picky", 10)
            publish(ch, "plain", 10)
            pump(conn, lambda: len(last) == 10 and len(p1) + len(p2) == 10)
            assert (len(first), len(last)) == (0, 10)
            assert picks == {"last": 10}
            assert (len(p1), len(p2)) == (5, 5)  # round-robin where the plugin declines
    finally:
        sys.modules.pop("pick_last_plugin", None)

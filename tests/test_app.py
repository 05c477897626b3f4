"""The Broker object without sockets: policy resolution follows bindings, reload, actions."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.config import parse_config
from plugbroker.policy import CloseConsumerChannels, DeleteQueue, LogOnly, SetPrefetch

CONFIG = """<broker><virtualhost name="/">
  <exchange name="orders" type="topic"/>
  <queue name="named">
    <consumer><messageCount>5</messageCount><policy name="Log"/></consumer>
  </queue>
  <topic key="stocks.us.*">
    <consumer><messageCount>50</messageCount><policy name="Delete"/></consumer>
  </topic>
  <topic key="orders.#" exchange="orders">
    <consumer><depth>1KB</depth><policy name="Log"/></consumer>
  </topic>
</virtualhost></broker>"""


@pytest.fixture
def broker() -> Broker:
    return Broker(parse_config(CONFIG), clock=ManualClock())


def consumer_of(q):
    return q.policy.get("consumer")


def test_queue_policy_by_name_applies_at_declare(broker):
    q, _ = broker.vhosts["/"].declare_queue("named")
    assert consumer_of(q).message_count == 5


def test_topic_policy_follows_bind_unbind_and_rebind(broker):
    vh = broker.vhosts["/"]
    q, _ = vh.declare_queue("sub")
    assert consumer_of(q) is None
    topic = vh.exchanges["amq.topic"]
    vh.bind(topic, q, "stocks.us.ibm", {})
    assert consumer_of(q).message_count == 50
    vh.unbind(topic, q, "stocks.us.ibm", {})
    assert consumer_of(q) is None
    vh.bind(vh.exchanges["orders"], q, "orders.eu.new", {})
    assert consumer_of(q).depth == 1024
    # a matching key on a direct exchange is not a topic subscription
    q2, _ = vh.declare_queue("direct-sub")
    vh.bind(vh.exchanges["amq.direct"], q2, "stocks.us.ibm", {})
    assert consumer_of(q2) is None


VHOST_CONSUMER = """<broker><virtualhost name="/">
  <consumer><messageAge>1m</messageAge><policy name="Delete"/></consumer>
  <queue name="named-dlq">
    <consumer><messageCount>5</messageCount><policy name="Log"/></consumer>
  </queue>
</virtualhost></broker>"""


@pytest.fixture
def vhost_consumer() -> Broker:
    return Broker(parse_config(VHOST_CONSUMER), clock=ManualClock())


def test_vhost_consumer_reaches_topic_subscriptions_only(vhost_consumer):
    vh = vhost_consumer.vhosts["/"]
    work, _ = vh.declare_queue("celery")  # the default exchange only
    vh.bind(vh.exchanges["amq.direct"], work, "celery", {})
    fan, _ = vh.declare_queue("fan")
    vh.bind(vh.exchanges["amq.fanout"], fan, "", {})
    sub, _ = vh.declare_queue("sub")
    vh.bind(vh.exchanges["amq.topic"], sub, "stocks.#", {})
    assert consumer_of(work) is None and consumer_of(fan) is None
    assert consumer_of(sub).message_age == 60.0
    # a retry queue bound to a topic exchange is still a retry target
    retry, _ = vh.declare_queue("sub-RETRY", arguments={"x-retry-target": "sub"})
    vh.bind(vh.exchanges["amq.topic"], retry, "retry.#", {})
    assert consumer_of(retry) is None


def test_a_queue_reached_by_a_dead_letter_route_is_not_a_topic_subscription(vhost_consumer):
    vh = vhost_consumer.vhosts["/"]
    topic = vh.exchanges["amq.topic"]
    dlq, _ = vh.declare_queue("dead")
    vh.bind(topic, dlq, "dead.#", {})
    other, _ = vh.declare_queue("other")
    vh.bind(topic, other, "stocks.#", {})
    assert consumer_of(dlq) is not None  # nothing dead-letters there yet
    src, _ = vh.declare_queue(
        "src",
        arguments={"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "dead.src"},
    )
    # re-resolved when the route appears: the DLQ is spared, the other subscription is not
    assert consumer_of(dlq) is None and consumer_of(other) is not None
    vh.delete_queue(src)
    # once named as a dead-letter target it stays one: the dead letters it may hold are the
    # ones nothing else kept
    assert consumer_of(dlq) is None and dlq.dead_letter_target
    # a route that keeps the message's own key may reach any binding of that exchange
    vh.declare_queue("src2", arguments={"x-dead-letter-exchange": "amq.topic"})
    assert consumer_of(dlq) is None and consumer_of(other) is None


def test_a_queue_that_received_a_dead_letter_is_a_target_and_by_name_still_reached(
    vhost_consumer,
):
    from plugbroker.codec import properties as props
    from plugbroker.domain import fate
    from plugbroker.domain.message import Message

    vh = vhost_consumer.vhosts["/"]
    topic = vh.exchanges["amq.topic"]
    for name in ("named-dlq", "plain-dlq"):
        q, _ = vh.declare_queue(name)
        vh.bind(topic, q, name, {})
    plain = vh.queues["plain-dlq"]
    assert consumer_of(plain).message_age == 60.0
    src, _ = vh.declare_queue(
        "src", arguments={"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "x"}
    )
    vh.bind(vh.exchanges["amq.direct"], plain, "x", {})  # the route reaches it
    assert consumer_of(plain) is None
    vh.delete_queue(src)
    assert consumer_of(plain) is None  # named as a target once: for good
    # a dead letter routed to one (as the dead-letter plugin's target does) marks it for good
    late, _ = vh.declare_queue("late-dlq")
    vh.bind(topic, late, "late-dlq", {})
    assert consumer_of(late).message_age == 60.0
    src, _ = vh.declare_queue(
        "src", arguments={"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "z"}
    )
    assert consumer_of(late).message_age == 60.0  # the route does not reach it
    m = Message.from_publish(vh.ids.next(), "", "late-dlq", props.encode({}), b"x", 1, 0.0, 0.0)
    vh.deliver_to_queues([src], m)
    [held] = list(src.ready)
    assert src.take_ready(held)
    vh.bind(topic, late, "z", {})  # now it does, and a dead letter arrives
    fate.dead_letter(src, held, "expired")
    vh.delete_queue(src)
    vh.unbind(topic, late, "z", {})
    assert late.dead_letter_target and consumer_of(late) is None
    assert consumer_of(vh.queues["named-dlq"]).message_count == 5  # <queue name> reaches it


def test_reload_applies_to_running_queues(broker):
    vh = broker.vhosts["/"]
    q, _ = vh.declare_queue("named")
    broker.reload(parse_config(CONFIG.replace("<messageCount>5<", "<messageCount>7<")))
    assert consumer_of(q).message_count == 7


def test_runner_reload_refuses_an_invalid_file_and_keeps_the_running_config(tmp_path: Path):
    import asyncio

    from plugbroker.runner import start_broker

    path = tmp_path / "b.xml"
    path.write_text(CONFIG.replace("<broker>", '<broker><listen host="127.0.0.1" port="0"/>'))

    async def scenario() -> None:
        running = await start_broker(path, port=0)
        try:
            q, _ = running.broker.vhosts["/"].declare_queue("named")
            path.write_text(CONFIG.replace("<messageCount>5<", "<messageCount>ten<"))
            assert running.reload() is False
            assert consumer_of(q).message_count == 5
            path.write_text(CONFIG.replace("<messageCount>5<", "<messageCount>9<"))
            assert running.reload() is True
            assert consumer_of(q).message_count == 9
        finally:
            await running.stop()

    asyncio.run(scenario())


def test_actions_are_rechecked_before_they_apply(broker):
    vh = broker.vhosts["/"]
    vh.declare_queue("q")
    outcomes = broker.apply_actions(
        [
            LogOnly(vhost="/", queue="q", policy="Log", reason="dry run"),
            SetPrefetch(vhost="/", queue="q", policy="P", reason="r", consumer_tag="nobody"),
            DeleteQueue(vhost="/", queue="q", policy="Delete", reason="r"),
            CloseConsumerChannels(vhost="/", queue="q", policy="Delete", reason="r"),
        ]
    )
    assert outcomes == ["logged", "stale", "applied", "stale"]
    assert "q" not in vh.queues


def test_snapshot_is_running_figures(broker):
    vh = broker.vhosts["/"]
    _q, _ = vh.declare_queue("named")
    snap = broker.snapshot()
    [view] = [v for v in snap.queues if v.name == "named"]
    assert (view.message_count, view.message_bytes, view.oldest_arrival) == (0, 0, None)
    assert view.policy["consumer"].message_count == 5


def test_an_external_login_needs_a_user_and_keeps_the_loopback_rule() -> None:
    b = Broker(
        parse_config(
            '<broker><users><user name="alice" password="a"/>'
            '<user name="local" password="l" loopbackOnly="true"/></users></broker>'
        ),
        clock=ManualClock(),
    )
    assert b.external_login_refusal("alice", "10.0.0.7") is None
    assert b.external_login_refusal("local", "127.0.0.1") is None
    assert "only connect via localhost" in (b.external_login_refusal("local", "10.0.0.7") or "")
    assert "not a configured user" in (b.external_login_refusal("nobody", "127.0.0.1") or "")

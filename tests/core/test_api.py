"""The core API on a real broker, driven by real py-amqp clients: its views say what the clients
did, its commands do what a client sees."""

from __future__ import annotations

import dataclasses
from typing import Any

import amqp
import pytest
from brokerutil import drain_until

from plugbroker.core import api as api_mod
from plugbroker.core.api import BrokerAPI, NotFound

pytestmark = pytest.mark.e2e


def connect(broker: Any) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{broker.port}", userid="guest", password="guest")
    conn.connect()
    return conn


def api_of(broker: Any) -> BrokerAPI:
    api: BrokerAPI = broker.broker.api
    return api


def test_views_show_what_clients_did_and_are_frozen_copies(broker):
    api = api_of(broker)
    conn = connect(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("jobs", durable=False, auto_delete=False)
        ch.queue_bind("jobs", "amq.topic", "jobs.#")
        ch.basic_qos(0, 5, False)
        for i in range(3):
            ch.basic_publish(amqp.Message(f"m{i}"), exchange="amq.topic", routing_key="jobs.a")
        got: list[amqp.Message] = []
        ch.basic_consume("jobs", consumer_tag="worker", callback=got.append)
        drain_until(conn, lambda: len(got) == 3)

        q = broker.call(api.queue, "/", "jobs")
        assert (q.messages, q.ready, q.unacked, q.consumers) == (3, 0, 3, 1)
        assert ("amq.topic", "topic", "jobs.#") in q.bindings
        with pytest.raises(dataclasses.FrozenInstanceError):
            q.messages = 0  # type: ignore[misc]

        [c] = broker.call(api.consumers, "/", "jobs")
        assert (c.tag, c.unacked, c.prefetch, c.isolated) == ("worker", 3, 5, False)
        [info] = [x for x in broker.call(api.connections) if x.id == c.connection_id]
        assert info.user == "guest" and info.vhost == "/"
        [chan] = broker.call(api.channels, c.connection_id)
        assert chan.consumers == ("worker",) and chan.unacked == 3
        deliveries = [d for d in broker.call(lambda: list(api.deliveries())) if d.queue == "jobs"]
        assert sorted(d.delivery_tag for d in deliveries) == [1, 2, 3]
        peek = broker.call(lambda: api.messages("/", "jobs", ready_only=False))
        assert [m.routing_key for m in peek] == ["jobs.a"] * 3

        got[0].channel.basic_ack(got[0].delivery_tag)
        drain_until(conn, lambda: broker.call(api.queue, "/", "jobs").messages == 2)
        assert q.messages == 3  # the view taken before is a copy of its moment
    finally:
        conn.close()


def test_commands_act_as_clients_see_them(broker):
    api = api_of(broker)
    conn = connect(broker)
    bystander = connect(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("work", auto_delete=False)
        for i in range(4):
            ch.basic_publish(amqp.Message(f"m{i}"), routing_key="work")
        got: list[amqp.Message] = []
        ch.basic_consume("work", consumer_tag="slow", callback=got.append)
        drain_until(conn, lambda: len(got) == 4)
        [c] = broker.call(api.consumers, "/", "work")

        # isolate: its unacked messages go back to the queue, redelivered
        assert broker.call(api.isolate, "/", "work", "slow", c.connection_id) == 4
        q = broker.call(api.queue, "/", "work")
        assert (q.ready, q.unacked) == (4, 0)
        assert broker.call(api.consumer, "/", "work", "slow").isolated
        assert broker.call(lambda: api.release("/", "work", "slow", reason="operator"))
        assert not broker.call(api.consumer, "/", "work", "slow").isolated

        # close a channel with a code the client sees; the connection stays usable
        closed = broker.call(api.close_channel, c.connection_id, c.channel_id, 506, "go away")
        assert closed
        with pytest.raises(amqp.exceptions.AMQPError) as err:
            drain_until(conn, lambda: False, timeout=1.0)
        assert err.value.reply_code == 506
        ch2 = conn.channel()
        ch2.queue_declare("work", passive=True)

        # purge, then delete with the messages it held
        assert broker.call(api.purge_queue, "/", "work") == 4
        ch2.basic_publish(amqp.Message("x"), routing_key="work")
        drain_until(conn, lambda: broker.call(api.queue, "/", "work").messages == 1)
        assert broker.call(lambda: api.delete_queue("/", "work", reason="test")) == 1
        assert broker.call(api.queue, "/", "work") is None
        with pytest.raises(NotFound, match="no queue 'work' in vhost '/'"):
            broker.call(api.purge_queue, "/", "work")

        # the bystander on another connection publishes with confirms throughout
        bch = bystander.channel()
        bch.confirm_select()
        bch.queue_declare("other", auto_delete=False)
        bch.basic_publish(amqp.Message("still here"), routing_key="other")
        assert broker.call(api.queue, "/", "other").messages == 1
    finally:
        bystander.close()
        try:
            conn.close()
        except Exception:
            pass


def test_close_connection_sends_320_connection_forced(broker):
    api = api_of(broker)
    conn = connect(broker)
    conn.channel()
    [info] = broker.call(api.connections)
    assert broker.call(api.close_connection, info.id, "operator says so")
    with pytest.raises(amqp.exceptions.ConnectionForced) as err:
        drain_until(conn, lambda: False, timeout=1.0)
    assert err.value.reply_code == 320
    assert "CONNECTION_FORCED - operator says so" in str(err.value)
    assert not broker.call(api.close_connection, "no-such-connection", "x")


USERS = (
    '<user name="guest" password="guest" vhosts="/ other"/>'
    '<user name="alice" passwordHash="kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"'
    ' tags="management" loopbackOnly="true">'
    '<permission vhost="other" configure="^alice-" write="" read=".*"/></user>'
    '<user name="remote" password="pw" loopbackOnly="false"/>'
)


def test_user_view_and_authenticate_with_the_loopback_rule(broker_factory):
    broker = broker_factory(users=USERS)
    api = api_of(broker)
    alice = broker.call(api.user, "alice")
    assert alice.name == "alice" and alice.tags == {"management"} and alice.loopback_only
    assert dict(alice.permissions) == {"other": api_mod.VhostPermission("^alice-", "", ".*")}
    assert alice.may_access("other") and not alice.may_access("/")
    with pytest.raises(TypeError):
        alice.permissions["/"] = alice.permissions["other"]  # type: ignore[index]
    assert broker.call(api.user, "nobody") is None
    assert not hasattr(alice, "password") and not hasattr(alice, "password_hash")

    auth = api.authenticate
    assert broker.call(auth, "alice", "test12")  # RabbitMQ's hash of "test12"
    assert broker.call(auth, "alice", "test12", "127.0.0.1")
    assert broker.call(auth, "alice", "test12", "::1")
    assert not broker.call(auth, "alice", "test12", "10.1.2.3")
    assert not broker.call(auth, "alice", "wrong", "127.0.0.1")
    assert broker.call(auth, "remote", "pw", "10.1.2.3")
    assert not broker.call(auth, "nobody", "", None)


@pytest.mark.parametrize("name", ["poison-\ud800", "q" * 256, "é" * 128])
def test_declare_queue_refuses_a_name_a_client_could_not_send(broker: Any, name: str) -> None:
    from plugbroker.errors import ChannelError

    api = api_of(broker)
    with pytest.raises(ChannelError) as info:
        api.call_on_loop(lambda: api.declare_queue("/", name, durable=True))
    assert info.value.code == 406
    assert not api.call_on_loop(api.has_queue, "/", name)

"""The limits on what one tenant may hold: channels per user, consumers per channel and per
vhost, refused with RabbitMQ's codes and texts while a bystander elsewhere goes on."""

from __future__ import annotations

from typing import Any

import amqp
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

USERS = (
    '<user name="guest" password="guest" vhosts="/ other"/>'
    '<user name="alice" password="alice" vhosts="other"/>'
)


def _amqp(b: Any, user: str = "guest", vhost: str = "/", **kw: Any) -> amqp.Connection:
    c = amqp.Connection(f"127.0.0.1:{b.port}", userid=user, password=user, virtual_host=vhost, **kw)
    c.connect()
    return c


class Bystander:
    def __init__(self, b: Any) -> None:
        self.conn = _amqp(b, "alice", "other", confirm_publish=True)
        self.ch = self.conn.channel()
        self.ch.queue_declare("bystander", auto_delete=False)
        self.sent = 0

    def publish(self, n: int = 3) -> None:
        for _ in range(n):
            self.ch.basic_publish(amqp.Message(b"b", delivery_mode=2), routing_key="bystander")
            self.sent += 1
        assert self.ch.queue_declare("bystander", passive=True).message_count == self.sent


def test_max_channels_per_user_counts_over_connections_and_frees_on_close(
    broker_factory: Any,
) -> None:
    b = broker_factory(
        limits="<limits><maxChannelsPerUser>4</maxChannelsPerUser></limits>", users=USERS
    )
    bystander = Bystander(b)
    first, second = _amqp(b), _amqp(b)
    try:
        held = [first.channel() for _ in range(3)]
        second.channel()
        bystander.publish()
        with pytest.raises(amqp.exceptions.NotAllowed) as info:
            second.channel()
        assert info.value.reply_code == 530
        assert info.value.reply_text == (
            "NOT_ALLOWED - number of channels opened for user 'guest' has reached the maximum "
            "allowed user limit of (4)"
        )
        # the refused connection is closed; closing channels on another frees places
        held[0].close()
        held[1].close()
        third = _amqp(b)
        for _ in range(3):  # 1 left on the first connection, 3 here
            third.channel()
        with pytest.raises(amqp.exceptions.NotAllowed):
            third.channel()
        bystander.publish()
        refusals = b.call(lambda: dict(b.broker.refusals))
        assert refusals["maxChannelsPerUser"] == 2
    finally:
        for c in (first, second, bystander.conn):
            try:
                c.close()
            except Exception:
                pass


def test_max_consumers_per_channel_and_per_vhost_refuse_with_530(broker_factory: Any) -> None:
    b = broker_factory(
        limits="<limits><maxConsumersPerChannel>2</maxConsumersPerChannel>"
        "<maxConsumersPerVhost>3</maxConsumersPerVhost></limits>",
        users=USERS,
    )
    bystander = Bystander(b)
    conn = _amqp(b)
    try:
        ch = conn.channel()
        ch.queue_declare("work", auto_delete=False)
        ch.basic_consume("work", callback=lambda m: None)
        ch.basic_consume("work", callback=lambda m: None)
        with pytest.raises(amqp.exceptions.NotAllowed) as info:
            ch.basic_consume("work", callback=lambda m: None)
        assert info.value.reply_text == "NOT_ALLOWED - reached maximum (2) of consumers per channel"
        bystander.publish()
        # the refused connection's consumers are gone: three fit in the vhost, not four
        conn = _amqp(b)
        chs = [conn.channel() for _ in range(2)]
        chs[0].basic_consume("work", callback=lambda m: None)
        chs[0].basic_consume("work", callback=lambda m: None)
        chs[1].basic_consume("work", callback=lambda m: None)
        assert b.call(lambda: b.broker.vhosts["/"].consumer_count) == 3
        with pytest.raises(amqp.exceptions.NotAllowed) as info:
            chs[1].basic_consume("work", callback=lambda m: None)
        assert info.value.reply_text == (
            "NOT_ALLOWED - reached maximum (3) of consumers in vhost '/'"
        )
        assert b.call(lambda: b.broker.vhosts["/"].consumer_count) == 0
        bystander.publish()
    finally:
        for c in (conn, bystander.conn):
            try:
                c.close()
            except Exception:
                pass


def test_the_default_limits_apply_without_a_limits_element(broker_factory: Any) -> None:
    b = broker_factory()
    lim = b.call(lambda: b.broker.config.limits)
    assert (
        lim.max_connections_per_user,
        lim.max_channels_per_user,
        lim.max_queues_per_vhost,
        lim.max_bindings_per_exchange,
        lim.max_bindings_per_vhost,
        lim.max_consumers_per_channel,
        lim.max_consumers_per_vhost,
    ) == (1000, 10_000, 20_000, 50_000, 100_000, 1000, 50_000)
    # the vhost gets the binding limits
    assert b.call(lambda: b.broker.vhosts["/"].max_bindings_per_vhost) == 100_000

"""Tenants stay apart on the AMQP door: ``user_id`` must be the connection's user (406, in
RabbitMQ's words, unless the user has the ``impersonator`` tag), and a retry through
``amq.retry`` is a write of the retry queue, authorized for the connection that asks.

Each hostile publish is followed by a bystander (another user, another connection)
publishing with confirms: one client's refusal never touches another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import amqp
import pytest
from brokerutil import BrokerThread

from plugbroker.retry import RetryError, reconsume_later

pytestmark = pytest.mark.e2e

USERS = (
    '<user name="guest" password="guest" vhosts="/"/>'
    '<user name="bob" password="pw">'
    '<permission vhost="/" configure="^bob-" write="^(bob-.*|amq\\.default|amq\\.retry)$" '
    'read="^bob-"/></user>'
    '<user name="alice" password="pw" vhosts="/"/>'
    '<user name="relay" password="pw" vhosts="/" tags="impersonator"/>'
)
#: bob-own retries into bob-own-retry (his); bob-shared into shared-retry (not his)
QUEUES = (
    "<queue name='bob-own'><deadLetter><retry><queue>bob-own-retry</queue>"
    "<levels>1s</levels></retry></deadLetter></queue>"
    "<queue name='bob-shared'><deadLetter><retry><queue>shared-retry</queue>"
    "<levels>1s</levels></retry></deadLetter></queue>"
)


@pytest.fixture
def b(broker_factory: Callable[..., BrokerThread]) -> Iterator[BrokerThread]:
    broker = broker_factory(QUEUES, users=USERS)
    setup = amqp.Connection(f"127.0.0.1:{broker.port}", userid="guest", password="guest")
    setup.connect()
    ch = setup.channel()
    for q in ("bob-in", "bystander", "bob-own", "bob-shared"):
        ch.queue_declare(q, durable=False, auto_delete=False)
    setup.close()
    yield broker


def connect(b: BrokerThread, user: str, password: str = "pw", **kw: object) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid=user, password=password, **kw)
    conn.connect()
    return conn


class Bystander:
    def __init__(self, b: BrokerThread) -> None:
        self.conn = connect(b, "guest", "guest", confirm_publish=True)
        self.ch = self.conn.channel()

    def publishes(self) -> None:
        self.ch.basic_publish(amqp.Message(b"still here"), exchange="", routing_key="bystander")


def held(b: BrokerThread, queue: str) -> int:
    return int(b.call(lambda: b.broker.vhosts["/"].queues[queue].ready_count))


def test_a_forged_user_id_is_refused_in_rabbitmqs_words(b: BrokerThread) -> None:
    by = Bystander(b)
    bob = connect(b, "bob")
    ch = bob.channel()
    with pytest.raises(amqp.exceptions.PreconditionFailed) as info:
        ch.basic_publish(amqp.Message(b"x", user_id="alice"), exchange="", routing_key="bob-in")
        ch.basic_qos(0, 0, False)  # a round trip: the asynchronous refusal lands here
    assert info.value.reply_code == 406
    assert info.value.reply_text == (
        "PRECONDITION_FAILED - user_id property set to 'alice' but authenticated user was 'bob'"
    )
    by.publishes()
    assert held(b, "bob-in") == 0
    # his own name, or none, goes through; the connection stayed usable
    ch = bob.channel()
    ch.confirm_select()
    ch.basic_publish(amqp.Message(b"x", user_id="bob"), exchange="", routing_key="bob-in")
    ch.basic_publish(amqp.Message(b"y"), exchange="", routing_key="bob-in")
    assert held(b, "bob-in") == 2
    # in a transaction the refusal comes at the publish, not the commit
    tx = bob.channel()
    tx.tx_select()
    with pytest.raises(amqp.exceptions.PreconditionFailed):
        tx.basic_publish(amqp.Message(b"x", user_id="alice"), exchange="", routing_key="bob-in")
        tx.tx_commit()
    by.publishes()
    assert held(b, "bob-in") == 2
    bob.close()


def test_an_impersonator_may_publish_as_another_user(b: BrokerThread) -> None:
    relay = connect(b, "relay")
    ch = relay.channel()
    ch.confirm_select()
    ch.basic_publish(amqp.Message(b"x", user_id="alice"), exchange="", routing_key="bystander")
    got = ch.basic_get("bystander", no_ack=True)
    assert got is not None and got.properties["user_id"] == "alice"
    relay.close()


def test_a_retry_is_a_write_of_the_retry_queue(b: BrokerThread) -> None:
    by = Bystander(b)
    setup = connect(b, "guest", "guest")
    sch = setup.channel()
    for q in ("bob-own", "bob-shared"):
        sch.basic_publish(amqp.Message(b"task"), exchange="", routing_key=q)
    sch.basic_qos(0, 0, False)
    setup.close()
    bob = connect(b, "bob")
    ch = bob.channel()
    mine = ch.basic_get("bob-own")
    assert mine is not None
    reconsume_later(mine, delay=1)  # his own retry queue: accepted
    shared = ch.basic_get("bob-shared")
    assert shared is not None
    with pytest.raises(RetryError) as info:
        reconsume_later(shared, delay=1)
    assert (
        "ACCESS_REFUSED - write access to queue 'shared-retry' in vhost '/' refused for "
        "user 'bob'" in str(info.value)
    )
    by.publishes()
    assert held(b, "shared-retry") == 0
    assert held(b, "bob-own-retry") == 0  # held as delayed, not ready
    counts = b.call(lambda: {q.name: q.messages for q in b.broker.api.queues("/")})
    assert counts["bob-own-retry"] == 1 and counts["shared-retry"] == 0
    bob.close()

"""Access control with real clients: RabbitMQ's permission table (each operation allowed and
refused, with its exact refusal text, the connection staying usable), vhost access, hashed
passwords, loopback-only users and revocation on reload.

Every refusal is followed by a bystander (another user, another connection) publishing with
publisher confirms: one client's refusal never touches another.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import kombu
import pika
import pika.exceptions
import pytest
from brokerutil import BrokerThread, drain_until, write_config
from rawclient import decode_method, method_frame, parse_frames

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.codec.frames import PROTOCOL_HEADER
from plugbroker.config import parse_config
from plugbroker.session import Connection

pytestmark = pytest.mark.e2e


def rabbit_hash(password: str, salt: bytes, algorithm: str = "sha256") -> str:
    """RabbitMQ's password hash, computed here independently of the broker's code."""
    digest = hashlib.new(algorithm, salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


#: bob's password as RabbitMQ stores it (SHA-256 over a fixed salt: a known vector)
BOB_HASH = rabbit_hash("bob-pw", b"\x0b\x0b\x0b\x0b")
DAVE_HASH = rabbit_hash("dave-pw", b"\xde\xad\xbe\xef", "sha512")

USERS = (
    '<user name="guest" password="guest" vhosts="/ other"/>'
    f'<user name="bob" passwordHash="{BOB_HASH}">'
    '<permission vhost="/" configure="^bob-" write="^bob-" read="^bob-"/></user>'
    # carol: server-named queues and the default exchange, as RabbitMQ's guide shows
    '<user name="carol" password="carol-pw">'
    '<permission vhost="/" configure="^(amq\\.gen.*|amq\\.default)$" '
    'write="^(amq\\.gen.*|amq\\.default)$" read="^amq\\.gen.*$"/></user>'
    f'<user name="dave" passwordHash="{DAVE_HASH}" hashingAlgorithm="sha512" vhosts="/"/>'
)


@pytest.fixture
def acl(broker_factory: Callable[..., BrokerThread]) -> Iterator[BrokerThread]:
    b = broker_factory(users=USERS)
    setup = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
    setup.connect()
    ch = setup.channel()
    ch.exchange_declare("alice-x", "direct", durable=False, auto_delete=False)
    ch.exchange_declare("bob-x", "direct", durable=False, auto_delete=False)
    ch.queue_declare("alice-q", durable=False, auto_delete=False)
    ch.queue_declare("bob-q", durable=False, auto_delete=False)
    ch.queue_declare("bystander", durable=False, auto_delete=False)
    ch.queue_bind("bob-q", "bob-x", "k")
    setup.close()
    yield b


class Bystander:
    """guest on its own connection, publishing with confirms after every refusal."""

    def __init__(self, port: int) -> None:
        self.conn = amqp.Connection(
            f"127.0.0.1:{port}", userid="guest", password="guest", confirm_publish=True
        )
        self.conn.connect()
        self.ch = self.conn.channel()
        self.sent = 0

    def publishes(self) -> None:
        # confirm_publish: basic_publish returns once the broker acked it (raises otherwise)
        self.ch.basic_publish(amqp.Message(b"still here"), exchange="", routing_key="bystander")
        self.sent += 1

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def bystander(acl: BrokerThread) -> Iterator[Bystander]:
    by = Bystander(acl.port)
    yield by
    by.close()


def login(b: BrokerThread, user: str = "bob", password: str = "bob-pw") -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid=user, password=password)
    conn.connect()
    return conn


def refused(conn: amqp.Connection, op: Callable[[Any], object], by: Bystander) -> str:
    """Run ``op`` on a fresh channel: it must be refused with 403, closing that channel only.
    Returns the reply text."""
    ch = conn.channel()
    with pytest.raises(amqp.exceptions.AccessRefused) as info:
        op(ch)
        ch.basic_qos(0, 0, False)  # a round trip: an asynchronous refusal (publish) lands here
    assert info.value.reply_code == 403
    # the connection stays usable
    ok = conn.channel()
    ok.queue_declare("bob-q", passive=True)
    ok.close()
    by.publishes()
    return str(info.value.reply_text)


def allowed(conn: amqp.Connection, op: Callable[[Any], object]) -> None:
    ch = conn.channel()
    op(ch)
    ch.basic_qos(0, 0, False)
    ch.close()


def text(kind: str, resource: str, name: str, user: str = "bob") -> str:
    return (
        f"ACCESS_REFUSED - {kind} access to {resource} '{name}' in vhost '/' refused for user "
        f"'{user}'"
    )


# (operation, allowed, refused, expected refusal text)
MATRIX: list[tuple[str, Callable[[Any], object], Callable[[Any], object], str]] = [
    (
        "exchange.declare",
        lambda ch: ch.exchange_declare("bob-new", "fanout", auto_delete=False),
        lambda ch: ch.exchange_declare("alice-new", "fanout", auto_delete=False),
        text("configure", "exchange", "alice-new"),
    ),
    (
        "exchange.declare with alternate-exchange",
        lambda ch: ch.exchange_declare(
            "bob-ae", "fanout", auto_delete=False, arguments={"alternate-exchange": "bob-x"}
        ),
        lambda ch: ch.exchange_declare(
            "bob-ae2", "fanout", auto_delete=False, arguments={"alternate-exchange": "alice-x"}
        ),
        text("write", "exchange", "alice-x"),
    ),
    (
        "exchange.delete",
        lambda ch: (
            ch.exchange_declare("bob-gone", "fanout", auto_delete=False),
            ch.exchange_delete("bob-gone"),
        ),
        lambda ch: ch.exchange_delete("alice-x"),
        text("configure", "exchange", "alice-x"),
    ),
    (
        "queue.declare",
        lambda ch: ch.queue_declare("bob-new", auto_delete=False),
        lambda ch: ch.queue_declare("alice-new", auto_delete=False),
        text("configure", "queue", "alice-new"),
    ),
    (
        "queue.declare with x-dead-letter-exchange",
        lambda ch: ch.queue_declare(
            "bob-dl", auto_delete=False, arguments={"x-dead-letter-exchange": "bob-x"}
        ),
        lambda ch: ch.queue_declare(
            "bob-dl2", auto_delete=False, arguments={"x-dead-letter-exchange": "alice-x"}
        ),
        text("write", "exchange", "alice-x"),
    ),
    (
        "queue.delete",
        lambda ch: (ch.queue_declare("bob-gone", auto_delete=False), ch.queue_delete("bob-gone")),
        lambda ch: ch.queue_delete("alice-q"),
        text("configure", "queue", "alice-q"),
    ),
    (
        "queue.bind (read on the exchange)",
        lambda ch: ch.queue_bind("bob-q", "bob-x", "k2"),
        lambda ch: ch.queue_bind("bob-q", "alice-x", "k"),
        text("read", "exchange", "alice-x"),
    ),
    (
        "queue.bind (write on the queue)",
        lambda ch: ch.queue_bind("bob-q", "bob-x", "k3"),
        lambda ch: ch.queue_bind("alice-q", "bob-x", "k"),
        text("write", "queue", "alice-q"),
    ),
    (
        "queue.unbind",
        lambda ch: ch.queue_unbind("bob-q", "bob-x", "k2"),
        lambda ch: ch.queue_unbind("alice-q", "bob-x", "k"),
        text("write", "queue", "alice-q"),
    ),
    (
        "exchange.bind (read on the source)",
        lambda ch: ch.exchange_bind("bob-new", "bob-x", "k"),
        lambda ch: ch.exchange_bind("bob-x", "alice-x", "k"),
        text("read", "exchange", "alice-x"),
    ),
    (
        "exchange.unbind (write on the destination)",
        lambda ch: ch.exchange_unbind("bob-new", "bob-x", "k"),
        lambda ch: ch.exchange_unbind("alice-x", "bob-x", "k"),
        text("write", "exchange", "alice-x"),
    ),
    (
        "basic.publish",
        lambda ch: ch.basic_publish(amqp.Message(b"x"), exchange="bob-x", routing_key="k"),
        lambda ch: ch.basic_publish(amqp.Message(b"x"), exchange="alice-x", routing_key="k"),
        text("write", "exchange", "alice-x"),
    ),
    (
        "basic.publish to the default exchange (amq.default)",
        lambda ch: ch.basic_publish(amqp.Message(b"x"), exchange="bob-x", routing_key="k"),
        lambda ch: ch.basic_publish(amqp.Message(b"x"), exchange="", routing_key="bob-q"),
        text("write", "exchange", "amq.default"),
    ),
    (
        "basic.get",
        lambda ch: ch.basic_get("bob-q", no_ack=True),
        lambda ch: ch.basic_get("alice-q"),
        text("read", "queue", "alice-q"),
    ),
    (
        "basic.consume",
        lambda ch: ch.basic_consume("bob-q", callback=lambda m: None),
        lambda ch: ch.basic_consume("alice-q", callback=lambda m: None),
        text("read", "queue", "alice-q"),
    ),
    (
        "queue.purge",
        lambda ch: ch.queue_purge("bob-q"),
        lambda ch: ch.queue_purge("alice-q"),
        text("read", "queue", "alice-q"),
    ),
]


def test_permission_matrix(acl: BrokerThread, bystander: Bystander) -> None:
    conn = login(acl)
    try:
        for name, ok, bad, want in MATRIX:
            allowed(conn, ok)
            got = refused(conn, bad, bystander)
            assert got == want, name
        assert bystander.sent == len(MATRIX)
    finally:
        conn.close()


def test_passive_declares_need_no_permission(acl: BrokerThread, bystander: Bystander) -> None:
    conn = login(acl)
    try:
        allowed(conn, lambda ch: ch.queue_declare("alice-q", passive=True))
        allowed(conn, lambda ch: ch.exchange_declare("alice-x", "direct", passive=True))
        bystander.publishes()
    finally:
        conn.close()


def test_server_named_queues_and_the_default_exchange(
    acl: BrokerThread, bystander: Bystander
) -> None:
    # bob may configure bob-* only: a server-named queue is checked under its amq.gen- name
    conn = login(acl)
    try:
        got = refused(conn, lambda ch: ch.queue_declare("", exclusive=True), bystander)
        assert re.fullmatch(
            re.escape("ACCESS_REFUSED - configure access to queue '")
            + r"amq\.gen-[\w-]+"
            + re.escape("' in vhost '/' refused for user 'bob'"),
            got,
        ), got
    finally:
        conn.close()
    # carol's patterns are RabbitMQ's example for server-named queues and the default exchange
    conn = login(acl, "carol", "carol-pw")
    try:
        ch = conn.channel()
        ch.confirm_select()
        qname, _, _ = ch.queue_declare("", exclusive=True)
        assert qname.startswith("amq.gen-")
        ch.basic_publish(amqp.Message(b"to myself"), exchange="", routing_key=qname)
        got_msgs: list[amqp.Message] = []
        ch.basic_consume(qname, callback=got_msgs.append, no_ack=True)
        drain_until(conn, lambda: len(got_msgs) == 1)
        assert got_msgs[0].body == b"to myself"
        got = refused(conn, lambda c: c.queue_declare("named", auto_delete=False), bystander)
        assert got == text("configure", "queue", "named", "carol")
    finally:
        conn.close()


def test_vhost_without_permission_is_not_allowed(acl: BrokerThread, bystander: Bystander) -> None:
    conn = amqp.Connection(
        f"127.0.0.1:{acl.port}", userid="bob", password="bob-pw", virtual_host="other"
    )
    with pytest.raises(amqp.exceptions.NotAllowed) as info:
        conn.connect()
    assert info.value.reply_code == 530
    assert info.value.reply_text == "NOT_ALLOWED - access to vhost 'other' refused for user 'bob'"
    bystander.publishes()


def test_hashed_password_login_with_each_client(acl: BrokerThread, bystander: Bystander) -> None:
    url = f"amqp://bob:bob-pw@127.0.0.1:{acl.port}//"
    with kombu.Connection(url) as kc:
        kc.connect()
        ch = kc.channel()
        ch.queue_declare("bob-kombu", auto_delete=False)
    params = pika.URLParameters(f"amqp://bob:bob-pw@127.0.0.1:{acl.port}/%2F")
    pc = pika.BlockingConnection(params)
    pch = pc.channel()
    pch.queue_declare("bob-pika")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        pch.queue_declare("alice-pika")
    assert info.value.reply_code == 403
    assert info.value.reply_text == text("configure", "queue", "alice-pika")
    pc.channel().queue_declare("bob-pika", passive=True)  # the connection stays usable
    pc.close()
    # a SHA-512 hash (hashingAlgorithm="sha512")
    login(acl, "dave", "dave-pw").close()
    with pytest.raises(amqp.exceptions.AccessRefused):
        login(acl, "dave", "bob-pw")
    # a wrong password is refused as RabbitMQ refuses it
    with pytest.raises(amqp.exceptions.AccessRefused) as refused_login:
        login(acl, "bob", "bob-pw2")
    assert refused_login.value.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism AMQPLAIN. "
        "For details see the broker logfile."
    )
    bystander.publishes()


# ------------------------------------------------------------------------------- loopback-only
# A real client can reach the broker here only over loopback (tests send nothing to any other
# address), so the loopback rule is checked where the peer's address is read: a session fed
# the client's frames over a fake transport whose peer is a documentation address (RFC 5737).
# tests/core/test_api.py checks the same rule through the core API.


class _Wire:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def methods(self) -> list[tuple[str, tuple[Any, ...]]]:
        frames, _ = parse_frames(bytes(self.data))
        self.data.clear()
        return [decode_method(payload) for ftype, _, payload in frames if ftype == 1]


_LOOPBACK_USERS = """<broker>
  <users>
    <user name="guest" password="guest"/>
    <user name="local" password="pw" loopbackOnly="true"/>
    <user name="remote" password="pw"/>
  </users>
  <virtualhost name="/"/>
</broker>"""


def _login(broker: Broker, peer: str, user: str, password: str) -> tuple[Connection, _Wire]:
    wire = _Wire()
    conn = Connection(broker, wire, peer)
    response = f"\x00{user}\x00{password}".encode()
    conn.data_received(
        PROTOCOL_HEADER
        + method_frame(
            0,
            "connection.start_ok",
            {"capabilities": {"authentication_failure_close": True}},
            "PLAIN",
            response,
            "en_US",
        )
    )
    broker.end_of_turn()
    return conn, wire


@pytest.mark.parametrize("user", ["guest", "local"])
def test_loopback_only_users_are_refused_from_another_address(
    user: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Broker(parse_config(_LOOPBACK_USERS), clock=ManualClock())
    password = "guest" if user == "guest" else "pw"
    with caplog.at_level(logging.WARNING, logger="broker"):
        _, wire = _login(broker, "192.0.2.7:40000", user, password)
        # the refusal is answered after the login throttle's delay
        broker.clock.advance(broker.limits.login_failure_delay)  # type: ignore[attr-defined]
        broker.timers.run_due()
    closes = [args for name, args in wire.methods() if name == "connection.close"]
    assert closes and closes[0][:2] == (
        403,
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile.",
    )
    assert f"user '{user}' can only connect via localhost" in caplog.text
    # the same user from loopback, and another user from anywhere, are let in
    for peer, who, pw in (("127.0.0.1:40001", user, password), ("192.0.2.7:40002", "remote", "pw")):
        _, ok = _login(broker, peer, who, pw)
        assert [name for name, _ in ok.methods()][-1] == "connection.tune"


def test_a_reload_that_makes_a_remote_user_loopback_only_closes_its_connection() -> None:
    broker = Broker(parse_config(_LOOPBACK_USERS), clock=ManualClock())
    conn, wire = _login(broker, "192.0.2.7:40000", "remote", "pw")
    conn.data_received(
        method_frame(0, "connection.tune_ok", 0, 131072, 0)
        + method_frame(0, "connection.open", "/", "", False)
    )
    broker.end_of_turn()
    assert [name for name, _ in wire.methods()][-1] == "connection.open_ok"
    _, stays_wire = _login(broker, "127.0.0.1:40001", "local", "pw")
    broker.reload(
        parse_config(
            _LOOPBACK_USERS.replace(
                '"remote" password="pw"', '"remote" password="pw" loopbackOnly="1"'
            )
        )
    )
    broker.end_of_turn()
    closes = [args for name, args in wire.methods() if name == "connection.close"]
    assert closes and closes[0][:2] == (
        320,
        "CONNECTION_FORCED - user 'remote' can now connect only via localhost",
    )
    assert not [name for name, _ in stays_wire.methods() if name == "connection.close"]


# ------------------------------------------------------------------------------- revocation


def _reload(b: BrokerThread, tmp: Path, users: str) -> None:
    path = write_config(tmp, users=users, name="reloaded.xml")
    assert b.running is not None
    assert b.call(b.running.reload, path)


def test_reload_that_narrows_permissions_closes_the_channels_that_lost_read(
    acl: BrokerThread, bystander: Bystander, tmp_path: Path
) -> None:
    conn = login(acl)
    try:
        reader = conn.channel()
        reader.basic_consume("bob-q", callback=lambda m: None)
        other = conn.channel()
        other.queue_declare("bob-keep", auto_delete=False)
        narrowed = USERS.replace(
            'configure="^bob-" write="^bob-" read="^bob-"',
            'configure="^bob-" write="^bob-" read="^bob-keep$"',
        )
        _reload(acl, tmp_path, narrowed)
        with pytest.raises(amqp.exceptions.AccessRefused) as closed:
            drain_until(conn, lambda: False, timeout=3)
        # the consumer's channel closed with RabbitMQ's 403; the rest of the connection works
        assert closed.value.reply_text == text("read", "queue", "bob-q")
        assert acl.call(acl.broker.api.consumers, "/", "bob-q") == []
        other.basic_get("bob-keep")
        with pytest.raises(amqp.exceptions.AccessRefused) as info:
            other.basic_get("bob-q")  # the new patterns apply at once, no stale memo
        assert info.value.reply_text == text("read", "queue", "bob-q")
        bystander.publishes()
    finally:
        conn.close()


def test_reload_that_removes_a_user_closes_its_connections(
    acl: BrokerThread, bystander: Bystander, tmp_path: Path
) -> None:
    conn = login(acl)
    conn.channel().queue_declare("bob-q", passive=True)
    users = '<user name="guest" password="guest" vhosts="/ other"/>'
    _reload(acl, tmp_path, users)
    with pytest.raises(amqp.exceptions.ConnectionForced) as info:
        drain_until(conn, lambda: False, timeout=3)
    assert info.value.reply_code == 320
    assert info.value.reply_text == (
        "CONNECTION_FORCED - user 'bob' was removed by a configuration reload"
    )
    bystander.publishes()


def test_reload_that_takes_the_vhost_away_closes_connections(
    acl: BrokerThread, bystander: Bystander, tmp_path: Path
) -> None:
    conn = login(acl)
    users = USERS.replace(
        '<permission vhost="/" configure="^bob-"', '<permission vhost="other" configure="^bob-"'
    )
    _reload(acl, tmp_path, users)
    with pytest.raises(amqp.exceptions.ConnectionForced) as info:
        drain_until(conn, lambda: False, timeout=3)
    assert "user 'bob' lost access to vhost '/'" in info.value.reply_text
    bystander.publishes()


def test_reload_that_changes_only_tags_or_password_leaves_the_user_alone(
    acl: BrokerThread, bystander: Bystander, tmp_path: Path
) -> None:
    conn = login(acl)
    try:
        ch = conn.channel()
        ch.basic_consume("bob-q", callback=lambda m: None)
        new_hash = rabbit_hash("new-pw", b"\x01\x02\x03\x04")
        changed = USERS.replace(
            f'<user name="bob" passwordHash="{BOB_HASH}">',
            f'<user name="bob" passwordHash="{new_hash}" tags="monitoring">',
        )
        assert changed != USERS
        _reload(acl, tmp_path, changed)
        ch.basic_qos(0, 0, False)
        assert acl.call(acl.broker.api.consumers, "/", "bob-q") != []
        assert ch.is_open
        bystander.publishes()
    finally:
        conn.close()

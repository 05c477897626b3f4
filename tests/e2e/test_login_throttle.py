"""A guesser does not lock out the innocent: while one address guesses passwords (for one user
and for many), a valid user from that very address logs in at once, over AMQP and over HTTP;
only the user under attack is refused from there, and only from there.

The throttle's delays are long (30 s): the guesser's answers are still pending when the test
ends, so an answer that arrives at all within the client's timeout was not delayed.
"""

from __future__ import annotations

from collections.abc import Callable

import amqp
import pytest
from brokerutil import ADMIN_GUEST, BrokerThread
from rawclient import RawClient, http_answer, http_from, method_frame, plain_response, raw_from

from plugbroker.codec.frames import PROTOCOL_HEADER

pytestmark = pytest.mark.e2e

USERS = (
    ADMIN_GUEST
    + '<user name="alice" password="alice-pw" vhosts="/" tags="management"/>'
    + '<user name="bob" password="bob-pw" vhosts="/" tags="management"/>'
)
LIMITS = (
    "<limits><loginFailureDelay>30s</loginFailureDelay>"
    "<loginFailureDelayMax>60s</loginFailureDelayMax></limits>"
)
ATTACKER = "127.0.0.2"


def start_ok(raw: RawClient, user: str, password: str) -> None:
    raw.send(PROTOCOL_HEADER)
    raw.expect("connection.start")
    caps = {"capabilities": {"authentication_failure_close": True}}
    raw.send(
        method_frame(0, "connection.start_ok", caps, "PLAIN", plain_response(user, password), "en")
    )


def http_login(source: str, port: int, user: str, password: str) -> int:
    status, _headers, body = http_answer(http_from(source, port, user, password))
    if status == 200:
        assert body["name"] == user
    return status


class Bystander:
    """guest on 127.0.0.1, publishing with confirms."""

    def __init__(self, b: BrokerThread) -> None:
        self.conn = amqp.Connection(
            f"127.0.0.1:{b.port}", userid="guest", password="guest", confirm_publish=True
        )
        self.conn.connect()
        self.ch = self.conn.channel()
        self.ch.queue_declare("bystander", auto_delete=False)

    def check(self) -> None:
        self.ch.basic_publish(amqp.Message(b"x"), exchange="", routing_key="bystander")


def test_a_valid_user_logs_in_at_once_while_its_address_is_under_attack(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory(limits=LIMITS, admin=True, users=USERS)
    assert b.running is not None and b.running.admin is not None
    by = Bystander(b)
    hostile = []
    # the guesser: alice's password, then a spray over other names, until the address has
    # the most refusals waiting it may have (32) and more
    for i in range(40):
        raw = raw_from(ATTACKER, b.port)
        start_ok(raw, "alice" if i < 20 else f"user{i}", f"guess{i}")
        hostile.append(raw)
    by.check()
    # bob, from the guesser's address, with his right password: in at once, 10 times of 10
    for _ in range(10):
        raw = raw_from(ATTACKER, b.port)
        start_ok(raw, "bob", "bob-pw")
        raw.expect("connection.tune")
        raw.close()
        assert http_login(ATTACKER, b.running.admin.port, "bob", "bob-pw") == 200
        by.check()
    # alice is under attack from there: refused from there even with her right password ...
    raw = raw_from(ATTACKER, b.port)
    start_ok(raw, "alice", "alice-pw")
    _ch, args = raw.expect("connection.close")
    assert args[0] == 403
    raw.close()
    assert http_login(ATTACKER, b.running.admin.port, "alice", "alice-pw") == 429
    # ... and in at once from anywhere else
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="alice", password="alice-pw")
    conn.connect()
    conn.close()
    assert http_login("127.0.0.1", b.running.admin.port, "alice", "alice-pw") == 200
    # the guesses that wait are still unanswered: they were delayed, bob's answers were not
    for raw in hostile[:32]:
        raw.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            raw.sock.recv(1)
    by.check()
    for raw in hostile:
        raw.close()

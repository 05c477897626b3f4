"""Limits at the front door: connections, connections per user, queues per vhost, channel_max,
login throttling and the accept loop's back-off, with real clients.

Every test keeps a bystander on another connection publishing with confirms and checks it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import amqp
import pytest
from brokerutil import ADMIN_GUEST, write_config
from rawclient import (
    PROTOCOL_HEADER,
    RawClient,
    http_answer,
    http_from,
    method_frame,
    plain_response,
    raw_from,
)

pytestmark = pytest.mark.e2e

USERS = (
    ADMIN_GUEST
    + '<user name="bob" password="bob" vhosts="/" tags="management"/>'
    # reads the figures: guest is the one the tests below guess at
    + '<user name="ops" password="ops" vhosts="/" tags="administrator"/>'
)


def connect(b: Any, user: str = "guest", vhost: str = "/") -> amqp.Connection:
    c = amqp.Connection(
        f"127.0.0.1:{b.port}", userid=user, password=user, virtual_host=vhost, connect_timeout=5
    )
    c.connect()
    return c


class Bystander:
    """A connection publishing persistent messages with confirms on its own queue."""

    def __init__(self, b: Any) -> None:
        self.conn = connect(b)
        self.ch = self.conn.channel()
        self.ch.confirm_select()
        self.q = self.ch.queue_declare("bystander", auto_delete=False)[0]
        self.sent = 0

    def check(self) -> None:
        self.ch.basic_publish(
            amqp.Message(b"still here", delivery_mode=2), routing_key="bystander"
        )  # raises on a nack (confirm mode)
        self.sent += 1
        got = self.ch.basic_get("bystander", no_ack=True)
        assert got is not None and got.body == b"still here"

    def close(self) -> None:
        self.conn.close()


def overview(b: Any) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{b.running.admin.port}/api/overview")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"ops:ops").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def metrics(b: Any) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{b.running.admin.port}/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"ops:ops").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


def test_max_connections_refuses_with_530_and_frees_a_place_on_close(broker_factory) -> None:
    b = broker_factory(
        limits="<limits><maxConnections>2</maxConnections></limits>", admin=True, users=USERS
    )
    by = Bystander(b)
    other = connect(b, "bob")
    with pytest.raises(amqp.exceptions.NotAllowed) as e:
        connect(b)
    assert e.value.reply_code == 530
    assert "NOT_ALLOWED - Connection refused: node connection limit (2) is reached" in str(e.value)
    by.check()
    other.close()
    third = connect(b)  # a place is free again
    third.close()
    by.check()
    ov = overview(b)["limits"]
    assert ov["max_connections"] == 2 and ov["refusals"] == {"maxConnections": 1}
    assert 'plugbroker_limit_refusals_total{limit="maxConnections"} 1' in metrics(b)
    by.close()


def test_max_connections_per_user_counts_each_user_apart(broker_factory) -> None:
    b = broker_factory(
        limits="<limits><maxConnectionsPerUser>1</maxConnectionsPerUser></limits>", users=USERS
    )
    by = Bystander(b)  # guest's one connection
    with pytest.raises(amqp.exceptions.NotAllowed) as e:
        connect(b)
    assert e.value.reply_code == 530
    assert (
        "NOT_ALLOWED - Connection refused for user 'guest': user connection limit (1) is reached"
        in str(e.value)
    )
    bob = connect(b, "bob")  # another user has its own count
    by.check()
    bob.close()
    by.check()
    by.close()


def test_max_queues_per_vhost_refuses_a_new_queue_with_406(broker_factory) -> None:
    b = broker_factory(limits="<limits><maxQueuesPerVhost>3</maxQueuesPerVhost></limits>")
    by = Bystander(b)  # its queue is one of the three
    c = connect(b)
    ch = c.channel()
    ch.queue_declare("q1")
    ch.queue_declare("q2")
    ch.queue_declare("q2")  # declaring an existing queue again is fine
    with pytest.raises(amqp.exceptions.PreconditionFailed) as e:
        ch.queue_declare("q3")
    assert e.value.reply_code == 406
    assert (
        "PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '/' (3) is reached"
        in str(e.value)
    )
    ch = c.channel()
    with pytest.raises(amqp.exceptions.PreconditionFailed):
        ch.queue_declare("")  # a server-named queue counts too
    ch = c.channel()
    ch.queue_delete("q1")
    ch.queue_declare("q3")
    other = connect(b, vhost="other")  # each vhost has its own count
    oc = other.channel()
    for i in range(3):
        oc.queue_declare(f"o{i}")
    by.check()
    other.close()
    c.close()
    by.close()


def _put_queue(b: Any, vhost: str, name: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    port = b.running.admin.port
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}",
        method="PUT",
        data=body,
    )
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_max_queues_per_vhost_holds_for_the_admin_api_and_counts_the_config_queues(
    broker_factory,
) -> None:
    b = broker_factory(
        '<queue name="cfg-a" durable="true"/><queue name="cfg-b" durable="false"/>',
        limits="<limits><maxQueuesPerVhost>4</maxQueuesPerVhost></limits>",
        admin=True,
        users=USERS,
    )
    by = Bystander(b)  # the file's two queues and the bystander's: 3 of 4
    assert overview(b)["limits"]["vhost_queues"]["/"] == 3
    status, body = _put_queue(
        b, "/", "adm-1", b'{"durable": true, "arguments": {"x-max-length": 5}}'
    )
    assert status == 201 and body["created"] is True
    assert body["queue"]["name"] == "adm-1" and body["queue"]["durable"] is True
    assert body["queue"]["arguments"] == {"x-max-length": 5}
    status, body = _put_queue(b, "/", "adm-2")
    assert status == 400
    assert body == {
        "error": "bad_request",
        "reason": "PRECONDITION_FAILED - cannot declare queue 'adm-2': queue limit in vhost '/' "
        "(4) is reached",
    }
    # declaring an existing queue again is fine, over the limit too
    status, body = _put_queue(
        b, "/", "adm-1", b'{"durable": true, "arguments": {"x-max-length": 5}}'
    )
    assert status == 200 and body["created"] is False
    c = connect(b)
    with pytest.raises(amqp.exceptions.PreconditionFailed):
        c.channel().queue_declare("by-amqp")
    by.check()
    lim = overview(b)["limits"]
    assert lim["refusals"]["maxQueuesPerVhost"] == 2 and lim["vhost_queues"]["/"] == 4
    c.channel().queue_delete("adm-1")
    assert _put_queue(b, "other", "adm-2")[0] == 201  # each vhost has its own count
    assert _put_queue(b, "/", "adm-2")[0] == 201  # a place came free
    c.close()
    by.check()
    by.close()


def test_config_queues_over_the_limit_are_made_at_start_and_the_admin_api_refuses_more(
    broker_factory,
) -> None:
    b = broker_factory(
        "".join(f'<queue name="cfg-{i}" durable="false"/>' for i in range(3)),
        limits="<limits><maxQueuesPerVhost>2</maxQueuesPerVhost></limits>",
        admin=True,
        users=USERS,
    )
    assert overview(b)["limits"]["vhost_queues"]["/"] == 3
    status, body = _put_queue(b, "/", "one-more")
    assert status == 400 and "queue limit in vhost '/' (2) is reached" in body["reason"]
    assert _put_queue(b, "/", "cfg-1")[0] == 200  # the file's own queue, as declared


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "the body is not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"durable": "yes"}', "field durable: 'yes' is not true or false"),
        (b'{"exclusive": true}', "unknown field(s) exclusive"),
        (b'{"arguments": [1]}', "field arguments: must be a JSON object"),
    ],
)
def test_a_bad_queue_body_is_a_400_that_says_why(broker_factory, body: bytes, says: str) -> None:
    b = broker_factory(admin=True, users=USERS)
    status, answer = _put_queue(b, "/", "q", body)
    assert status == 400 and says in answer["error"], answer
    assert not b.call(lambda: b.broker.api.has_queue("/", "q"))


def test_an_admin_declare_is_checked_as_a_client_declare(broker_factory) -> None:
    b = broker_factory(admin=True, users=USERS)
    assert _put_queue(b, "/", "q", b'{"durable": true}')[0] == 201
    status, body = _put_queue(b, "/", "q", b'{"durable": false}')
    assert status == 400 and body["reason"].startswith("PRECONDITION_FAILED - ")
    status, body = _put_queue(b, "/", "bad", b'{"arguments": {"x-max-length": "many"}}')
    assert status == 400 and body["reason"].startswith("PRECONDITION_FAILED - ")
    assert _put_queue(b, "nowhere", "q")[0] == 404


def test_a_channel_above_channel_max_is_refused_with_530(broker_factory) -> None:
    b = broker_factory(limits="<limits><channelMax>4</channelMax></limits>")
    by = Bystander(b)
    with RawClient(b.port) as raw:
        tune = raw.handshake(channel=4)
        assert tune["channel_max"] == 4
        raw.method(5, "channel.open", "")
        code, text, class_id, method_id = raw.expect_connection_close()
        assert (code, class_id, method_id) == (530, 20, 10)
        assert text == "NOT_ALLOWED - channel 5 is above the negotiated channel_max (4)"
    by.check()
    by.close()


# ------------------------------------------------------------------ login throttling


def _start_ok(raw: RawClient, password: str) -> None:
    raw.send(PROTOCOL_HEADER)
    raw.expect("connection.start")
    caps = {"capabilities": {"authentication_failure_close": True}}
    raw.send(
        method_frame(
            0, "connection.start_ok", caps, "PLAIN", plain_response("guest", password), "en_US"
        )
    )


def test_failed_logins_are_answered_late_and_still_refused(broker_factory) -> None:
    b = broker_factory(
        limits="<limits><loginFailureDelay>20ms</loginFailureDelay>"
        "<loginFailureDelayMax>80ms</loginFailureDelayMax></limits>",
        admin=True,
        users=USERS,
    )
    by = Bystander(b)
    for _ in range(4):
        with pytest.raises(amqp.exceptions.AccessRefused) as e:
            amqp.Connection(
                f"127.0.0.1:{b.port}", userid="guest", password="wrong", connect_timeout=5
            ).connect()
        assert e.value.reply_code == 403
        by.check()
    lim = overview(b)["limits"]
    assert lim["login_failures"] == 4 and lim["login_throttled"] == 4
    assert lim["login_throttled_peers"] == 1
    assert "plugbroker_login_throttled_total 4" in metrics(b)
    by.close()


def test_a_peer_that_keeps_failing_does_not_slow_another_peer(broker_factory) -> None:
    # long delays: the failing peer's answers are still pending when the test ends
    b = broker_factory(
        limits="<limits><loginFailureDelay>30s</loginFailureDelay>"
        "<loginFailureDelayMax>60s</loginFailureDelayMax></limits>"
    )
    by = Bystander(b)
    hostile = []
    for _ in range(5):
        raw = raw_from("127.0.0.2", b.port)  # another peer address (loopback)
        _start_ok(raw, "wrong")
        hostile.append(raw)
    # 127.0.0.1 logs in, opens channels, publishes with confirms while 127.0.0.2 waits
    for _ in range(3):
        c = connect(b)
        c.channel().queue_declare("", exclusive=True)
        c.close()
        by.check()
    for raw in hostile:  # nothing answered yet: its refusals are still delayed
        raw.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            raw.sock.recv(1)
        raw.close()
    by.check()
    by.close()


# ------------------------------------------------------------------ admin HTTP logins


def test_failed_admin_logins_go_through_the_login_throttle(broker_factory, caplog) -> None:
    b = broker_factory(
        limits="<limits><loginFailureDelay>20ms</loginFailureDelay>"
        "<loginFailureDelayMax>80ms</loginFailureDelayMax></limits>",
        admin=True,
        users=USERS,
    )
    caplog.set_level(logging.WARNING, logger="plugbroker.admin")
    by = Bystander(b)
    port = b.running.admin.port
    for password in ("wrong", "worse", "still wrong", "no"):
        status, _headers, body = http_answer(http_from("127.0.0.1", port, "guest", password))
        assert status == 401 and body["error"] == "not_authorized"
        by.check()
    # a header that is not base64 at all is a failed login too
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"GET /api/whoami HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic !!\r\n"
        b"Connection: close\r\n\r\n"
    )
    assert http_answer(sock)[0] == 401
    # AMQP and HTTP share the throttle: the next AMQP failure from here counts as the 6th
    with pytest.raises(amqp.exceptions.AccessRefused):
        amqp.Connection(
            f"127.0.0.1:{b.port}", userid="guest", password="wrong", connect_timeout=5
        ).connect()
    lim = overview(b)["limits"]  # another user's right password is served at once
    assert lim["login_failures"] == 6 and lim["login_throttled"] == 6
    assert lim["login_throttled_peers"] == 1
    refused = [
        r.getMessage()
        for r in caplog.records
        if r.name == "plugbroker.admin" and "login refused" in r.getMessage()
    ]
    assert len(refused) == 5
    assert refused[0].endswith(
        "login refused: user 'guest' - invalid credentials (answered in 0.02 s: failed logins "
        "from 127.0.0.1 are throttled)"
    )
    assert "answered in 0.08 s" in refused[3]
    assert "not base64" in refused[4]
    by.close()


def test_an_admin_peer_that_keeps_failing_waits_and_others_are_served(broker_factory) -> None:
    # long delays: the failing peer's answers are still pending when the test ends
    b = broker_factory(
        limits="<limits><loginFailureDelay>30s</loginFailureDelay>"
        "<loginFailureDelayMax>60s</loginFailureDelayMax></limits>",
        admin=True,
        users=USERS,
    )
    by = Bystander(b)
    port = b.running.admin.port
    hostile = [http_from("127.0.0.2", port, "guest", f"guess{i}") for i in range(32)]
    # the refusals are counted (and so pending) once the server has read the requests
    for _ in range(100):
        if overview(b)["limits"]["login_failures"] == 32:
            break
        time.sleep(0.05)
    assert overview(b)["limits"]["login_failures"] == 32
    # 127.0.0.1 is served at once meanwhile, over HTTP and AMQP
    for _ in range(3):
        status, _h, body = http_answer(http_from("127.0.0.1", port, "guest", "guest"))
        assert status == 200 and body["name"] == "guest"
        by.check()
    for sock in hostile:  # nothing answered yet: the refusals are still delayed
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(1)
    # 32 refusals wait for 127.0.0.2: one more guess is answered 429 at once, and so is
    # guest's right password from there (guest is under attack there: no guess is confirmed)
    for password in ("guess", "guest"):
        status, headers, body = http_answer(http_from("127.0.0.2", port, "guest", password))
        assert status == 429 and body["error"] == "too_many_requests"
        assert int(headers["Retry-After"]) >= 30
    assert overview(b)["limits"]["login_turned_away"] == 2
    assert overview(b)["limits"]["login_failures"] == 33  # the guess counts, the right one not
    # another user from the attacking address is served at once, over HTTP and AMQP
    status, _h, body = http_answer(http_from("127.0.0.2", port, "bob", "bob"))
    assert status == 200 and body["name"] == "bob"
    by.check()
    for sock in hostile:
        sock.close()
    by.check()
    by.close()


# ------------------------------------------------------------------ accept() back-off

ACCEPT_CHILD = r"""
import asyncio, logging, resource, socket, sys
sys.path.insert(0, sys.argv[2])
from plugbroker.app import Broker
from plugbroker.config import load_config
from plugbroker.server import Server

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

async def main():
    b = Broker(load_config(sys.argv[1]))
    srv = Server(b, "127.0.0.1", 0)
    await srv.start()
    print(srv.port, flush=True)
    await srv.serve_forever()

if sys.argv[3] == "uvloop":
    import uvloop
    uvloop.install()
asyncio.run(main())
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_accept_backs_off_when_out_of_descriptors_and_serves_once_they_free_up(
    tmp_path: Path, loop: str
) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    cfg = write_config(tmp_path)
    root = str(Path(__file__).resolve().parents[2])

    def low_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc = subprocess.Popen(
        [sys.executable, "-c", ACCEPT_CHILD, str(cfg), root, loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=low_fd_limit,
        env={**os.environ, "PYTHONPATH": root},
    )
    hogs: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        by_conn = amqp.Connection(f"127.0.0.1:{port}", connect_timeout=5)
        by_conn.connect()
        by_ch = by_conn.channel()
        by_ch.confirm_select()
        by_ch.queue_declare("bystander")
        # raw sockets that never speak: the broker holds one descriptor for each until all
        # are used (the handshake timeout is 10 s, longer than this test)
        for _ in range(80):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            hogs.append(s)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait until the broker meets EMFILE
            by_ch.basic_publish(amqp.Message(b"x", delivery_mode=2), routing_key="bystander")
            if by_ch.queue_declare("bystander", passive=True)[1] >= 3:
                break
        # the bystander is served throughout
        by_ch.basic_publish(amqp.Message(b"x", delivery_mode=2), routing_key="bystander")
        for s in hogs:
            s.close()
        hogs.clear()
        # a normal client is served once descriptors are free again
        c = amqp.Connection(f"127.0.0.1:{port}", connect_timeout=5)
        c.connect()
        c.channel().queue_declare("", exclusive=True)
        c.close()
        by_ch.basic_publish(amqp.Message(b"x", delivery_mode=2), routing_key="bystander")
        by_conn.close()
    finally:
        for s in hogs:
            s.close()
        proc.terminate()
        _out, err = proc.communicate(timeout=10)
    log = err.decode()
    failures = log.count("accept() failed")
    assert failures >= 1, log[-2000:]
    assert failures <= 3, log[-2000:]  # once per interval, not once per attempt
    assert "Traceback" not in log, log[-2000:]

"""The admin server itself: JSON errors, bad parameters, timeouts, the connection bound, HTTPS."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trustme
from brokerutil import ADMIN_GUEST

from plugbroker.admin_http import AdminServer, HttpLimits
from plugbroker.cli import main as cli

pytestmark = pytest.mark.e2e

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def raw(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as is; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
            if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in chunks[0]:
                # keep-alive answers: stop once the body is complete
                head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        if len(body) >= int(line.split(b":")[1]):
                            return b"".join(chunks)
    return b"".join(chunks)


def status_and_json(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    assert b"application/json" in head, head
    return status, json.loads(body)


def get(port: int, path: str, *, scheme: str = "http", context=None):
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}")
    req.add_header("Authorization", AUTH)
    with urllib.request.urlopen(req, timeout=5, context=context) as resp:
        return json.loads(resp.read())


@pytest.fixture
def admin_port(broker_factory) -> int:
    b = broker_factory(admin=True, users=ADMIN_GUEST)
    return b.running.admin.port


def test_a_parameter_that_is_no_integer_is_a_400_in_json(admin_port: int) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        get(admin_port, "/api/queues/%2F/q/messages?limit=abc")
    assert err.value.code == 400
    assert json.loads(err.value.read()) == {"error": "parameter limit: 'abc' is not an integer"}
    with pytest.raises(urllib.error.HTTPError) as err:
        get(admin_port, "/api/queues/%2F/q/messages?limit=-1")
    assert err.value.code == 400


def test_a_negative_content_length_is_a_400_in_json(admin_port: int) -> None:
    answer = raw(
        admin_port,
        b"POST /api/reload HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
        + AUTH.encode()
        + b"\r\nContent-Length: -1\r\n\r\n",
    )
    status, body = status_and_json(answer)
    assert status == 400 and body["error"].startswith("bad request")


def test_a_bad_request_line_is_a_400_in_json(admin_port: int) -> None:
    status, body = status_and_json(raw(admin_port, b"NOT HTTP AT ALL\r\n\r\n"))
    assert status == 400 and "error" in body


def test_unknown_paths_and_methods_answer_json(admin_port: int) -> None:
    head = b"Host: localhost\r\nAuthorization: " + AUTH.encode() + b"\r\nConnection: close\r\n\r\n"
    status, body = status_and_json(raw(admin_port, b"GET /api/nothing HTTP/1.1\r\n" + head))
    assert status == 404 and body == {"error": "no such endpoint: GET /api/nothing"}
    status, body = status_and_json(raw(admin_port, b"DELETE /api/queues HTTP/1.1\r\n" + head))
    assert status == 405 and "DELETE" in body["error"]
    status, body = status_and_json(
        raw(
            admin_port,
            b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
    )
    assert status == 401 and body["error"] == "not_authorized" and "Login failed" in body["reason"]


def test_the_cli_reads_through_the_server(admin_port: int, capsys) -> None:
    url = f"http://127.0.0.1:{admin_port}"
    assert cli(["admin", "overview", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["product"] == "plugbroker"


# ------------------------------------------------------------------ limits


@pytest.fixture
def limited(broker_factory):
    """An admin server with small limits, on a broker's loop."""
    b = broker_factory(users=ADMIN_GUEST)
    servers: list[AdminServer] = []

    def start(**limits: float) -> AdminServer:
        srv = AdminServer(
            b.broker.api,
            b.running,
            "127.0.0.1",
            0,
            limits=HttpLimits(**limits),  # type: ignore[arg-type]
        )
        asyncio.run_coroutine_threadsafe(srv.start(), b.loop).result(5)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        asyncio.run_coroutine_threadsafe(srv.stop(), b.loop).result(10)


def test_headers_that_never_end_are_cut_off(limited) -> None:
    srv = limited(header_timeout=0.3)
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n")  # and never the blank line
        assert s.recv(100) == b""
    assert time.monotonic() - t0 < 3


def test_an_idle_socket_is_closed(limited) -> None:
    srv = limited(header_timeout=0.3)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        assert s.recv(100) == b""


def test_a_body_that_never_comes_is_a_408(limited) -> None:
    srv = limited(body_timeout=0.3)
    answer = raw(
        srv.port,
        b"POST /api/reload HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
        + AUTH.encode()
        + b"\r\nContent-Length: 100\r\n\r\nonly a little",
    )
    status, body = status_and_json(answer)
    assert status == 408 and "did not arrive" in body["error"]


def test_a_body_over_the_bound_is_a_413(limited) -> None:
    srv = limited(max_body=1000)
    answer = raw(
        srv.port,
        b"POST /api/reload HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
        + AUTH.encode()
        + b"\r\nContent-Length: 5000\r\n\r\n"
        + b"x" * 5000,
    )
    status, body = status_and_json(answer)
    assert status == 413 and "over 1000 bytes" in body["error"]


def whoami(s: socket.socket) -> None:
    """A logged-in request on keep-alive socket ``s``, answered 200."""
    s.sendall(
        b"GET /api/whoami HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
        + AUTH.encode()
        + b"\r\n\r\n"
    )
    got = b""
    while b"}" not in got:
        got += s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200"), got


def logged_in_socket(port: int) -> socket.socket:
    """A keep-alive socket that has answered one logged-in request."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    whoami(s)
    return s


def test_connections_over_the_bound_get_503_and_the_rest_are_served(limited) -> None:
    srv = limited(max_connections=3)
    idle = [logged_in_socket(srv.port) for _ in range(3)]
    try:
        status, body = status_and_json(raw(srv.port, b"GET /api/overview HTTP/1.1\r\n\r\n"))
        assert status == 503 and "too many" in body["error"]
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 3
    while srv.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert get(srv.port, "/api/overview")["product"] == "plugbroker"


# ------------------------------------------------------------------ https


def test_https_admin(broker_factory, tmp_path: Path, capsys, caplog) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "admin.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "admin.pem"))
    b = broker_factory(admin=True, users=ADMIN_GUEST)
    path = b.running.config.source
    text = path.read_text().replace(
        '<admin host="127.0.0.1" port="0"/>',
        f'<admin host="127.0.0.1" port="0"><tls cert="{tmp_path / "admin.pem"}" '
        f'key="{tmp_path / "admin.key"}"/></admin>',
    )
    path.write_text(text)
    b2 = broker_factory(config_path=path)
    srv = b2.running.admin
    assert srv.scheme == "https"
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    assert get(srv.port, "/api/overview", scheme="https", context=ctx)["product"] == "plugbroker"
    with caplog.at_level(logging.WARNING, logger="plugbroker.admin"):
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: no answer
            get(srv.port, "/api/overview")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not caplog.records:
            time.sleep(0.02)
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "admin https connection from 127.0.0.1" in line and "HTTP_REQUEST" in line
    url = f"https://127.0.0.1:{srv.port}"
    assert (
        cli(["admin", "queues", "--json", "--url", url, "--cacert", str(tmp_path / "ca.pem")]) == 0
    )
    assert isinstance(json.loads(capsys.readouterr().out), list)
    assert cli(["admin", "queues", "--url", url]) == 1  # our CA is not the system's


# ------------------------------------------------------------------ internal errors


def test_a_500_tells_the_client_a_reference_and_the_log_the_cause(
    broker_factory, monkeypatch, caplog
) -> None:
    b = broker_factory(admin=True, users=ADMIN_GUEST)
    srv = b.running.admin

    def broken(vhosts=None):
        raise RuntimeError("secret detail: /var/lib/plugbroker/store.db is locked")

    monkeypatch.setattr(srv.admin, "overview", broken)
    caplog.set_level(logging.ERROR, logger="plugbroker.admin")
    with pytest.raises(urllib.error.HTTPError) as err:
        get(srv.port, "/api/overview")
    assert err.value.code == 500
    assert err.value.headers["Content-Type"].startswith("application/json")
    body = json.loads(err.value.read())
    assert "secret" not in json.dumps(body) and "RuntimeError" not in json.dumps(body)
    ref = body["ref"]
    assert len(ref) == 12 and ref in body["error"]
    logged = [r for r in caplog.records if ref in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert "store.db is locked" in str(logged[0].exc_info[1])
    # the server goes on serving
    assert get(srv.port, "/api/whoami")["name"] == "guest"


# ------------------------------------------------------------------ per address, login deadline


def half_sent(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A socket that sends half a request and no more (a slowloris)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n")
    return s


def wait_closed(s: socket.socket) -> None:
    """Until the server has closed ``s`` (recv sees the end, or a reset)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass


def test_one_address_cannot_take_every_socket(limited) -> None:
    srv = limited(max_connections=10, max_connections_per_address=2)
    held = [logged_in_socket(srv.port) for _ in range(2)]
    try:
        status, body = status_and_json(raw(srv.port, b"GET /api/overview HTTP/1.1\r\n\r\n"))
        assert status == 503 and "too many" in body["error"]
        # another address is served while this one is at its bound
        with socket.create_connection(
            ("127.0.0.1", srv.port), timeout=5, source_address=("127.0.0.2", 0)
        ) as other:
            other.sendall(
                b"GET /api/whoami HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                b"Authorization: " + AUTH.encode() + b"\r\n\r\n"
            )
            answer = b""
            while chunk := other.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        assert srv.gate.refused == 1
    finally:
        for s in held:
            s.close()


def test_half_sent_requests_make_room_for_an_operator(limited) -> None:
    srv = limited(max_connections=4, max_connections_per_address=4, login_timeout=60)
    loris = [half_sent(srv.port) for _ in range(4)]
    try:
        # every socket is taken, by requests that never log in: the oldest makes room
        assert get(srv.port, "/api/overview")["product"] == "plugbroker"
        wait_closed(loris[0])
        assert srv.gate.evicted >= 1
    finally:
        for s in loris:
            s.close()


def test_a_socket_that_does_not_log_in_is_closed_early(limited) -> None:
    srv = limited(login_timeout=0.2, header_timeout=60)
    operator = logged_in_socket(srv.port)
    loris = half_sent(srv.port)
    try:
        wait_closed(loris)  # long before the 60 s the header timeout allows
        whoami(operator)  # the logged-in socket outlived the same deadline and still serves
    finally:
        operator.close()
        loris.close()

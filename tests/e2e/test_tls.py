"""amqps: kombu, py-amqp and pika over TLS; EXTERNAL by client certificate; clean refusals.

Certificates are made per test session by ``trustme`` (a CA, the broker's certificate for
127.0.0.1, client certificates whose CN names the user, and a second CA nobody trusts).
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import amqp
import kombu
import pika
import pytest
import trustme
from brokerutil import BrokerThread

from plugbroker.config import ConfigError

pytestmark = pytest.mark.e2e

HOST = "127.0.0.1"


@dataclass
class Certs:
    ca: trustme.CA
    ca_file: Path
    cert: Path
    key: Path
    #: client certificate + key (one PEM each) by name: alice, nobody (a CN no user has),
    #: stranger (CN alice, signed by an untrusted CA)
    clients: dict[str, tuple[Path, Path]]

    def sslopts(self, who: str | None = None) -> dict[str, object]:
        """py-amqp's (and kombu's) ``ssl=`` options: trust our CA, present ``who``'s cert."""
        opts: dict[str, object] = {
            "ca_certs": str(self.ca_file),
            "cert_reqs": ssl.CERT_REQUIRED,
            "server_hostname": HOST,
        }
        if who is not None:
            cert, key = self.clients[who]
            opts.update(certfile=str(cert), keyfile=str(key))
        return opts

    def client_context(self, who: str | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if who is not None:
            ctx.load_cert_chain(*map(str, self.clients[who]))
        return ctx


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert(HOST, "localhost")
    server.private_key_pem.write_to_path(str(d / "server.key"))
    with open(d / "server.pem", "wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    clients: dict[str, tuple[Path, Path]] = {}
    other_ca = trustme.CA()
    for name, issuer, cn in (
        ("alice", ca, "alice"),
        ("nobody", ca, "nobody"),
        ("stranger", other_ca, "alice"),
    ):
        cert = issuer.issue_cert(f"{name}.clients.test", common_name=cn)
        cert.cert_chain_pems[0].write_to_path(str(d / f"{name}.pem"))
        cert.private_key_pem.write_to_path(str(d / f"{name}.key"))
        clients[name] = (d / f"{name}.pem", d / f"{name}.key")
    return Certs(ca, d / "ca.pem", d / "server.pem", d / "server.key", clients)


def tls_config(tmp_path: Path, certs: Certs, attrs: str = "", *, listen: bool = True) -> Path:
    listen_el = f'<listen host="{HOST}" port="0"/>' if listen else ""
    text = f"""<?xml version="1.0"?>
<broker>
  {listen_el}
  <tls host="{HOST}" port="0" cert="{certs.cert}" key="{certs.key}" ca="{certs.ca_file}" {attrs}/>
  <users>
    <user name="guest" password="guest" vhosts="/"/>
    <user name="alice" password="alice-secret" vhosts="/"/>
  </users>
  <virtualhost name="/"/>
</broker>
"""
    path = tmp_path / "tls.xml"
    path.write_text(text)
    return path


@pytest.fixture
def tls_broker(tmp_path: Path, certs: Certs):
    started: list[BrokerThread] = []

    def start(attrs: str = "", *, listen: bool = True) -> BrokerThread:
        b = BrokerThread(tls_config(tmp_path, certs, attrs, listen=listen)).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


def tls_port(b: BrokerThread) -> int:
    assert b.running is not None and b.running.tls_port is not None
    return b.running.tls_port


# ------------------------------------------------------------------ three clients over amqps


def test_kombu_over_amqps(tls_broker, certs: Certs) -> None:
    b = tls_broker()
    url = f"amqps://guest:guest@{HOST}:{tls_port(b)}//"
    ssl_opts = {"ca_certs": str(certs.ca_file), "cert_reqs": ssl.CERT_REQUIRED}
    with kombu.Connection(url, ssl=ssl_opts) as conn:
        q = kombu.Queue("tls-kombu", routing_key="tls-kombu", durable=False)
        conn.Producer().publish({"over": "tls"}, routing_key="tls-kombu", declare=[q])
        msg = q(conn.default_channel).get(no_ack=True)
        assert msg is not None and msg.payload == {"over": "tls"}
        [peer] = b.call(lambda: [c.peer for c in b.broker.connections.values()])
        assert peer.startswith(HOST)


def test_pyamqp_over_amqps_with_confirms(tls_broker, certs: Certs) -> None:
    b = tls_broker()
    conn = amqp.Connection(
        f"{HOST}:{tls_port(b)}", userid="guest", password="guest", ssl=certs.sslopts()
    )
    conn.connect()
    try:
        ch = conn.channel()
        ch.confirm_select()
        ch.queue_declare("tls-pyamqp", auto_delete=False)
        for i in range(50):
            ch.basic_publish(amqp.Message(f"m{i}".encode()), routing_key="tls-pyamqp")
        got = [ch.basic_get("tls-pyamqp", no_ack=True).body for _ in range(50)]
        assert got == [f"m{i}".encode() for i in range(50)]
        assert b"EXTERNAL" not in conn.mechanisms  # verify="none": no client certificates
    finally:
        conn.close()


def test_pika_over_amqps(tls_broker, certs: Certs) -> None:
    b = tls_broker()
    params = pika.ConnectionParameters(
        host=HOST,
        port=tls_port(b),
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(certs.client_context(), HOST),
    )
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("tls-pika")
        ch.basic_publish("", "tls-pika", b"hello")
        _, _, body = ch.basic_get("tls-pika", auto_ack=True)
        assert body == b"hello"
    finally:
        conn.close()


def test_amqps_only_when_listen_is_left_out(tls_broker, certs: Certs) -> None:
    b = tls_broker(listen=False)
    assert b.running is not None and not b.running.server.plain
    assert b.port == tls_port(b)
    conn = amqp.Connection(
        f"{HOST}:{tls_port(b)}", userid="guest", password="guest", ssl=certs.sslopts()
    )
    conn.connect()
    conn.close()


# ------------------------------------------------------------------ EXTERNAL


def test_external_logs_in_by_the_certificates_cn(tls_broker, certs: Certs) -> None:
    b = tls_broker('verify="peer" failIfNoPeerCert="true"')
    conn = amqp.Connection(
        f"{HOST}:{tls_port(b)}", login_method="EXTERNAL", ssl=certs.sslopts("alice")
    )
    conn.connect()
    try:
        assert b"EXTERNAL" in conn.mechanisms
        conn.channel().queue_declare("ext", auto_delete=True)
        [user] = b.call(lambda: [c.user for c in b.broker.connections.values()])
        assert user == "alice"
    finally:
        conn.close()


def test_external_with_pika_and_kombu(tls_broker, certs: Certs) -> None:
    b = tls_broker('verify="peer" failIfNoPeerCert="true"')
    params = pika.ConnectionParameters(
        host=HOST,
        port=tls_port(b),
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(certs.client_context("alice"), HOST),
    )
    pconn = pika.BlockingConnection(params)
    pconn.channel().queue_declare("ext-pika")
    pconn.close()
    alice_cert, alice_key = certs.clients["alice"]
    ssl_opts = {
        "ca_certs": str(certs.ca_file),
        "certfile": str(alice_cert),
        "keyfile": str(alice_key),
        "cert_reqs": ssl.CERT_REQUIRED,
    }
    with kombu.Connection(
        f"amqps://{HOST}:{tls_port(b)}//", ssl=ssl_opts, login_method="EXTERNAL"
    ) as conn:
        conn.connect()
        assert conn.connected


def test_external_refused_for_a_cn_that_is_no_user(tls_broker, certs: Certs, caplog) -> None:
    b = tls_broker('verify="peer"')
    conn = amqp.Connection(
        f"{HOST}:{tls_port(b)}", login_method="EXTERNAL", ssl=certs.sslopts("nobody")
    )
    with caplog.at_level(logging.WARNING), pytest.raises(amqp.exceptions.AccessRefused):
        conn.connect()
    assert any("EXTERNAL login refused: user 'nobody'" in r.getMessage() for r in caplog.records)


def test_without_a_certificate_external_is_not_offered_and_a_password_works(
    tls_broker, certs: Certs
) -> None:
    b = tls_broker('verify="peer"')  # failIfNoPeerCert false: a certificate is optional
    conn = amqp.Connection(f"{HOST}:{tls_port(b)}", login_method="EXTERNAL", ssl=certs.sslopts())
    with pytest.raises(amqp.exceptions.ConnectionError) as err:
        conn.connect()
    assert "available: PLAIN, AMQPLAIN" in str(err.value)
    # py-amqp prefers EXTERNAL when offered: offered only with a certificate, so this logs in
    conn = amqp.Connection(
        f"{HOST}:{tls_port(b)}", userid="alice", password="alice-secret", ssl=certs.sslopts()
    )
    conn.connect()
    try:
        assert b"EXTERNAL" not in conn.mechanisms
    finally:
        conn.close()


def test_external_is_not_offered_on_the_plain_listener(tls_broker, certs: Certs) -> None:
    b = tls_broker('verify="peer"')
    conn = amqp.Connection(f"{HOST}:{b.port}", userid="guest", password="guest")
    conn.connect()
    try:
        assert b"EXTERNAL" not in conn.mechanisms
    finally:
        conn.close()
    conn = amqp.Connection(f"{HOST}:{b.port}", login_method="EXTERNAL")
    with pytest.raises(amqp.exceptions.ConnectionError) as err:
        conn.connect()
    assert "available: PLAIN, AMQPLAIN" in str(err.value)


# ------------------------------------------------------------------ refusals


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]


def wait_for(pred, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_refusals_are_clean_one_line_each_and_spare_a_bystander(
    tls_broker, certs: Certs, caplog
) -> None:
    b = tls_broker('verify="peer" failIfNoPeerCert="true"')
    port = tls_port(b)
    bystander = amqp.Connection(
        f"{HOST}:{port}", login_method="EXTERNAL", ssl=certs.sslopts("alice")
    )
    bystander.connect()
    ch = bystander.channel()
    ch.confirm_select()  # py-amqp waits for each confirm: a stall would raise here
    ch.queue_declare("bystander", auto_delete=False)
    sent = 0

    def publish(n: int = 20) -> None:
        nonlocal sent
        for _ in range(n):
            ch.basic_publish(amqp.Message(b"x"), routing_key="bystander")
            sent += 1

    caplog.set_level(logging.WARNING, logger="plugbroker.server")
    publish()
    # 1. a plaintext AMQP client on the TLS port
    with socket.create_connection((HOST, port), timeout=3) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        assert s.recv(100) == b""  # closed, nothing sent back in plaintext
    wait_for(lambda: len(refusals(caplog)) == 1)
    assert "plaintext client" in refusals(caplog)[0]
    publish()
    # 2. a TLS client without a certificate where one is required
    with pytest.raises((ssl.SSLError, OSError, amqp.exceptions.AMQPError)):
        c = amqp.Connection(f"{HOST}:{port}", userid="guest", password="guest", ssl=certs.sslopts())
        c.connect()
    wait_for(lambda: len(refusals(caplog)) == 2)
    assert "sent no certificate" in refusals(caplog)[1]
    publish()
    # 3. a certificate from a CA the broker does not trust
    with pytest.raises((ssl.SSLError, OSError, amqp.exceptions.AMQPError)):
        c = amqp.Connection(
            f"{HOST}:{port}", login_method="EXTERNAL", ssl=certs.sslopts("stranger")
        )
        c.connect()
    wait_for(lambda: len(refusals(caplog)) == 3)
    assert "does not verify" in refusals(caplog)[2]
    publish()
    time.sleep(0.1)
    assert len(refusals(caplog)) == 3  # one line each
    assert ch.queue_declare("bystander", passive=True).message_count == sent == 80
    bystander.close()


def test_a_handshake_that_never_comes_is_dropped_after_the_handshake_timeout(
    tmp_path: Path, certs: Certs, caplog
) -> None:
    path = tls_config(tmp_path, certs)
    text = path.read_text().replace(
        "<users>", "<limits><handshakeTimeout>300ms</handshakeTimeout></limits>\n  <users>"
    )
    path.write_text(text)
    b = BrokerThread(path).start()
    try:
        caplog.set_level(logging.WARNING, logger="plugbroker.server")
        with socket.create_connection((HOST, tls_port(b)), timeout=3) as s:
            assert s.recv(100) == b""  # silent client: dropped
        wait_for(lambda: len(refusals(caplog)) == 1)
        assert "taking longer than 0.3 seconds" in refusals(caplog)[0]
    finally:
        b.stop()


def test_a_certificate_that_does_not_load_stops_the_start(tmp_path: Path, certs: Certs) -> None:
    path = tls_config(tmp_path, certs)
    path.write_text(path.read_text().replace(str(certs.key), str(tmp_path / "missing.key")))
    with pytest.raises(ConfigError) as err:
        BrokerThread(path).start()
    assert "<tls>" in str(err.value) and "missing.key" in str(err.value)

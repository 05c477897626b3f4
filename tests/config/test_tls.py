"""``<tls>`` under ``<broker>`` (amqps) and under ``<admin>`` (https)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugbroker.config import ConfigElementRegistry, ConfigError, TlsConfig, parse_config


def parse(body: str):
    return parse_config(f"<broker>{body}</broker>", "tls.xml", registry=ConfigElementRegistry())


def test_no_tls_keeps_the_plain_listener_alone() -> None:
    cfg = parse("")
    assert cfg.tls is None and cfg.admin_tls is None and cfg.listen_plain


def test_tls_beside_the_plain_listener() -> None:
    cfg = parse(
        '<listen port="5672"/><tls port="5671" cert="s.pem" key="s.key" ca="ca.pem" '
        'verify="peer" failIfNoPeerCert="true"/>'
    )
    assert cfg.listen_plain and cfg.listen_port == 5672
    assert cfg.tls == TlsConfig(
        port=5671,
        cert=Path("s.pem"),
        key=Path("s.key"),
        ca=Path("ca.pem"),
        verify="peer",
        fail_if_no_peer_cert=True,
    )
    assert cfg.tls.verify_peer
    assert "tls amqps://127.0.0.1:5671" in cfg.describe()
    assert "verify peer, required" in cfg.describe()


def test_tls_without_listen_serves_amqps_only_on_5671_by_default() -> None:
    cfg = parse('<tls cert="s.pem" key="s.key"/>')
    assert not cfg.listen_plain
    assert cfg.tls is not None and cfg.tls.port == 5671 and cfg.tls.verify == "none"
    assert not cfg.tls.verify_peer and cfg.tls.ca is None
    assert "listen off" in cfg.describe()


def test_tls_under_admin_serves_https_on_the_admin_port_unless_it_names_one() -> None:
    cfg = parse('<admin port="15672"><tls cert="s.pem" key="s.key"/></admin>')
    assert cfg.admin == ("127.0.0.1", 15672)
    assert cfg.admin_tls is not None and cfg.admin_tls.port == 15672
    assert "admin https://127.0.0.1:15672" in cfg.describe()
    assert cfg.tls is None and cfg.listen_plain
    cfg = parse('<admin port="15672"><tls port="15671" cert="s.pem" key="s.key"/></admin>')
    assert cfg.admin_tls is not None and cfg.admin_tls.port == 15671


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('<tls cert="s.pem" key="s.key" verify="peer"/>', 'verify="peer" checks'),
        ('<tls cert="s.pem" key="s.key" failIfNoPeerCert="true"/>', 'needs verify="peer"'),
        ('<tls cert="s.pem" key="s.key" verify="sometimes"/>', "sometimes"),
        ('<tls key="s.key"/>', "cert"),
        ('<tls cert="a" key="b"/><tls cert="a" key="b"/>', "tls"),
        ('<admin><tls cert="a" key="b"/><tls cert="a" key="b"/></admin>', "tls"),
    ],
)
def test_bad_tls_elements_are_refused_with_the_line(body: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(body)
    assert says in str(err.value) and "tls.xml:1" in str(err.value)

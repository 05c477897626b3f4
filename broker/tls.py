"""TLS for the listeners: server contexts from ``<tls>``, the peer's identity, refusal texts.

Used by the AMQP adapter (:mod:`broker.server`, amqps) and by the admin server (https). The
context is built once at start from the PEM files the ``<tls>`` element names; a file that is
missing or does not load is a :class:`~broker.config.ConfigError` naming the element, so the
broker refuses to start rather than serve without the TLS it was told to serve.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from broker.config import ConfigError, TlsConfig

__all__ = ["handshake_failure", "peer_common_name", "server_context"]


def server_context(cfg: TlsConfig, *, where: str = "<tls>") -> ssl.SSLContext:
    """A server-side context for ``cfg``: TLS 1.2 or later, the system's default ciphers.

    ``verify="none"`` asks no client certificate; ``verify="peer"`` asks for one and checks it
    against ``ca``, refusing a client without one only when ``fail_if_no_peer_cert``.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cfg.cert), str(cfg.key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the certificate {cfg.cert} with the key {cfg.key}: {_reason(exc)}",
            element=where,
        ) from None
    if cfg.verify_peer:
        try:
            ctx.load_verify_locations(cafile=str(cfg.ca))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the CA certificates {cfg.ca}: {_reason(exc)}", element=where
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_common_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The CN of a verified peer certificate (``transport.get_extra_info("peercert")``): the
    last commonName of its subject, as RabbitMQ's EXTERNAL mechanism takes it; None when the
    peer sent no certificate or it has no CN."""
    if not peercert:
        return None
    cn: str | None = None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = str(value)
    return cn


#: OpenSSL's reasons for refusals worth explaining in the log
_HINTS = {
    "WRONG_VERSION_NUMBER": "not TLS: a plaintext client on the TLS port?",
    "HTTP_REQUEST": "not TLS: a plain HTTP request on the TLS port",
    "UNSUPPORTED_PROTOCOL": "the client offers only TLS versions older than 1.2",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client sent no certificate; one is required",
    "CERTIFICATE_VERIFY_FAILED": "the client's certificate does not verify against the CA",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the broker's certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client refused the broker's certificate",
}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return str(exc) or type(exc).__name__


def handshake_failure(exc: BaseException) -> str:
    """One line that says why a TLS handshake failed (for the log)."""
    if isinstance(exc, TimeoutError):
        return "the handshake did not finish in time"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or ""
        hint = _HINTS.get(reason)
        detail = getattr(exc, "verify_message", None)
        text = reason or str(exc)
        if detail:
            text = f"{text} ({detail})"
        return f"{text}: {hint}" if hint else text
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return "the client closed the connection during the handshake"
    return _reason(exc)

"""TLS for the listeners: server contexts from ``<tls>``, the peer's identity, refusal texts.

Used by the AMQP adapter (:mod:`plugbroker.server`, amqps) and by the admin server (https). The
context is built once at start from the PEM files the ``<tls>`` element names; a file that is
missing or does not load is a :class:`~plugbroker.config.ConfigError` naming the element, so the
broker refuses to start rather than serve without the TLS it was told to serve.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any, cast

from plugbroker.config import ConfigError, TlsConfig

__all__ = ["TLSAcceptor", "handshake_failure", "peer_common_name", "server_context"]


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


class TLSAcceptor(asyncio.Protocol):
    """A socket on a TLS listener until its handshake is done; then the real protocol's.

    Listening with ``loop.create_server(ssl=...)`` would refuse a bad handshake silently
    (asyncio reports it only in debug mode). This protocol runs the handshake itself
    (``loop.start_tls``), so each refusal is one warning that says why, and the socket is
    closed. On success ``on_ready(transport)`` returns the protocol that serves the connection;
    it is attached to the TLS transport and gets ``connection_made`` as if it had been there
    from the start. Decrypted bytes that arrive before it takes over (a client may send its
    first bytes with its last handshake message) are handed on, in order.

    :param timeout: seconds the handshake may take.
    :param what: how the log names the listener (``"amqps"``, ``"admin https"``).
    :param track: called with the handshake's task, so a server can cancel it at stop.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        *,
        timeout: float,
        on_ready: Callable[[asyncio.Transport], asyncio.BaseProtocol],
        what: str,
        log: logging.Logger,
        track: Callable[[asyncio.Future[None]], None],
    ) -> None:
        self.context = context
        self.timeout = timeout
        self.on_ready = on_ready
        self.what = what
        self.log = log
        self.track = track
        self.early: list[bytes] = []
        self.peer = "?"
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; not an asyncio.Transport subclass on uvloop, so no isinstance
        transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.track(asyncio.ensure_future(self.handshake(transport)))

    async def handshake(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(
                raw, self, self.context, server_side=True, ssl_handshake_timeout=self.timeout
            )
        except asyncio.CancelledError:
            raw.close()
            raise
        except Exception as exc:  # each refusal: one line, and the socket closed
            raw.close()
            self.log.warning(
                "%s connection from %s refused: TLS handshake failed: %s",
                self.what,
                self.peer,
                handshake_failure(exc),
            )
            return
        if transport is None or self.lost or transport.is_closing():
            return
        proto = self.on_ready(transport)
        transport.set_protocol(proto)
        proto.connection_made(transport)
        if self.early and isinstance(proto, asyncio.Protocol):
            for data in self.early:
                proto.data_received(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        self.early.append(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

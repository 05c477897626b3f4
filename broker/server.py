"""The asyncio adapter: sockets in, :class:`plugbroker.session.Connection` out.

The protocol class is deliberately thin: it feeds bytes to the session and forwards flow
control. Two pairs of water marks bound memory:

* write side: the transport's buffer limits (:data:`WRITE_HIGH_WATER` / :data:`WRITE_LOW_WATER`).
  Above the high mark asyncio calls ``pause_writing`` and the session stops delivering to that
  connection, so a consumer that stops reading cannot make the broker buffer without bound.
* read side: a connection handles at most ``MAX_EVENTS_PER_TURN`` events per loop turn; when
  more is buffered it calls ``pause_reading`` and continues on the next turn, so a publisher
  that outruns the broker is held back by TCP instead of by broker memory.

amqps (``<tls>``) is a second listener. Its sockets first meet :class:`plugbroker.tls.TLSAcceptor`,
which runs the TLS handshake itself so that a refusal (a plaintext client, a missing or untrusted
client certificate, a handshake that never ends) is one log line that says why; only a finished
handshake gets an :class:`AMQPProtocol`, which from then on receives the decrypted bytes
directly (no extra hop per read).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from typing import Any, cast

from plugbroker.app import Broker
from plugbroker.guard import Acceptor, listening_sockets
from plugbroker.session import Connection
from plugbroker.tls import TLSAcceptor, peer_common_name

log = logging.getLogger("plugbroker.server")

WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1 * 1024 * 1024


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


class AMQPProtocol(asyncio.Protocol):
    __slots__ = ("broker", "conn", "external", "transport")

    def __init__(self, broker: Broker, *, external: bool = False) -> None:
        self.broker = broker
        self.conn: Connection | None = None
        self.transport: asyncio.Transport | None = None
        #: offer EXTERNAL (a TLS listener that verifies client certificates)
        self.external = external

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; not an asyncio.Transport subclass on uvloop, so no isinstance
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        # EXTERNAL is offered only to a client that presented a (verified) certificate, as
        # RabbitMQ does: clients that prefer it when offered (py-amqp) log in with a password
        # when they have none
        cert = transport.get_extra_info("peercert") if self.external else None
        if cert:
            self.conn = Connection(
                self.broker,
                transport,
                _peer(transport),
                external=True,
                cert_user=peer_common_name(cert),
            )
        else:
            self.conn = Connection(self.broker, transport, _peer(transport))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None:
            broker = self.broker
            broker.open_turn()
            try:
                conn.data_received(data)
            finally:
                broker.end_of_turn()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn is not None:
            if exc is not None and not conn.close_reason:
                conn.close_reason = str(exc)
            conn.connection_lost()
            self.broker.end_of_turn()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_writing()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_writing()
            self.broker.end_of_turn()


class TLSListener:
    """What the amqps listener needs: its address, context, and whether it offers EXTERNAL."""

    __slots__ = ("context", "external", "host", "port")

    def __init__(self, context: ssl.SSLContext, host: str, port: int, *, external: bool) -> None:
        self.context = context
        self.host = host
        self.port = port
        self.external = external


class Server:
    """Listens on host:port (plain AMQP) and, with ``tls``, on the amqps port; runs the broker
    until :meth:`stop`.

    :param plain: serve plain AMQP on ``host:port`` (False: amqps only).
    :param tls: the amqps listener's context, address, and whether it offers EXTERNAL.
    """

    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        *,
        plain: bool = True,
        tls: TLSListener | None = None,
    ) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.plain = plain
        self.tls = tls
        #: the amqps port once listening (None without ``tls``)
        self.tls_port: int | None = None
        self._acceptors: list[Acceptor] = []
        self._tls_acceptors: list[Acceptor] = []
        self._handshakes: set[asyncio.Future[None]] = set()
        self._stopped: asyncio.Event | None = None

    def track(self, fut: asyncio.Future[None]) -> None:
        self._handshakes.add(fut)
        fut.add_done_callback(self._handshakes.discard)

    async def _listen(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        factory: Any,
        what: str,
    ) -> tuple[list[Acceptor], int]:
        """Listen on ``host:port`` with our own accept loop (:class:`plugbroker.guard.Acceptor`:
        it backs off when accept() runs out of file descriptors, on asyncio and uvloop alike)."""
        socks = await listening_sockets(loop, host, port)
        acceptors = [
            Acceptor(loop, s, factory, clock=self.broker.clock, log=log, what=what) for s in socks
        ]
        for a in acceptors:
            a.start()
        self.broker.acceptors.extend(acceptors)
        return acceptors, socks[0].getsockname()[1]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.broker.attach_loop(loop)
        self._stopped = asyncio.Event()
        if self.plain:
            self._acceptors, self.port = await self._listen(
                loop, self.host, self.port, lambda: AMQPProtocol(self.broker), "amqp"
            )
            log.info("listening on %s:%d", self.host, self.port)
        tls = self.tls
        if tls is not None:

            def accept() -> TLSAcceptor:
                return TLSAcceptor(
                    tls.context,
                    timeout=self.broker.limits.handshake_timeout,
                    on_ready=lambda _t: AMQPProtocol(self.broker, external=tls.external),
                    what="amqps",
                    log=log,
                    track=self.track,
                )

            try:
                self._tls_acceptors, self.tls_port = await self._listen(
                    loop, tls.host, tls.port, accept, "amqps"
                )
            except OSError:
                for a in self._acceptors:
                    a.close()
                raise
            if not self.plain:
                self.host, self.port = tls.host, self.tls_port
            log.info(
                "listening for amqps on %s:%d%s",
                tls.host,
                self.tls_port,
                " (client certificates verified; EXTERNAL offered)" if tls.external else "",
            )

    async def stop(self, timeout: float = 5.0) -> None:
        """Graceful shutdown: stop listening, close connections with 320, then flush."""
        if not self._acceptors and not self._tls_acceptors:
            return
        for a in (*self._acceptors, *self._tls_acceptors):
            a.close()
            if a in self.broker.acceptors:
                self.broker.acceptors.remove(a)
        for fut in list(self._handshakes):
            fut.cancel()
        self.broker.close_all("broker shutdown")
        # let close frames go out and clients answer close-ok
        deadline = asyncio.get_running_loop().time() + timeout
        while self.broker.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.broker.connections.values()):
            conn.transport.close()
        self._acceptors, self._tls_acceptors = [], []
        if self._stopped is not None:
            self._stopped.set()

    async def serve_forever(self) -> None:
        assert self._stopped is not None
        await self._stopped.wait()


def install_signal_handlers(loop: asyncio.AbstractEventLoop, stop: Any, reload: Any = None) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not on this platform
            pass
    if reload is not None:
        try:
            loop.add_signal_handler(signal.SIGHUP, reload)
        except (NotImplementedError, RuntimeError, AttributeError):  # pragma: no cover
            pass

"""The asyncio adapter: sockets in, :class:`broker.session.Connection` out.

The protocol class is deliberately thin: it feeds bytes to the session and forwards flow
control. Two pairs of water marks bound memory:

* write side: the transport's buffer limits (:data:`WRITE_HIGH_WATER` / :data:`WRITE_LOW_WATER`).
  Above the high mark asyncio calls ``pause_writing`` and the session stops delivering to that
  connection, so a consumer that stops reading cannot make the broker buffer without bound.
* read side: a connection handles at most ``MAX_EVENTS_PER_TURN`` events per loop turn; when
  more is buffered it calls ``pause_reading`` and continues on the next turn, so a publisher
  that outruns the broker is held back by TCP instead of by broker memory.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from broker.app import Broker
from broker.session import Connection

log = logging.getLogger("broker.server")

WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1 * 1024 * 1024


class AMQPProtocol(asyncio.Protocol):
    __slots__ = ("broker", "conn", "transport")

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.conn: Connection | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        peer = transport.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.conn = Connection(self.broker, transport, peer_s)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None:
            conn.data_received(data)
            self.broker.end_of_turn()

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


class Server:
    """Listens on host:port and runs the broker until :meth:`stop`."""

    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        self._stopped: asyncio.Event | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.broker.attach_loop(loop)
        self._stopped = asyncio.Event()
        self._server = await loop.create_server(
            lambda: AMQPProtocol(self.broker), self.host, self.port, reuse_address=True
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("listening on %s:%d", self.host, self.port)

    async def stop(self, timeout: float = 5.0) -> None:
        """Graceful shutdown: stop listening, close connections with 320, then flush."""
        if self._server is None:
            return
        self._server.close()
        self.broker.close_all("broker shutdown")
        # let close frames go out and clients answer close-ok
        deadline = asyncio.get_running_loop().time() + timeout
        while self.broker.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.broker.connections.values()):
            conn.transport.close()
        await self._server.wait_closed()
        self._server = None
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

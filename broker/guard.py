"""Guards at the broker's front door: login throttling and an accept loop that backs off.

:class:`LoginThrottle` delays the answer to a failed login from one peer address, doubling the
delay with each further failure from that address up to a cap. The delay is a timer, never a
wait: other peers (and the rest of the broker) are served meanwhile. An address's record is
forgotten after a quiet period, and the table holds a bounded number of addresses.

:class:`Acceptor` accepts connections on a listening socket for both asyncio and uvloop. When
``accept()`` fails for want of a resource (EMFILE, ENFILE, ENOBUFS, ENOMEM) it stops watching the
socket for a while (doubling up to a cap), logs the failure once per interval with a count of
the failures it did not log, and resumes on its own: clients waiting in the backlog are served
as soon as file descriptors free up.

Both keep their state in O(1) per event; neither imports the broker.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from plugbroker.clock import Clock

#: accept() errors that mean "out of a resource": back off instead of spinning
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: accept() errors about one connection that went away before it was accepted: skip it
TRANSIENT_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.ECONNRESET, errno.EPERM})


class LoginThrottle:
    """Per peer address: how long to delay the answer to its next failed login.

    :param base: seconds the first failure is delayed (0 disables the throttle).
    :param cap: the delay never grows beyond this.
    :param forget_after: seconds without a failure after which an address starts over
        (default: ``max(60, 4 * cap)``).
    :param max_peers: addresses remembered at most (the oldest is forgotten first).
    :param max_pending: refusals one address may have waiting at once; a further connection
        from it is closed before it can try a password (see :meth:`over`).
    """

    def __init__(
        self,
        clock: Clock,
        base: float,
        cap: float,
        *,
        forget_after: float | None = None,
        max_peers: int = 10_000,
        max_pending: int = 32,
    ) -> None:
        self.clock = clock
        self.base = base
        self.cap = max(cap, base)
        self.forget_after = forget_after if forget_after is not None else max(60.0, 4 * self.cap)
        self.max_peers = max_peers
        self.max_pending = max_pending
        #: peer -> refusals being delayed right now (each holds a connection open)
        self._pending: dict[str, int] = {}
        #: connections closed at once because their address had max_pending refusals waiting
        self.turned_away_total = 0
        #: peer -> (failures, time of the last failure); insertion order is age order
        self._peers: dict[str, tuple[int, float]] = {}
        #: failed logins answered with a delay, since start
        self.throttled_total = 0
        #: failed logins seen, since start
        self.failures_total = 0

    def failed(self, peer: str) -> float:
        """Record a failed login from ``peer``; return the seconds its answer is delayed."""
        self.failures_total += 1
        if self.base <= 0:
            return 0.0
        now = self.clock.monotonic()
        rec = self._peers.pop(peer, None)
        n = 1 if rec is None or now - rec[1] > self.forget_after else rec[0] + 1
        self._peers[peer] = (n, now)
        if len(self._peers) > self.max_peers:
            self._prune(now)
        self.throttled_total += 1
        # 2 ** (n - 1) without overflow for a peer that keeps failing
        return min(self.base * (2.0 ** min(n - 1, 62)), self.cap)

    def next_delay(self, peer: str) -> float:
        """The delay the next failure from ``peer`` would get (nothing is recorded)."""
        if self.base <= 0:
            return 0.0
        n = self.failures(peer) + 1
        return min(self.base * (2.0 ** min(n - 1, 62)), self.cap)

    def hold(self, peer: str) -> None:
        """A refusal to ``peer`` is being delayed (its connection stays open meanwhile)."""
        self._pending[peer] = self._pending.get(peer, 0) + 1

    def release(self, peer: str) -> None:
        """A refusal :meth:`hold` counted was answered, or its connection went away."""
        n = self._pending.get(peer, 0) - 1
        if n > 0:
            self._pending[peer] = n
        else:
            self._pending.pop(peer, None)

    def over(self, peer: str) -> bool:
        """``peer`` has ``max_pending`` refusals waiting: a new connection from it is turned
        away before it may try a password, so that guessing in parallel neither beats the
        delay nor holds more than ``max_pending`` descriptors per address. Counts it."""
        if self.base > 0 and self._pending.get(peer, 0) >= self.max_pending:
            self.turned_away_total += 1
            return True
        return False

    def failures(self, peer: str) -> int:
        """Failures counted for ``peer`` (0 once forgotten)."""
        rec = self._peers.get(peer)
        if rec is None or self.clock.monotonic() - rec[1] > self.forget_after:
            return 0
        return rec[0]

    def peers(self) -> int:
        """Addresses with failures remembered."""
        return len(self._peers)

    def _prune(self, now: float) -> None:
        peers = self._peers
        for key in [k for k, (_n, t) in peers.items() if now - t > self.forget_after]:
            del peers[key]
        while len(peers) > self.max_peers:
            del peers[next(iter(peers))]


class Acceptor:
    """Accepts connections on ``sock`` and hands each to ``protocol_factory``.

    :param min_delay: the first back-off after a resource error, in seconds; each further
        consecutive error doubles it up to ``max_delay``.
    :param log_interval: resource errors are logged at most once per this many seconds.
    """

    #: connections accepted per readiness callback before the loop serves others
    BATCH = 64

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        *,
        clock: Clock,
        log: logging.Logger,
        what: str = "amqp",
        min_delay: float = 0.05,
        max_delay: float = 1.0,
        log_interval: float = 10.0,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = protocol_factory
        self.clock = clock
        self.log = log
        self.what = what
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.log_interval = log_interval
        self.delay = min_delay
        #: accept() failures for want of a resource, since start
        self.failures_total = 0
        #: consecutive failures (0 while accepting normally)
        self.failing = 0
        self._unlogged = 0
        self._last_log: float | None = None
        self._watching = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        self._pending: set[asyncio.Future[Any]] = set()
        sock.setblocking(False)

    def start(self) -> None:
        if not self._watching and not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = True

    def close(self) -> None:
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False
        for fut in list(self._pending):
            fut.cancel()
        self.sock.close()

    @property
    def backing_off(self) -> bool:
        return self._retry is not None

    def _on_readable(self) -> None:
        for _ in range(self.BATCH):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in TRANSIENT_ERRNOS:
                    continue
                self._back_off(e)
                return
            self._recovered()
            self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # pragma: no cover - not a TCP socket
            pass
        fut = asyncio.ensure_future(
            self.loop.connect_accepted_socket(self.factory, conn), loop=self.loop
        )
        self._pending.add(fut)
        fut.add_done_callback(lambda f: self._accepted(f, conn))

    def _accepted(self, fut: asyncio.Future[Any], conn: socket.socket) -> None:
        self._pending.discard(fut)
        if fut.cancelled():
            conn.close()
            return
        exc = fut.exception()
        if exc is not None:
            self.log.warning("%s: could not set up an accepted connection: %s", self.what, exc)
            conn.close()

    def _back_off(self, e: OSError) -> None:
        self.failures_total += 1
        self.failing += 1
        now = self.clock.monotonic()
        delay = self.delay
        if self._last_log is None or now - self._last_log >= self.log_interval:
            more = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
            self.log.warning(
                "%s: accept() failed: %s; not accepting for %.2f s (backing off up to %.2f s)%s",
                self.what,
                e.strerror or e,
                delay,
                self.max_delay,
                more,
            )
            self._last_log = now
            self._unlogged = 0
        else:
            self._unlogged += 1
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False
        self.delay = min(delay * 2, self.max_delay)
        self._retry = self.loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        self._retry = None
        self.start()

    def _recovered(self) -> None:
        if self.failing:
            self.log.warning(
                "%s: accepting connections again after %d failed accept() calls",
                self.what,
                self.failing,
            )
            self.failing = 0
            self._unlogged = 0
            self._last_log = None
            self.delay = self.min_delay


async def listening_sockets(
    loop: asyncio.AbstractEventLoop, host: str | None, port: int, backlog: int = 1024
) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host:port`` (every address it resolves to,
    as ``loop.create_server`` does; with port 0, one port chosen for all of them). The name is
    resolved off the loop, as ``create_server`` does (the loop runs meanwhile: signals noted
    during the start are handled then)."""
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    socks: list[socket.socket] = []
    seen: set[tuple[Any, ...]] = set()
    try:
        for family, type_, proto, _name, addr in infos:
            key = (family, addr)
            if key in seen:
                continue
            seen.add(key)
            try:
                s = socket.socket(family, type_, proto)
            except OSError:  # an address family this host lacks (IPv6): skipped, as asyncio does
                continue
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                chosen = socks[0].getsockname()[1]
                addr = (addr[0], chosen, *addr[2:])
            s.bind(addr)
            s.listen(backlog)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    if not socks:
        raise OSError(f"cannot listen on {host}:{port}: no usable address")
    return socks


__all__ = ["Acceptor", "LoginThrottle", "listening_sockets"]

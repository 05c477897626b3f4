"""Guards at the broker's front door: login throttling and an accept loop that backs off.

:class:`LoginThrottle` delays the answer to a failed login, doubling the delay with each
further failure up to a cap. Failures are counted per (user, address) and per address, with
different limits, so that a guesser does not lock out the innocent: a correct password is
answered at once unless that very user has failed :attr:`LoginThrottle.attack_after` times from
that very address (it is *under attack* there; then its logins from there are refused, after
the delay, until the record is forgotten, so a guess can never be confirmed); the address as a
whole adds a delay of its own only past :attr:`LoginThrottle.address_free` failures (a guesser
trying one password on many users). The delay is a timer, never a wait: other peers (and the
rest of the broker) are served meanwhile. A record is forgotten after a quiet period, and the
tables hold a bounded number of entries.

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


#: what a door does with a login (:meth:`LoginThrottle.judge`)
ACCEPT = "accept"
REFUSE = "refuse"
TURN_AWAY = "turn-away"


class LoginThrottle:
    """Per (user, peer address) and per peer address: how long to delay the answer to a failed
    login, and whether a correct one goes through (:meth:`judge`, the one rule both doors use).

    :param base: seconds the first failure is delayed (0 disables the throttle).
    :param cap: the delay never grows beyond this.
    :param forget_after: seconds without a failure after which an address starts over
        (default: ``max(60, 4 * cap)``).
    :param max_peers: addresses remembered at most (the oldest is forgotten first).
    :param max_pending: refusals one address may have waiting at once; a further attempt
        from it that would wait is answered at once instead (see :meth:`judge`).
    :param attack_after: failures of one user from one address after which that user is
        under attack there: its logins from there are refused, whatever the password.
    :param address_free: failures from one address (all users together) before the address
        adds a delay of its own.
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
        attack_after: int = 5,
        address_free: int = 20,
    ) -> None:
        self.clock = clock
        self.base = base
        self.cap = max(cap, base)
        self.forget_after = forget_after if forget_after is not None else max(60.0, 4 * self.cap)
        self.max_peers = max_peers
        self.max_pending = max_pending
        self.attack_after = attack_after
        self.address_free = address_free
        #: (user, peer) -> (failures, time of the last failure); insertion order is age order
        self._pairs: dict[tuple[str, str], tuple[int, float]] = {}
        #: correct passwords refused because their user is under attack from that address
        self.locked_total = 0
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

    def judge(self, user: str, peer: str, ok: bool) -> tuple[str, float]:
        """What a door does with a login of ``user`` from ``peer`` whose credentials were
        right (``ok``) or not; counts a failure. Returns:

        * ``(ACCEPT, 0)``: let it in now (a correct password for a user not under attack from
          this address, however many others fail from it; or any correct one without a
          throttle);
        * ``(REFUSE, delay)``: refuse it, the answer ``delay`` seconds late (a wrong password;
          or a right one for a user under attack from this address, which must not confirm a
          guess);
        * ``(TURN_AWAY, 0)``: refuse it at once: it would wait, and ``max_pending`` refusals
          to this address wait already."""
        attacked = self.under_attack(user, peer)
        if ok and not attacked:
            return ACCEPT, 0.0
        if self.base <= 0:
            self.failures_total += not ok
            return (ACCEPT if ok else REFUSE), 0.0
        if self._pending.get(peer, 0) >= self.max_pending:
            self.turned_away_total += 1
            if not ok:
                self.failed(peer, user)
            return TURN_AWAY, 0.0
        if ok:
            self.locked_total += 1
            return REFUSE, self.next_delay(peer, user)
        return REFUSE, self.failed(peer, user)

    def under_attack(self, user: str, peer: str) -> bool:
        """``user`` failed ``attack_after`` times from ``peer`` lately."""
        return self.base > 0 and self.failures(peer, user) >= self.attack_after

    def failed(self, peer: str, user: str = "") -> float:
        """Record a failed login of ``user`` from ``peer``; return the seconds its answer is
        delayed: doubling with the failures of the pair, or of the address past
        ``address_free``, whichever is longer."""
        self.failures_total += 1
        if self.base <= 0:
            return 0.0
        now = self.clock.monotonic()
        n_peer = self._count(self._peers, peer, now)
        n_pair = self._count(self._pairs, (user, peer), now)
        self.throttled_total += 1
        return self._delay(n_pair, n_peer)

    def next_delay(self, peer: str, user: str = "") -> float:
        """The delay the next failure of ``user`` from ``peer`` would get (nothing is
        recorded)."""
        if self.base <= 0:
            return 0.0
        return self._delay(self.failures(peer, user) + 1, self.failures(peer) + 1)

    def _delay(self, n_pair: int, n_peer: int) -> float:
        # 2 ** (n - 1) without overflow for a peer that keeps failing
        n = max(n_pair, n_peer - self.address_free)
        return min(self.base * (2.0 ** min(n - 1, 62)), self.cap)

    def _count(self, table: dict[Any, tuple[int, float]], key: Any, now: float) -> int:
        rec = table.pop(key, None)
        n = 1 if rec is None or now - rec[1] > self.forget_after else rec[0] + 1
        table[key] = (n, now)
        if len(table) > self.max_peers:
            self._prune(table, now)
        return n

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

    def failures(self, peer: str, user: str | None = None) -> int:
        """Failures counted for ``peer``, or for ``user`` from ``peer`` (0 once forgotten)."""
        rec = self._peers.get(peer) if user is None else self._pairs.get((user, peer))
        if rec is None or self.clock.monotonic() - rec[1] > self.forget_after:
            return 0
        return rec[0]

    def peers(self) -> int:
        """Addresses with failures remembered."""
        return len(self._peers)

    def _prune(self, table: dict[Any, tuple[int, float]], now: float) -> None:
        for key in [k for k, (_n, t) in table.items() if now - t > self.forget_after]:
            del table[key]
        while len(table) > self.max_peers:
            del table[next(iter(table))]


def under_attack_text(user: str, peer: str) -> str:
    """The log's reason for refusing a correct password (:meth:`LoginThrottle.judge`)."""
    return (
        f"user '{user}' failed too many logins from {peer} lately: its logins from there are "
        "refused for now, whatever the password"
    )


def throttled_text(verdict: str, delay: float, peer: str, max_pending: int) -> str:
    """What a refusal's log line adds about the throttle (or nothing)."""
    if verdict == TURN_AWAY:
        return f" (answered at once: {max_pending} refusals to {peer} are waiting already)"
    if delay:
        return f" (answered in {delay:.2f} s: failed logins from {peer} are throttled)"
    return ""


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

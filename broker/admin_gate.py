"""Who gets an admin socket: a bound in total and per client address, and a deadline for
connections that have not logged in.

* at most ``max_connections`` sockets are served, and at most ``max_connections_per_address``
  from one address; over either bound the oldest socket of that address (or, for the total
  bound, of any address) that has not logged in and has no request in progress makes room,
  else the newcomer is answered 503 and closed;
* a socket must carry a request that logs in within ``login_timeout`` of its opening, or it
  is closed (a request in progress, a login being throttled for instance, is not cut): a
  client that opens sockets and trickles half requests holds each for seconds, not for as
  long as the header timeout allows again and again.

An operator therefore always gets in: one address cannot take every socket, and the sockets
held by clients that never log in are the first to go.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol, cast

__all__ = ["Busy", "Gate", "Member"]

log = logging.getLogger("plugbroker.admin")


class Member(Protocol):
    """A served socket as the gate sees it."""

    peer: str
    #: a request of this socket logged in
    authenticated: bool
    #: requests being answered now
    busy: int

    def evict(self) -> None:
        """Close the socket now (it made room for another)."""
        ...


class Busy(asyncio.Protocol):
    """A socket over a bound: a 503, our side shut, then closed once the client has had a
    moment to read it (closing with its request unread would reset the answer)."""

    BODY = b'{"error": "too many admin connections; try again later"}'
    LINGER = 1.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; not an asyncio.Transport subclass on uvloop, so no isinstance
        transport = cast(asyncio.Transport, transport)
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nRetry-After: 1\r\nContent-Length: "
            + str(len(self.BODY)).encode()
            + b"\r\n\r\n"
            + self.BODY
        )
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(self.LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request is not read

    def eof_received(self) -> bool | None:
        return None  # the client is done: close


def peer_of(transport: asyncio.BaseTransport) -> str:
    """The client's address (no port) a transport is connected to."""
    peer = transport.get_extra_info("peername")
    host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
    return str(host).partition("%")[0]


class Gate:
    """The admin server's sockets by address, oldest first (see the module docstring)."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.by_peer: dict[str, OrderedDict[int, Member]] = {}
        self.total = 0
        #: sockets closed to make room, sockets refused (503)
        self.evicted = 0
        self.refused = 0
        self._warned: set[str] = set()

    def admit(self, member: Member) -> bool:
        """Whether ``member`` may be served (room made if need be); counted if so."""
        peer = member.peer
        mine = self.by_peer.get(peer)
        if mine is not None and len(mine) >= self.max_per_address:
            if not self._make_room(mine.values()):
                return self._refuse(peer, f"{self.max_per_address} from this address")
        if self.total >= self.max_total:
            every = (m for ms in self.by_peer.values() for m in ms.values())
            if not self._make_room(every):
                return self._refuse(peer, f"{self.max_total} in total")
        self.by_peer.setdefault(peer, OrderedDict())[id(member)] = member
        self.total += 1
        return True

    def leave(self, member: Member) -> None:
        """``member``'s socket closed (nothing if it was evicted or never admitted)."""
        mine = self.by_peer.get(member.peer)
        if mine is None or mine.pop(id(member), None) is None:
            return
        self.total -= 1
        if not mine:
            del self.by_peer[member.peer]
            self._warned.discard(member.peer)

    def _make_room(self, members: Iterable[Member]) -> bool:
        for m in list(members):  # oldest first
            if not m.authenticated and not m.busy:
                self.leave(m)
                m.evict()
                self.evicted += 1
                return True
        return False

    def _refuse(self, peer: str, bound: str) -> bool:
        self.refused += 1
        if peer not in self._warned:
            self._warned.add(peer)
            log.warning(
                "admin: connection from %s refused (503): %s admin connections open, the bound, "
                "and each of them is logged in or busy",
                peer,
                bound,
            )
        return False

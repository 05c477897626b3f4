"""A connection's flow control under resource alarms: connection.blocked and unblocked, when
the broker stops reading from a client, and what a connection holds in memory.

An alarm blocks a connection when the broker says it does (``Broker.blocking_reason``): every
connection for the disk and store alarms, the connections of the heaviest virtual hosts for the
memory alarm (every connection once the memory goes on rising). A blocked connection hears
connection.blocked (when it advertised the capability); the broker stops reading from it at its
first publish, or, during the memory alarm, at its first method that makes the broker hold more
(a new queue, exchange or binding). Consumers keep being served, so queues can drain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugbroker.domain import fate
from plugbroker.errors import CONNECTION_FORCED, ConnectionError_
from plugbroker.session_state import ConnectionState

if TYPE_CHECKING:
    from plugbroker.clock import Clock
    from plugbroker.codec import ServerCodec
    from plugbroker.session import Channel, Transport

OPEN = ConnectionState.OPEN


class FlowControl:
    """Mixed into :class:`plugbroker.session.Connection`."""

    broker: Any
    transport: Transport
    state: ConnectionState
    codec: ServerCodec
    clock: Clock
    channels: dict[int, Channel]
    client_caps: dict[str, Any]
    out: list[bytes]
    notified_blocked: bool
    blocked: bool
    published: bool
    _stall_mark: tuple[int, float] | None

    def send(self, channel: int, name: str, *args: Any) -> None:
        raise NotImplementedError

    def connection_error(self, e: Any) -> None:
        raise NotImplementedError

    def _sync_reading(self) -> None:
        raise NotImplementedError

    def set_blocked(self, reason: str | None) -> None:
        """The alarms that block this connection changed: ``reason`` is what now blocks it
        (None: nothing does). Idempotent.

        The client hears connection.blocked once (when it advertised the capability), and the
        broker stops reading from it now if it has published or is sending a message body;
        otherwise at its first publish (:meth:`block_if_alarmed`). It hears
        connection.unblocked when nothing blocks it any more.
        """
        if reason is not None:
            if (
                not self.notified_blocked
                and self.state is OPEN
                and self.client_caps.get("connection.blocked")
            ):
                self.send(0, "connection.blocked", reason)
                self.notified_blocked = True
            if self.published or self.codec.partial_bytes:
                self.block()
            return
        if self.notified_blocked:
            self.notified_blocked = False
            if self.state is OPEN:
                self.send(0, "connection.unblocked")
        if self.blocked:
            self.blocked = False
            self._stall_mark = None
            self._sync_reading()
            # its acks went unread while it was blocked: its consumers' ack clocks restart
            # now, as on an ack, so isolation never takes a consumer for stuck because the
            # broker was not listening to it
            now = self.clock.monotonic()
            for ch in self.channels.values():
                for c in ch.consumers.values():
                    if c.unacked:
                        fate.restart_clock(c, now)

    def grew(self, more: bool = True) -> None:
        """This connection made the broker hold more (``more``: a new queue, exchange
        or binding): under the memory alarm, stop reading from it if the alarm blocks it."""
        if more and self.broker.alarm is not None and "memory" in self.broker.alarms:
            self.block_if_alarmed()

    def block_if_alarmed(self) -> None:
        """A publish arrived (or the broker holds more for this connection) while an alarm
        is raised: stop reading from this connection if the alarm blocks it."""
        broker = self.broker
        if self.blocked or broker.alarm is None:
            return
        reason = broker.blocking_reason(self)
        if reason is None:
            return
        if not self.notified_blocked and self.client_caps.get("connection.blocked"):
            self.send(0, "connection.blocked", reason)
            self.notified_blocked = True
        self.block()

    def block(self) -> None:
        """Stop reading from this connection while a resource alarm is raised."""
        if not self.blocked:
            self.blocked = True
            self._sync_reading()

    def unsent_bytes(self) -> int:
        """Output written to the transport and not yet on the socket, plus this turn's."""
        size = getattr(self.transport, "get_write_buffer_size", None)
        pending = sum(map(len, self.out))
        return pending + (size() if size is not None else 0)

    def held_bytes(self) -> int:
        """What this connection holds in memory: message bodies still arriving, unparsed
        input, unsent output (the memory alarm counts it)."""
        codec = self.codec
        return codec.partial_bytes + codec.buffered() + self.unsent_bytes()

    def check_body_stall(self, now: float, timeout: float) -> None:
        """Close the connection (320) if it has sat in the middle of a message body, its
        partial bytes unchanged, for ``timeout`` seconds. During a resource alarm a connection
        caught in the middle of a body is blocked too, and its time blocked counts: its partial
        body is memory nobody can use, and the broker, not reading, would not even see the
        client leave."""
        partial = self.codec.partial_bytes
        if not partial or self.state is not OPEN:
            self._stall_mark = None
            return
        self.block_if_alarmed()
        mark = self._stall_mark
        if mark is None or mark[0] != partial:
            self._stall_mark = (partial, now)
            return
        if now - mark[1] >= timeout:
            self.connection_error(
                ConnectionError_(
                    CONNECTION_FORCED,
                    f"message body stalled: {partial} bytes received, nothing more for "
                    f"{now - mark[1]:.1f} s (limit {timeout:g} s)",
                )
            )


__all__ = ["FlowControl"]

"""A message as a queue holds it."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from plugbroker.codec import properties as props_codec

log = logging.getLogger("broker.message")

#: the header that tells a consumer how many earlier hand-outs of a message ran past their ack
#: timeout (set only once one did); ``x-delivery-count`` keeps counting requeues
TIMEOUT_COUNT = "x-ack-timeout-count"


class MessageIds:
    """Message ids of one broker: unique across its vhosts, increasing, never reused.

    ``next()`` is the C-level ``__next__`` of an :func:`itertools.count`, so taking an id on the
    publish path costs no Python frame.
    """

    __slots__ = ("_count", "next")

    def __init__(self, start: int = 1) -> None:
        self._count = itertools.count(start)
        self.next: Callable[[], int] = self._count.__next__

    def advance(self, floor: int) -> None:
        """Continue above ``floor`` (the highest id recovered from the store)."""
        current = self.next()
        self._count = itertools.count(max(current, floor + 1))
        self.next = self._count.__next__


class Message:
    """One published message in one queue.

    A message routed to several queues is shallow-copied per queue (:meth:`copy`): the body and
    raw properties are shared, the per-queue state (delivery count, redelivered, expiry) is not.

    ``properties`` are the raw property bytes of the content header, passed through unchanged to
    consumers. ``headers`` and :attr:`decoded` are decoded on first use only.
    """

    __slots__ = (
        "__weakref__",
        "_headers",
        "_hoff",
        "arrival",
        "body",
        "body_size",
        "delivery_count",
        "exchange",
        "expiration",
        "expires_at",
        "id",
        "persistent",
        "priority",
        "properties",
        "queue_name",
        "redelivered",
        "routing_key",
        "stored",
        "timeouts",
        "timestamp",
    )

    def __init__(
        self,
        id: int,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes | None,
        body_size: int,
        arrival: float,
        timestamp: float,
        *,
        delivery_mode: int = 0,
        priority: int = 0,
        expiration: int | None = None,
        headers_offset: int = -1,
    ) -> None:
        self.id = id
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        #: None while the store has paged it out (plugbroker.store.sqlite.PagedReady reads it back)
        self.body: bytes | None = body
        self.body_size = body_size
        self.persistent = delivery_mode == 2
        self.priority = priority
        #: per-message TTL in milliseconds (the ``expiration`` property), or None
        self.expiration = expiration
        self._hoff = headers_offset
        self._headers: dict[str, Any] | None = None
        #: monotonic time it entered its queue (ages and rates are measured from it)
        self.arrival = arrival
        #: wall-clock time it was published (for x-death and the journal)
        self.timestamp = timestamp
        self.delivery_count = 0
        #: hand-outs whose ack clock ran out while a consumer held it (isolated or not),
        #: shown to consumers as :data:`TIMEOUT_COUNT`; at ``<poisonDeliveries>`` it is
        #: dead-lettered as poison (:func:`plugbroker.domain.fate.count_timeout`)
        self.timeouts = 0
        self.redelivered = False
        #: monotonic deadline after which the message is expired, or None
        self.expires_at: float | None = None
        self.queue_name = ""
        #: True once the store holds it (persistent message in a durable queue)
        self.stored = False

    @classmethod
    def from_publish(
        cls,
        id: int,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes | None,
        body_size: int,
        arrival: float,
        timestamp: float,
    ) -> Message:
        """Build from the raw publish; raises PropertiesError for malformed properties."""
        mode, prio, exp, hoff = props_codec.peek(properties)
        return cls(
            id,
            exchange,
            routing_key,
            properties,
            body,
            body_size,
            arrival,
            timestamp,
            delivery_mode=mode,
            priority=prio,
            expiration=props_codec.expiration_ms(exp),
            headers_offset=hoff,
        )

    @property
    def headers(self) -> dict[str, Any]:
        """The application headers (decoded once, on first use)."""
        h = self._headers
        if h is None:
            h = self._headers = props_codec.headers_at(self.properties, self._hoff)
        return h

    @property
    def decoded(self) -> dict[str, Any]:
        """All properties, decoded (slow path); never fails for a queued message (a headers
        table nobody read on publish may be garbage: see ``decode_lenient``)."""
        return props_codec.decode_lenient(self.properties)

    @property
    def message_id(self) -> str | None:
        """The publisher's ``message_id`` property, if any (slow path)."""
        return self.decoded.get("message_id")

    def delivery_properties(self) -> bytes:
        """The raw properties to deliver: as published, plus ``x-delivery-count`` on a
        redelivery and :data:`TIMEOUT_COUNT` once a hand-out of it timed out (re-encoding only
        then, off the first-delivery hot path)."""
        if not self.delivery_count and not self.timeouts:
            return self.properties
        props = self.decoded
        headers = dict(props.get("application_headers") or {})
        self._count_headers(headers)
        props["application_headers"] = headers
        try:
            return props_codec.encode(props)
        except Exception:  # RecursionError on headers the codec let in before it bounded depth
            log.warning(
                "message %d: its properties cannot be re-encoded with x-delivery-count; "
                "delivered as published",
                self.id,
                exc_info=True,
            )
            return self.properties

    def delivery_properties_with(self, name: str, value: Any) -> bytes:
        """:meth:`delivery_properties` with one more header set by the broker (re-encoded:
        only for queues that ask for it, e.g. ``x-ack-timeout`` under isolation)."""
        props = self.decoded
        headers = dict(props.get("application_headers") or {})
        self._count_headers(headers)
        headers[name] = value
        props["application_headers"] = headers
        return props_codec.encode(props)

    def _count_headers(self, headers: dict[str, Any]) -> None:
        if self.delivery_count:
            headers["x-delivery-count"] = self.delivery_count
        if self.timeouts:
            headers[TIMEOUT_COUNT] = self.timeouts

    def copy(self) -> Message:
        m = Message(
            self.id,
            self.exchange,
            self.routing_key,
            self.properties,
            self.body,
            self.body_size,
            self.arrival,
            self.timestamp,
            priority=self.priority,
            expiration=self.expiration,
            headers_offset=self._hoff,
        )
        m.persistent = self.persistent
        m._headers = self._headers
        m.delivery_count = self.delivery_count
        m.timeouts = self.timeouts
        m.redelivered = self.redelivered
        m.expires_at = self.expires_at
        m.queue_name = self.queue_name
        m.stored = self.stored
        return m

    def with_properties(self, props: dict[str, Any], new_id: int) -> Message:
        """A copy with re-encoded properties and fresh per-queue state (dead-lettering)."""
        raw = props_codec.encode(props)
        mode, prio, exp, hoff = props_codec.peek(raw)
        m = Message(
            new_id,
            self.exchange,
            self.routing_key,
            raw,
            self.body,
            self.body_size,
            self.arrival,
            self.timestamp,
            delivery_mode=mode,
            priority=prio,
            expiration=props_codec.expiration_ms(exp),
            headers_offset=hoff,
        )
        return m

    def __repr__(self) -> str:
        return (
            f"<Message {self.id} {self.exchange!r}/{self.routing_key!r} "
            f"{self.body_size}B count={self.delivery_count} timeouts={self.timeouts}>"
        )

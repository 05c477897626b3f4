"""The store interface, and the records a store returns when the broker starts.

The domain calls a :class:`Store` as it changes: a durable queue is declared, a persistent
message enters a durable queue, is delivered, acked. Those calls are fire-and-forget from the
event loop's point of view; :meth:`Store.after_durable` runs a callback once everything
submitted before it is on disk, which is how publisher confirms wait for the disk.

At start the store hands back what it kept as plain, immutable records (frozen dataclasses
:class:`ExchangeRecord`, :class:`QueueRecord`, :class:`BindingRecord`; named tuples
:class:`MessageRecord`, :class:`DelayedRecord`, one per stored message);
the core rebuilds virtual hosts, exchanges, queues and messages from them
(:mod:`plugbroker.core.recovery`). A store never builds domain objects itself.

Times in records are wall-clock seconds since the epoch (what outlives the process); the core
turns them into its monotonic clock. A queue is named by its :data:`QueueKey`, ``(virtual
host, queue name)``: whatever the store uses to identify a queue on disk stays inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import asyncio

    from plugbroker.clock import Clock
    from plugbroker.domain.exchange import Exchange
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Queue
    from plugbroker.domain.ready import ReadyList

#: ``(virtual host name, queue name)``
QueueKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ExchangeRecord:
    """A durable exchange as declared."""

    vhost: str
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A durable queue as declared (exclusive queues are never kept)."""

    vhost: str
    name: str
    auto_delete: bool
    arguments: dict[str, Any]
    #: the subscription type it was declared with (None: the default)
    subscription_type: str | None
    #: it is known as a dead-letter or retry target (no policy deletes or purges it)
    dead_letter_target: bool = False

    @property
    def key(self) -> QueueKey:
        return (self.vhost, self.name)


@dataclass(frozen=True, slots=True)
class BindingRecord:
    """A binding whose source and destination were both durable when it was made."""

    vhost: str
    source: str
    #: ``"queue"`` or ``"exchange"``
    dest_kind: str
    dest: str
    routing_key: str
    arguments: dict[str, Any]


class MessageRecord(NamedTuple):
    """A persistent message in a durable queue. Records come in the order the messages
    entered their queues.

    Immutable like the other records, but a named tuple: a store returns one per stored
    message (a million at the start of a long queue), and a tuple is built about four times
    faster than a frozen dataclass.
    """

    queue: QueueKey
    id: int
    exchange: str
    routing_key: str
    #: the raw content-header properties (headers, ``x-death`` history included)
    properties: bytes
    #: None when the store kept it on disk for now (a paging queue): :meth:`Store.read_body`
    body: bytes | None
    body_size: int
    #: wall-clock time it was published
    timestamp: float
    #: wall-clock time it entered the queue (its TTL runs from there)
    arrival: float
    delivery_count: int
    #: it had been delivered to a consumer at least once
    delivered: bool
    #: wall-clock time a hold ends (nack backoff, or a retry queue's delay); None: not held
    due: float | None
    #: hand-outs of it whose ack clock ran out (``Message.timeouts``)
    timeouts: int = 0
    #: its body, read back, fails the checksum stored with it (it must not be delivered)
    corrupt: bool = False


class DelayedRecord(NamedTuple):
    """A persistent message held by a durable ``x-delayed-message`` exchange (a named tuple,
    as :class:`MessageRecord`)."""

    vhost: str
    exchange: str
    id: int
    routing_key: str
    properties: bytes
    body: bytes
    timestamp: float
    #: wall-clock time it is to be routed
    due: float


@dataclass(frozen=True, slots=True)
class StoredTopology:
    """Exchanges, queues and bindings in the order the store returns them."""

    exchanges: tuple[ExchangeRecord, ...] = ()
    queues: tuple[QueueRecord, ...] = ()
    bindings: tuple[BindingRecord, ...] = ()


class Store(Protocol):
    """What the broker needs from a store."""

    #: False for a store that keeps nothing: the domain then skips persistence work entirely,
    #: and such a store returns no records
    durable: bool

    # ------------------------------------------------------------------ wiring

    def attach(self, clock: Clock, on_alarm: Callable[[str | None], None]) -> None:
        """The broker's clock (for wall-clock times), and where to raise (a reason) or clear
        (None) a resource alarm when writing fails and succeeds again."""

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop is running: callbacks (:meth:`after_durable`) run on it from now."""

    # ------------------------------------------------------------------ writes, from the loop

    def save_exchange(self, vhost: str, exchange: Exchange) -> None: ...

    def delete_exchange(self, vhost: str, name: str) -> None:
        """Also deletes the bindings from and to it and the messages it holds back."""

    def save_queue(self, queue: Queue) -> None:
        """A durable queue was declared (an exclusive one is not kept)."""

    def delete_queue(self, vhost: str, name: str) -> None:
        """Also deletes its messages and the bindings to it."""

    def save_binding(
        self,
        vhost: str,
        source: str,
        dest_kind: str,
        dest: str,
        key: str,
        arguments: dict[str, Any],
    ) -> None: ...

    def delete_binding(
        self,
        vhost: str,
        source: str,
        dest_kind: str,
        dest: str,
        key: str,
        arguments: dict[str, Any],
    ) -> None: ...

    def add_message(self, queue: Queue, msg: Message) -> None:
        """A persistent message entered a saved queue."""

    def remove_message(self, queue: Queue, msg: Message) -> None: ...

    def update_message(self, queue: Queue, msg: Message) -> None:
        """The delivery count of a stored message changed."""

    # called only for stored messages (``msg.stored``) or durable delayed holds
    def delivered(self, queue: Queue, msg: Message) -> None:
        """A stored message went to a consumer for the first time."""

    def hold_message(self, queue: Queue, msg: Message, delay: float) -> None:
        """A stored message is held back for ``delay`` seconds (nack backoff, retry queue)."""

    def add_delayed(self, vhost: str, exchange: Exchange, msg: Message, delay: float) -> None:
        """A persistent message is held by a durable x-delayed-message exchange."""

    def remove_delayed(self, vhost: str, msg: Message) -> None: ...

    def after_durable(
        self, callback: Callable[[], None], on_failure: Callable[[], None] | None = None
    ) -> None:
        """Run ``callback`` on the loop once everything submitted before it is on disk
        (at once for a store that keeps nothing). Callbacks run in the order given. When an
        operation submitted since the previous callback could not be written (its record is
        unwritable, see docs/durability.md), ``on_failure`` runs instead, if given."""

    # ------------------------------------------------------------------ paging

    def paged_ready(self, queue: Queue) -> ReadyList | None:
        """A ready list for a saved, pageable queue that keeps deep bodies on disk only, or
        None (the queue keeps its own)."""

    def read_body(self, queue: Queue, msg: Message) -> bytes | None:
        """The body of a stored message, read now (a paged message about to be copied)."""

    # ------------------------------------------------------------------ recovery

    def recovering(self) -> AbstractContextManager[None]:
        """Around rebuilding the broker from the records: declarations the core replays are
        not written back, and the store finishes its own work (paging) at the end."""

    def read_topology(self) -> StoredTopology: ...

    def read_messages(self) -> Iterator[MessageRecord]:
        """Every stored message of every stored queue, in the order they entered it."""

    def read_delayed(self) -> Iterator[DelayedRecord]:
        """Messages held by delayed exchanges, earliest due first."""

    def discard(self, record: BindingRecord | MessageRecord | DelayedRecord) -> None:
        """The core could not restore this record (an end is missing, it is unreadable):
        delete it."""

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is on disk (tests, tools; never on the
        loop). False if that took longer than ``timeout``."""

    def close(self) -> None:
        """Write out what is pending and release the store. A second call does nothing."""


__all__ = [
    "BindingRecord",
    "DelayedRecord",
    "ExchangeRecord",
    "MessageRecord",
    "QueueKey",
    "QueueRecord",
    "Store",
    "StoredTopology",
]

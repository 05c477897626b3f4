"""The durable store behind the broker.

:class:`Store` is the interface the domain calls; :class:`MemoryStore` keeps nothing (a broker
with no ``<store>`` or in tests of the domain). Writes are fire-and-forget from the loop's
point of view; :meth:`Store.after_durable` runs a callback once everything submitted before it
is on disk, which is how publisher confirms for persistent messages wait for the disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.domain.exchange import Exchange
    from broker.domain.message import Message
    from broker.domain.queue import Queue


class Store(Protocol):
    #: False for a store that keeps nothing; the domain then skips persistence work entirely
    durable: bool

    def add_message(self, queue: Queue, msg: Message) -> None: ...

    def remove_message(self, queue: Queue, msg: Message) -> None: ...

    def update_message(self, queue: Queue, msg: Message) -> None: ...

    def save_queue(self, queue: Queue) -> None: ...

    def delete_queue(self, vhost: str, name: str) -> None: ...

    def save_exchange(self, vhost: str, exchange: Exchange) -> None: ...

    def delete_exchange(self, vhost: str, name: str) -> None: ...

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

    def after_durable(self, callback: Callable[[], None]) -> None: ...

    def close(self) -> None: ...

    # called only for stored messages (``msg.stored``) or durable delayed holds
    def delivered(self, queue: Queue, msg: Message) -> None: ...

    def hold_message(self, queue: Queue, msg: Message, delay: float) -> None: ...

    def add_delayed(self, vhost: str, exchange: Exchange, msg: Message, delay: float) -> None: ...

    def remove_delayed(self, vhost: str, msg: Message) -> None: ...

    def bind_loop(self, loop: Any) -> None: ...

    def read_body(self, queue: Queue, msg: Message) -> bytes | None: ...


class MemoryStore:
    """Keeps nothing: every call returns at once and confirms are immediate."""

    durable = False

    def add_message(self, queue: Any, msg: Any) -> None:
        pass

    def remove_message(self, queue: Any, msg: Any) -> None:
        pass

    def update_message(self, queue: Any, msg: Any) -> None:
        pass

    def save_queue(self, queue: Any) -> None:
        pass

    def delete_queue(self, vhost: str, name: str) -> None:
        pass

    def save_exchange(self, vhost: str, exchange: Any) -> None:
        pass

    def delete_exchange(self, vhost: str, name: str) -> None:
        pass

    def save_binding(
        self,
        vhost: str,
        source: str,
        dest_kind: str,
        dest: str,
        key: str,
        arguments: dict[str, Any],
    ) -> None:
        pass

    def delete_binding(
        self,
        vhost: str,
        source: str,
        dest_kind: str,
        dest: str,
        key: str,
        arguments: dict[str, Any],
    ) -> None:
        pass

    def after_durable(self, callback: Callable[[], None]) -> None:
        callback()

    def close(self) -> None:
        pass

    def delivered(self, queue: Any, msg: Any) -> None:
        pass

    def read_body(self, queue: Any, msg: Any) -> bytes | None:
        return None  # nothing is ever paged out

    def hold_message(self, queue: Any, msg: Any, delay: float) -> None:
        pass

    def add_delayed(self, vhost: str, exchange: Any, msg: Any, delay: float) -> None:
        pass

    def remove_delayed(self, vhost: str, msg: Any) -> None:
        pass

    def bind_loop(self, loop: Any) -> None:
        pass

"""The store of a broker without ``<store>``: it keeps nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from plugbroker.store.base import (
    BindingRecord,
    DelayedRecord,
    MessageRecord,
    StoredTopology,
)

if TYPE_CHECKING:
    import asyncio

    from plugbroker.clock import Clock
    from plugbroker.domain.exchange import Exchange
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Queue
    from plugbroker.domain.ready import ReadyList


class MemoryStore:
    """Keeps nothing: every call returns at once, confirms are immediate, and a start
    recovers nothing. Messages live in memory only, as long as the process."""

    durable = False

    def attach(self, clock: Clock, on_alarm: Callable[[str | None], None]) -> None:
        pass

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def save_exchange(self, vhost: str, exchange: Exchange) -> None:
        pass

    def delete_exchange(self, vhost: str, name: str) -> None:
        pass

    def save_queue(self, queue: Queue) -> None:
        pass

    def delete_queue(self, vhost: str, name: str) -> None:
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

    def add_message(self, queue: Queue, msg: Message) -> None:
        pass

    def remove_message(self, queue: Queue, msg: Message) -> None:
        pass

    def update_message(self, queue: Queue, msg: Message) -> None:
        pass

    def delivered(self, queue: Queue, msg: Message) -> None:
        pass

    def hold_message(self, queue: Queue, msg: Message, delay: float) -> None:
        pass

    def add_delayed(self, vhost: str, exchange: Exchange, msg: Message, delay: float) -> None:
        pass

    def remove_delayed(self, vhost: str, msg: Message) -> None:
        pass

    def after_durable(
        self, callback: Callable[[], None], on_failure: Callable[[], None] | None = None
    ) -> None:
        callback()

    def paged_ready(self, queue: Queue) -> ReadyList | None:
        return None

    def read_body(self, queue: Queue, msg: Message) -> bytes | None:
        return None  # nothing is ever paged out

    def recovering(self) -> AbstractContextManager[None]:
        return nullcontext()

    def read_topology(self) -> StoredTopology:
        return StoredTopology()

    def read_messages(self) -> Iterator[MessageRecord]:
        return iter(())

    def read_delayed(self) -> Iterator[DelayedRecord]:
        return iter(())

    def discard(self, record: BindingRecord | MessageRecord | DelayedRecord) -> None:
        pass

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self) -> None:
        pass


__all__ = ["MemoryStore"]

"""What a queue needs from the channel a consumer lives on (the session's channel)."""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Consumer, Queue


class ConsumerChannel(Protocol):
    """What a queue needs from the channel a consumer lives on."""

    id: int
    connection_id: str

    @property
    def unheard(self) -> bool:
        """The broker is not reading the connection (a resource alarm blocks it): the ack
        clocks of its consumers stand still meanwhile."""
        ...

    def can_deliver(self) -> bool: ...

    def deliver(self, consumer: Consumer, msg: Message, queue: Queue) -> None: ...

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None: ...

    def take_unacked(self, consumer: Consumer, only: Container[int] | None = None) -> list[Message]:
        """Take back every message ``consumer`` holds unacked (it is being isolated), or only
        those whose ids are in ``only``; a later ack for one of them is a late settle, not an
        error."""
        ...

    def held_by(self, consumer: Consumer) -> Iterator[Message]:
        """The messages ``consumer`` holds unacked on this channel, oldest delivery first."""
        ...


__all__ = ["ConsumerChannel"]

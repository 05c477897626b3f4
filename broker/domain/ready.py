"""Ready lists: the messages of a queue that wait for a consumer, in the order they go out.

A queue keeps its ready messages in an object that implements :class:`ReadyList`. The domain
has two: :class:`FifoReady` (the default, first in first out) and :class:`PriorityReady`
(``x-max-priority``: highest priority first, first in first out within a priority). A store may
provide a third for queues whose messages can wait without their body in memory (paging, see
:meth:`broker.store.Store.paged_ready`); the queue installs it with
:meth:`broker.domain.queue.Queue.set_ready_list` and treats it like the others.

Dispatch, ``basic.get`` and acks go through these lists for every message, so
:class:`FifoReady` is a :class:`collections.deque` with nothing added on the paths a message
takes: ``len``, truth value, ``append`` and ``popleft`` stay in C.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol

from broker.domain.message import Message


class ReadyList(Protocol):
    """What a queue needs from its list of ready messages.

    ``len(ready)`` is the number of ready messages. The truth value says whether a message can
    be taken now; it is ``len(ready) > 0`` except for a paging list, which answers False while
    its head's body is still on disk (the dispatcher and ``basic.get`` then see an empty queue
    for the few milliseconds a read takes). Iteration goes in delivery order.
    """

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Message]: ...

    def append(self, msg: Message, /) -> None:
        """Add a message at the back (a publish)."""

    def popleft(self) -> Message:
        """Take the next message to deliver; IndexError when there is none."""

    def peek(self) -> Message | None:
        """The next message to deliver, left in place; None when there is none."""

    def requeue(self, msgs: list[Message], /) -> None:
        """Put delivered messages back at the front, oldest (lowest id) first."""

    def put_front(self, msgs: list[Message], /) -> None:
        """Put messages back at the front in the order given (they were just taken)."""

    def drain(self) -> list[Message]:
        """Remove and return every message, in delivery order."""

    def remove(self, msg: Message, /) -> None:
        """Remove one message; ValueError when it is not in the list."""


class FifoReady(deque[Message]):
    """Ready messages in arrival order."""

    __slots__ = ()

    def peek(self) -> Message | None:
        return self[0] if self else None

    def requeue(self, msgs: list[Message]) -> None:
        for m in sorted(msgs, key=lambda m: m.id, reverse=True):
            self.appendleft(m)

    def put_front(self, msgs: list[Message]) -> None:
        self.extendleft(reversed(msgs))

    def drain(self) -> list[Message]:
        out = list(self)
        self.clear()
        return out


class PriorityReady:
    """Ready messages by priority (``x-max-priority``): highest first, FIFO within a level."""

    __slots__ = ("_levels", "_max", "_n")

    def __init__(self, max_priority: int) -> None:
        self._max = max_priority
        self._levels: list[deque[Message]] = [deque() for _ in range(max_priority + 1)]
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Message]:
        return (m for level in reversed(self._levels) for m in level)

    def _level(self, m: Message) -> deque[Message]:
        return self._levels[min(m.priority, self._max)]

    def append(self, m: Message) -> None:
        self._level(m).append(m)
        self._n += 1

    def popleft(self) -> Message:
        for level in reversed(self._levels):
            if level:
                self._n -= 1
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def peek(self) -> Message | None:
        for level in reversed(self._levels):
            if level:
                return level[0]
        return None

    def requeue(self, msgs: list[Message]) -> None:
        for m in sorted(msgs, key=lambda m: m.id, reverse=True):
            self._level(m).appendleft(m)
            self._n += 1

    def put_front(self, msgs: list[Message]) -> None:
        for m in reversed(msgs):
            self._level(m).appendleft(m)
            self._n += 1

    def drain(self) -> list[Message]:
        out = [m for level in reversed(self._levels) for m in level]
        for level in self._levels:
            level.clear()
        self._n = 0
        return out

    def remove(self, m: Message) -> None:
        self._level(m).remove(m)
        self._n -= 1


__all__ = ["FifoReady", "PriorityReady", "ReadyList"]

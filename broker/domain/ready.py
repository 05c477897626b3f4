"""Ready lists: the messages of a queue that wait for a consumer, in the order they go out.

A queue keeps its ready messages in an object that implements :class:`ReadyList`. The domain
has two: :class:`FifoReady` (the default, first in first out) and :class:`PriorityReady`
(``x-max-priority``: highest priority first, first in first out within a priority). A store may
provide a third for queues whose messages can wait without their body in memory (paging, see
:meth:`plugbroker.store.Store.paged_ready`); the queue installs it with
:meth:`plugbroker.domain.queue.Queue.set_ready_list` and treats it like the others.

Dispatch, ``basic.get`` and acks go through these lists for every message, so
:class:`FifoReady` is a :class:`collections.deque` with nothing added on the paths a message
takes: ``len``, truth value, ``append`` and ``popleft`` stay in C.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

from plugbroker.domain.message import Message


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
        """Put delivered messages back where they were: by id (publish order) among the
        messages ahead of the oldest one that never left, oldest first."""

    def put_front(self, msgs: list[Message], /) -> None:
        """Put messages back at the front in the order given (they were just taken)."""

    def drain(self) -> list[Message]:
        """Remove and return every message, in delivery order."""

    def remove(self, msg: Message, /) -> None:
        """Remove one message; ValueError when it is not in the list."""


# ------------------------------------------------------------------ requeue in place
#
# A requeued message goes back to its original position (as RabbitMQ returns it): ahead of
# every message published after it, behind those published before it that are ready again
# too. A deque's front is sorted by id while nothing was requeued, so a batch whose ids are
# all below the head (a channel close, a recover, one reject) goes in with ``appendleft``.
# Anything else (rejects one by one in publish order, say) waits in a small heap by id
# beside the deque, and the list changes its class to :class:`_FrontHeap`'s subclass for as
# long as the heap has messages: then ``popleft``, ``peek``, ``len`` and iteration merge the
# two by id. The class without a heap keeps the deque's own C methods, so the message path
# costs nothing more; a requeue costs O(log k) for k messages in the heap.

_dq_len = deque.__len__
_dq_getitem = deque.__getitem__
_dq_iter = deque.__iter__


def requeue_in_place(r: deque[Message], msgs: list[Message], fronted: type) -> None:
    """Requeue ``msgs`` into ``r`` (a deque-based list without a heap); see above."""
    msgs = sorted(msgs, key=_by_id)
    if not msgs:
        return
    if not _dq_len(r) or msgs[-1].id < _dq_getitem(r, 0).id:
        r.extendleft(reversed(msgs))
        return
    r._front = [(m.id, id(m), m) for m in msgs]  # type: ignore[attr-defined]
    heapq.heapify(r._front)  # type: ignore[attr-defined]
    r.__class__ = fronted


def _by_id(m: Message) -> int:
    return m.id


def with_front_heap(base: type[Any]) -> type[Any]:
    """The class ``base`` (a deque of messages with a ``_front`` slot) takes while requeued
    messages wait in its heap. ``base.popleft`` and ``base.__bool__`` are used for the deque's
    own head."""
    base_popleft = base.popleft
    base_bool = base.__dict__.get("__bool__")
    base_drain = base.drain
    base_remove = base.remove

    class Fronted(base):
        __slots__ = ()

        def _heap_first(self) -> bool:
            front = self._front
            return bool(front) and (not _dq_len(self) or front[0][0] < _dq_getitem(self, 0).id)

        def _settle(self) -> None:
            if not self._front:
                self.__class__ = base

        def __len__(self) -> int:
            return _dq_len(self) + len(self._front)

        def __bool__(self) -> bool:
            if self._heap_first():
                return True
            if base_bool is not None:
                return bool(base_bool(self))
            return _dq_len(self) > 0

        def __iter__(self) -> Iterator[Message]:
            front: list[tuple[int, int, Message]] = sorted(self._front)
            i, n = 0, len(front)
            m: Message
            for m in _dq_iter(self):
                while i < n and front[i][0] < m.id:
                    yield front[i][2]
                    i += 1
                yield m
            for _, _, m in front[i:]:
                yield m

        def popleft(self) -> Message:
            if not _dq_len(self):
                # only requeued messages left: into the deque in one go (O(k log k) once), and
                # back to the class whose popleft is the deque's
                front = self._front
                if not front:
                    raise IndexError("pop from an empty queue")
                front.sort()
                self.extend([entry[2] for entry in front])
                front.clear()
                self.__class__ = base
                first: Message = base_popleft(self)
                return first
            if self._heap_first():
                m: Message = heapq.heappop(self._front)[2]
                self._settle()
                return m
            head: Message = base_popleft(self)
            return head

        def peek(self) -> Message | None:
            head: Message | None
            if self._heap_first():
                head = self._front[0][2]
            else:
                head = _dq_getitem(self, 0) if _dq_len(self) else None
            return head

        def requeue(self, msgs: list[Message]) -> None:
            front = self._front
            for m in msgs:
                heapq.heappush(front, (m.id, id(m), m))

        def drain(self) -> list[Message]:
            out = list(self)
            self._front.clear()
            self.__class__ = base
            base_drain(self)
            return out

        def remove(self, msg: Message) -> None:
            front = self._front
            for i, entry in enumerate(front):
                if entry[2] is msg:
                    front[i] = front[-1]
                    front.pop()
                    heapq.heapify(front)
                    self._settle()
                    return
            base_remove(self, msg)

    Fronted.__name__ = Fronted.__qualname__ = f"{base.__name__}WithRequeued"
    return Fronted


class FifoReady(deque[Message]):
    """Ready messages in arrival order."""

    __slots__ = ("_front",)

    def peek(self) -> Message | None:
        return self[0] if self else None

    def requeue(self, msgs: list[Message]) -> None:
        requeue_in_place(self, msgs, _FifoFronted)

    def put_front(self, msgs: list[Message]) -> None:
        self.extendleft(reversed(msgs))

    def drain(self) -> list[Message]:
        out = list(self)
        self.clear()
        return out


_FifoFronted = with_front_heap(FifoReady)


class PriorityReady:
    """Ready messages by priority (``x-max-priority``): highest first, FIFO within a level."""

    __slots__ = ("_levels", "_max", "_n")

    def __init__(self, max_priority: int) -> None:
        self._max = max_priority
        self._levels: list[FifoReady] = [FifoReady() for _ in range(max_priority + 1)]
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Message]:
        return (m for level in reversed(self._levels) for m in level)

    def _level(self, m: Message) -> FifoReady:
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
                return level.peek()
        return None

    def requeue(self, msgs: list[Message]) -> None:
        by_level: dict[int, list[Message]] = {}
        for m in msgs:
            by_level.setdefault(min(m.priority, self._max), []).append(m)
        for p, group in by_level.items():
            self._levels[p].requeue(group)
        self._n += len(msgs)

    def put_front(self, msgs: list[Message]) -> None:
        for m in reversed(msgs):
            self._level(m).appendleft(m)
            self._n += 1

    def drain(self) -> list[Message]:
        out = [m for level in reversed(self._levels) for m in level.drain()]
        self._n = 0
        return out

    def remove(self, m: Message) -> None:
        self._level(m).remove(m)
        self._n -= 1


__all__ = ["FifoReady", "PriorityReady", "ReadyList", "requeue_in_place", "with_front_heap"]

"""One heap of deferred callbacks per broker, woken by a single loop timer.

Message TTLs, delayed deliveries, nack backoff and queue expiry all schedule here. A million
pending entries are a million heap items, not a million loop timers: the adapter arms one
``loop.call_at`` for the earliest due time (:attr:`Timers.on_earliest_changed`) and calls
:meth:`Timers.run_due` when it fires. Tests drive :meth:`run_due` with a manual clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("broker.timers")

#: cancelled entries are dropped from the heap all at once when there are more of them than
#: this and they outnumber the live ones (a heap of cancelled entries costs memory, not time)
COMPACT_AT = 256


def _cancelled_fn(
    *args: Any,
) -> None:  # pragma: no cover - never called: cancelled handles are skipped
    pass


class TimerHandle:
    __slots__ = ("args", "cancelled", "due", "fn")

    def __init__(self, due: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.due = due
        self.fn = fn
        self.args = args
        self.cancelled = False


class Timers:
    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        #: set by the adapter: called with the new earliest due time when it moves earlier
        self.on_earliest_changed: Callable[[float], None] | None = None
        self.live = 0
        #: cancelled entries still in the heap (see :data:`COMPACT_AT`)
        self._dead = 0

    def __len__(self) -> int:
        return self.live

    def call_at(self, due: float, fn: Callable[..., Any], *args: Any) -> TimerHandle:
        handle = TimerHandle(due, fn, args)
        heap = self._heap
        earliest = heap[0][0] if heap else None
        heapq.heappush(heap, (due, next(self._seq), handle))
        self.live += 1
        if (earliest is None or due < earliest) and self.on_earliest_changed is not None:
            self.on_earliest_changed(due)
        return handle

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> TimerHandle:
        return self.call_at(self.clock.monotonic() + delay, fn, *args)

    def cancel(self, handle: TimerHandle) -> None:
        """Cancel ``handle``. What it would have called is let go at once: a cancelled
        connection timer must not keep a closed connection alive until its due time."""
        if not handle.cancelled:
            handle.cancelled = True
            handle.fn = _cancelled_fn
            handle.args = ()
            self.live -= 1
            self._dead += 1
            if self._dead > COMPACT_AT and self._dead > self.live:
                heap = self._heap  # in place: run_due may be iterating over it
                heap[:] = [e for e in heap if not e[2].cancelled]
                heapq.heapify(heap)
                self._dead = 0

    def earliest(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][0] if heap else None

    def run_due(self, now: float | None = None, limit: int = 100_000) -> int:
        """Run callbacks due at ``now`` (default: the clock's time); return how many ran.

        At most ``limit`` run per call so a burst of due timers cannot starve the loop; the
        caller re-arms for :meth:`earliest`.
        """
        if now is None:
            now = self.clock.monotonic()
        heap = self._heap
        ran = 0
        while heap and ran < limit:
            due, _, handle = heap[0]
            if handle.cancelled:
                heapq.heappop(heap)
                self._dead -= 1
                continue
            if due > now:
                break
            heapq.heappop(heap)
            handle.cancelled = True
            self.live -= 1
            ran += 1
            try:
                handle.fn(*handle.args)
            except Exception:  # one broken timer must not stop the others due with it
                log.exception("timer callback %r failed", handle.fn)
        return ran

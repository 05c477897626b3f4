"""Work of the admin interface that grows with the broker's objects, done in bounded steps.

A listing, a metrics page or a sample of every queue reads the core API a chunk of
:data:`CHUNK` objects at a time and gives the loop a turn between two chunks
(:class:`Steps`), so one request over 100,000 queues costs every other client a few
milliseconds a turn instead of seconds at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

__all__ = ["CHUNK", "STEP_BUDGET", "Steps", "chunked"]

T = TypeVar("T")

#: objects handled between two turns of the loop
CHUNK = 128
#: and at most this much of the loop's time (seconds), whatever the objects cost
STEP_BUDGET = 0.002


class Steps:
    """Counts a request's work and yields to the loop every ``chunk`` objects or ``budget``
    seconds, whichever comes first. ``turns`` counts the yields."""

    __slots__ = ("budget", "chunk", "n", "started", "turns", "waited")

    def __init__(self, chunk: int = CHUNK, budget: float = STEP_BUDGET) -> None:
        self.chunk = chunk
        self.budget = budget
        self.n = 0
        self.turns = 0
        #: seconds spent waiting for the loop's other work between steps
        self.waited = 0.0
        self.started = time.perf_counter()

    async def tick(self, n: int = 1) -> None:
        """``n`` more objects handled: a turn for everyone else once the step is full."""
        self.n += n
        if self.n >= self.chunk or time.perf_counter() - self.started >= self.budget:
            await self.turn()

    async def turn(self) -> None:
        """A turn of the loop for everyone else now; the next step starts afresh."""
        before = time.perf_counter()
        await asyncio.sleep(0)
        self.turns += 1
        self.n = 0
        self.started = time.perf_counter()
        self.waited += self.started - before


def chunked(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    """``items`` a slice of ``size`` at a time."""
    for start in range(0, len(items), size):
        yield items[start : start + size]

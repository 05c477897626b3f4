"""Injectable time for the core.

Nothing in the domain calls :func:`time.monotonic` directly: it asks its clock, so a test of a
five-minute timeout advances a :class:`ManualClock` instead of sleeping.

``monotonic()`` measures intervals (timeouts, ages, rates); ``time()`` is wall-clock seconds
since the epoch and is only used for what leaves the broker (journal timestamps, ``x-death``).
"""

from __future__ import annotations

import time as _time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()


class ManualClock:
    """A clock that moves only when told to; for tests and for replaying a journal."""

    __slots__ = ("_mono", "_offset")

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._mono = start
        self._offset = wall_offset

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._mono + self._offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._mono += seconds

    def set(self, monotonic: float) -> None:
        if monotonic < self._mono:
            raise ValueError("a clock does not go back")
        self._mono = monotonic

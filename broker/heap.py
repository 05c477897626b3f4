"""CPython's cycle collector, watched and kept small for a broker.

A full collection (generation 2) walks every object the collector tracks, and the event loop
stands still while it does: 25 to 45 ms for the 50,000 objects of a plain start on the
development machine, a second with 400,000 messages held. CPython runs one whenever what
survived into generation 2 since the last one is a quarter of what was there.

What ``plugbroker run`` does about it:

- at start, once the store is recovered and the listeners are open, one collection and then
  :func:`gc.freeze` (:func:`freeze_start_heap`): what the start built (modules, plugins, the
  configuration, recovered messages) is out of the collector's reach, so later full
  collections walk only what was made since. Frozen objects are still freed by reference
  counting the moment they are dropped (an acked recovered message, a deleted queue);
  a reference cycle among them would stay until the process ends, and what the start builds
  lives as long as the broker.
- the broker's own objects hold no reference cycles when they are let go: a closed connection
  is freed by reference counting at once (``tests/e2e/test_connection_lifetime.py``), so a
  client opening and dropping connections in a loop leaves nothing for the collector.
- every collection is counted and timed (:class:`CollectorWatch`) for ``/metrics``.

Freezing what survives every full collection, not only the start, was tried and dropped: it
would keep cyclic garbage among frozen objects alive until an unfreeze.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CollectorStats:
    """What the cycle collector cost, per generation (index 2: full collections)."""

    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    pause_total: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    pause_max: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    frozen: int = 0
    #: timed by a :class:`CollectorWatch` (else only counts are known)
    timed: bool = False


class CollectorWatch:
    """Counts and times every collection through :data:`gc.callbacks` (two calls per
    collection: a few microseconds per young collection, nothing on the message path)."""

    def __init__(self) -> None:
        self.stats = CollectorStats(timed=True)
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_collection)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_collection)
            self._installed = False

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        s = self.stats
        generation = info["generation"]
        s.collections[generation] += 1
        s.pause_total[generation] += took
        if took > s.pause_max[generation]:
            s.pause_max[generation] = took


_watch: CollectorWatch | None = None


def freeze_start_heap() -> int:
    """Collect once and freeze what the start left; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def watch_collector() -> CollectorWatch:
    """Install the process' collector watch (once) and return it."""
    global _watch
    if _watch is None:
        _watch = CollectorWatch()
        _watch.install()
    return _watch


def collector_stats() -> CollectorStats:
    """The watch's figures, or a snapshot with counts only when none is installed.
    Counting the frozen objects walks them (about 10 ms per million): not for a hot path."""
    if _watch is not None:
        _watch.stats.frozen = gc.get_freeze_count()
        return _watch.stats
    counts = [g["collections"] for g in gc.get_stats()]
    return CollectorStats(collections=counts, frozen=gc.get_freeze_count())

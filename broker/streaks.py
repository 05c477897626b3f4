"""Repeated decisions, told once: the first and the last of a run of "spared" or "deferred".

A policy job that finds the same queue in the same state at every check (a durable
subscription its ``<consumer>`` section spares, a queue known as a dead-letter target, an
action the blast-radius budget keeps deferring) would otherwise log a line and journal an
event every few seconds. One :class:`Streaks` per job (kept by the housekeeping pool, handed to
:func:`plugbroker.core.actions.apply_actions`) turns that into two: one when the decision first
comes, one when a check no longer makes it, with how many checks in a row it lasted.

Plain Python with no broker import: the core and any other applier may use it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Streak", "Streaks"]


@dataclass(slots=True)
class Streak:
    """One decision repeated at consecutive checks."""

    #: ``"spared"`` or ``"deferred"``
    outcome: str
    #: the action of its latest check
    action: Any
    #: checks in a row that made it
    count: int = 1


@dataclass(slots=True)
class Streaks:
    """The open streaks of one policy job, by key (policy, action type, vhost, queue,
    consumer, threshold, outcome)."""

    open: dict[Hashable, Streak] = field(default_factory=dict)
    _seen: set[Hashable] = field(default_factory=set)

    def begin(self) -> None:
        """A check's actions are about to be applied."""
        self._seen = set()

    def repeat(self, key: Hashable, outcome: str, action: Any) -> bool:
        """``action`` had ``outcome`` at this check: True when the previous check had the
        same (a repeat: count it, say nothing), False when it starts a streak."""
        self._seen.add(key)
        s = self.open.get(key)
        if s is None:
            self.open[key] = Streak(outcome, action)
            return False
        s.count += 1
        s.action = action
        return True

    def end(self) -> list[Streak]:
        """The check is over: the streaks it did not continue, removed."""
        gone = [k for k in self.open if k not in self._seen]
        return [self.open.pop(k) for k in gone]

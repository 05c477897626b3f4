"""The blast-radius budget: how much all policies together may do to one vhost in a window.

``<virtualhost><blastRadius maxActionsPerMinute="..." maxConsumersAffected="..."/>`` bounds,
over a sliding window of one minute on the broker's monotonic clock, how many policy actions
are applied in the vhost and how many distinct consumers they touch. An action over the budget
is not applied: its outcome is ``deferred`` (logged, reported to ``broker_policy_action`` and so
journaled).

Which actions count (:func:`counts`): every action that changes what a client sees, except
:class:`~plugbroker.policy.LogOnly` and :class:`~plugbroker.policy.Spared` (they change nothing) and
:class:`~plugbroker.policy.ReleaseConsumer` (it undoes an isolation; deferring it would prolong
the harm the budget is there to bound) and :class:`~plugbroker.policy.CountTimeout` (it only
counts a timeout the consumer already had on its message; deferring it would let a task longer
than its ack timeout run more often than ``<poisonDeliveries>``).

Which consumers an action affects: the one it names (``consumer_tag`` and ``connection_id``),
or, for an action on the whole queue (a channel close, a queue delete), every consumer of the
queue when it is applied. A consumer already affected within the window is not counted again.

This module is plain Python with no broker import: the core (:mod:`plugbroker.core.actions`) and
the backtest (:mod:`plugbroker.analyze.replay`) apply the same budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from plugbroker.policy import Action, CountTimeout, LogOnly, ReleaseConsumer, Spared

__all__ = ["EXEMPT", "WINDOW", "Budget", "Budgets", "ConsumerKey", "counts"]

#: the sliding window, seconds (the limits are "per minute")
WINDOW = 60.0

#: action types the budget never counts nor defers
EXEMPT: tuple[type[Action], ...] = (LogOnly, Spared, ReleaseConsumer, CountTimeout)

#: a consumer, as ``(connection_id, consumer_tag)``
ConsumerKey = tuple[str, str]


def counts(action: Action) -> bool:
    """Whether ``action`` counts against (and may be deferred by) a budget."""
    return not isinstance(action, EXEMPT)


@dataclass(slots=True)
class Budget:
    """One vhost's budget. ``None`` for a limit means "no limit".

    :meth:`check` says whether an action may be applied now, :meth:`record` counts one that was.
    Both first forget what left the window, so memory stays bounded by the limits' worth of
    actions and consumers in a minute.
    """

    max_actions: int | None = None
    max_consumers: int | None = None
    window: float = WINDOW
    #: times of the actions applied in the window, oldest first
    _actions: deque[float] = field(default_factory=deque)
    #: consumer -> when an action last affected it
    _consumers: dict[ConsumerKey, float] = field(default_factory=dict)

    def _forget(self, now: float) -> None:
        horizon = now - self.window
        acts = self._actions
        while acts and acts[0] <= horizon:
            acts.popleft()
        if self._consumers:
            old = [k for k, t in self._consumers.items() if t <= horizon]
            for k in old:
                del self._consumers[k]

    def check(self, now: float, consumers: Iterable[ConsumerKey] = ()) -> str | None:
        """``None`` if an action affecting ``consumers`` fits the budget at ``now``, else why not
        (for the log line)."""
        self._forget(now)
        if self.max_actions is not None and len(self._actions) + 1 > self.max_actions:
            return (
                f"{len(self._actions)} action(s) applied in the last {self.window:g} s, "
                f"maxActionsPerMinute {self.max_actions}"
            )
        if self.max_consumers is not None:
            new = {c for c in consumers if c not in self._consumers}
            if new and len(self._consumers) + len(new) > self.max_consumers:
                return (
                    f"{len(self._consumers)} consumer(s) affected in the last {self.window:g} s "
                    f"and {len(new)} more, maxConsumersAffected {self.max_consumers}"
                )
        return None

    def record(self, now: float, consumers: Iterable[ConsumerKey] = ()) -> None:
        """Count an action applied at ``now`` that affected ``consumers``."""
        self._forget(now)
        self._actions.append(now)
        for c in consumers:
            self._consumers[c] = now

    @property
    def used(self) -> tuple[int, int]:
        """``(actions, consumers)`` in the window as last pruned (for tests and the admin)."""
        return len(self._actions), len(self._consumers)


class Budgets:
    """The budgets of every vhost, created on first use from the configured limits.

    A reload that changes a vhost's limits starts its budget afresh; one that keeps them keeps
    the window's history.
    """

    __slots__ = ("_by_vhost",)

    def __init__(self) -> None:
        self._by_vhost: dict[str, Budget] = {}

    def get(self, vhost: str, max_actions: int | None, max_consumers: int | None) -> Budget | None:
        """The budget of ``vhost`` with these limits; ``None`` when both limits are unset."""
        if max_actions is None and max_consumers is None:
            self._by_vhost.pop(vhost, None)
            return None
        b = self._by_vhost.get(vhost)
        if b is None or (b.max_actions, b.max_consumers) != (max_actions, max_consumers):
            b = self._by_vhost[vhost] = Budget(max_actions, max_consumers)
        return b

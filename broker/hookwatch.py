"""The hook watchdog: which plugin hook held the event loop, and for how long.

Python cannot pre-empt a hook implementation: one that sleeps or computes for two seconds holds
the loop, and every connection, for two seconds. What the broker can do is say so. The plugin
host times every implementation it calls (:meth:`HookWatch.enter` / :meth:`HookWatch.leave`,
about two clock reads a call) and a call over the budget (``<limits><hookBudget>``) is counted
per plugin and hook (``/metrics``) and logged with both names: the first time, then at most once
a minute with the count since. A hook that never returns would never be measured, so a
watchdog thread (:meth:`HookWatch.start`) looks at the call in progress a few times per budget
and logs, while the call is still running, which plugin's hook holds the loop.

The timer is injectable (``timer``, seconds as a float); the watchdog thread needs real time to
notice anything and waits on a :class:`threading.Event`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("broker.plugins")

__all__ = ["DEFAULT_HOOK_BUDGET", "HookWatch"]

#: seconds a hook call may take on the loop before it is logged and counted
DEFAULT_HOOK_BUDGET = 0.1
#: seconds between two log lines about the same plugin and hook (the count says the rest)
LOG_EVERY = 60.0


class HookWatch:
    """Times hook calls against :attr:`budget`; counts and logs the slow ones."""

    def __init__(
        self,
        budget: float = DEFAULT_HOOK_BUDGET,
        *,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        #: seconds a call may take (0: no watch)
        self.budget = budget
        self.timer = timer
        #: the call in progress on the loop: (plugin, hook, started), or None
        self.current: tuple[str, str, float] | None = None
        #: (plugin, hook) -> calls over the budget
        self.slow_calls: dict[tuple[str, str], int] = {}
        #: (plugin, hook) -> the longest call seen, seconds
        self.slowest: dict[tuple[str, str], float] = {}
        #: (plugin, hook) -> when it was last logged, and the count then
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def enter(self, plugin: str, hook: str) -> float:
        """A call of ``plugin``'s ``hook`` starts; returns its start time for :meth:`leave`."""
        t0 = self.timer()
        self.current = (plugin, hook, t0)
        return t0

    def leave(self, plugin: str, hook: str, t0: float) -> None:
        """The call started at ``t0`` returned (or raised)."""
        self.current = None
        took = self.timer() - t0
        if took > self.budget > 0:
            self.over(plugin, hook, took)

    def over(self, plugin: str, hook: str, took: float) -> None:
        """Count a call over the budget, and log it when due."""
        key = (plugin, hook)
        n = self.slow_calls.get(key, 0) + 1
        self.slow_calls[key] = n
        if took > self.slowest.get(key, 0.0):
            self.slowest[key] = took
        now = self.timer()
        last = self._logged.get(key)
        if last is not None and now - last[0] < LOG_EVERY:
            return
        since = n - last[1] if last is not None else 1
        self._logged[key] = (now, n)
        log.warning(
            "plugin %r: its %s hook held the event loop for %.3f s (budget %.3f s); every "
            "connection waited meanwhile (%d such call(s) since the last line, %d in all)",
            plugin,
            hook,
            took,
            self.budget,
            since,
            n,
        )

    # -- the watchdog thread ------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="hook-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _watch(self) -> None:
        reported: tuple[str, str, float] | None = None
        while not self._stop.wait(max(self.budget / 2, 0.01) if self.budget > 0 else 1.0):
            cur = self.current
            if cur is None or cur is reported or self.budget <= 0:
                continue
            plugin, hook, t0 = cur
            held = self.timer() - t0
            if held > self.budget:
                reported = cur
                log.warning(
                    "plugin %r: its %s hook has held the event loop for %.3f s so far (budget "
                    "%.3f s); the broker serves nobody until it returns",
                    plugin,
                    hook,
                    held,
                    self.budget,
                )

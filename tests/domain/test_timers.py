from __future__ import annotations

import weakref

from plugbroker.clock import ManualClock
from plugbroker.domain.timers import COMPACT_AT, Timers


def test_timers_run_in_due_order_and_report_the_earliest_change():
    clock = ManualClock()
    t = Timers(clock)
    armed: list[float] = []
    t.on_earliest_changed = armed.append
    ran: list[str] = []
    t.call_later(3, ran.append, "c")
    t.call_later(1, ran.append, "a")
    h = t.call_later(2, ran.append, "b")
    t.call_later(5, ran.append, "late")  # not earlier: no re-arm
    assert armed == [clock.monotonic() + 3, clock.monotonic() + 1]
    t.cancel(h)
    clock.advance(3)
    assert t.run_due() == 2
    assert ran == ["a", "c"]
    assert t.earliest() == clock.monotonic() + 2
    assert len(t) == 1


def test_run_due_is_bounded_per_call():
    clock = ManualClock()
    t = Timers(clock)
    ran: list[int] = []
    for i in range(10):
        t.call_later(0.001 * i, ran.append, i)
    clock.advance(1)
    assert t.run_due(limit=4) == 4
    assert t.run_due() == 6
    assert ran == list(range(10))


class _Owner:
    """Something a timer's callback keeps alive (a connection, in the broker)."""

    def fire(self) -> None:
        raise AssertionError("a cancelled timer ran")


def test_a_cancelled_timer_lets_go_of_its_callback_at_once():
    t = Timers(ManualClock())
    owner = _Owner()
    ref = weakref.ref(owner)
    h = t.call_later(3600, owner.fire)
    t.cancel(h)
    del owner
    assert ref() is None  # not kept until the hour is up
    t.cancel(h)  # twice is harmless
    assert len(t) == 0


def test_cancelled_entries_are_compacted_and_the_rest_still_run_in_order():
    clock = ManualClock()
    t = Timers(clock)
    ran: list[int] = []
    handles = [t.call_later(1 + i * 0.001, ran.append, i) for i in range(3 * COMPACT_AT)]
    for i, h in enumerate(handles):
        if i % 3:
            t.cancel(h)
    assert len(t._heap) < 3 * COMPACT_AT  # compacted while cancelling, not only when due
    assert len(t) == COMPACT_AT
    clock.advance(10)
    assert t.run_due() == COMPACT_AT
    assert ran == list(range(0, 3 * COMPACT_AT, 3))
    assert t.earliest() is None


def test_a_callback_may_cancel_timers_while_run_due_runs():
    clock = ManualClock()
    t = Timers(clock)
    ran: list[int] = []
    later = [t.call_later(2 + i * 0.001, ran.append, i) for i in range(2 * COMPACT_AT + 2)]

    def cancel_all() -> None:  # compacts the heap run_due is walking
        for h in later[1:]:
            t.cancel(h)

    t.call_later(1, cancel_all)
    clock.advance(10)
    assert t.run_due() == 2
    assert ran == [0]

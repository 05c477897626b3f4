from __future__ import annotations

from plugbroker.clock import ManualClock
from plugbroker.domain.timers import Timers


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

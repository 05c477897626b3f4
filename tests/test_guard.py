"""The login throttle: doubling per peer address up to a cap, forgotten after a quiet period."""

from __future__ import annotations

from broker.clock import ManualClock
from broker.guard import LoginThrottle


def test_each_failure_from_one_peer_doubles_its_delay_up_to_the_cap() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0)
    assert [t.failed("10.0.0.1") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert t.failures("10.0.0.1") == 5


def test_another_peer_starts_at_the_base_delay() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0)
    for _ in range(4):
        t.failed("10.0.0.1")
    assert t.failed("10.0.0.2") == 0.5


def test_a_quiet_peer_is_forgotten() -> None:
    clock = ManualClock()
    t = LoginThrottle(clock, 0.5, 3.0, forget_after=60.0)
    for _ in range(4):
        t.failed("10.0.0.1")
    clock.advance(61.0)
    assert t.failures("10.0.0.1") == 0
    assert t.failed("10.0.0.1") == 0.5


def test_the_table_holds_a_bounded_number_of_peers() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0, max_peers=100)
    for i in range(1000):
        t.failed(f"10.0.{i // 256}.{i % 256}")
    assert t.peers() <= 100
    assert t.failures("10.0.3.231") == 1  # the newest is kept


def test_a_zero_base_disables_the_throttle() -> None:
    t = LoginThrottle(ManualClock(), 0.0, 0.0)
    assert t.failed("10.0.0.1") == 0.0 and t.failures_total == 1 and t.throttled_total == 0


def test_a_peer_failing_for_ever_does_not_overflow() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0)
    for _ in range(2000):
        delay = t.failed("10.0.0.1")
    assert delay == 3.0

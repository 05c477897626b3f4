"""The front door's guards: the login throttle (doubling per peer address up to a cap,
forgotten after a quiet period) and the accept loop's back-off."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pytest

from plugbroker.clock import ManualClock
from plugbroker.guard import ACCEPT, REFUSE, TURN_AWAY, Acceptor, LoginThrottle


def test_each_failure_from_one_peer_doubles_its_delay_up_to_the_cap() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0)
    assert [t.failed("10.0.0.1") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert t.failures("10.0.0.1") == 5


def test_next_delay_says_what_the_next_failure_gets_without_counting_it() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0)
    assert t.next_delay("10.0.0.1") == 0.5
    for expected in (0.5, 1.0, 2.0, 3.0, 3.0):
        assert t.next_delay("10.0.0.1") == expected == t.failed("10.0.0.1")
    assert t.failures_total == 5
    assert LoginThrottle(ManualClock(), 0.0, 3.0).next_delay("10.0.0.1") == 0.0


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


class _Loop:
    """Records what the acceptor asks of the event loop."""

    def __init__(self) -> None:
        self.readers: dict[int, Any] = {}
        self.later: list[tuple[float, Any]] = []

    def add_reader(self, fd: int, cb: Any) -> None:
        self.readers[fd] = cb

    def remove_reader(self, fd: int) -> bool:
        return self.readers.pop(fd, None) is not None

    def call_later(self, delay: float, cb: Any) -> Any:
        self.later.append((delay, cb))
        return _Handle()


class _Handle:
    def cancel(self) -> None:
        pass


class _EmfileSocket:
    def __init__(self) -> None:
        self.closed = False

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:
        return 7

    def accept(self) -> Any:
        raise OSError(errno.EMFILE, "Too many open files")

    def close(self) -> None:
        self.closed = True


def test_accept_out_of_descriptors_backs_off_doubling_and_logs_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    loop = _Loop()
    a = Acceptor(
        loop,  # type: ignore[arg-type]
        _EmfileSocket(),  # type: ignore[arg-type]
        lambda: None,  # type: ignore[arg-type,return-value]
        clock=clock,
        log=logging.getLogger("test.accept"),
        min_delay=0.05,
        max_delay=0.4,
        log_interval=10.0,
    )
    a.start()
    delays = []
    with caplog.at_level(logging.WARNING, logger="test.accept"):
        for _ in range(6):
            loop.readers[7]()  # readable: accept() fails
            assert 7 not in loop.readers and a.backing_off  # not watched while backing off
            delay, resume = loop.later.pop()
            delays.append(delay)
            clock.advance(delay)
            resume()
            assert 7 in loop.readers
        assert delays == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]
        assert len(caplog.records) == 1  # 1.55 s of failures: one line
        clock.advance(10.0)
        loop.readers[7]()
        assert len(caplog.records) == 2 and "(5 more since the last report)" in caplog.text
    assert a.failures_total == 7
    a.close()


# -------------------------------------------------- per (user, address) and per address


def test_a_right_password_is_let_in_at_once_however_many_others_fail_from_its_address() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0)
    for i in range(1000):  # a guesser spraying many users from the address
        assert t.judge(f"user{i % 50}", "10.0.0.1", False)[0] == REFUSE
    assert t.judge("bob", "10.0.0.1", True) == (ACCEPT, 0.0)
    assert t.locked_total == 0


def test_a_user_under_attack_from_an_address_is_refused_there_whatever_the_password() -> None:
    clock = ManualClock()
    t = LoginThrottle(clock, 0.5, 3.0, attack_after=3, forget_after=60.0)
    assert [t.judge("alice", "10.0.0.1", False) for _ in range(3)] == [
        (REFUSE, 0.5),
        (REFUSE, 1.0),
        (REFUSE, 2.0),
    ]
    assert t.under_attack("alice", "10.0.0.1")
    # the right password is refused too, as late as a guess would be: no guess is confirmed
    assert t.judge("alice", "10.0.0.1", True) == (REFUSE, 3.0)
    assert t.locked_total == 1 and t.failures("10.0.0.1", "alice") == 3  # not counted
    # from another address, and for another user from this one, nothing changes
    assert t.judge("alice", "10.0.0.2", True) == (ACCEPT, 0.0)
    assert t.judge("bob", "10.0.0.1", True) == (ACCEPT, 0.0)
    clock.advance(61.0)  # quiet for long enough: forgotten
    assert t.judge("alice", "10.0.0.1", True) == (ACCEPT, 0.0)


def test_an_address_adds_its_own_delay_past_its_free_failures() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 60.0, address_free=4)
    # one failure each for many users: the pair delay stays at the base ...
    delays = [t.judge(f"u{i}", "10.0.0.1", False)[1] for i in range(8)]
    # ... until the address as a whole is past its free failures, then it doubles
    assert delays == [0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 2.0, 4.0]
    assert t.judge("u0", "10.0.0.2", False)[1] == 0.5  # another address starts afresh


def test_an_attempt_that_would_wait_is_turned_away_while_the_address_has_too_many_waiting() -> None:
    t = LoginThrottle(ManualClock(), 0.5, 3.0, max_pending=2)
    t.hold("10.0.0.1")
    t.hold("10.0.0.1")
    assert t.judge("alice", "10.0.0.1", False) == (TURN_AWAY, 0.0)
    assert t.failures("10.0.0.1", "alice") == 1  # a guess turned away still counts
    assert t.judge("bob", "10.0.0.1", True) == (ACCEPT, 0.0)  # the innocent get in
    assert t.turned_away_total == 1
    t.release("10.0.0.1")
    assert t.judge("alice", "10.0.0.1", False)[0] == REFUSE

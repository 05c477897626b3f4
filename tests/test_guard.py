"""The front door's guards: the login throttle (doubling per peer address up to a cap,
forgotten after a quiet period) and the accept loop's back-off."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pytest

from plugbroker.clock import ManualClock
from plugbroker.guard import Acceptor, LoginThrottle


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

"""The ack clock with ETA awareness and touch (broker/domain/fate.py), on bare consumers."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from plugbroker.compiled import in_use
from plugbroker.domain import fate

# these tests drive the clock functions with bare namespaces; a compiled fate (the optional
# mypyc build) checks its arguments' types and takes a Consumer only (e2e tests cover it there)
pytestmark = pytest.mark.skipif(
    "plugbroker.domain.fate" in in_use(),
    reason="compiled build: fate takes a real Consumer, not a SimpleNamespace",
)


def consumer() -> SimpleNamespace:
    return SimpleNamespace(unacked=0, busy_since=None, deferred={}, due_heap=[])


def deliver(c: SimpleNamespace, msg_id: int, now: float, due: float | None = None) -> None:
    c.unacked += 1
    if due is not None and due > now:
        fate.hold_deferred(c, msg_id, due)
    else:
        fate.held_due(c, now)


def settle(c: SimpleNamespace, msg_id: int, now: float) -> None:
    c.unacked -= 1
    fate.unheld(c, msg_id)
    fate.restart_clock(c, now)


def test_a_consumer_holding_only_deliveries_not_due_has_its_clock_start_at_the_earliest():
    c = consumer()
    deliver(c, 1, now=0.0, due=50.0)
    deliver(c, 2, now=1.0, due=20.0)
    assert c.busy_since == 20.0
    settle(c, 2, now=5.0)  # acked before due: the clock goes back to the other's due time
    assert c.busy_since == 50.0
    deliver(c, 3, now=6.0)  # a delivery due at once: the clock runs from now
    assert c.busy_since == 6.0
    settle(c, 3, now=7.0)
    assert c.busy_since == 50.0
    fate.touch(c, 60.0)  # past due: a touch restarts it from now
    assert c.busy_since == 60.0
    settle(c, 1, now=61.0)
    assert c.busy_since is None and c.deferred == {} and c.due_heap == []


def test_a_touch_restarts_the_clock_like_an_ack_without_settling():
    c = consumer()
    deliver(c, 1, now=0.0)
    fate.touch(c, 4.0)
    assert (c.unacked, c.busy_since) == (1, 4.0)


def test_the_due_heap_stays_bounded_by_what_is_held():
    c = consumer()
    deliver(c, 0, now=0.0, due=1e9)  # one held for ever keeps the heap's top valid
    for i in range(1, 1000):
        deliver(c, i, now=0.0, due=1e6 + i)
        settle(c, i, now=1.0)
    assert len(c.due_heap) <= 2 * len(c.deferred) + 33


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-01-01T00:00:10+00:00", 1_767_225_610.0),
        ("2026-01-01T01:00:10+01:00", 1_767_225_610.0),
        ("2026-01-01T00:00:10", 1_767_225_610.0),  # no timezone: UTC, as Celery sends it
        ("2026-01-01T00:00:10Z", 1_767_225_610.0),
        (b"2026-01-01T00:00:10Z", 1_767_225_610.0),
        (dt.datetime(2026, 1, 1, 0, 0, 10, tzinfo=dt.UTC), 1_767_225_610.0),
        (1_767_225_610, 1_767_225_610.0),
        ("next tuesday", None),
        (float("nan"), None),
        (True, None),
        ({"a": 1}, None),
    ],
)
def test_due_time_reads_iso_8601_timestamps_and_epoch_seconds(value, expected):
    assert fate.due_time({"eta": value}, ("eta",)) == expected


def test_due_time_takes_the_first_header_present():
    h = {"b": "2026-01-01T00:00:10Z", "a": None}
    assert fate.due_time(h, ("a", "b")) == 1_767_225_610.0
    assert fate.due_time(h, ("c",)) is None


def test_the_message_age_counts_a_message_not_due_from_its_due_time():
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Queue

    vh = SimpleNamespace(clock=SimpleNamespace(monotonic=lambda: 0.0))
    q = Queue(vh, "q")  # type: ignore[arg-type]
    for i, arrival in enumerate((1.0, 2.0, 3.0)):
        q.held[i] = Message(i, "", "q", b"", b"", 0, arrival, 0.0)
    assert q.oldest_counting() == 1.0
    q.not_due[0] = 50.0  # the oldest is not due before 50: the next one is the oldest
    assert q.oldest_counting() == 2.0
    q.not_due[1] = 40.0
    q.not_due[2] = 45.0
    assert q.oldest_counting() == 40.0  # all not due: the earliest due time (age 0 until then)

"""The domain's ready lists: the shared ReadyList contract, then what each adds."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from readylist import check_ready_list

from plugbroker.codec import properties as P
from plugbroker.domain.message import Message, MessageIds
from plugbroker.domain.ready import FifoReady, PriorityReady, ReadyList

IDS = MessageIds()


def message(body: bytes, priority: int = 0) -> Message:
    raw = P.encode({"priority": priority}) if priority else P.encode({})
    return Message.from_publish(IDS.next(), "", "q", raw, body, len(body), 0.0, 0.0)


LISTS: dict[str, Callable[[], ReadyList]] = {
    "fifo": FifoReady,
    "priority": lambda: PriorityReady(5),
}


@pytest.mark.parametrize("make", LISTS.values(), ids=LISTS.keys())
def test_ready_list_contract(make: Callable[[], ReadyList]) -> None:
    check_ready_list(make(), message)


def test_priority_list_takes_the_highest_first_and_fifo_within_a_level() -> None:
    r = PriorityReady(5)
    low1, high, low2, top = message(b"l1", 1), message(b"h", 4), message(b"l2", 1), message(b"t", 9)
    for m in (low1, high, low2, top):
        r.append(m)
    assert r.peek() is top  # above the maximum: counted as the maximum
    assert list(r) == [top, high, low1, low2]
    assert [r.popleft() for _ in range(4)] == [top, high, low1, low2]
    r.requeue([low2, high, low1])
    assert list(r) == [high, low1, low2]


def test_fifo_list_is_a_deque_so_the_message_path_stays_in_c() -> None:
    # dispatch, basic.get and publish call len(), bool(), append() and popleft() per message:
    # none of them may be a Python-level method on the default list
    for name in ("__len__", "__bool__", "append", "popleft"):
        assert name not in FifoReady.__dict__

"""The :class:`plugbroker.domain.ready.ReadyList` contract, one body for every implementation
(the domain's lists in tests/domain/test_ready.py, a store's paging list in
tests/store/test_store_contract.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from plugbroker.domain.message import Message
from plugbroker.domain.ready import ReadyList


def check_ready_list(r: ReadyList, make: Callable[[bytes], Message]) -> None:
    """``r`` is empty; ``make`` builds a message (with its body, of one priority)."""
    assert len(r) == 0 and not r and r.peek() is None and list(r) == []
    with pytest.raises(IndexError):
        r.popleft()
    a, b, c, d = (make(x) for x in (b"a", b"b", b"c", b"d"))
    for m in (a, b, c):
        r.append(m)
    assert len(r) == 3 and r and r.peek() is a and list(r) == [a, b, c]
    assert r.popleft() is a and r.popleft() is b and len(r) == 1
    r.requeue([b, a])  # oldest (lowest id) first, whatever the order given
    assert list(r) == [a, b, c] and r.peek() is a
    x, y = r.popleft(), r.popleft()
    r.put_front([y, x])  # in the order given
    assert list(r) == [b, a, c]
    r.remove(a)
    assert list(r) == [b, c] and len(r) == 2
    with pytest.raises(ValueError):
        r.remove(d)
    assert r.drain() == [b, c]
    assert len(r) == 0 and not r and r.peek() is None
    check_requeue_in_place(r, make)


def check_requeue_in_place(r: ReadyList, make: Callable[[bytes], Message]) -> None:
    """Requeued messages go back to their original positions (by publish order), whether
    they come back together or one by one, in any order, while others wait or arrive."""
    ms = [make(b"%d" % i) for i in range(8)]
    for m in ms:
        r.append(m)
    taken = [r.popleft() for _ in range(5)]
    assert taken == ms[:5]
    # one by one, oldest first (a consumer rejecting in delivery order): each one goes
    # behind the ones requeued before it
    for m in (taken[1], taken[3], taken[4]):
        r.requeue([m])
    assert list(r) == [ms[1], ms[3], ms[4], ms[5], ms[6], ms[7]] and len(r) == 6
    assert r.peek() is ms[1]
    r.requeue([taken[2], taken[0]])
    assert list(r) == ms and len(r) == 8 and r
    late = make(b"late")
    r.append(late)
    assert [r.popleft() for _ in range(3)] == ms[:3]
    r.requeue([ms[2]])
    r.requeue([ms[0]])
    assert r.peek() is ms[0]
    r.remove(ms[2])
    assert list(r) == [ms[0], *ms[3:], late]
    x = r.popleft()
    r.put_front([x])
    assert r.drain() == [ms[0], *ms[3:], late]
    assert len(r) == 0 and not r and r.peek() is None and list(r) == []
    # and a list that empties its heap behaves as new
    r.append(ms[0])
    r.requeue([])
    assert r.popleft() is ms[0] and not r

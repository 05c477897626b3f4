"""The :class:`broker.domain.ready.ReadyList` contract, one body for every implementation
(the domain's lists in tests/domain/test_ready.py, a store's paging list in
tests/store/test_store_contract.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.domain.message import Message
from broker.domain.ready import ReadyList


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

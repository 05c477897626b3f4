"""Message.copy: every per-message attribute is taken over, in a pure and a compiled build."""

from __future__ import annotations

import pytest

from plugbroker.domain.message import Message

#: every slot of Message but __weakref__ (a compiled build has no __slots__ to read)
ATTRIBUTES = (
    "_headers",
    "_hoff",
    "arrival",
    "body",
    "body_size",
    "delivery_count",
    "exchange",
    "expiration",
    "expires_at",
    "id",
    "persistent",
    "priority",
    "properties",
    "queue_name",
    "redelivered",
    "routing_key",
    "stored",
    "timeouts",
    "timestamp",
)


def test_the_list_is_every_slot_but_weakref() -> None:
    slots = Message.__dict__.get("__slots__")
    if slots is None:
        pytest.skip("compiled build (mypyc): the class has no __slots__ to compare with")
    assert sorted(ATTRIBUTES) == sorted(n for n in slots if n != "__weakref__")


def test_copy_takes_over_every_attribute_and_shares_the_body() -> None:
    m = Message(
        7, "ex", "rk", b"\x00\x00", b"body", 4, 1.5, 2.5, delivery_mode=2, priority=3, expiration=9
    )
    m._headers = {"a": 1}
    m.delivery_count = 2
    m.redelivered = True
    m.expires_at = 9.0
    m.queue_name = "q"
    m.stored = True
    c = m.copy()
    assert c is not m
    for name in ATTRIBUTES:
        assert getattr(c, name) == getattr(m, name), name
    assert c.body is m.body
    c.delivery_count = 5
    assert m.delivery_count == 2


def test_a_copy_of_a_transient_message_is_transient() -> None:
    m = Message(1, "", "q", b"\x00\x00", b"", 0, 0.0, 0.0)
    assert m.persistent is False
    assert m.copy().persistent is False
    assert Message(2, "", "q", b"", b"", 0, 0.0, 0.0, delivery_mode=2).copy().persistent is True

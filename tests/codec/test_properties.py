"""Content properties: the routing peek agrees with the full decode; encode/decode round-trip."""

from __future__ import annotations

import random
from typing import Any

import pytest
from rawclient import properties_bytes

from plugbroker.codec import properties as P

SHORTSTRS = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


def _shortstr(rng: random.Random) -> str:
    s = "".join(rng.choice("abcXYZ019-./:é中") for _ in range(rng.randint(0, 30)))
    return s.encode()[:255].decode("utf-8", "ignore")


def random_properties(rng: random.Random) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name in SHORTSTRS:
        if rng.random() < 0.4:
            props[name] = _shortstr(rng)
    if "expiration" in props and rng.random() < 0.7:
        props["expiration"] = str(rng.randrange(10**9))
    if rng.random() < 0.5:
        props["delivery_mode"] = rng.choice([1, 2, 0, 255])
    if rng.random() < 0.5:
        props["priority"] = rng.randrange(256)
    if rng.random() < 0.3:
        props["timestamp"] = rng.randrange(2**63)  # py-amqp writes and reads it as an int
    if rng.random() < 0.5:
        props["application_headers"] = {
            f"h{i}": rng.choice([1, "v", True, None, 2**40, {"n": [1, 2]}])
            for i in range(rng.randint(0, 6))
        }
    return props


@pytest.mark.parametrize("seed", range(20))
def test_peek_matches_decode_for_random_property_sets(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        props = random_properties(rng)
        raw = properties_bytes(**props)
        full = P.decode(raw)
        mode, prio, exp, hoff = P.peek(raw)
        assert mode == full.get("delivery_mode", 0)
        assert prio == full.get("priority", 0)
        assert exp == full.get("expiration")
        assert (hoff >= 0) == ("application_headers" in full)
        assert P.headers_at(raw, hoff) == full.get("application_headers", {})
        assert P.encode(full) == raw


def test_decode_names_and_values() -> None:
    raw = properties_bytes(
        content_type="application/json",
        delivery_mode=2,
        priority=9,
        expiration="5000",
        application_headers={"x-delay": 100},
        message_id="m1",
        correlation_id="c1",
        reply_to="r",
    )
    assert P.peek(raw)[:3] == (2, 9, "5000")
    d = P.decode(raw)
    assert d["content_type"] == "application/json"
    assert d["application_headers"] == {"x-delay": 100}
    assert d["message_id"] == "m1"


def test_empty_properties() -> None:
    assert P.peek(b"\x00\x00") == (0, 0, None, -1)
    assert P.decode(b"\x00\x00") == {}
    assert P.headers_at(b"\x00\x00", -1) == {}
    assert P.encode({}) == b"\x00\x00"


def test_non_ascii_expiration_peeks_like_decode() -> None:
    raw = properties_bytes(expiration="é1")
    assert P.peek(raw)[2] == P.decode(raw)["expiration"] == "é1"


@pytest.mark.parametrize("seed", range(5))
def test_truncated_or_garbled_properties_raise_only_properties_error(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(60):
        raw = properties_bytes(**random_properties(rng))
        cands = [raw[:n] for n in range(len(raw))]
        for _ in range(20):
            b = bytearray(raw)
            b[rng.randrange(len(b))] = rng.randrange(256)
            cands.append(bytes(b))
        for c in cands:
            for fn in (P.peek, P.decode):
                try:
                    fn(c)
                except P.PropertiesError:
                    pass
            try:
                _, _, _, hoff = P.peek(c)
                P.headers_at(c, hoff)
            except P.PropertiesError:
                pass


def test_truncation_inside_what_peek_reads_is_an_error() -> None:
    raw = properties_bytes(
        content_type="t",
        application_headers={"a": "b"},
        delivery_mode=2,
        priority=1,
        expiration="100",
    )
    for n in range(len(raw)):
        with pytest.raises(P.PropertiesError):
            P.peek(raw[:n])


@pytest.mark.parametrize("value,expect", [(None, None), ("0", 0), ("60000", 60000), ("007", 7)])
def test_expiration_ms(value: str | None, expect: int | None) -> None:
    assert P.expiration_ms(value) == expect


@pytest.mark.parametrize("value", ["", "-1", "1.5", "abc", " 1", "1e3", "²", "٣", "１"])
def test_expiration_ms_rejects_what_rabbitmq_rejects(value: str) -> None:
    with pytest.raises(P.PropertiesError):
        P.expiration_ms(value)


@pytest.mark.parametrize(
    "props",
    [
        dict(message_id="m" * 20),
        dict(timestamp=123),
        dict(type="t" * 10),
        dict(user_id="u"),
        dict(app_id="app"),
        dict(cluster_id="c"),
        dict(correlation_id="c", reply_to="r"),
    ],
)
def test_truncated_fields_after_what_routing_reads_are_an_error_too(props: dict[str, Any]) -> None:
    """Peek reads only four properties but checks that the whole list fits, so a truncated
    property list is refused on publish rather than handed to consumers."""
    raw = properties_bytes(delivery_mode=2, **props)
    assert P.peek(raw)[0] == 2
    for n in range(2, len(raw)):
        with pytest.raises(P.PropertiesError):
            P.peek(raw[:n])


def test_headers_table_longer_than_the_properties_is_an_error() -> None:
    with pytest.raises(P.PropertiesError):
        P.peek(b"\x20\x00\x00\x00\x00\x09\x01")


GARBLED_HEADERS = b"\x20\x00" + b"\x00\x00\x00\x03" + b"\x01kZ"  # field type 'Z'


def test_peek_accepts_a_garbled_headers_table_that_decode_refuses() -> None:
    assert P.peek(GARBLED_HEADERS) == (0, 0, None, 2)
    with pytest.raises(P.PropertiesError):
        P.headers_at(GARBLED_HEADERS, 2)
    with pytest.raises(P.PropertiesError):
        P.decode(GARBLED_HEADERS)


def test_decode_lenient_leaves_out_a_garbled_headers_table() -> None:
    good = properties_bytes(content_type="text/plain", delivery_mode=2, message_id="m1")
    assert P.decode_lenient(good) == P.decode(good)
    flags = int.from_bytes(good[:2], "big") | 0x2000
    # content_type first, then the garbled table, then delivery_mode and message_id
    ct_end = 2 + 1 + len("text/plain")
    raw = flags.to_bytes(2, "big") + good[2:ct_end] + GARBLED_HEADERS[2:] + good[ct_end:]
    assert P.peek(raw)[:3] == (2, 0, None)
    assert P.decode_lenient(raw) == {
        "content_type": "text/plain",
        "delivery_mode": 2,
        "message_id": "m1",
    }


def test_decode_lenient_keeps_what_peek_read_when_nothing_else_decodes() -> None:
    raw = properties_bytes(content_type="x", delivery_mode=2, priority=4, expiration="10")
    raw = raw[:3] + b"\xff" + raw[4:]  # content_type is not UTF-8
    assert P.decode_lenient(raw) == {"delivery_mode": 2, "priority": 4, "expiration": "10"}

"""Names and field tables checked at the codec edge (sans-IO): text that is not UTF-8 and
tables nested deeper than MAX_DEPTH are a 502 before anything reaches the domain or the store."""

from __future__ import annotations

import struct

import pytest
from rawclient import (
    body_frame,
    deep_header_properties,
    frame,
    header_frame,
    method_frame,
    nested_table,
    publish_frames,
)

from plugbroker.codec.frames import NEED_DATA, PROTOCOL_HEADER, Publish, ServerCodec
from plugbroker.codec.methods import BY_NAME, decode_args
from plugbroker.codec.tables import MAX_DEPTH, too_deep
from plugbroker.errors import ConnectionError_


def _codec() -> ServerCodec:
    codec = ServerCodec()
    codec.receive_data(PROTOCOL_HEADER)
    codec.next_event()
    return codec


def _events(codec: ServerCodec, data: bytes) -> list[object]:
    codec.receive_data(data)
    out = []
    for _ in range(100):
        ev = codec.next_event()
        if ev is NEED_DATA:
            return out
        out.append(ev)
    raise AssertionError("more than 100 events")


def _shortstr(raw: bytes) -> bytes:
    return bytes([len(raw)]) + raw


def _queue_declare(name: bytes, table: bytes = b"\x00\x00\x00\x00") -> bytes:
    # reserved, queue, bits (durable), arguments
    return frame(1, 1, struct.pack(">HHH", 50, 10, 0) + _shortstr(name) + b"\x02" + table)


@pytest.mark.parametrize(
    "name",
    [
        "poison-\ud800".encode("utf-8", "surrogatepass"),  # what py-amqp sends for a lone surrogate
        b"bad-\xff\xfe",
        b"\xc0\xaf",  # overlong encoding of "/"
    ],
)
def test_a_name_that_is_not_utf8_is_502(name: bytes) -> None:
    codec = _codec()
    with pytest.raises(ConnectionError_) as info:
        _events(codec, _queue_declare(name))
    assert info.value.code == 502
    assert "UTF-8" in info.value.text and "queue.declare" in info.value.text


def test_a_lone_surrogate_in_a_table_string_is_502() -> None:
    value = "dlx-\udfff".encode("utf-8", "surrogatepass")
    key = b"x-dead-letter-exchange"
    table = _shortstr(key) + b"S" + struct.pack(">I", len(value)) + value
    codec = _codec()
    with pytest.raises(ConnectionError_) as info:
        _events(codec, _queue_declare(b"q", struct.pack(">I", len(table)) + table))
    assert info.value.code == 502 and "UTF-8" in info.value.text


def test_a_good_name_still_passes() -> None:
    (ev,) = _events(_codec(), _queue_declare("очередь-ü".encode()))
    assert ev.queue == "очередь-ü"  # type: ignore[attr-defined]


@pytest.mark.parametrize("arrays", [False, True])
def test_table_depth_bound_in_method_arguments(arrays: bool) -> None:
    (ev,) = _events(_codec(), _queue_declare(b"q", nested_table(MAX_DEPTH, arrays=arrays)))
    assert ev.queue == "q"  # type: ignore[attr-defined]
    for depth in (MAX_DEPTH + 1, 700, 18_000):
        codec = _codec()
        with pytest.raises(ConnectionError_) as info:
            _events(codec, _queue_declare(b"q", nested_table(depth, arrays=arrays)))
        assert info.value.code == 502
        assert f"deeper than {MAX_DEPTH}" in info.value.text


def test_decode_args_refuses_deep_tables_after_a_bit_run() -> None:
    # exchange.declare: "BssbbbbbF", the table comes after five bits packed in one octet
    spec = BY_NAME["exchange.declare"]
    payload = (
        struct.pack(">HHH", 40, 10, 0)
        + _shortstr(b"ex")
        + _shortstr(b"topic")
        + b"\x00"
        + nested_table(MAX_DEPTH + 1)
    )
    with pytest.raises(ConnectionError_) as info:
        decode_args(spec, payload)
    assert info.value.code == 502 and "deeper" in info.value.text


def test_published_headers_depth_bound_in_one_pass_and_frame_by_frame() -> None:
    ok = publish_frames(1, "", "q", b"body", deep_header_properties(MAX_DEPTH))
    (ev,) = _events(_codec(), ok)
    assert isinstance(ev, Publish) and ev.body == b"body"
    for depth in (MAX_DEPTH + 1, 700):
        props = deep_header_properties(depth)
        # all three frames at once: the one-pass path
        codec = _codec()
        with pytest.raises(ConnectionError_) as info:
            _events(codec, publish_frames(1, "", "q", b"body", props))
        assert info.value.code == 502 and "headers" in info.value.text
        # frame by frame: the header arrives alone, the body later
        codec = _codec()
        assert _events(codec, method_frame(1, "basic.publish", 0, "", "q", False, False)) == []
        assert _events(codec, header_frame(1, 4, props)) == []
        with pytest.raises(ConnectionError_) as info:
            _events(codec, body_frame(1, b"body"))
        assert info.value.code == 502


def test_too_deep_never_raises_on_garbage() -> None:
    table = nested_table(MAX_DEPTH + 1)
    for cut in range(0, len(table), 7):
        too_deep(table[:cut], 0)  # truncated: False or True, never an exception
    assert not too_deep(b"\x00\x00\x00\x05\x01nZ\x00\x00", 0)  # unknown type ends the scan
    assert too_deep(table, 0)
    assert not too_deep(table, 0, limit=MAX_DEPTH + 1)

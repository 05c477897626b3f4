"""The server codec over a fake wire: client bytes in, events out; events in, bytes out.

No sockets and no event loop. Client frames come from the test client's builders (the broker's
own method table) or from a real py-amqp ``Channel`` writing into a :class:`rawclient.FakeWire`;
server output is read back with py-amqp's own frame handler.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from rawclient import (
    body_frame,
    frame,
    header_frame,
    header_payload,
    heartbeat_frame,
    method_frame,
    method_payload,
    parse_frames,
    properties_bytes,
    publish_frames,
    py_amqp_channel,
    py_amqp_read,
    raw_method_frame,
)

from plugbroker.codec.events import BasicAck, BasicQos, ConnectionTuneOk, QueueDeclare
from plugbroker.codec.frames import (
    FRAME_MIN_SIZE,
    NEED_DATA,
    PROTOCOL_HEADER,
    Heartbeat,
    ProtocolHeader,
    Publish,
    ServerCodec,
)
from plugbroker.codec.methods import BY_NAME, decode_args, encode_args
from plugbroker.errors import AMQPError, ChannelError, ConnectionError_

# ------------------------------------------------------------------ helpers


def drain(codec: ServerCodec) -> list[Any]:
    out = []
    while True:
        ev = codec.next_event()
        if ev is NEED_DATA:
            return out
        out.append(ev)


def feed(codec: ServerCodec, data: bytes) -> list[Any]:
    codec.receive_data(data)
    return drain(codec)


def greeted(**kw: Any) -> ServerCodec:
    codec = ServerCodec(**kw)
    assert feed(codec, PROTOCOL_HEADER) == [ProtocolHeader(True, PROTOCOL_HEADER)]
    return codec


def error_of(codec: ServerCodec, data: bytes) -> AMQPError:
    """Feed ``data`` and return the error the codec raises (events before it are dropped)."""
    codec.receive_data(data)
    with pytest.raises(AMQPError) as info:
        drain(codec)
    return info.value


def conn_error(data: bytes, *, codec: ServerCodec | None = None, **kw: Any) -> ConnectionError_:
    codec = codec or greeted(**kw)
    err = error_of(codec, data)
    assert isinstance(err, ConnectionError_), err
    assert codec.broken, "a connection error must leave the codec broken"
    # a broken codec ignores anything else and never raises again
    codec.receive_data(method_frame(0, "connection.close_ok"))
    assert codec.next_event() is NEED_DATA
    return err


# ------------------------------------------------------------------ protocol header


def test_good_protocol_header() -> None:
    codec = ServerCodec()
    assert codec.next_event() is NEED_DATA
    assert feed(codec, PROTOCOL_HEADER) == [ProtocolHeader(True, PROTOCOL_HEADER)]
    assert not codec.broken


def test_protocol_header_in_pieces_then_frames_in_the_same_chunk() -> None:
    codec = ServerCodec()
    for piece in (b"A", b"MQ", b"P\x00", b"\x00\x09"):
        assert feed(codec, piece) == []
    tail = method_frame(0, "connection.tune_ok", 2047, 131072, 60)
    evs = feed(codec, b"\x01" + tail)
    assert evs[0] == ProtocolHeader(True, PROTOCOL_HEADER)
    assert evs[1] == ConnectionTuneOk(0, 2047, 131072, 60)


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x08\x00",  # 0-8
        b"AMQP\x01\x01\x00\x0a",  # 0-10
        b"AMQP\x00\x00\x09\x00",  # 0-9
        b"AMQP\x03\x01\x00\x00",  # 1.0 SASL
        b"AMQP\x00\x01\x00\x00",  # 1.0
    ],
)
def test_bad_protocol_header(header: bytes) -> None:
    codec = ServerCodec()
    evs = feed(codec, header + method_frame(0, "connection.close_ok"))
    assert len(evs) == 1
    assert not evs[0].ok
    assert codec.broken
    assert codec.next_event() is NEED_DATA


@pytest.mark.parametrize(
    "first", [b"G", b"GET / HTTP/1.1\r\n", b"\x16\x03\x01", b"\x00", b"AMQX", b"AMQP\x01"]
)
def test_bad_protocol_header_is_answered_before_eight_bytes(first: bytes) -> None:
    codec = ServerCodec()
    evs = feed(codec, first)
    assert len(evs) == 1
    assert evs[0].ok is False
    assert evs[0].data.startswith(first[:8])
    assert codec.broken
    codec.receive_data(b"x" * 100)
    assert codec.next_event() is NEED_DATA


# ------------------------------------------------------------------ methods


def test_method_frame_from_py_amqp_client() -> None:
    ch, wire = py_amqp_channel()
    ch.queue_declare("q", durable=True, nowait=True, arguments={"x-max-length": 5})
    wire.write(method_frame(1, "basic.qos", 0, 10, False))  # py-amqp would wait for qos-ok
    codec = greeted()
    evs = feed(codec, wire.take())
    assert evs == [
        QueueDeclare(1, "q", False, True, False, True, True, {"x-max-length": 5}),
        BasicQos(1, 0, 10, False),
    ]


def test_heartbeat_frame() -> None:
    codec = greeted()
    assert feed(codec, heartbeat_frame()) == [Heartbeat(0)]
    assert codec.encode_heartbeat() == heartbeat_frame()


# ------------------------------------------------------------------ fast paths


def _rand_name(rng: random.Random, max_len: int = 255) -> str:
    alphabet = "abcxyz.-_#*09" + "éü中"
    s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    while len(s.encode()) > max_len:
        s = s[:-1]
    return s


def test_publish_fast_path_agrees_with_the_table() -> None:
    rng = random.Random(40)
    spec = BY_NAME["basic.publish"]
    for _ in range(300):
        exchange, key = _rand_name(rng), _rand_name(rng)
        if rng.random() < 0.05:
            key = "k" * 255
        mandatory, immediate = rng.random() < 0.5, rng.random() < 0.5
        payload = encode_args(spec, (0, exchange, key, mandatory, immediate))
        assert decode_args(spec, payload) == (0, exchange, key, mandatory, immediate)
        codec = greeted()
        evs = feed(codec, frame(1, 3, payload) + header_frame(3, 0))
        assert evs == [Publish(3, exchange, key, mandatory, immediate, 0, b"\x00\x00", b"")]


def test_publish_fast_path_rejects_what_the_table_rejects() -> None:
    """Truncated and mutated basic.publish arguments: the fast path raises 502 exactly when
    the generic table decoder does (and otherwise parses the same values)."""
    rng = random.Random(41)
    spec = BY_NAME["basic.publish"]
    good = encode_args(spec, (0, "ex", "route.key", True, False))
    candidates = [good[:n] for n in range(4, len(good))] + [good + b"\x00", good + b"xyz"]
    for _ in range(500):
        b = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(4, len(b))
            b[i] = rng.choice([0, 1, 2, 0x7F, 0xFF, rng.randrange(256)])
        candidates.append(bytes(b))
    for payload in candidates:
        try:
            generic: Any = decode_args(spec, payload)[1:]  # the fast path ignores the ticket
        except ConnectionError_ as e:
            generic = e.code
        codec = greeted()
        codec.receive_data(frame(1, 1, payload) + header_frame(1, 0))
        try:
            evs = drain(codec)
            fast: Any = (evs[0].exchange, evs[0].routing_key, evs[0].mandatory, evs[0].immediate)
        except ConnectionError_ as e:
            fast = e.code
            assert e.method == (60, 40)
        assert fast == generic, payload


def test_ack_fast_path_agrees_with_the_table() -> None:
    rng = random.Random(80)
    spec = BY_NAME["basic.ack"]
    tags = [0, 1, 255, 256, 2**32, 2**63, 2**64 - 1] + [rng.randrange(2**64) for _ in range(50)]
    for tag in tags:
        for multiple in (False, True):
            payload = encode_args(spec, (tag, multiple))
            assert len(payload) == 13
            codec = greeted()
            (ev,) = feed(codec, frame(1, 7, payload))
            assert ev == spec.event_of(7, decode_args(spec, payload))
            assert ev == BasicAck(7, tag, multiple)
            assert type(ev.multiple) is bool


def test_hot_events_built_slot_by_slot_equal_the_dataclass_constructor() -> None:
    import dataclasses

    from plugbroker.codec.frames import _ack_event, _publish_event

    args = (3, "ex", "rk", True, False, 5, b"\x00\x00", b"hello")
    fast, slow = _publish_event(*args), Publish(*args)
    assert type(fast) is Publish
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == args
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.body = b""  # type: ignore[misc]
    ack = _ack_event(7, 2**64 - 1, True)
    assert type(ack) is BasicAck and ack == BasicAck(7, 2**64 - 1, True)
    assert repr(ack) == repr(BasicAck(7, 2**64 - 1, True))


def test_ack_with_other_bits_set_matches_the_table() -> None:
    spec = BY_NAME["basic.ack"]
    for bits in (0x02, 0x03, 0xFE, 0xFF):
        payload = encode_args(spec, (5, False))[:-1] + bytes([bits])
        (ev,) = feed(greeted(), frame(1, 1, payload))
        assert ev == spec.event_of(1, decode_args(spec, payload))


def test_encode_ack_agrees_with_the_table_and_py_amqp_reads_it() -> None:
    """The publisher-confirm fast path: one basic.ack frame, multiple or not."""
    rng = random.Random(81)
    tags = [1, 255, 256, 2**32, 2**64 - 1] + [rng.randrange(1, 2**64) for _ in range(30)]
    for channel in (1, 2, 65535):
        for tag in tags:
            for multiple in (False, True):
                fast = ServerCodec.encode_ack(channel, tag, multiple)
                assert fast == ServerCodec.encode_method(channel, "basic.ack", tag, multiple)
                ((ch, sig, buf, _msg),) = py_amqp_read(fast)
                assert (ch, sig) == (channel, (60, 80))
                assert decode_args(BY_NAME["basic.ack"], buf) == (tag, multiple)


def test_encode_deliver_agrees_with_the_table() -> None:
    rng = random.Random(60)
    for frame_max in (4096, 131072):
        codec = ServerCodec()
        codec.tune(frame_max)
        for _ in range(60):
            tag = _rand_name(rng) or "ctag"
            exchange, key = _rand_name(rng), _rand_name(rng)
            dtag = rng.choice([1, rng.randrange(2**64)])
            redelivered = rng.random() < 0.5
            body = rng.randbytes(rng.choice([0, 1, 64, 4087, 4088, 4089, 10000]))
            props = properties_bytes(
                content_type="application/json",
                delivery_mode=2,
                application_headers={"n": rng.randrange(1000)},
            )
            fast = codec.encode_deliver(
                2,
                tag.encode(),
                dtag,
                redelivered,
                exchange.encode(),
                key.encode(),
                len(body),
                props,
                body,
            )
            slow = codec.encode_method(
                2, "basic.deliver", tag, dtag, redelivered, exchange, key
            ) + codec.encode_content(2, len(body), props, body)
            assert fast == slow
            ((ch, sig, buf, msg),) = py_amqp_read(fast)
            assert (ch, sig) == (2, (60, 60))
            assert decode_args(BY_NAME["basic.deliver"], buf) == (
                tag,
                dtag,
                redelivered,
                exchange,
                key,
            )
            assert (msg.body or b"") == body
            assert msg.properties["application_headers"]["n"] >= 0
            for _ftype, _, payload in parse_frames(fast)[0]:
                assert len(payload) + 8 <= frame_max


# ------------------------------------------------------------------ content assembly


def test_publish_from_py_amqp_client_keeps_properties_byte_for_byte() -> None:
    import amqp

    ch, wire = py_amqp_channel(frame_max=4096)
    body = bytes(range(256)) * 40  # 10240 bytes: three body frames at frame_max 4096
    msg = amqp.Message(
        body,
        content_type="application/octet-stream",
        delivery_mode=2,
        priority=3,
        expiration="60000",
        application_headers={"a": 1, "b": "x"},
    )
    ch.basic_publish(msg, exchange="ex", routing_key="rk", mandatory=True)
    data = wire.take()
    assert sum(1 for f in parse_frames(data)[0] if f[0] == 3) == 3
    (ev,) = feed(greeted(), data)
    assert isinstance(ev, Publish)
    assert (ev.channel, ev.exchange, ev.routing_key, ev.mandatory, ev.immediate) == (
        1,
        "ex",
        "rk",
        True,
        False,
    )
    assert ev.body == body and ev.body_size == len(body)
    assert ev.properties == bytes(msg._serialize_properties())


def test_content_over_several_body_frames() -> None:
    body = b"".join(bytes([i % 256]) * 1000 for i in range(37))
    codec = greeted()
    data = publish_frames(1, "", "q", body, frame_max=FRAME_MIN_SIZE)
    frames, _ = parse_frames(data)
    assert len(frames) == 2 + 10
    evs = []
    for f in frames:
        evs += feed(codec, frame(f[0], f[1], f[2]))
        if f is not frames[-1]:
            assert evs == []
    assert evs == [Publish(1, "", "q", False, False, len(body), b"\x00\x00", body)]


def test_interleaved_channels() -> None:
    codec = greeted()
    a, b = b"A" * 5000, b"B" * 300
    data = b"".join(
        [
            method_frame(1, "basic.publish", 0, "ex1", "k1", False, False),
            method_frame(2, "basic.publish", 0, "ex2", "k2", True, False),
            header_frame(1, len(a), properties_bytes(content_type="a")),
            header_frame(2, len(b)),
            body_frame(1, a[:1000]),
            method_frame(3, "basic.ack", 9, False),  # another channel may talk meanwhile
            body_frame(2, b[:100]),
            body_frame(1, a[1000:]),
            heartbeat_frame(),
            body_frame(2, b[100:]),
        ]
    )
    evs = feed(codec, data)
    assert evs == [
        BasicAck(3, 9, False),
        Publish(1, "ex1", "k1", False, False, len(a), properties_bytes(content_type="a"), a),
        Heartbeat(0),
        Publish(2, "ex2", "k2", True, False, len(b), b"\x00\x00", b),
    ]


def test_zero_length_body_completes_on_the_header() -> None:
    codec = greeted()
    data = (
        method_frame(1, "basic.publish", 0, "", "q", False, False)
        + header_frame(1, 0)
        + method_frame(1, "basic.ack", 1, False)
    )
    evs = feed(codec, data)
    assert evs[0] == Publish(1, "", "q", False, False, 0, b"\x00\x00", b"")
    assert evs[1].NAME == "basic.ack"


def test_py_amqp_empty_body() -> None:
    import amqp

    ch, wire = py_amqp_channel()
    ch.basic_publish(amqp.Message(b""), exchange="", routing_key="q")
    (ev,) = feed(greeted(), wire.take())
    assert ev.body == b"" and ev.body_size == 0


# ------------------------------------------------------------------ split input


def _stream() -> bytes:
    import amqp

    ch, wire = py_amqp_channel(frame_max=FRAME_MIN_SIZE)
    ch.queue_declare("work", durable=True, nowait=True, arguments={"x-max-priority": 5})
    ch.basic_publish(amqp.Message(b"x" * 9000, priority=1), exchange="", routing_key="work")
    ch.basic_publish(amqp.Message(b""), exchange="amq.direct", routing_key="e")
    ch.basic_ack(1, multiple=True)
    return b"".join(
        [
            PROTOCOL_HEADER,
            method_frame(0, "connection.tune_ok", 10, FRAME_MIN_SIZE, 0),
            wire.take(),
            heartbeat_frame(),
            publish_frames(2, "ex", "k", b"tiny"),
            method_frame(2, "channel.close", 200, "bye", 0, 0),
        ]
    )


def test_split_at_every_byte_boundary_yields_the_same_events() -> None:
    data = _stream()
    ref = feed(ServerCodec(), data)
    assert len(ref) == 9
    for i in range(len(data) + 1):
        codec = ServerCodec()
        assert feed(codec, data[:i]) + feed(codec, data[i:]) == ref, i


def test_byte_by_byte_and_random_chunks() -> None:
    data = _stream()
    ref = feed(ServerCodec(), data)
    codec = ServerCodec()
    got: list[Any] = []
    for i in range(len(data)):
        got += feed(codec, data[i : i + 1])
    assert got == ref
    rng = random.Random(7)
    for _ in range(50):
        codec, got, i = ServerCodec(), [], 0
        while i < len(data):
            n = rng.randint(1, 3000)
            got += feed(codec, data[i : i + n])
            i += n
        assert got == ref
    assert codec.buffered() == 0


def _frame_by_frame(codec: ServerCodec, data: bytes) -> list[Any]:
    """Feed one frame at a time, so a publish's header and body are never there yet when
    its method frame is read (the frame-by-frame path)."""
    out: list[Any] = []
    pos = 0
    while len(data) - pos >= 7:
        end = pos + 8 + struct.unpack_from(">I", data, pos + 3)[0]  # by size, end byte or not
        out += feed(codec, data[pos:end])
        pos = end
    return out + feed(codec, data[pos:])


def _outcome(fn: Any, codec: ServerCodec, data: bytes) -> Any:
    try:
        return ("events", fn(codec, data))
    except AMQPError as err:
        return ("error", type(err).__name__, err.code, err.text, codec.broken)


_P = method_frame(1, "basic.publish", 0, "ex", "key", True, False)
_PROPS = properties_bytes(delivery_mode=2, headers={"a": 1})


@pytest.mark.parametrize(
    "data",
    [
        publish_frames(1, "ex", "key", b"body", _PROPS, mandatory=True),
        publish_frames(1, "ex", "key", b"", _PROPS),  # no body frame at all
        publish_frames(1, "", "q", b"x" * 100),  # exactly max_message_size
        publish_frames(1, "", "q", b"x" * 101),  # over it: 406 once complete
        publish_frames(1, "", "q", b"x" * 9000, frame_max=4096),  # body in three frames
        _P + header_frame(1, 4) + body_frame(1, b"ab") + body_frame(1, b"cd"),
        _P + header_frame(2, 4) + body_frame(1, b"abcd"),  # header on another channel
        _P + header_frame(1, 4, class_id=50) + body_frame(1, b"abcd"),
        _P + frame(2, 1, header_payload(4)[:10]) + body_frame(1, b"abcd"),  # short header
        _P + frame(2, 1, header_payload(4), end=b"\x00") + body_frame(1, b"abcd"),
        _P + header_frame(1, 4) + body_frame(1, b"abcde"),  # longer than declared
        _P + header_frame(1, 4) + body_frame(2, b"abcd"),  # body on another channel
        _P + header_frame(1, 4) + frame(3, 1, b"abcd", end=b"\x01"),
        _P + header_frame(1, 4) + method_frame(1, "basic.ack", 1, False),
        _P + header_frame(1, 5000) + body_frame(1, b"y" * 5000),  # over frame_max
        _P + header_frame(1, 4) + heartbeat_frame() + body_frame(1, b"abcd"),
    ],
    ids=[
        "whole",
        "empty-body",
        "at-max-size",
        "over-max-size",
        "three-body-frames",
        "two-body-frames",
        "header-other-channel",
        "header-other-class",
        "short-header",
        "header-bad-end",
        "body-too-long",
        "body-other-channel",
        "body-bad-end",
        "method-instead-of-body",
        "header-over-frame-max",
        "heartbeat-between",
    ],
)
def test_a_publish_read_in_one_pass_is_what_frame_by_frame_reads(data: bytes) -> None:
    """When the header and body are in the buffer with the method, the codec reads the whole
    publish at once; the events, and any error, are those of reading it frame by frame."""
    whole = _outcome(feed, greeted(frame_max=4096, max_message_size=100), data)
    apart = _outcome(_frame_by_frame, greeted(frame_max=4096, max_message_size=100), data)
    assert whole == apart
    # and twice in a row in one buffer, on the same codec
    if whole[0] == "events":
        assert feed(greeted(frame_max=4096, max_message_size=100), data + data) == whole[1] * 2


def test_large_input_is_compacted() -> None:
    codec = greeted()
    one = method_frame(1, "basic.ack", 1, False)
    for _ in range(20):
        assert len(feed(codec, one * 1000)) == 1000
    assert codec.buffered() == 0


# ------------------------------------------------------------------ errors


def test_frame_over_frame_max_is_501_as_soon_as_its_size_is_known() -> None:
    codec = greeted()
    codec.tune(FRAME_MIN_SIZE)
    big = body_frame(1, b"x" * (FRAME_MIN_SIZE - 7))  # one byte over
    err = conn_error(big[:7], codec=codec)
    assert err.code == 501
    assert "frame_max" in err.text and str(FRAME_MIN_SIZE) in err.text


def test_frame_at_frame_max_is_accepted() -> None:
    codec = greeted()
    codec.tune(FRAME_MIN_SIZE)
    body = b"x" * (FRAME_MIN_SIZE - 8)
    evs = feed(codec, publish_frames(1, "", "q", body, frame_max=FRAME_MIN_SIZE))
    assert evs[0].body == body


def test_frame_max_before_tune_is_the_offer() -> None:
    codec = greeted(frame_max=8192)
    ok = method_frame(
        1, "queue.declare", 0, "q" * 200, False, False, False, False, False, {"k": "v" * 7000}
    )
    assert len(ok) <= 8192
    assert feed(codec, ok)[0].NAME == "queue.declare"
    too_big = method_frame(
        1, "queue.declare", 0, "q", False, False, False, False, False, {"k": "v" * 9000}
    )
    assert conn_error(too_big, codec=codec).code == 501


def test_tune() -> None:
    codec = ServerCodec(frame_max=131072)
    codec.tune(0)
    assert codec.frame_max == 131072
    codec.tune(100)
    assert codec.frame_max == FRAME_MIN_SIZE
    codec.tune(65536)
    assert codec.frame_max == 65536
    assert ServerCodec(frame_max=10).frame_max == FRAME_MIN_SIZE


@pytest.mark.parametrize("end", [b"\x00", b"\xcd", b"\xff"])
def test_bad_frame_end_is_501(end: bytes) -> None:
    err = conn_error(frame(1, 1, method_payload("basic.ack", 1, False), end=end))
    assert err.code == 501
    assert "frame end" in err.text and "0xce" in err.text


def test_size_that_overstates_the_payload_desynchronises_to_501() -> None:
    good = method_payload("basic.ack", 1, False)
    data = frame(1, 1, good, size=len(good) + 3) + method_frame(1, "basic.ack", 2, False)
    assert conn_error(data).code == 501


@pytest.mark.parametrize("ftype", [0, 4, 5, 7, 9, 65, 255])
def test_unknown_frame_type_is_501(ftype: int) -> None:
    err = conn_error(frame(ftype, 0, b"abc"))
    assert err.code == 501
    assert f"unknown frame type {ftype}" in err.text


@pytest.mark.parametrize(
    "class_id,method_id,what",
    [
        (60, 99, "unknown method 99 of class 60"),
        (10, 12, "unknown method 12 of class 10"),
        (30, 10, "unknown class 30"),  # the 0-8 access class
        (0, 0, "unknown class 0"),
        (65535, 65535, "unknown class 65535"),
    ],
)
def test_unknown_class_or_method_is_540(class_id: int, method_id: int, what: str) -> None:
    err = conn_error(raw_method_frame(1, class_id, method_id, b"\x00\x00"))
    assert err.code == 540
    assert what in err.text
    assert err.method == (class_id, method_id)


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x3c\x00"])
def test_method_frame_without_ids_is_502(payload: bytes) -> None:
    err = conn_error(frame(1, 1, payload))
    assert err.code == 502


@pytest.mark.parametrize(
    "name,args",
    [
        ("queue.declare", (0, "q", False, True, False, False, False, {"x-expires": 1000})),
        ("exchange.declare", (0, "ex", "topic", False, True, False, False, False, {})),
        ("basic.consume", (0, "q", "tag", False, False, False, False, {})),
        ("basic.nack", (5, True, False)),
        ("connection.start_ok", ({"product": "x"}, "PLAIN", b"\x00guest\x00guest", "en_US")),
        ("connection.tune_ok", (0, 131072, 60)),
        ("basic.publish", (0, "ex", "rk", False, False)),
        ("basic.ack", (1, False)),
    ],
)
def test_truncated_arguments_are_502(name: str, args: tuple[Any, ...]) -> None:
    payload = method_payload(name, *args)
    for n in range(4, len(payload)):
        err = conn_error(frame(1, 1, payload[:n]))
        assert err.code == 502, (name, n)
        assert name in err.text
        assert err.method == BY_NAME[name].sig


@pytest.mark.parametrize(
    "name,args",
    [
        ("queue.declare", (0, "q", False, True, False, False, False, {})),
        ("basic.qos", (0, 10, False)),
        ("basic.ack", (1, False)),
        ("channel.close", (200, "ok", 0, 0)),
    ],
)
def test_trailing_bytes_after_the_arguments_are_502(name: str, args: tuple[Any, ...]) -> None:
    payload = method_payload(name, *args)
    err = conn_error(frame(1, 1, payload + b"\x00\x01"))
    assert err.code == 502
    assert name in err.text


def test_garbled_arguments_are_502() -> None:
    bad_utf8 = b"\x00\x32\x00\x0a" + b"\x00\x00" + b"\x02\xff\xfe" + b"\x00" + b"\x00" * 4
    assert conn_error(frame(1, 1, bad_utf8)).code == 502  # queue.declare, name not UTF-8
    bad_table = method_payload("queue.declare", 0, "q", False, False, False, False, False, {})
    bad_table = bad_table[:-4] + b"\x00\x00\x00\x03\x01kZ"  # field type 'Z' does not exist
    assert conn_error(frame(1, 1, bad_table)).code == 502
    table_len_lies = method_payload(
        "queue.declare", 0, "q", False, False, False, False, False, {"a": 1}
    )
    table_len_lies = table_len_lies[:-11] + b"\x7f\xff\xff\xff" + table_len_lies[-7:]
    assert conn_error(frame(1, 1, table_len_lies)).code == 502


def test_content_header_without_publish_is_505() -> None:
    err = conn_error(header_frame(1, 10))
    assert err.code == 505
    assert err.text == "expected method frame, got non method frame instead"


def test_second_content_header_is_505() -> None:
    data = (
        method_frame(1, "basic.publish", 0, "", "q", False, False)
        + header_frame(1, 10)
        + header_frame(1, 10)
    )
    assert conn_error(data).code == 505


def test_body_without_header_is_505() -> None:
    assert conn_error(body_frame(1, b"abc")).code == 505
    err = conn_error(
        method_frame(1, "basic.publish", 0, "", "q", False, False) + body_frame(1, b"abc")
    )
    assert err.code == 505
    assert err.text == "expected content header for class 60, got non content header frame instead"


def test_body_on_another_channel_is_505() -> None:
    data = (
        method_frame(1, "basic.publish", 0, "", "q", False, False)
        + header_frame(1, 3)
        + body_frame(2, b"abc")
    )
    assert conn_error(data).code == 505


@pytest.mark.parametrize("cut", ["after_method", "after_header"])
def test_method_while_content_expected_is_505(cut: str) -> None:
    data = method_frame(1, "basic.publish", 0, "", "q", False, False)
    if cut == "after_header":
        data += header_frame(1, 10) + body_frame(1, b"12345")
    err = conn_error(data + method_frame(1, "channel.close", 200, "", 0, 0))
    assert err.code == 505
    # RabbitMQ's texts (rabbit_command_assembler)
    if cut == "after_header":
        assert err.text == "expected content body, got non content body frame instead"
    else:
        assert err.text == (
            "expected content header for class 60, got non content header frame instead"
        )


def test_content_header_too_short_is_501() -> None:
    data = method_frame(1, "basic.publish", 0, "", "q", False, False) + frame(2, 1, b"\x00" * 13)
    assert conn_error(data).code == 501


def test_content_header_for_another_class_is_505() -> None:
    data = method_frame(1, "basic.publish", 0, "", "q", False, False) + frame(
        2, 1, header_payload(0, class_id=50)
    )
    assert conn_error(data).code == 505


def test_body_longer_than_declared_is_501() -> None:
    data = (
        method_frame(1, "basic.publish", 0, "", "q", False, False)
        + header_frame(1, 4)
        + body_frame(1, b"123")
        + body_frame(1, b"45")
    )
    err = conn_error(data)
    assert err.code == 501
    assert "longer than" in err.text


@pytest.mark.parametrize("channel", [1, 65535])
def test_heartbeat_on_a_channel_is_501(channel: int) -> None:
    err = conn_error(heartbeat_frame(channel))
    assert err.code == 501
    assert "heartbeat" in err.text


def test_publish_on_channel_zero_is_503() -> None:
    err = conn_error(method_frame(0, "basic.publish", 0, "", "q", False, False))
    assert err.code == 503


@pytest.mark.parametrize(
    "name,args",
    [
        ("basic.deliver", ("tag", 1, False, "", "q")),
        ("basic.return", (312, "NO_ROUTE", "", "q")),
        ("basic.get_ok", (1, False, "", "q", 0)),
    ],
)
def test_server_only_content_methods_are_503(name: str, args: tuple[Any, ...]) -> None:
    err = conn_error(method_frame(1, name, *args))
    assert err.code == 503
    assert name in err.text


def test_events_before_an_error_come_out_first() -> None:
    codec = greeted()
    codec.receive_data(method_frame(1, "basic.ack", 1, False) + frame(9, 0, b""))
    assert codec.next_event().NAME == "basic.ack"
    with pytest.raises(ConnectionError_):
        codec.next_event()


def test_oversize_message_is_a_406_channel_error_and_the_codec_keeps_working() -> None:
    codec = greeted(max_message_size=100)
    ok = publish_frames(1, "", "q", b"x" * 100)
    (ev,) = feed(codec, ok)
    assert ev.body_size == 100
    big = b"y" * 5000
    data = (
        method_frame(5, "basic.publish", 0, "", "q", False, False)
        + header_frame(5, 5000)
        + body_frame(5, big[:2500])
        + method_frame(6, "basic.ack", 1, False)
        + body_frame(5, big[2500:])
        + ok
    )
    codec.receive_data(data)
    assert codec.next_event().NAME == "basic.ack"
    with pytest.raises(ChannelError) as info:
        codec.next_event()
    err = info.value
    assert (err.code, err.channel, err.method) == (406, 5, (60, 40))
    assert "5000" in err.text and "100" in err.text
    assert not codec.broken
    (ev,) = drain(codec)
    assert isinstance(ev, Publish) and ev.body == b"x" * 100
    # the same channel may publish again (the session closes it; the codec does not care)
    (ev,) = feed(codec, publish_frames(5, "", "q", b"z"))
    assert ev.body == b"z"


def test_oversize_message_with_no_body_frames_yet() -> None:
    codec = greeted(max_message_size=10)
    codec.receive_data(
        method_frame(1, "basic.publish", 0, "", "q", False, False) + header_frame(1, 11)
    )
    assert codec.next_event() is NEED_DATA
    codec.discard_channel(1)  # channel closed meanwhile: the partial content is forgotten
    assert feed(codec, method_frame(1, "channel.close_ok"))[0].NAME == "channel.close_ok"


# ------------------------------------------------------------------ output


def test_encode_content_splits_bodies_at_frame_max() -> None:
    codec = ServerCodec()
    codec.tune(FRAME_MIN_SIZE)
    room = FRAME_MIN_SIZE - 8
    props = properties_bytes(content_type="text/plain")
    for size, expect in [
        (0, []),
        (1, [1]),
        (room, [room]),
        (room + 1, [room, 1]),
        (10000, [room, room, 10000 - 2 * room]),
    ]:
        body = bytes(i % 251 for i in range(size))
        data = codec.encode_content(4, size, props, body)
        frames, rest = parse_frames(data)
        assert rest == b""
        assert frames[0] == (2, 4, header_payload(size, props))
        assert [len(p) for t, c, p in frames[1:]] == expect
        assert all(t == 3 and c == 4 for t, c, _ in frames[1:])
        assert b"".join(p for _, _, p in frames[1:]) == body
        assert all(len(p) + 8 <= FRAME_MIN_SIZE for _, _, p in frames)


def test_encode_method_is_what_py_amqp_reads() -> None:
    codec = ServerCodec()
    out = (
        codec.encode_method(
            0, "connection.start", 0, 9, {"capabilities": {"a": True}}, "PLAIN AMQPLAIN", "en_US"
        )
        + codec.encode_method(1, "basic.get_ok", 3, True, "ex", "rk", 7)
        + codec.encode_content(1, 2, b"\x00\x00", b"hi")
        + codec.encode_method(1, "channel.close", 406, "PRECONDITION_FAILED - x", 60, 80)
    )
    got = py_amqp_read(out)
    assert [(c, s) for c, s, _, _ in got] == [(0, (10, 10)), (1, (60, 71)), (1, (20, 40))]
    assert got[1][3].body == b"hi"
    from amqp.serialization import loads

    assert loads("Lbssl", got[1][2], 4)[0] == [3, True, "ex", "rk", 7]
    assert loads("BsBB", got[2][2], 4)[0] == [406, "PRECONDITION_FAILED - x", 60, 80]


def test_header_and_body_split_inside_the_frame_header() -> None:
    codec = greeted()
    data = publish_frames(1, "", "q", b"abc")
    for i in range(len(data)):
        codec.receive_data(data[i : i + 1])
    assert drain(codec) == [Publish(1, "", "q", False, False, 3, b"\x00\x00", b"abc")]
    assert struct.calcsize(">BHI") == 7


def test_a_channel_closed_by_the_broker_mid_publish_drops_the_rest_quietly() -> None:
    """A 506 (or any broker-side channel close) can land between two body frames; the rest of
    the content is already on the wire and must not kill the connection."""
    codec = ServerCodec(frame_max=4096)
    feed(codec, PROTOCOL_HEADER)
    body = b"x" * 10000
    head = method_frame(1, "basic.publish", 0, "", "q", False, False) + header_frame(1, len(body))
    assert feed(codec, head + body_frame(1, body[:4000])) == []
    codec.discard_channel(1)
    assert feed(codec, body_frame(1, body[4000:8000]) + body_frame(1, body[8000:])) == []
    assert feed(codec, method_frame(1, "channel.close_ok"))[0].NAME == "channel.close_ok"

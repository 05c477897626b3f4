"""Sans-IO AMQP 0-9-1 codec for the server side.

The codec never touches a socket or an event loop: bytes go in with :meth:`ServerCodec.
receive_data`, events come out of :meth:`ServerCodec.next_event` (or :data:`NEED_DATA`), and the
``encode_*`` methods turn outgoing methods into bytes for the caller to write.

Content is assembled here: a ``basic.publish`` method frame, its content header and its body
frames come out as one :class:`Publish` event whose ``properties`` are the raw property bytes of
the header, passed through to consumers byte for byte. Routing reads only what it needs from
them (:func:`plugbroker.codec.properties.peek`).

Framing errors raise :class:`plugbroker.errors.ConnectionError_` (or :class:`ChannelError` for a
per-channel content error) carrying the reply code; after a framing error the codec is
``broken`` and discards further input, since frame boundaries can no longer be trusted.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Final

from plugbroker.codec.events import (
    BasicAck,
    Event,
    Heartbeat,
    MethodEvent,
    ProtocolHeader,
    Publish,
    UnexpectedMethod,
)
from plugbroker.codec.ids import BASIC_ACK, BASIC_CLASS, BASIC_DELIVER, BASIC_PUBLISH, MethodId
from plugbroker.codec.methods import BY_NAME, decode_args, encode_args, lookup
from plugbroker.codec.properties import PropertiesError, peek
from plugbroker.codec.tables import MAX_DEPTH, MIN_LEVEL_BYTES, too_deep
from plugbroker.errors import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    ChannelError,
    ConnectionError_,
    FrameError,
)

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_OVERHEAD: Final = 8  # type(1) channel(2) size(4) ... end(1)
#: every peer must accept frames this large before tune (spec 4.2.3)
FRAME_MIN_SIZE: Final = 4096

_HDR = struct.Struct(">BHI")
_CONTENT_HDR = struct.Struct(">HHQ")
_U64 = struct.Struct(">Q")
#: a whole basic.ack frame: type, channel, size 13, class 60, method 80, tag, bits, frame end
_ACK_FRAME = struct.Struct(">BHIHHQBB")
_HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"
#: content properties shorter than this cannot hold headers nested past MAX_DEPTH
_DEEP_MIN: Final = MAX_DEPTH * MIN_LEVEL_BYTES
#: ...and a content header frame (12 bytes before its properties) no longer than this
_DEEP_HEADER_FRAME: Final = 12 + _DEEP_MIN


def _check_headers_depth(properties: bytes) -> None:
    """A 502 for a published message whose headers nest deeper than MAX_DEPTH (only called
    for properties long enough to, so usual publishes skip it)."""
    try:
        hoff = peek(properties)[3]
    except PropertiesError:
        return  # reported where the properties are read (406 on the channel)
    if hoff >= 0 and too_deep(properties, hoff):
        raise ConnectionError_(
            SYNTAX_ERROR,
            f"the headers of a basic.publish nest field tables deeper than {MAX_DEPTH} levels",
            BASIC_PUBLISH,
        )


def _head(sig: MethodId) -> bytes:
    """The first four bytes of a method frame's payload: class and method id."""
    return struct.pack(">HH", *sig)


_PUBLISH_SIG: Final = _head(BASIC_PUBLISH)
_ACK_SIG: Final = _head(BASIC_ACK)
_DELIVER_SIG: Final = _head(BASIC_DELIVER)


# The two events built once per message get their slots set directly: a frozen dataclass's
# __init__ goes through object.__setattr__ for every field, which costs twice as much. The
# setters are taken in field order, so a field added to the class breaks the unpacking below
# at import; the tests check the results equal the dataclass constructor's.
def _setters(cls: type, count: int) -> list[Callable[[Any, Any], None]]:
    names = [f.name for f in fields(cls)]
    if len(names) != count:
        raise AssertionError(f"{cls.__name__} has fields {names}")
    return [getattr(cls, name).__set__ for name in names]


_new = object.__new__
_pub_ch, _pub_ex, _pub_rk, _pub_mand, _pub_imm, _pub_size, _pub_props, _pub_body = _setters(
    Publish, 8
)
_ack_ch, _ack_tag, _ack_multiple = _setters(BasicAck, 3)


def _publish_event(
    channel: int,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    body_size: int,
    properties: bytes,
    body: bytes,
) -> Publish:
    """``Publish(...)``, at half the cost."""
    ev: Publish = _new(Publish)
    _pub_ch(ev, channel)
    _pub_ex(ev, exchange)
    _pub_rk(ev, routing_key)
    _pub_mand(ev, mandatory)
    _pub_imm(ev, immediate)
    _pub_size(ev, body_size)
    _pub_props(ev, properties)
    _pub_body(ev, body)
    return ev


def _ack_event(channel: int, delivery_tag: int, multiple: bool) -> BasicAck:
    """``BasicAck(...)``, at half the cost."""
    ev: BasicAck = _new(BasicAck)
    _ack_ch(ev, channel)
    _ack_tag(ev, delivery_tag)
    _ack_multiple(ev, multiple)
    return ev


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class _Pending:
    """A publish whose header or body frames have not all arrived."""

    __slots__ = (
        "body_size",
        "chunks",
        "discard",
        "exchange",
        "has_header",
        "immediate",
        "mandatory",
        "properties",
        "received",
        "routing_key",
        "silent",
    )

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.body_size = 0
        self.properties = b""
        #: the body so far: its first frame's payload, then one bytearray the later frames
        #: extend (one growing allocation rather than one per frame: the heap of a broker
        #: holding many partial bodies stays unfragmented, and is returned once they go)
        self.chunks: list[bytes | bytearray] = []
        self.received = 0
        self.has_header = False
        self.discard = False
        #: its channel was closed by the broker: drop it quietly when complete
        self.silent = False


class ServerCodec:
    """Parses client frames and encodes server frames for one connection.

    :param frame_max: the largest frame (including its 8 bytes of overhead) accepted before
        tune-ok; :meth:`tune` sets the negotiated value.
    :param max_message_size: larger bodies are refused with a 406 channel error.
    """

    def __init__(
        self,
        frame_max: int = 131072,
        max_message_size: int = 128 * 1024 * 1024,
        partial_budget: int = 0,
    ) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._greeted = False
        self.broken = False
        self.frame_max = max(frame_max, FRAME_MIN_SIZE)
        self.max_message_size = max_message_size
        self._pending: dict[int, _Pending] = {}
        #: body bytes held for publishes still being assembled, over all channels
        self.partial_bytes = 0
        #: the most :attr:`partial_bytes` may reach (0: no budget); past it the publish that
        #: would cross it fails with a 506 channel error and its body is read and dropped
        self.partial_budget = partial_budget

    # ------------------------------------------------------------------ input

    def tune(self, frame_max: int) -> None:
        """Apply the negotiated frame_max (0 means no limit beyond our own offer)."""
        if frame_max:
            self.frame_max = max(frame_max, FRAME_MIN_SIZE)

    def receive_data(self, data: bytes) -> None:
        if self.broken:
            return
        buf = self._buf
        if self._pos and self._pos == len(buf):
            buf.clear()
            self._pos = 0
        elif self._pos > 65536:
            del buf[: self._pos]
            self._pos = 0
        buf += data

    def buffered(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self._buf) - self._pos

    def discard_channel(self, channel: int) -> None:
        """A channel is being closed: a publish still arriving on it is read to its end (its
        frames are on the wire already) and dropped without an event or an error."""
        pending = self._pending.get(channel)
        if pending is not None:
            self._drop_chunks(pending)
            if pending.has_header and pending.received >= pending.body_size:
                del self._pending[channel]
            else:
                pending.discard = True
                pending.silent = True

    def _drop_chunks(self, pending: _Pending) -> None:
        """Let go of what a publish being assembled holds (it is dropped or complete)."""
        if pending.chunks:
            self.partial_bytes -= sum(len(c) for c in pending.chunks)
            pending.chunks = []

    def drop_partials(self) -> None:
        """The connection is closing: let go of the bodies being assembled (what more
        arrives of them is read and dropped)."""
        for pending in self._pending.values():
            self._drop_chunks(pending)
            pending.discard = pending.silent = True

    def release(self) -> None:
        """The connection is gone: drop every publish still being assembled, and the input."""
        for pending in self._pending.values():
            self._drop_chunks(pending)
        self._pending.clear()
        self._buf = bytearray()
        self._pos = 0

    def next_event(self) -> Event | _NeedData:
        """The next complete event, or :data:`NEED_DATA`.

        Raises an :class:`~plugbroker.errors.AMQPError` for input that breaks the protocol.
        """
        if self.broken:
            return NEED_DATA
        try:
            if not self._greeted:
                return self._read_protocol_header()
            while True:
                ev = self._read_frame()
                if ev is not None:
                    return ev
        except ConnectionError_:
            self.broken = True
            raise

    def _read_protocol_header(self) -> ProtocolHeader | _NeedData:
        buf = self._buf
        have = len(buf) - self._pos
        if have < 8:
            # A wrong first byte is already an answer; do not wait for eight of them.
            if have and not PROTOCOL_HEADER.startswith(bytes(buf[self._pos : self._pos + have])):
                self.broken = True
                return ProtocolHeader(False, bytes(buf[self._pos :]))
            return NEED_DATA
        data = bytes(buf[self._pos : self._pos + 8])
        self._pos += 8
        if data != PROTOCOL_HEADER:
            self.broken = True
            return ProtocolHeader(False, data)
        self._greeted = True
        return ProtocolHeader(True, data)

    def _read_frame(self) -> Event | _NeedData | None:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 7:
            return NEED_DATA
        ftype, channel, size = _HDR.unpack_from(buf, pos)
        if size + FRAME_OVERHEAD > self.frame_max:
            raise FrameError(
                FRAME_ERROR,
                f"frame of {size + FRAME_OVERHEAD} bytes exceeds frame_max {self.frame_max}",
            )
        end = pos + 7 + size
        if len(buf) <= end:
            return NEED_DATA
        if buf[end] != FRAME_END:
            raise FrameError(FRAME_ERROR, f"frame end octet is 0x{buf[end]:02x}, not 0xce")
        payload = bytes(buf[pos + 7 : end])
        self._pos = end + 1
        if ftype == FRAME_METHOD:
            return self._on_method(channel, payload)
        if ftype == FRAME_BODY:
            return self._on_body(channel, payload)
        if ftype == FRAME_HEADER:
            return self._on_header(channel, payload)
        if ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise FrameError(FRAME_ERROR, f"heartbeat frame on channel {channel}")
            return Heartbeat(channel)
        raise FrameError(FRAME_ERROR, f"unknown frame type {ftype}")

    def _on_method(self, channel: int, payload: bytes) -> MethodEvent | UnexpectedMethod | None:
        if len(payload) < 4:
            raise ConnectionError_(
                SYNTAX_ERROR, "method frame shorter than its class and method ids"
            )
        pending = self._pending.get(channel)
        if pending is not None:
            if not pending.silent:
                raise ConnectionError_(UNEXPECTED_FRAME, _expected_content(pending))
            # the broker closed this channel mid-content and the client moved on
            self._drop_chunks(pending)
            del self._pending[channel]
        head = payload[:4]
        if head == _ACK_SIG and len(payload) == 13:
            return _ack_event(channel, _U64.unpack_from(payload, 4)[0], bool(payload[12] & 1))
        if head == _PUBLISH_SIG:
            try:
                p = 6
                n = payload[p]
                exchange = payload[p + 1 : p + 1 + n].decode()
                p += 1 + n
                n = payload[p]
                routing_key = payload[p + 1 : p + 1 + n].decode()
                p += 1 + n
                bits = payload[p]
                if p + 1 != len(payload) or len(routing_key.encode()) != n:
                    raise IndexError
            except (IndexError, UnicodeDecodeError):
                raise ConnectionError_(
                    SYNTAX_ERROR, "malformed arguments for basic.publish", BASIC_PUBLISH
                ) from None
            if channel == 0:
                raise ConnectionError_(COMMAND_INVALID, "basic.publish on channel 0", BASIC_PUBLISH)
            ev = self._publish_in_one(channel, exchange, routing_key, bits)
            if ev is not None:
                return ev
            self._pending[channel] = _Pending(exchange, routing_key, bool(bits & 1), bool(bits & 2))
            return None
        class_id, method_id = struct.unpack_from(">HH", payload)
        spec = lookup(class_id, method_id)
        args = decode_args(spec, payload)
        if spec.content:
            # Only basic.publish carries content from a client; the others are server-only.
            raise ConnectionError_(
                COMMAND_INVALID, f"{spec.name} is sent by servers only", spec.sig
            )
        return spec.event_of(channel, args)

    def _publish_in_one(
        self, channel: int, exchange: str, routing_key: str, bits: int
    ) -> Publish | None:
        """The whole publish at once, when its content header and its single body frame are
        already in the buffer and well formed (the usual case: a client writes the three frames
        of a publish together). None leaves them to the frame-by-frame path, which also reports
        whatever is wrong with them."""
        buf = self._buf
        pos = self._pos
        have = len(buf)
        if have - pos < 22:  # 7 + a 14-byte content header + frame end
            return None
        ftype, ch, size = _HDR.unpack_from(buf, pos)
        end = pos + 7 + size
        if (
            ftype != FRAME_HEADER
            or ch != channel
            or size < 14
            or size + FRAME_OVERHEAD > self.frame_max
            or have <= end
            or buf[end] != FRAME_END
        ):
            return None
        if size > _DEEP_HEADER_FRAME:
            return None  # long properties: the frame-by-frame path checks the headers' depth
        class_id, _weight, body_size = _CONTENT_HDR.unpack_from(buf, pos + 7)
        if class_id != BASIC_CLASS or body_size > self.max_message_size:
            return None
        if body_size:
            bpos = end + 1
            if have - bpos < 8:
                return None
            ftype, ch, size = _HDR.unpack_from(buf, bpos)
            bend = bpos + 7 + size
            if (
                ftype != FRAME_BODY
                or ch != channel
                or size != body_size
                or size + FRAME_OVERHEAD > self.frame_max
                or have <= bend
                or buf[bend] != FRAME_END
            ):
                return None
            # one copy instead of two (slice, then bytes) pays off for large bodies
            body = bytes(buf[bpos + 7 : bend] if size < 8192 else memoryview(buf)[bpos + 7 : bend])
            self._pos = bend + 1
        else:
            body = b""
            self._pos = end + 1
        return _publish_event(
            channel,
            exchange,
            routing_key,
            bool(bits & 1),
            bool(bits & 2),
            body_size,
            bytes(buf[pos + 19 : end]),
            body,
        )

    def _on_header(self, channel: int, payload: bytes) -> Publish | None:
        pending = self._pending.get(channel)
        if pending is None:
            raise ConnectionError_(UNEXPECTED_FRAME, _EXPECTED_METHOD)
        if pending.has_header:
            raise ConnectionError_(UNEXPECTED_FRAME, _expected_content(pending))
        if len(payload) < 14:
            raise FrameError(FRAME_ERROR, "content header frame shorter than 14 bytes")
        class_id, _weight, body_size = _CONTENT_HDR.unpack_from(payload)
        if class_id != BASIC_CLASS:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"expected content header for class {BASIC_CLASS}, "
                f"got one for class {class_id} instead",
            )
        pending.has_header = True
        pending.body_size = body_size
        pending.properties = payload[12:]
        if body_size > self.max_message_size:
            pending.discard = True
        if body_size == 0:
            return self._complete(channel, pending)
        return None

    def _on_body(self, channel: int, payload: bytes) -> Publish | None:
        pending = self._pending.get(channel)
        if pending is not None and pending.silent and not pending.has_header:
            return None  # the rest of a publish on a channel the broker closed
        if pending is None:
            raise ConnectionError_(UNEXPECTED_FRAME, _EXPECTED_METHOD)
        if not pending.has_header:
            raise ConnectionError_(UNEXPECTED_FRAME, _expected_content(pending))
        pending.received += len(payload)
        if pending.received > pending.body_size:
            raise FrameError(
                FRAME_ERROR,
                f"content body on channel {channel} is longer than the "
                f"{pending.body_size} bytes its header declared",
            )
        if not pending.discard:
            n = len(payload)
            budget = self.partial_budget
            if budget and self.partial_bytes + n > budget and pending.received < pending.body_size:
                # past the connection's budget: this publish fails, its body is read and dropped
                held = self.partial_bytes
                self._drop_chunks(pending)
                pending.discard = pending.silent = True
                raise ChannelError(
                    RESOURCE_ERROR,
                    f"partial message bodies on this connection would exceed its budget of "
                    f"{budget} bytes ({held} held)",
                    BASIC_PUBLISH,
                    channel,
                )
            chunks = pending.chunks
            if not chunks:
                chunks.append(payload)
            else:
                first = chunks[0]
                if type(first) is bytes:
                    chunks[0] = first = bytearray(first)
                first += payload
            self.partial_bytes += n
        if pending.received == pending.body_size:
            return self._complete(channel, pending)
        return None

    def _complete(self, channel: int, p: _Pending) -> Publish | None:
        del self._pending[channel]
        chunks = p.chunks
        if chunks:
            self.partial_bytes -= p.received
        if p.silent:
            return None
        if p.discard:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"message size {p.body_size} is larger than the configured "
                f"maximum {self.max_message_size}",
                BASIC_PUBLISH,
                channel,
            )
        if len(p.properties) > _DEEP_MIN:
            _check_headers_depth(p.properties)
        first = chunks[0] if chunks else b""
        body = first if type(first) is bytes else bytes(first)
        return _publish_event(
            channel,
            p.exchange,
            p.routing_key,
            p.mandatory,
            p.immediate,
            p.body_size,
            p.properties,
            body,
        )

    # ----------------------------------------------------------------- output

    @staticmethod
    def encode_method(channel: int, name: str, *args: Any) -> bytes:
        """A method frame for ``name`` (e.g. ``"queue.declare_ok"``) with its arguments."""
        payload = encode_args(BY_NAME[name], args)
        return _HDR.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"

    def encode_content(self, channel: int, body_size: int, properties: bytes, body: bytes) -> bytes:
        """Content header plus body frames, split at the negotiated frame_max."""
        header = _CONTENT_HDR.pack(BASIC_CLASS, 0, body_size) + properties
        parts: list[bytes | memoryview] = [
            _HDR.pack(FRAME_HEADER, channel, len(header)),
            header,
            b"\xce",
        ]
        if body:
            room = self.frame_max - FRAME_OVERHEAD
            if len(body) <= room:
                parts += (_HDR.pack(FRAME_BODY, channel, len(body)), body, b"\xce")
            else:
                view = memoryview(body)
                for i in range(0, len(body), room):
                    chunk = view[i : i + room]
                    parts += (_HDR.pack(FRAME_BODY, channel, len(chunk)), chunk, b"\xce")
        return b"".join(parts)

    def encode_deliver(
        self,
        channel: int,
        consumer_tag: bytes,
        delivery_tag: int,
        redelivered: bool,
        exchange: bytes,
        routing_key: bytes,
        body_size: int,
        properties: bytes,
        body: bytes,
    ) -> bytes:
        """basic.deliver with its content; tags and names come pre-encoded (the hot path)."""
        args = b"".join(
            (
                _DELIVER_SIG,
                bytes((len(consumer_tag),)),
                consumer_tag,
                _U64.pack(delivery_tag),
                b"\x01" if redelivered else b"\x00",
                bytes((len(exchange),)),
                exchange,
                bytes((len(routing_key),)),
                routing_key,
            )
        )
        return (
            _HDR.pack(FRAME_METHOD, channel, len(args))
            + args
            + b"\xce"
            + self.encode_content(channel, body_size, properties, body)
        )

    @staticmethod
    def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
        """A basic.ack frame (publisher confirms: the hot path of a confirming publisher)."""
        return _ACK_FRAME.pack(
            FRAME_METHOD,
            channel,
            13,
            BASIC_CLASS,
            BASIC_ACK.method_id,
            delivery_tag,
            multiple,
            FRAME_END,
        )

    @staticmethod
    def encode_heartbeat() -> bytes:
        return _HEARTBEAT_FRAME


# RabbitMQ's texts for a frame out of order (rabbit_command_assembler), which clients show
_EXPECTED_METHOD = "expected method frame, got non method frame instead"


def _expected_content(pending: _Pending) -> str:
    if pending.has_header:
        return "expected content body, got non content body frame instead"
    return f"expected content header for class {BASIC_CLASS}, got non content header frame instead"


__all__ = [
    "CHANNEL_ERROR",
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "Event",
    "Heartbeat",
    "MethodEvent",
    "ProtocolHeader",
    "Publish",
    "ServerCodec",
    "UnexpectedMethod",
]

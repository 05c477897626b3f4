"""Basic content properties: a cheap peek for routing, full decode/encode for the slow path.

The broker passes the raw property bytes of a published message through to its consumers. Only
four properties matter to routing and queueing (delivery_mode, priority, expiration, headers),
and :func:`peek` reads just those, skipping the rest by their lengths. Headers are decoded only
when an exchange or a feature needs them. Dead-lettering, which must add headers, decodes and
re-encodes the whole property list with py-amqp's serializer.
"""

from __future__ import annotations

import struct
from typing import Any

from amqp.basic_message import Message as _AmqpMessage
from amqp.serialization import decode_properties_basic, loads

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# flag bits, in property-list order
_CONTENT_TYPE = 1 << 15
_CONTENT_ENCODING = 1 << 14
_HEADERS = 1 << 13
_DELIVERY_MODE = 1 << 12
_PRIORITY = 1 << 11
_CORRELATION_ID = 1 << 10
_REPLY_TO = 1 << 9
_EXPIRATION = 1 << 8
_MESSAGE_ID = 1 << 7
_TIMESTAMP = 1 << 6
_TYPE = 1 << 5
#: the user_id bit, in the second (low) byte of the flags
USER_ID_FLAG = _USER_ID = 1 << 4
#: type, user_id, app_id, cluster_id
_REST_SHORTSTRS = (1 << 5, 1 << 4, 1 << 3, 1 << 2)
_REST = _MESSAGE_ID | _TIMESTAMP | (1 << 5) | (1 << 4) | (1 << 3) | (1 << 2)


class PropertiesError(ValueError):
    """The property list does not match its flags."""


def peek(raw: bytes) -> tuple[int, int, str | None, int]:
    """Read ``(delivery_mode, priority, expiration, headers_offset)`` from raw properties.

    ``headers_offset`` is the offset of the headers table in ``raw``, or -1 when absent;
    :func:`headers_at` decodes it on demand. Missing values are 0 / ``None``.
    """
    try:
        flags = _U16.unpack_from(raw, 0)[0]
        p = 2
        if flags & 1:  # a continuation word; basic has no properties there
            p += 2
        if flags & _CONTENT_TYPE:
            p += 1 + raw[p]
        if flags & _CONTENT_ENCODING:
            p += 1 + raw[p]
        hoff = -1
        if flags & _HEADERS:
            hoff = p
            p += 4 + _U32.unpack_from(raw, p)[0]
            if p > len(raw):
                raise IndexError("headers table runs past the end of the properties")
        mode = 0
        if flags & _DELIVERY_MODE:
            mode = raw[p]
            p += 1
        prio = 0
        if flags & _PRIORITY:
            prio = raw[p]
            p += 1
        if flags & _CORRELATION_ID:
            p += 1 + raw[p]
        if flags & _REPLY_TO:
            p += 1 + raw[p]
        expiration = None
        if flags & _EXPIRATION:
            n = raw[p]
            exp_raw = raw[p + 1 : p + 1 + n]
            if len(exp_raw) != n:  # compare bytes, not characters
                raise IndexError
            expiration = exp_raw.decode()
            p += 1 + n
        if flags & _REST:  # message_id .. cluster_id: not read here, but they must fit
            if flags & _MESSAGE_ID:
                p += 1 + raw[p]
            if flags & _TIMESTAMP:
                p += 8
            for bit in _REST_SHORTSTRS:
                if flags & bit:
                    p += 1 + raw[p]
        if p > len(raw):
            raise IndexError("property list runs past the end of the content header")
        return mode, prio, expiration, hoff
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise PropertiesError(f"content header properties are malformed: {exc}") from None


def user_id(raw: bytes) -> str | None:
    """The ``user_id`` property, or None when absent. One byte test when it is absent (the
    usual case): only a publish that sets it pays for the walk to it.

    Raises :class:`PropertiesError` for a property list that does not match its flags."""
    if len(raw) < 2 or not raw[1] & _USER_ID:
        return None
    try:
        flags = _U16.unpack_from(raw, 0)[0]
        p = 4 if flags & 1 else 2
        for bit in (_CONTENT_TYPE, _CONTENT_ENCODING):
            if flags & bit:
                p += 1 + raw[p]
        if flags & _HEADERS:
            p += 4 + _U32.unpack_from(raw, p)[0]
        if flags & _DELIVERY_MODE:
            p += 1
        if flags & _PRIORITY:
            p += 1
        for bit in (_CORRELATION_ID, _REPLY_TO, _EXPIRATION, _MESSAGE_ID):
            if flags & bit:
                p += 1 + raw[p]
        if flags & _TIMESTAMP:
            p += 8
        if flags & _TYPE:
            p += 1 + raw[p]
        n = raw[p]
        value = raw[p + 1 : p + 1 + n]
        if len(value) != n:
            raise IndexError("user_id runs past the end of the properties")
        return value.decode()
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise PropertiesError(f"content header properties are malformed: {exc}") from None


def headers_at(raw: bytes, offset: int) -> dict[str, Any]:
    """Decode the headers table found by :func:`peek` (``{}`` when ``offset`` is -1)."""
    if offset < 0:
        return {}
    try:
        values, _ = loads("F", raw, offset)
    except Exception as exc:
        raise PropertiesError(f"headers table is malformed: {exc}") from None
    headers: dict[str, Any] = values[0]
    return headers


def decode(raw: bytes) -> dict[str, Any]:
    """All properties as a dict (py-amqp's names: ``content_type``, ``application_headers`` …)."""
    try:
        props, _ = decode_properties_basic(raw, 0)
    except Exception as exc:
        raise PropertiesError(f"content header properties are malformed: {exc}") from None
    decoded: dict[str, Any] = props
    return decoded


def decode_lenient(raw: bytes) -> dict[str, Any]:
    """:func:`decode` for properties already accepted by :func:`peek`, which never fails.

    Peek does not read the headers table's contents (nor check that short strings are UTF-8),
    so a message can be queued with properties that do not decode. Its redelivery or
    dead-lettering, which re-encode them, must not fail: a headers table that does not decode
    is left out, and if the rest still does not decode only what peek read is kept.
    """
    try:
        return decode(raw)
    except PropertiesError:
        pass
    mode, prio, exp, hoff = peek(raw)
    if hoff >= 0:
        end = hoff + 4 + _U32.unpack_from(raw, hoff)[0]
        flags = _U16.unpack_from(raw, 0)[0] & ~_HEADERS
        try:
            return decode(_U16.pack(flags) + raw[2:hoff] + raw[end:])
        except PropertiesError:
            pass
    props = {"delivery_mode": mode or None, "priority": prio or None, "expiration": exp}
    return {k: v for k, v in props.items() if v is not None}


def encode(props: dict[str, Any]) -> bytes:
    """Raw property bytes for a dict in :func:`decode`'s shape."""
    msg = _AmqpMessage()
    msg.properties = {k: v for k, v in props.items() if v is not None}
    return bytes(msg._serialize_properties())


def expiration_ms(value: str | None) -> int | None:
    """The per-message ``expiration`` property as milliseconds; ``None`` when absent.

    Raises :class:`PropertiesError` for anything but a non-negative integer, as RabbitMQ does.
    """
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):  # str.isdigit() also takes "²" and "٣"
        raise PropertiesError(f"invalid expiration value {value!r}: must be a non-negative integer")
    return int(value)

"""Field-table nesting: a bound, and an iterative scan that checks it without recursion.

AMQP field tables (``F``) and arrays (``A``) nest. A peer can nest them hundreds of levels
deep in a few kilobytes, and every recursive encoder or decoder (py-amqp's, SQLite's JSON, the
``repr`` in a log line) then raises ``RecursionError`` somewhere far from the frame that
brought it. The broker refuses such tables where they are parsed: method arguments
(:func:`plugbroker.codec.methods.decode_args`) and the ``headers`` property of a published message
(:class:`plugbroker.codec.frames.ServerCodec`), with 502 SYNTAX_ERROR.

:func:`too_deep` walks the bytes with an explicit stack, so it cannot itself recurse, and it is
only called when the table is long enough to nest past the bound: every level costs at least
:data:`MIN_LEVEL_BYTES` bytes, so a headers table shorter than ``MAX_DEPTH * MIN_LEVEL_BYTES``
bytes is accepted without a scan (the publish hot path pays nothing for usual headers).
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["MAX_DEPTH", "MIN_LEVEL_BYTES", "too_deep"]

#: the deepest nesting of field tables/arrays accepted (the outermost table is depth 1)
MAX_DEPTH: Final = 100
#: the fewest bytes one level of nesting takes on the wire (type octet + 4-byte length)
MIN_LEVEL_BYTES: Final = 5

_U32 = struct.Struct(">I")
#: value types of a fixed size (after the type octet), as py-amqp and RabbitMQ read them
_FIXED: Final = {
    ord("t"): 1,
    ord("b"): 1,
    ord("B"): 1,
    ord("s"): 2,
    ord("U"): 2,
    ord("u"): 2,
    ord("I"): 4,
    ord("i"): 4,
    ord("f"): 4,
    ord("L"): 8,
    ord("l"): 8,
    ord("d"): 8,
    ord("T"): 8,
    ord("D"): 5,
    ord("V"): 0,
}
_LONG = (ord("S"), ord("x"))
_TABLE = ord("F")
_ARRAY = ord("A")


def too_deep(buf: bytes | bytearray | memoryview, offset: int, limit: int = MAX_DEPTH) -> bool:
    """Whether the field table whose 4-byte length is at ``offset`` nests deeper than ``limit``.

    Malformed bytes (a length running past the end, an unknown type) end the scan with False:
    the decoder that reads the table later reports those itself.
    """
    end_all = len(buf)
    try:
        (size,) = _U32.unpack_from(buf, offset)
    except struct.error:
        return False
    pos = offset + 4
    # each entry: (end of this container, whether it is a table: entries have a name)
    stack: list[tuple[int, bool]] = [(min(pos + size, end_all), True)]
    try:
        while stack:
            end, is_table = stack[-1]
            if pos >= end:
                stack.pop()
                continue
            if is_table:
                pos += 1 + buf[pos]  # the field name
            kind = buf[pos]
            pos += 1
            fixed = _FIXED.get(kind)
            if fixed is not None:
                pos += fixed
            elif kind in _LONG:
                pos += 4 + _U32.unpack_from(buf, pos)[0]
            elif kind == _TABLE or kind == _ARRAY:
                (n,) = _U32.unpack_from(buf, pos)
                pos += 4
                if len(stack) >= limit:
                    return True
                stack.append((min(pos + n, end), kind == _TABLE))
            else:
                return False
    except (IndexError, struct.error):
        return False
    return False

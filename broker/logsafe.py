"""Log lines a client cannot forge.

A user name, a client property, a queue or consumer name, a close reason and a certificate
subject all come from the client, and all end up in log lines. A newline in one of them would
start a line of the client's making (``... opened: user 'admin'``), a terminal escape could
rewrite what an operator sees. So the text format escapes every control character of a
record's message (C0, DEL, C1 and the Unicode line and paragraph separators) as ``\\n``,
``\\r``, ``\\t`` or ``\\xNN`` / ``\\uNNNN``, and a backslash as ``\\\\`` so that an escape
cannot be faked either: each record is exactly one line, whatever a client sent. A traceback
that follows a message (the broker's own) keeps its lines.

``--log-format json`` needs no escaping: each record is one JSON object, and the lines about
clients carry what they sent as fields of their own (``user``, ``peer``, ``vhost``), see
:mod:`plugbroker.logjson`.
"""

from __future__ import annotations

import logging
import re

__all__ = ["TEXT_FORMAT", "TextFormatter", "escape"]

#: the text format's layout (``plugbroker run --log-format text``, the default)
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

_UNSAFE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def escape(text: str) -> str:
    """``text`` with control characters and backslashes escaped: one line, always."""
    return _UNSAFE.sub(_escape_one, text) if _UNSAFE.search(text) else text


class TextFormatter(logging.Formatter):
    """The text log format, one line per record (see the module docstring)."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))

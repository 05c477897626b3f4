"""Durations and sizes as they are written in the XML configuration.

The Qpid design this broker follows writes every duration as integer milliseconds
(``<messageAge>600000</messageAge>``) and every size as plain bytes (``<depth>4235264</depth>``).
That is exact but hard to read, so a unit may be given instead: ``1.5s``, ``10m``, ``2h``, ``4MB``.
A bare integer keeps its Qpid meaning (milliseconds, bytes) so that configs copied from the
design keep working. Everything is converted once, at load, to the units the code uses:
float **seconds** for durations and int **bytes** for sizes.

The same grammar is expressed as patterns in ``config/plugbroker.xsd`` (:data:`DURATION_PATTERN`,
:data:`SIZE_PATTERN`); a test keeps the two in step. The error messages here are the ones a user
sees in ``file:line: <element>: ...`` reports, so they say what *would* have been accepted.

This module is the one home of these conversions: the loader, plugin parsers (through
:class:`plugbroker.config.ParseContext`), the schema's error messages and the analysis pipeline all
use it.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "DURATION_PATTERN",
    "DURATION_UNITS",
    "SIZE_PATTERN",
    "SIZE_UNITS",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_duration_list",
    "parse_size",
]

#: XSD pattern (implicitly anchored) of a duration; mirrored by ``durationType`` in the schema.
DURATION_PATTERN = r"[0-9]+|[0-9]+(\.[0-9]+)?(ms|s|m|h|d)"
#: XSD pattern of a size; mirrored by ``sizeType`` in the schema.
SIZE_PATTERN = r"[0-9]+|[0-9]+(\.[0-9]+)?(KB|MB|GB)"

#: seconds per unit
DURATION_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
#: bytes per unit (1024-based, as memory and queue depths are usually reasoned about)
SIZE_UNITS: dict[str, int] = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}

_DURATION_RE = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>ms|s|m|h|d)?")
_SIZE_RE = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>KB|MB|GB)?")

_DURATION_HINT = "use ms or a number with ms|s|m|h|d"
_SIZE_HINT = "use bytes or a number with KB|MB|GB"


def parse_duration(text: str) -> float:
    """Parse ``"300000"`` (integer milliseconds) or ``"1.5s"``/``"10m"``/``"250ms"`` to seconds.

    A bare number must be an integer: ``"1.5"`` is refused rather than guessed, since it is
    ambiguous whether the writer meant seconds or milliseconds.

    :raises ValueError: with a message naming the bad value and the accepted forms.
    """
    raw = text.strip() if isinstance(text, str) else text
    m = _DURATION_RE.fullmatch(raw) if isinstance(raw, str) else None
    if m is None or (m["unit"] is None and "." in m["num"]):
        raise ValueError(f"{text!r} is not a duration ({_DURATION_HINT})")
    num = Decimal(m["num"])
    scale = DURATION_UNITS[m["unit"]] if m["unit"] else DURATION_UNITS["ms"]
    return float(num * scale)


def parse_size(text: str) -> int:
    """Parse ``"4235264"`` (bytes) or ``"4MB"``/``"1.5KB"`` (1024-based) to an int of bytes.

    A fractional number of bytes is refused; a fractional KB/MB/GB is rounded to whole bytes.

    :raises ValueError: with a message naming the bad value and the accepted forms.
    """
    raw = text.strip() if isinstance(text, str) else text
    m = _SIZE_RE.fullmatch(raw) if isinstance(raw, str) else None
    if m is None or (m["unit"] is None and "." in m["num"]):
        raise ValueError(f"{text!r} is not a size ({_SIZE_HINT})")
    try:
        num = Decimal(m["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{text!r} is not a size ({_SIZE_HINT})") from exc
    scale = SIZE_UNITS[m["unit"]] if m["unit"] else 1
    return int((num * scale).to_integral_value())


def parse_duration_list(text: str) -> tuple[float, ...]:
    """Parse a whitespace-separated level list such as ``"1s 5s 10s 30s 1m 2m"`` to seconds.

    This is the TDMQ ``MESSAGE_DELAYLEVEL`` notation; level *n* (1-based) is item *n-1*.

    :raises ValueError: for an empty list, or naming the position and value of a bad item.
    """
    items = text.split()
    if not items:
        raise ValueError("an empty list is not a list of durations (e.g. '1s 5s 10s 30s 1m')")
    out: list[float] = []
    for i, item in enumerate(items, start=1):
        try:
            out.append(parse_duration(item))
        except ValueError as exc:
            raise ValueError(f"item {i}: {exc}") from None
    return tuple(out)


_FORMAT_STEPS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def format_duration(seconds: float) -> str:
    """Render seconds in the shortest exact unit form (``300.0 -> "5m"``, ``1.5 -> "1.5s"``).

    Used by ``check-config`` and log lines, so the output can be pasted back into a config.
    """
    ms = round(seconds * 1000)
    if abs(seconds * 1000 - ms) > 1e-6:
        return f"{seconds:g}s"
    if ms == 0:
        return "0s"
    for unit, factor in _FORMAT_STEPS:
        if ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms" if ms < 1000 else f"{ms / 1000:g}s"


def format_size(nbytes: int) -> str:
    """Render bytes as ``4MB`` when exact, else as plain bytes (always valid config input)."""
    if nbytes:
        for unit in ("GB", "MB", "KB"):
            if nbytes % SIZE_UNITS[unit] == 0:
                return f"{nbytes // SIZE_UNITS[unit]}{unit}"
    return str(nbytes)

"""Durations, sizes and level lists as written in the XML configuration."""

from __future__ import annotations

import pytest
from lxml import etree

from plugbroker.config import schema_path
from plugbroker.config.units import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    format_duration,
    format_size,
    parse_duration,
    parse_duration_list,
    parse_size,
)

XSD = schema_path()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300000", 300.0),  # bare integer = milliseconds, as in the Qpid design
        ("0", 0.0),
        ("1", 0.001),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("10d", 864000.0),
        ("0.5m", 30.0),
        ("  30s \n", 30.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize(
    "text", ["10 minutes", "1.5", "-1s", "1 s", "s", "", "1e3", "5S", "1w", "１s"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == f"{text!r} is not a duration (use ms or a number with ms|s|m|h|d)"


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("4235264", 4235264),
        ("0", 0),
        ("1KB", 1024),
        ("4MB", 4 * 1024 * 1024),
        ("1.5KB", 1536),
        ("2GB", 2 * 1024**3),
        (" 128MB ", 128 * 1024**2),
    ],
)
def test_parse_size(text: str, nbytes: int) -> None:
    value = parse_size(text)
    assert value == nbytes and isinstance(value, int)


@pytest.mark.parametrize("text", ["4 MB", "1.5", "1kb", "1TB", "MB", "-1", "10 bytes"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"is not a size \(use bytes or a number with KB\|MB\|GB\)"
    ):
        parse_size(text)


def test_parse_duration_list_tdmq_levels() -> None:
    levels = parse_duration_list("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
    assert len(levels) == 18
    assert levels[:4] == (1.0, 5.0, 10.0, 30.0)
    assert levels[-1] == 7200.0
    assert parse_duration_list("1000\n 2s\t3s") == (1.0, 2.0, 3.0)


def test_parse_duration_list_errors_name_the_item() -> None:
    with pytest.raises(ValueError, match=r"^item 3: '10x' is not a duration"):
        parse_duration_list("1s 5s 10x")
    with pytest.raises(ValueError, match="empty list"):
        parse_duration_list("   ")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300.0, "5m"),
        (1.5, "1.5s"),
        (0.25, "250ms"),
        (0.0, "0s"),
        (7200.0, "2h"),
        (864000.0, "10d"),
        (90.0, "90s"),
    ],
)
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_format_size() -> None:
    assert format_size(4 * 1024 * 1024) == "4MB"
    assert format_size(1000) == "1000"
    assert format_size(0) == "0"
    assert parse_size(format_size(4235264)) == 4235264


def _schema_pattern(type_name: str) -> str:
    doc = etree.parse(str(XSD))
    ns = {"xs": "http://www.w3.org/2001/XMLSchema"}
    (value,) = doc.xpath(f"//xs:simpleType[@name='{type_name}']//xs:pattern/@value", namespaces=ns)
    return str(value)


def test_schema_patterns_match_units() -> None:
    """The schema and this module must accept the same language."""
    assert _schema_pattern("durationType") == DURATION_PATTERN
    assert _schema_pattern("sizeType") == SIZE_PATTERN

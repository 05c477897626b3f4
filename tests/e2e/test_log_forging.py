"""Logs a client cannot forge: a user name carrying a newline and a whole fake log line stays
one escaped line in the text log, and a field of its own in the JSON log."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator

import amqp
import pytest
from brokerutil import BrokerThread

from plugbroker.cli import _setup_logging
from plugbroker.logjson import JsonFormatter
from plugbroker.logsafe import TextFormatter, escape

pytestmark = pytest.mark.e2e

FAKE = "2026-01-01 00:00:00,000 INFO    plugbroker.session: connection 1 opened: user 'admin'"
#: a text log line starts with its time
LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


@pytest.fixture
def logged() -> Iterator[Callable[[logging.Formatter], io.StringIO]]:
    handlers: list[logging.Handler] = []
    root = logging.getLogger()

    def attach(fmt: logging.Formatter) -> io.StringIO:
        out = io.StringIO()
        h = logging.StreamHandler(out)
        h.setFormatter(fmt)
        h.setLevel(logging.INFO)
        root.addHandler(h)
        handlers.append(h)
        return out

    old = root.level
    root.setLevel(logging.INFO)
    yield attach
    root.setLevel(old)
    for h in handlers:
        root.removeHandler(h)


def forge(b: BrokerThread) -> None:
    with pytest.raises(amqp.exceptions.AccessRefused):
        amqp.Connection(
            f"127.0.0.1:{b.port}", userid="x\n" + FAKE, password="nope", connect_timeout=5
        ).connect()


def test_a_newline_in_a_user_name_stays_one_line(
    broker_factory: Callable[..., BrokerThread],
    logged: Callable[[logging.Formatter], io.StringIO],
) -> None:
    text = logged(TextFormatter())
    b = broker_factory()
    forge(b)
    lines = text.getvalue().splitlines()
    assert lines and all(LINE_START.match(line) for line in lines), lines
    assert not any(line.startswith(FAKE) for line in lines)
    [refused] = [line for line in lines if "login refused" in line]
    assert "user 'x\\n" + FAKE + "' - invalid credentials" in refused


def test_the_json_log_keeps_the_name_as_a_field(
    broker_factory: Callable[..., BrokerThread],
    logged: Callable[[logging.Formatter], io.StringIO],
) -> None:
    out = logged(JsonFormatter())
    b = broker_factory()
    forge(b)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    [refused] = [r for r in records if "login refused" in r["message"]]
    assert refused["user"] == "x\n" + FAKE
    assert refused["peer"].startswith("127.0.0.1:")


def test_plugbroker_run_logs_text_through_the_escaping_formatter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: seen.update(kw))
    _setup_logging("info", "text")
    [handler] = seen["handlers"]  # type: ignore[misc]
    assert isinstance(handler.formatter, TextFormatter)


def test_escape_leaves_one_line_and_cannot_be_faked() -> None:
    assert escape("plain name") == "plain name"
    assert escape("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert escape("\x1b[2J\x00\x7f\x85") == "\\x1b[2J\\x00\\x7f\\x85"
    assert escape("line\u2028sep\u2029") == "line\\u2028sep\\u2029"
    # a client that sends a literal backslash-n cannot pass it off as an escaped newline
    assert escape("a\\nb") == "a\\\\nb" != escape("a\nb")
    assert "\n" not in escape("".join(chr(i) for i in range(0x2030)))

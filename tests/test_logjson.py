"""``--log-format json``: the formatter."""

from __future__ import annotations

import json
import logging

from plugbroker.logjson import JsonFormatter


def _record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "plugbroker.policy", logging.INFO, "x.py", 1, "queue %s: %d", ("q", 3), None
    )
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_a_record_is_one_line_of_json_with_its_structured_fields() -> None:
    line = JsonFormatter().format(_record(vhost="/", queue="q", action="DeleteQueue"))
    assert "\n" not in line
    out = json.loads(line)
    assert out["level"] == "INFO" and out["logger"] == "plugbroker.policy"
    assert out["message"] == "queue q: 3"
    assert out["time"].endswith("+00:00") and "T" in out["time"]
    assert (out["vhost"], out["queue"], out["action"]) == ("/", "q", "DeleteQueue")
    assert "args" not in out and "msg" not in out and "levelno" not in out


def test_an_exception_goes_in_one_field() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys

        rec = logging.LogRecord("broker", logging.ERROR, "x.py", 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "failed" and "ValueError: bad" in out["exc"]

"""``--log-format json``: one JSON object per log line, for log shippers.

Each line has ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message`` (the formatted text), then the structured fields a record carries: anything a
caller passed with ``extra={...}``, ``exc`` (the traceback) when there is one, and
``thread`` when the line comes from another thread than the event loop's (the housekeeping
pool).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from typing import Any

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.thread != threading.main_thread().ident and record.threadName:
            out.setdefault("thread", record.threadName)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


__all__ = ["JsonFormatter"]

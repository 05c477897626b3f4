"""Parameters of admin requests: a queue declaration's body and query parameters, each a
400 with a clear message when wrong."""

from __future__ import annotations

import json
from typing import Any

from plugbroker.admin import AdminError

__all__ = ["bool_param", "float_param", "int_param", "queue_spec"]


#: what the body of ``PUT /api/queues/{vhost}/{queue}`` may hold (RabbitMQ's names)
QUEUE_SPEC_KEYS = ("durable", "auto_delete", "arguments")


def queue_spec(body: bytes) -> dict[str, Any]:
    """The keyword arguments of a queue declare from a PUT body: a JSON object with
    ``durable`` and ``auto_delete`` (true/false) and ``arguments`` (an object), each optional;
    an empty body declares a transient queue without arguments. Anything else is a 400."""
    if not body.strip():
        return {}
    try:
        spec = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdminError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise AdminError(400, "the body must be a JSON object (durable, auto_delete, arguments)")
    unknown = sorted(set(spec) - set(QUEUE_SPEC_KEYS))
    if unknown:
        raise AdminError(
            400,
            f"unknown field(s) {', '.join(unknown)}; a queue takes {', '.join(QUEUE_SPEC_KEYS)}",
        )
    for key in ("durable", "auto_delete"):
        if key in spec and not isinstance(spec[key], bool):
            raise AdminError(400, f"field {key}: {spec[key]!r} is not true or false")
    if "arguments" in spec and not isinstance(spec["arguments"], dict):
        raise AdminError(400, "field arguments: must be a JSON object")
    return {k: spec[k] for k in QUEUE_SPEC_KEYS if k in spec}


def bool_param(query: dict[str, list[str]], name: str, default: bool) -> bool:
    """A true/false query parameter (``true``, ``1``, ``yes``; ``false``, ``0``, ``no``)."""
    values = query.get(name)
    if not values:
        return default
    raw = values[0].lower()
    if raw in ("true", "1", "yes", ""):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise AdminError(400, f"parameter {name}: {values[0]!r} is not true or false")


def float_param(query: dict[str, list[str]], name: str) -> float | None:
    """A positive number query parameter, or None when absent."""
    values = query.get(name)
    if not values:
        return None
    try:
        value = float(values[0])
    except ValueError:
        raise AdminError(400, f"parameter {name}: {values[0]!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise AdminError(400, f"parameter {name}: {values[0]} must be a positive number")
    return value


def int_param(
    query: dict[str, list[str]],
    name: str,
    default: int | None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int | None:
    """An integer query parameter, or a 400 that says what was wrong."""
    values = query.get(name)
    if not values:
        return default
    raw = values[0]
    try:
        value = int(raw)
    except ValueError:
        raise AdminError(400, f"parameter {name}: {raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise AdminError(400, f"parameter {name}: {value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise AdminError(400, f"parameter {name}: {value} is above {maximum}")
    return value

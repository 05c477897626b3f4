"""Client side of the retry queue: ``reconsume_later`` for kombu consumers (TDMQ's API).

::

    from broker.retry import reconsume_later

    def handle(body, message):
        try:
            process(body)
            message.ack()
        except TemporaryFailure:
            reconsume_later(message, delay=30)      # any delay, 1 s .. 864,000 s
            # reconsume_later(message, level=3)     # the 3rd delay level (10 s by default)
            # reconsume_later(message)              # the next level: 1 s, 5 s, 10 s, ...

Each call publishes a copy of the message to the queue's retry queue (``{queue}-RETRY``, declared
by the broker when the queue has ``<deadLetter><retry>``) with the properties ``REAL_TOPIC``
(the original queue), ``ORIGIN_MESSAGE_ID``, ``RETRY_TOPIC`` (the retry queue) and
``RECONSUMETIMES`` (how many times it was reconsumed), then acks the original. When the delay
has passed the broker puts the copy back on the original queue, so the same consumers get it.
Past ``max_reconsume`` retries the message goes to the dead-letter queue instead.

The copy is published before the original is acked: a crash in between delivers the message
twice rather than losing it (at-least-once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: TDMQ's MESSAGE_DELAYLEVEL, in seconds: the default ``<retry><levels>`` of the broker too
#: (``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``). This module is the one home
#: of the retry contract's numbers; it imports nothing from the broker, so kombu consumers can use
#: it on their own.
DEFAULT_LEVELS: tuple[float, ...] = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    180.0,
    240.0,
    300.0,
    360.0,
    420.0,
    480.0,
    540.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
)
#: the range of a retry delay, seconds (SPEC section 7: 1 s to 864,000 s, ten days)
MIN_DELAY = 1.0
MAX_DELAY = 864_000.0
DEFAULT_MAX_RECONSUME = 16

RETRIED = "retry"
DEAD_LETTERED = "dead-letter"


class RetryError(ValueError):
    """A delay or level out of range, or no way to tell which queue the message came from."""


def original_queue(message: Any, queue: str | None = None) -> str:
    """The queue a message is retried on: ``REAL_TOPIC`` if it was retried before, else
    ``queue``, else its routing key (right when it was published to the default exchange)."""
    headers = message.headers or {}
    name = headers.get("REAL_TOPIC") or queue or message.delivery_info.get("routing_key")
    if not name:
        raise RetryError("cannot tell which queue the message came from: pass queue=")
    return str(name)


def reconsume_later(
    message: Any,
    delay: float | None = None,
    level: int | None = None,
    *,
    queue: str | None = None,
    retry_queue: str | None = None,
    dead_letter_queue: str | None = None,
    max_reconsume: int = DEFAULT_MAX_RECONSUME,
    levels: Sequence[float] = DEFAULT_LEVELS,
) -> str:
    """Consume ``message`` again later; returns :data:`RETRIED` or :data:`DEAD_LETTERED`.

    :param message: the kombu message being handled (not yet acked).
    :param delay: seconds, 1 to 864,000.
    :param level: a 1-based delay level; the broker's ``<retry><levels>`` give its delay.
    :param queue: the original queue, when the message was not published to it by name.
    :param retry_queue: default ``{queue}-RETRY``.
    :param dead_letter_queue: default ``{queue}-DLQ``.
    :param max_reconsume: retries before the message goes to the dead-letter queue (16).
    :param levels: only to check ``level``'s range on the client; the broker's own levels
        decide the delay.
    :raises RetryError: out-of-range delay or level (the message is left unacked).
    """
    if delay is not None and level is not None:
        raise RetryError("give delay or level, not both")
    if delay is not None and not (MIN_DELAY <= delay <= MAX_DELAY):
        raise RetryError(f"delay {delay!r} s is out of range: {MIN_DELAY:g} to {MAX_DELAY:g} s")
    if level is not None and not (1 <= level <= len(levels)):
        raise RetryError(f"level {level!r} is out of range: 1 to {len(levels)}")
    name = original_queue(message, queue)
    headers = dict(message.headers or {})
    times = int(headers.get("RECONSUMETIMES", 0)) + 1
    retry_name = retry_queue or f"{name}-RETRY"
    props = message.properties or {}
    headers.update(
        {
            "REAL_TOPIC": name,
            "ORIGIN_MESSAGE_ID": headers.get("ORIGIN_MESSAGE_ID")
            or props.get("message_id")
            or f"{name}/{message.delivery_tag}",
            "RETRY_TOPIC": retry_name,
            "RECONSUMETIMES": times,
        }
    )
    headers.pop("x-delay", None)
    headers.pop("x-retry-level", None)
    if times > max_reconsume:
        target = dead_letter_queue or f"{name}-DLQ"
        message.channel.queue_declare(queue=target, durable=True, auto_delete=False)
        outcome = DEAD_LETTERED
    else:
        target = retry_name
        if delay is not None:
            headers["x-delay"] = round(delay * 1000)
        elif level is not None:
            headers["x-retry-level"] = level
        outcome = RETRIED  # neither: the broker takes the level after RECONSUMETIMES
    _publish_copy(message, target, headers)
    message.ack()
    return outcome


def _publish_copy(message: Any, queue: str, headers: dict[str, Any]) -> None:
    channel = message.channel
    props = dict(message.properties or {})
    props.pop("application_headers", None)
    body = message.body
    msg = channel.prepare_message(
        body,
        priority=props.get("priority"),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=headers,
        properties={
            k: v
            for k, v in props.items()
            if k
            in (
                "delivery_mode",
                "correlation_id",
                "reply_to",
                "message_id",
                "timestamp",
                "type",
                "app_id",
                "expiration",
            )
        },
    )
    channel.basic_publish(msg, exchange="", routing_key=queue)

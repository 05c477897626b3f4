"""Client side of the retry queue: ``reconsume_later`` for kombu and py-amqp consumers (TDMQ's
reconsumeLater, with the decisions made by the broker).

::

    from plugbroker.retry import reconsume_later

    def handle(body, message):
        try:
            process(body)
            message.ack()
        except TemporaryFailure:
            reconsume_later(message, delay=30)      # any delay, 1 s .. 864,000 s
            # reconsume_later(message, level=3)     # the 3rd delay level of the queue
            # reconsume_later(message)              # the next level: 1 s, 5 s, 10 s, ...

The helper asks the broker to retry the delivery: it publishes an empty message to the reserved
exchange ``amq.retry`` naming the delivery (its channel and delivery tag), on a channel of the
same connection in confirm mode. The broker copies the message it holds into the queue's retry
queue with ``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``RETRY_TOPIC`` and ``RECONSUMETIMES``, or,
past the queue's ``<maxRedeliveries>``, into its dead-letter queue; the retry queue, its delay
levels, the limit and the dead-letter queue are the broker's configuration (``<deadLetter>``),
never the client's. Only when the broker has confirmed the copy does the helper ack the
original: a crash in between delivers the message twice rather than losing it. When the broker
refuses (the queue has no ``<retry>``, a level past the queue's last), the helper raises
:class:`RetryError` with the broker's reason and the message stays unacked.
"""

from __future__ import annotations

import weakref
from typing import Any

#: TDMQ's MESSAGE_DELAYLEVEL, in seconds: the default ``<retry><levels>`` of the broker too
#: (``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``). This module is the one home
#: of the retry contract's numbers; it imports nothing from the broker (py-amqp only when it
#: sends a request), so kombu consumers can use it on their own.
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
#: ``<maxRedeliveries>``'s default, the limit of reconsumes too
DEFAULT_MAX_RECONSUME = 16


class RetryError(ValueError):
    """The broker refused the retry (the reason is the message), or a delay or level out of
    range; the message was left unacked."""


#: the reserved exchange every virtual host has for retry requests
RETRY_EXCHANGE = "amq.retry"
#: headers of a retry request: the channel id and delivery tag of the delivery to retry
CHANNEL_HEADER = "x-reconsume-channel"
TAG_HEADER = "x-reconsume-tag"


def reconsume_later(
    message: Any, delay: float | None = None, level: int | None = None, *, timeout: float = 10.0
) -> None:
    """Consume ``message`` again later (or dead-letter it, when it has used up its retries).

    :param message: the kombu (py-amqp transport) or py-amqp message being handled, delivered
        with manual acks and not yet acked.
    :param delay: seconds, 1 to 864,000.
    :param level: a 1-based delay level of the queue's ``<retry><levels>``. With neither,
        the level after the message's ``RECONSUMETIMES`` (1 s, 5 s, 10 s, ... by default).
    :param timeout: seconds to wait for the broker's confirm.
    :raises RetryError: the broker refused (no retry configured for the queue, a level out
        of range, the delivery already settled), or a delay out of range; the message is left
        unacked.
    """
    if delay is not None and level is not None:
        raise RetryError("give delay or level, not both")
    if delay is not None and not (MIN_DELAY <= delay <= MAX_DELAY):
        raise RetryError(f"delay {delay!r} s is out of range: {MIN_DELAY:g} to {MAX_DELAY:g} s")
    if level is not None and (isinstance(level, bool) or not isinstance(level, int) or level < 1):
        raise RetryError(f"level {level!r} is out of range: levels start at 1")
    channel = getattr(message, "channel", None)
    tag = getattr(message, "delivery_tag", None)
    if channel is None or tag is None:
        raise RetryError("the message has no channel or delivery tag: was it delivered?")
    headers: dict[str, Any] = {CHANNEL_HEADER: channel.channel_id, TAG_HEADER: tag}
    if delay is not None:
        headers["x-delay"] = round(delay * 1000)
    elif level is not None:
        headers["x-retry-level"] = level
    _request(channel.connection, headers, timeout)
    _ack(message, channel, tag)


def _request(connection: Any, headers: dict[str, Any], timeout: float) -> None:
    """Publish a retry request on the connection's retry channel; wait for the confirm."""
    import amqp

    ch = _retry_channel(connection)
    returned: list[str] = ch.retry_refusals
    returned.clear()
    try:
        ch.basic_publish_confirm(
            amqp.Message(b"", application_headers=headers),
            exchange=RETRY_EXCHANGE,
            routing_key="",
            mandatory=True,
            confirm_timeout=timeout,
        )
    except amqp.exceptions.MessageNacked:
        raise RetryError(
            returned[0] if returned else "the broker refused the retry (see its log)"
        ) from None
    except amqp.exceptions.ChannelError as exc:  # e.g. 403: no write permission on amq.retry
        _CHANNELS.pop(connection, None)
        raise RetryError(f"the broker closed the retry channel: {exc}") from exc


def _retry_channel(connection: Any) -> Any:
    """One channel per connection for retry requests, in confirm mode (the consumer's own
    channel stays as it is)."""
    ch = _CHANNELS.get(connection)
    if ch is None or not ch.is_open:
        ch = connection.channel()  # basic_publish_confirm turns confirm mode on
        ch.retry_refusals = []

        def on_return(exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
            ch.retry_refusals.append(getattr(exc, "reply_text", None) or str(exc))

        ch.events["basic_return"].add(on_return)
        _CHANNELS[connection] = ch
    return ch


def _ack(message: Any, channel: Any, tag: int) -> None:
    ack = getattr(message, "ack", None)
    if callable(ack):  # kombu: its state says acked too
        ack()
    else:  # py-amqp
        channel.basic_ack(tag)


_CHANNELS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

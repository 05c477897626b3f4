"""``touch(message)``: tell the broker that a consumer still works on a delivery.

::

    from plugbroker.contrib.touch import ack_timeout, touch

    def handle(body, message):          # a kombu (or py-amqp) consumer callback
        for chunk in work(body):
            process(chunk)
            touch(message)              # "still on it": the ack clock restarts
        message.ack()

On a queue under ack-timeout isolation (``<isolation>``, docs/isolation.md) the broker isolates
a consumer that holds unacked messages for longer than ``ackTimeout`` without acking anything.
A touch is a sign of life: the broker restarts the consumer's ack clock as an ack would, without
settling the message. It is a plain AMQP 0-9-1 publish, on the channel the delivery came on, of
an empty message to the reserved exchange ``amq.touch`` with the delivery tag in the header
``x-touch-tag``: any client library can send it. A touch for a delivery that is already acked
(or was taken back by isolation) does nothing and closes nothing.

The broker puts ``x-ack-timeout`` (milliseconds) on every delivery from a queue under isolation;
:func:`ack_timeout` reads it, so a client can touch at a fraction of it.

The publish may come from another thread than the one that consumes (a worker thread touching
while the main thread waits for frames): :func:`touch` serialises the frames it writes with the
connection's other writes (py-amqp is not thread-safe otherwise). The channel must not be in
confirm mode (a consumer's channel usually is not): py-amqp would wait for the confirm there.
"""

from __future__ import annotations

import threading
from typing import Any

#: the reserved exchange every virtual host has for touches
TOUCH_EXCHANGE = "amq.touch"
#: the header naming the delivery tag (of the channel the touch is published on)
TOUCH_TAG_HEADER = "x-touch-tag"
#: the header on every delivery from a queue under isolation: its ``ackTimeout`` in ms
ACK_TIMEOUT_HEADER = "x-ack-timeout"

_LOCK_ATTR = "_plugbroker_touch_lock"
_wrap_lock = threading.Lock()


def _headers(message: Any) -> dict[str, Any]:
    """The application headers of a kombu or py-amqp message."""
    h = getattr(message, "headers", None)
    if h is None:
        props = getattr(message, "properties", None) or {}
        h = props.get("application_headers")
    return h if isinstance(h, dict) else {}


def ack_timeout(message: Any) -> float | None:
    """The ack timeout, in seconds, of the queue ``message`` came from (its ``x-ack-timeout``
    header), or ``None`` when the queue is not under isolation (or the broker is not
    plugbroker)."""
    value = _headers(message).get(ACK_TIMEOUT_HEADER)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return value / 1000.0
    return None


def _amqp_channel(message: Any) -> Any:
    """The py-amqp channel a kombu or py-amqp message came on."""
    return getattr(message, "channel", None)


def _delivery_tag(message: Any) -> int | None:
    tag = getattr(message, "delivery_tag", None)
    if tag is None:
        info = getattr(message, "delivery_info", None) or {}
        tag = info.get("delivery_tag")
    return tag if isinstance(tag, int) else None


def serialise_writes(connection: Any) -> None:
    """Make every frame py-amqp writes on ``connection`` go out under one lock, so that a touch
    from another thread never interleaves with the consuming thread's acks. Idempotent."""
    with _wrap_lock:
        current = connection.frame_writer
        if getattr(current, _LOCK_ATTR, None) is not None:
            return
        lock = threading.RLock()

        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return current(*args, **kwargs)

        setattr(locked, _LOCK_ATTR, lock)
        connection.frame_writer = locked


def touch(message: Any) -> bool:
    """Ask the broker to restart the ack clock for ``message`` (a kombu or py-amqp message).

    Returns ``False`` without sending anything for a message already acked, rejected or
    requeued (kombu's ``message.acknowledged``) or one delivered with no-ack, ``True`` once the
    touch is written. A broker that is not plugbroker has no ``amq.touch`` and closes the
    channel with 404: call it only for messages that carry ``x-ack-timeout``
    (:func:`ack_timeout`), as :mod:`plugbroker.contrib.celery` does.
    """
    if getattr(message, "acknowledged", False):
        return False
    channel = _amqp_channel(message)
    tag = _delivery_tag(message)
    if channel is None or tag is None:
        return False
    import amqp  # py-amqp: kombu's transport for amqp:// URLs

    connection = getattr(channel, "connection", None)
    if connection is not None:
        serialise_writes(connection)
    body = amqp.Message(b"", application_headers={TOUCH_TAG_HEADER: tag})
    # the frames of basic.publish, written directly: py-amqp's basic_publish first reads any
    # pending frames (to see a connection.blocked), which from another thread would steal the
    # consuming thread's deliveries
    channel.send_method(
        amqp.spec.Basic.Publish, "Bssbb", (0, TOUCH_EXCHANGE, "", False, False), body
    )
    return True


__all__ = [
    "ACK_TIMEOUT_HEADER",
    "TOUCH_EXCHANGE",
    "TOUCH_TAG_HEADER",
    "ack_timeout",
    "serialise_writes",
    "touch",
]

"""Sample 3: active retry with a negative acknowledgement and a redelivery delay (TDMQ's
negativeAcknowledge with negativeAckRedeliveryDelay); the queue is `thumbnails` (a fixed 200 ms
backoff) in broker.xml."""

from __future__ import annotations

import itertools
import time

import kombu


def run(url: str) -> list[float]:
    """A thumbnail that fails twice; returns the seconds between its deliveries."""
    times: list[float] = []

    def handle(body: dict, message: kombu.Message) -> None:
        times.append(time.monotonic())
        try:
            if len(times) < 3:
                raise OSError("the image store is unavailable")
            message.ack()
        except OSError:
            message.requeue()  # basic.reject(requeue=True): redelivered after the backoff

    with kombu.Connection(url) as conn:
        thumbnails = kombu.Queue("thumbnails", routing_key="thumbnails", durable=True)
        conn.Producer().publish(
            {"image": "cat.png"}, routing_key="thumbnails", declare=[thumbnails]
        )
        with conn.Consumer(thumbnails, callbacks=[handle]):
            for _ in range(30):
                if len(times) == 3:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
    return [b - a for a, b in itertools.pairwise(times)]

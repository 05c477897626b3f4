"""Sample 1: retry with reconsume_later (TDMQ's consumer.reconsumeLater), then read
RECONSUMETIMES; the queue is `orders` in broker.xml."""

from __future__ import annotations

import kombu

from plugbroker.retry import reconsume_later


def run(url: str, mode: str = "delay", seconds: float = 4.0) -> list[int]:
    """Publish one order whose first handling fails; return RECONSUMETIMES of each delivery."""
    seen: list[int] = []

    def handle(body: dict, message: kombu.Message) -> None:
        seen.append(int(message.headers.get("RECONSUMETIMES", 0)))  # how many retries so far
        try:
            if len(seen) == 1:
                raise RuntimeError("the database is down")  # do something with the message
            message.ack()
        except RuntimeError:
            if mode == "delay":
                reconsume_later(message, delay=1)  # any delay, 1 s .. 864,000 s
            elif mode == "level":
                reconsume_later(message, level=1)  # the first delay level: 1 s
            else:
                reconsume_later(message)  # the next level: 1 s, 5 s, 10 s, ...

    with kombu.Connection(url) as conn:
        orders = kombu.Queue("orders", routing_key="orders", durable=True)
        conn.Producer().publish({"order": 1}, routing_key="orders", declare=[orders])
        with conn.Consumer(orders, callbacks=[handle], prefetch_count=10):
            for _ in range(int(seconds / 0.1)):
                if len(seen) == 2:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
    return seen

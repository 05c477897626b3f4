"""Sample 2: your own retry and dead-letter queue names and limit (TDMQ's deadLetterPolicy with
maxRedeliverCount, retryLetterTopic, deadLetterTopic); the queue is `invoices` in broker.xml.
The names and the limit are the broker's configuration: the consumer passes none of them."""

from __future__ import annotations

import kombu

from plugbroker.retry import reconsume_later


def run(url: str) -> dict:
    """An invoice that always fails: retried through invoices-retry, then dead-lettered to
    invoices-dlq once its retries are used up. Returns what the dead-letter queue holds."""
    seen: list[int] = []

    def handle(body: dict, message: kombu.Message) -> None:
        seen.append(int(message.headers.get("RECONSUMETIMES", 0)))
        # always fails: the broker retries it 3 times (maxRedeliveries), then dead-letters it
        reconsume_later(message)

    with kombu.Connection(url) as conn:
        invoices = kombu.Queue("invoices", routing_key="invoices", durable=True)
        dlq = kombu.Queue("invoices-dlq", routing_key="invoices-dlq", durable=True)
        conn.Producer().publish({"invoice": 7}, routing_key="invoices", declare=[invoices, dlq])
        dead = None
        with conn.Consumer(invoices, callbacks=[handle]):
            for _ in range(120):  # 1 s + 2 s + 4 s of retries, bounded
                dead = dlq(conn.default_channel).get(no_ack=True)
                if dead is not None:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
        assert dead is not None
        return {"seen": seen, "body": dead.payload, "headers": dead.headers}

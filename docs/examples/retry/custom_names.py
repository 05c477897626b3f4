"""Sample 2: your own retry and dead-letter queue names and limit (TDMQ's deadLetterPolicy with
maxRedeliverCount, retryLetterTopic, deadLetterTopic); the queue is `invoices` in broker.xml."""

from __future__ import annotations

import kombu

from broker.retry import DEAD_LETTERED, reconsume_later


def run(url: str) -> dict:
    """An invoice that always fails: retried through invoices-retry, then dead-lettered to
    invoices-dlq once its retries are used up. Returns what the dead-letter queue holds."""
    outcomes: list[str] = []

    def handle(body: dict, message: kombu.Message) -> None:
        # always fails; retried 3 times (maxRedeliveries), then dead-lettered
        outcomes.append(
            reconsume_later(
                message,
                retry_queue="invoices-retry",
                dead_letter_queue="invoices-dlq",
                max_reconsume=3,
            )
        )

    with kombu.Connection(url) as conn:
        invoices = kombu.Queue("invoices", routing_key="invoices", durable=True)
        conn.Producer().publish({"invoice": 7}, routing_key="invoices", declare=[invoices])
        with conn.Consumer(invoices, callbacks=[handle]):
            for _ in range(120):  # 1 s + 2 s + 4 s of retries, bounded
                if outcomes[-1:] == [DEAD_LETTERED]:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
        dead = kombu.Queue("invoices-dlq", channel=conn.default_channel, no_declare=True).get(
            no_ack=True
        )
        return {"outcomes": outcomes, "body": dead.payload, "headers": dead.headers}

"""Sample 4: negative acknowledgements with a maximum number of redeliveries and a dead-letter
queue (TDMQ's negativeAcknowledge with deadLetterPolicy maxRedeliverCount 5); the queue is
`payments` in broker.xml."""

from __future__ import annotations

import time

import amqp
import kombu


def _exists(conn: kombu.Connection, queue: str) -> bool:
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except amqp.exceptions.NotFound:
        return False


def run(url: str) -> dict:
    """A payment that always fails: delivered 6 times (the first plus 5 redeliveries, each
    after an exponential backoff), then found in payments-dlq."""
    counts: list[int] = []

    def handle(body: dict, message: kombu.Message) -> None:
        counts.append(message.headers.get("x-delivery-count", 0))  # getRedeliveryCount()
        message.requeue()  # fails every time

    with kombu.Connection(url) as conn:
        payments = kombu.Queue("payments", routing_key="payments", durable=True)
        conn.Producer().publish({"payment": 99}, routing_key="payments", declare=[payments])
        with conn.Consumer(payments, callbacks=[handle]):
            for _ in range(40):  # 50+100+200+400+800 ms of backoff, bounded
                if len(counts) == 6:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
        # the dead-letter queue is created by its first dead letter
        dlq = kombu.Queue("payments-dlq", durable=True)
        dead = None
        for _ in range(20):
            dead = dlq(conn.channel()).get(no_ack=True) if _exists(conn, "payments-dlq") else None
            if dead is not None:
                break
            time.sleep(0.05)
        assert dead is not None
        return {
            "counts": counts,
            "reason": dead.headers["x-death"][0]["reason"],
            "headers": dead.headers,
        }

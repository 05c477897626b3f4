"""Every way a message enters or leaves a queue is in the journal (schema version 2).

One live broker with the journal on, driven by py-amqp (and the kombu-side retry helper), goes
through every fate path the core has: publish, delivery, ack, reject with and without requeue,
a retry copy held by the retry queue and sent back, a dead letter arriving on its dead-letter
queue, a redrive out of it, a delayed message released by an ``x-delayed-message`` exchange, a
TTL expiry with no dead-letter target (dropped), ``queue.purge`` and the deletion of a queue that
still held a message. The test checks each event, then rebuilds every queue's backlog from the
journal alone and compares it with the live broker's own count at the end of the run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import amqp
import pytest

from plugbroker.plugins.journal import SCHEMA_VERSION, read_journal
from plugbroker.retry import reconsume_later

pytestmark = pytest.mark.e2e

CONFIG = """
    <queue name="work">
      <deadLetter>
        <maxRedeliveries>3</maxRedeliveries>
        <retry><levels>1s</levels></retry>
      </deadLetter>
    </queue>
"""

#: the ``redelivered`` reasons of a copy that arrives from another queue (a new message id)
MOVED_IN = {"retry", "redrive"}
LEAVES = {"acked", "dead_lettered", "dropped", "expired", "removed"}


def backlog_from_journal(events: list[dict[str, Any]]) -> dict[str, set[int]]:
    """Per queue, the ids of the messages the journal says it still holds at the end."""
    held: dict[str, set[int]] = defaultdict(set)
    for e in events:
        q, ev, mid = e["queue"], e["event"], e["message_id"]
        if q is None or mid is None:
            if ev == "queue_deleted":
                held.pop(q, None)
            continue
        if ev in ("published", "enqueued"):
            held[q].add(mid)
        elif ev == "redelivered" and e["reason"] in MOVED_IN:
            held[q].add(mid)
        elif ev in LEAVES or (ev == "rejected" and not e["requeue"]):
            held[q].discard(mid)
        elif ev == "delivered" and e["no_ack"]:
            held[q].discard(mid)
    return held


def wait_for(b: Any, pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not b.call(pred):
        assert time.monotonic() < deadline, "the broker did not reach the expected state"
        time.sleep(0.02)


def test_every_fate_path_has_its_journal_event(broker_factory, tmp_path):
    b = broker_factory(CONFIG, journal=True)
    api = b.broker.api

    def depth(name: str) -> int:
        info = api.queue("/", name)
        return -1 if info is None else info.messages

    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5
    )
    conn.connect()
    try:
        ch = conn.channel()
        ch.confirm_select()
        ch.queue_declare("work", durable=True, auto_delete=False)
        ch.queue_declare("keep", durable=False, auto_delete=False)
        ch.queue_declare("ttl", durable=False, auto_delete=False, arguments={"x-message-ttl": 50})
        ch.queue_declare("late", durable=False, auto_delete=False)
        ch.exchange_declare(
            "later", "x-delayed-message", durable=False, arguments={"x-delayed-type": "direct"}
        )
        ch.queue_bind("late", "later", "late")
        for body in (b"retry-me", b"dead", b"stay-1", b"stay-2"):
            ch.basic_publish(amqp.Message(body), "", "work")
        for body in (b"keep-1", b"keep-2", b"requeue-me"):
            ch.basic_publish(amqp.Message(body), "", "keep")

        # a retry: the copy goes to work-RETRY, comes back to work after 1 s
        m = ch.basic_get("work")
        assert m is not None and m.body == b"retry-me"
        reconsume_later(m, delay=1)
        # a dead letter: rejected without requeue, it lands on work-DLQ
        m = ch.basic_get("work")
        assert m is not None and m.body == b"dead"
        ch.basic_reject(m.delivery_tag, requeue=False)
        wait_for(b, lambda: depth("work-DLQ") == 1)
        # a delayed message, released into "late" after 100 ms
        ch.basic_publish(
            amqp.Message(b"later", application_headers={"x-delay": 100}), "later", "late"
        )
        # a message that expires with no dead-letter target: dropped
        ch.basic_publish(amqp.Message(b"short-lived"), "", "ttl")
        # keep: one acked, one requeued by a reject and then acked, one left
        k = ch.basic_get("keep")
        assert k is not None and k.body == b"keep-1"
        ch.basic_ack(k.delivery_tag)
        k = ch.basic_get("keep")
        assert k is not None
        ch.basic_reject(k.delivery_tag, requeue=True)
        k = ch.basic_get("keep")
        assert k is not None and k.body == b"keep-2"
        ch.basic_ack(k.delivery_tag)

        wait_for(b, lambda: depth("late") == 1 and depth("ttl") == 0)
        wait_for(b, lambda: depth("work-RETRY") == 0 and depth("work") == 3, timeout=5.0)
        moved = b.call(lambda: api.redrive("/", "work-DLQ"))
        assert moved.moved == {"work": 1}
        assert ch.queue_purge("work") == 4  # stay-1, stay-2, the retry copy, the redriven one
        assert ch.queue_delete("late") == 1
        live = {
            name: b.call(lambda n=name: depth(n))
            for name in ("work", "work-RETRY", "work-DLQ", "keep", "ttl")
        }
    finally:
        conn.close()
    b.stop()

    events = read_journal(tmp_path / "journal").to_pylist()
    assert {e["schema_version"] for e in events} == {SCHEMA_VERSION} == {3}

    def one(event: str, queue: str, reason: str | None = None, **cols: Any) -> dict[str, Any]:
        got = [
            e
            for e in events
            if e["event"] == event
            and e["queue"] == queue
            and (reason is None or e["reason"] == reason)
            and all(e[k] == v for k, v in cols.items())
        ]
        assert got, f"no {event} event on {queue} ({reason})"
        return got[0]

    # the retry copy: published into work-RETRY, removed from it, back on work as a new message
    held = one("published", "work-RETRY")
    one("removed", "work-RETRY", "retry", message_id=held["message_id"])
    back = one("redelivered", "work", "retry")
    assert back["message_id"] != held["message_id"]
    # the dead letter: leaves work, arrives on work-DLQ, redriven out of it
    one("dead_lettered", "work", "rejected")
    dl = one("enqueued", "work-DLQ", "dead-letter")
    assert dl["exchange"] == "" and dl["routing_key"] == "work-DLQ"
    one("removed", "work-DLQ", "redrive", message_id=dl["message_id"])
    one("redelivered", "work", "redrive")
    # the delayed message appears on its queue when released, with its exchange and key
    late = one("enqueued", "late", "delayed", exchange="later", routing_key="late")
    assert late["body_size"] == len(b"later")
    # expiry with no dead-letter target
    exp = one("expired", "ttl")
    one("dropped", "ttl", "expired", message_id=exp["message_id"])
    # requeue by a reject
    one("rejected", "keep", requeue=True)
    one("redelivered", "keep", "rejected")
    # purge: one event per message
    purged = [e for e in events if e["event"] == "removed" and e["reason"] == "purged"]
    assert len(purged) == 4 and {e["queue"] for e in purged} == {"work"}
    # the deletion of a queue that still held a message says how many
    assert one("queue_deleted", "late", "client")["count"] == 1

    # the journal alone gives every queue's backlog as the live broker counted it
    rebuilt = backlog_from_journal(events)
    assert {q: len(rebuilt.get(q, ())) for q in live} == live
    assert live == {"work": 0, "work-RETRY": 0, "work-DLQ": 0, "keep": 1, "ttl": 0}

"""The first thing a user does: publish and consume with kombu."""

from __future__ import annotations

import kombu
import pytest

pytestmark = pytest.mark.e2e


def test_kombu_publish_consume_ack(broker):
    got = []
    with kombu.Connection(broker.url()) as conn:
        q = kombu.Queue("smoke", kombu.Exchange("smoke-ex", "direct"), routing_key="k")
        conn.Producer().publish({"n": 1}, exchange=q.exchange, routing_key="k", declare=[q])
        with conn.Consumer(q, callbacks=[lambda body, m: (got.append(body), m.ack())]):
            conn.drain_events(timeout=5)
    assert got == [{"n": 1}]
    assert broker.call(lambda: broker.broker.vhosts["/"].queues["smoke"].message_count) == 0

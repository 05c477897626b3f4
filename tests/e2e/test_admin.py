"""The admin interface: JSON API, metrics, reload, blocklist and dead-letter redrive."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import kombu
import pytest
from brokerutil import ADMIN_GUEST

from broker.cli import main as cli

pytestmark = pytest.mark.e2e


def call(b, path: str, method: str = "GET", auth: tuple[str, str] = ("guest", "guest")):
    port = b.running.admin.port
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "POST" else None
    )
    req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read().decode()
        return (
            json.loads(body)
            if resp.headers["Content-Type"].startswith("application/json")
            else body
        )


def test_requests_need_a_broker_user(broker_factory):
    b = broker_factory(admin=True, users=ADMIN_GUEST)
    with pytest.raises(urllib.error.HTTPError) as err:
        call(b, "/api/overview", auth=("guest", "wrong"))
    assert err.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as err:
        call(b, "/api/nothing-here")
    assert err.value.code == 404


def test_overview_queues_consumers_connections_and_metrics(broker_factory):
    b = broker_factory(admin=True, users=ADMIN_GUEST)
    with kombu.Connection(b.url()) as conn:
        q = kombu.Queue("jobs", routing_key="jobs", durable=False)
        conn.Producer().publish({"n": 1}, routing_key="jobs", declare=[q])
        conn.Producer().publish({"n": 2}, routing_key="jobs")
        with conn.Consumer(q, callbacks=[lambda body, m: None], prefetch_count=1):
            conn.drain_events(timeout=2)
            ov = call(b, "/api/overview")
            assert ov["product"] == "plugbroker" and ov["connections"] >= 1
            assert "plugins.slow_consumer" in ov["plugins"]
            [jobs] = [x for x in call(b, "/api/queues") if x["name"] == "jobs"]
            assert (jobs["messages"], jobs["ready"], jobs["unacked"], jobs["consumers"]) == (
                2,
                1,
                1,
                1,
            )
            [c] = [x for x in call(b, "/api/consumers") if x["queue"] == "jobs"]
            assert c["unacked"] == 1 and c["prefetch"] == 1 and not c["isolated"]
            assert call(b, "/api/connections")[0]["user"] == "guest"
            peek = call(b, "/api/queues/%2F/jobs/messages?limit=5")
            assert len(peek) == 1 and peek[0]["routing_key"] == "jobs"
            metrics = call(b, "/metrics")
            assert 'plugbroker_queue_messages{vhost="/",queue="jobs"} 2' in metrics
            assert 'plugbroker_queue_messages_unacked{vhost="/",queue="jobs"} 1' in metrics
            assert "# TYPE plugbroker_queue_acks_total counter" in metrics


def test_blocklist_lists_isolated_consumers(broker_factory):
    b = broker_factory(
        '<queue name="work"><isolation><ackTimeout>200ms</ackTimeout>'
        "<checkPeriod>100ms</checkPeriod></isolation></queue>",
        admin=True,
        users=ADMIN_GUEST,
    )
    conns = [kombu.Connection(b.url()) for _ in range(2)]
    try:
        q = kombu.Queue("work", routing_key="work", durable=False)
        consumers = []
        for i, conn in enumerate(conns):
            cb = (lambda body, m: None) if i == 0 else (lambda body, m: m.ack())
            c = conn.Consumer(q, callbacks=[cb], prefetch_count=2)
            c.consume()
            consumers.append(c)
        with kombu.Connection(b.url()) as p:
            for i in range(6):
                p.Producer().publish(i, routing_key="work")
        deadline = time.monotonic() + 3
        blocked: list = []
        while not blocked and time.monotonic() < deadline:
            for conn in conns:
                try:
                    conn.drain_events(timeout=0.05)
                except TimeoutError:
                    pass
            blocked = call(b, "/api/blocklist")
        assert len(blocked) == 1 and blocked[0]["queue"] == "work" and blocked[0]["isolated"]
        metrics = call(b, "/metrics")
        assert "plugbroker_consumer_isolated{" in metrics and "} 1" in metrics
        assert 'plugbroker_policy_actions_total{policy="Isolation",outcome="applied"} 1' in metrics
    finally:
        for conn in conns:
            conn.release()


def test_dead_letters_listed_and_redriven_to_their_queue(broker_factory, capsys):
    b = broker_factory(
        '<queue name="orders"><deadLetter><maxRedeliveries>0</maxRedeliveries>'
        "</deadLetter></queue>",
        admin=True,
        users=ADMIN_GUEST,
    )
    with kombu.Connection(b.url()) as conn:
        q = kombu.Queue("orders", routing_key="orders", durable=True)
        for i in range(3):
            conn.Producer().publish(i, routing_key="orders", declare=[q])
        for _ in range(3):
            m = q(conn.default_channel).get(no_ack=False)
            m.requeue()  # maxRedeliveries 0: straight to the DLQ
        time.sleep(0.1)
        [dl] = call(b, "/api/dead-letters")
        assert dl == {
            "vhost": "/",
            "queue": "orders-DLQ",
            "messages": 3,
            "received_by_reason": {"delivery_limit": 3},
        }
        port = b.running.admin.port
        assert cli(["admin", "redrive", "orders-DLQ", "--url", f"http://127.0.0.1:{port}"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out == {"moved": {"orders": 3}, "kept": 0}
        got = sorted(q(conn.default_channel).get(no_ack=True).payload for _ in range(3))
        assert got == [0, 1, 2]


def test_reload_by_admin_call(broker_factory, tmp_path):
    b = broker_factory(
        '<queue name="q"><consumer><messageCount>5</messageCount>'
        '<policy name="Log"/></consumer></queue>',
        admin=True,
        users=ADMIN_GUEST,
    )
    path = b.running.config.source
    b.call(lambda: b.broker.vhosts["/"].declare_queue("q"))

    def limit():
        return b.call(lambda: b.broker.vhosts["/"].queues["q"].policy["consumer"].message_count)

    path.write_text(path.read_text().replace("<messageCount>5<", "<messageCount>8<"))
    assert call(b, "/api/reload", "POST") == {"reloaded": True}
    assert limit() == 8
    path.write_text(path.read_text().replace("<messageCount>8<", "<messageCount>eight<"))
    with pytest.raises(urllib.error.HTTPError) as err:
        call(b, "/api/reload", "POST")
    assert err.value.code == 400
    assert limit() == 8

"""The admin interface: JSON API, metrics, reload, blocklist and dead-letter redrive."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import amqp
import kombu
import pytest
from brokerutil import ADMIN_GUEST

from plugbroker.cli import main as cli

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
            assert "plugbroker.plugins.slow_consumer" in ov["plugins"]
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
            metrics = call(b, "/metrics/per-object")
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
        metrics = call(b, "/metrics/per-object")
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
            "by_reason": {"delivery_limit": 3},
            "sources": {"orders": 3},
        }
        port = b.running.admin.port
        assert (
            cli(["admin", "redrive", "orders-DLQ", "--json", "--url", f"http://127.0.0.1:{port}"])
            == 0
        )
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


RETRYING = (
    '<queue name="orders" durable="true"><deadLetter><maxRedeliveries>1</maxRedeliveries>'
    "<retry><levels>1s</levels></retry></deadLetter></queue>"
)


def _dead_letter_some(url: str) -> None:
    """Into orders-DLQ: one rejected, one past the nack limit, one past the retry limit (by
    reconsume_later); all persistent."""
    from plugbroker.retry import reconsume_later

    with kombu.Connection(url) as conn:
        q = kombu.Queue("orders", routing_key="orders", durable=True)
        prod = conn.Producer()
        for body in ("rejected", "nacked", "retried"):
            prod.publish(body, routing_key="orders", declare=[q], delivery_mode=2)
        q = q(conn.default_channel)
        m = q.get(no_ack=False)
        m.reject(requeue=False)
        for _ in range(2):  # maxRedeliveries 1: the second requeue dead-letters it
            m = q.get(no_ack=False)
            m.requeue()
        m = q.get(no_ack=False)
        assert m.payload == "retried"
        reconsume_later(m, delay=1)  # RECONSUMETIMES 1: retried
        deadline = time.monotonic() + 5
        while (m := q.get(no_ack=False)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m is not None and m.headers["RECONSUMETIMES"] == 1
        reconsume_later(m)  # RECONSUMETIMES 2 > maxRedeliveries 1: dead-lettered


def test_the_dead_letter_view_reads_the_queues_and_survives_a_restart(broker_factory):
    kw = {"store": True, "admin": True, "users": ADMIN_GUEST}
    b = broker_factory(RETRYING, **kw)
    _dead_letter_some(b.url())
    [before] = call(b, "/api/dead-letters")
    assert before["by_reason"] == {"rejected": 1, "delivery_limit": 2}
    assert before["received_by_reason"] == {"rejected": 1, "delivery_limit": 2}
    b.stop()
    b = broker_factory(RETRYING, **kw)
    [after] = call(b, "/api/dead-letters")
    assert after == {
        "vhost": "/",
        "queue": "orders-DLQ",
        "messages": 3,
        "received_by_reason": {},  # since this start
        "by_reason": {"rejected": 1, "delivery_limit": 2},
        "sources": {"orders": 3},
    }


def test_redrive_options_dry_run_reason_rate_and_reset(broker_factory, capsys):
    from plugbroker.retry import reconsume_later

    b = broker_factory(RETRYING, admin=True, users=ADMIN_GUEST)
    _dead_letter_some(b.url())
    common = ["--url", f"http://127.0.0.1:{b.running.admin.port}"]

    def admin(*args: str) -> dict:
        assert cli(["admin", "redrive", "orders-DLQ", "--json", *args, *common]) == 0
        return json.loads(capsys.readouterr().out)

    dry = admin("--dry-run")
    assert dry["planned"] == {"orders": 3} and dry["moved"] == {} and dry["dry_run"]
    assert call(b, "/api/dead-letters")[0]["messages"] == 3
    only = admin("--reason", "rejected")
    assert only["moved"] == {"orders": 1} and only["kept"] == 2
    with kombu.Connection(b.url()) as conn:
        q = kombu.Queue("orders", channel=conn.default_channel, no_declare=True)
        m = q.get(no_ack=False)
        assert m.payload == "rejected" and "x-delivery-count" not in m.headers
        m.ack()
        # the one that used up its retries: redriven with its counts kept it dies again at once
        kept = admin("--reason", "delivery_limit", "--limit", "1", "--keep-counts")
        assert kept["moved"] == {"orders": 1} and kept["reset"] is False
        m = q.get(no_ack=False)
        assert m.payload == "nacked" and m.headers["x-delivery-count"] >= 1
        m.requeue()  # past maxRedeliveries again: straight back to the DLQ
        time.sleep(0.1)
        assert call(b, "/api/dead-letters")[0]["messages"] == 2
        # reset (the default): RECONSUMETIMES and the count start again, retries work again
        paced = admin("--reason", "delivery_limit", "--rate", "5")
        assert paced["planned"] == {"orders": 2}
        assert paced["moved"] == {"orders": 1} and paced["pending"] == 1
        t0 = time.monotonic()
        while call(b, "/api/dead-letters")[0]["messages"] and time.monotonic() - t0 < 3:
            time.sleep(0.02)
        assert 0.15 <= time.monotonic() - t0 < 1.0  # the second one 200 ms later, not at once
        got = {}
        while len(got) < 2:
            m = q.get(no_ack=False)
            if m is not None:
                got[m.payload] = m
        assert "RECONSUMETIMES" not in got["retried"].headers
        assert "x-delivery-count" not in got["nacked"].headers
        reconsume_later(got["retried"], delay=1)  # a retry again, not a dead letter
        got["nacked"].ack()
        assert call(b, "/api/dead-letters")[0]["messages"] == 0
        assert b.call(lambda: b.broker.vhosts["/"].queues["orders-RETRY"].message_count) == 1


def test_redrive_parameters_are_checked(broker_factory):
    b = broker_factory(RETRYING, admin=True, users=ADMIN_GUEST)
    with kombu.Connection(b.url()) as conn:
        kombu.Queue("orders", routing_key="orders", durable=True)(conn.default_channel).declare()
    for query in ("rate=0", "rate=abc", "dry_run=maybe", "reset=2"):
        with pytest.raises(urllib.error.HTTPError) as err:
            call(b, f"/api/queues/%2F/orders/redrive?{query}", "POST")
        assert err.value.code == 400, query


def _metric(text: str, name: str, labels: str) -> float:
    prefix = f"{name}{{{labels}}} "
    [line] = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return float(line[len(prefix) :])


def test_metrics_count_published_delivered_acked_redelivered_dead_lettered(broker_factory):
    b = broker_factory(admin=True, users=ADMIN_GUEST)
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare("counted-dlq")
        ch.queue_declare(
            "counted",
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "counted-dlq"},
        )
        for body in ("a", "b", "c"):
            ch.basic_publish(amqp.Message(body), routing_key="counted")
        a = ch.basic_get("counted")
        ch.basic_ack(a.delivery_tag)
        first_b = ch.basic_get("counted")
        ch.basic_reject(first_b.delivery_tag, requeue=True)
        again = ch.basic_get("counted")
        assert again.body == "b" and again.delivery_info["redelivered"]
        ch.basic_reject(again.delivery_tag, requeue=False)
        c = ch.basic_get("counted")
        ch.basic_ack(c.delivery_tag)
        assert ch.basic_get("counted") is None
        assert ch.queue_declare("counted-dlq", passive=True).message_count == 1
    finally:
        conn.close()
    b.call(lambda: b.broker.raise_alarm("disk", "test"))
    metrics = call(b, "/metrics/per-object")
    q = 'vhost="/",queue="counted"'
    got = {
        k: _metric(metrics, f"plugbroker_queue_{k}_total", q)
        for k in ("published", "delivered", "acked", "redelivered", "dead_lettered")
    }
    assert got == {
        "published": 3,
        "delivered": 4,
        "acked": 2,
        "redelivered": 1,
        "dead_lettered": 1,
    }
    assert (
        _metric(metrics, "plugbroker_queue_published_total", 'vhost="/",queue="counted-dlq"') == 1
    )
    assert "# TYPE plugbroker_queue_dead_lettered_total counter" in metrics
    assert _metric(metrics, "plugbroker_alarm", 'alarm="disk"') == 1
    assert "plugbroker_resource_alarm 1" in metrics.splitlines()
    b.call(lambda: b.broker.clear_alarm("disk"))
    assert "plugbroker_resource_alarm 0" in call(b, "/metrics").splitlines()

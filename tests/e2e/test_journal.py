"""The event journal on a live broker, driven by kombu and py-amqp clients."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import amqp
import kombu
import pytest

from plugbroker.plugins.journal import journal_of, read_journal

pytestmark = pytest.mark.e2e


def rows(path: Path) -> list[dict[str, Any]]:
    return J_rows(read_journal(path))


def J_rows(table: Any) -> list[dict[str, Any]]:
    return table.to_pylist()


def files(path: Path) -> tuple[list[Path], list[Path]]:
    all_ = list(path.rglob("*.parquet"))
    return (
        [p for p in all_ if not p.name.startswith(".")],
        [p for p in all_ if p.name.startswith(".")],
    )


def connect(b: Any) -> amqp.Connection:
    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5
    )
    conn.connect()
    return conn


def test_a_kombu_session_is_recorded_event_by_event(broker_factory, tmp_path):
    b = broker_factory(journal=True)
    journal = tmp_path / "journal"
    with kombu.Connection(b.url()) as conn:
        ex = kombu.Exchange("orders", "direct", durable=False)
        q = kombu.Queue(
            "orders-q",
            ex,
            routing_key="new",
            durable=False,
            queue_arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "orders-dlq",
            },
        )
        dlq = kombu.Queue("orders-dlq", durable=False)
        producer = conn.Producer()
        producer.publish({"n": 0}, exchange=ex, routing_key="new", declare=[q, dlq])
        for i in range(1, 5):
            producer.publish({"n": i}, exchange=ex, routing_key="new")
        got: list[Any] = []

        def handle(body: Any, message: Any) -> None:
            got.append(body["n"])
            if body["n"] == 3:
                message.reject(requeue=False)
            else:
                message.ack()

        with conn.Consumer(q, callbacks=[handle], prefetch_count=10):
            deadline = time.monotonic() + 5
            while len(got) < 5 and time.monotonic() < deadline:
                conn.drain_events(timeout=1)
        q(conn.default_channel).delete()
    b.stop()

    visible, hidden = files(journal)
    assert visible and not hidden
    evs = rows(journal)
    kinds = [e["event"] for e in evs]
    assert kinds[0] == "journal_started" and kinds[-1] == "journal_stopped"
    for k in (
        "connection_opened",
        "queue_declared",
        "queue_bound",
        "consumer_added",
        "published",
        "delivered",
        "acked",
        "rejected",
        "dead_lettered",
        "consumer_removed",
        "queue_deleted",
        "connection_closed",
    ):
        assert k in kinds, k
    mine = [e for e in evs if e["queue"] == "orders-q"]
    published = [e for e in mine if e["event"] == "published"]
    assert len(published) == 5 and all(e["exchange"] == "orders" for e in published)
    delivered = {e["message_id"]: e for e in mine if e["event"] == "delivered"}
    acked = [e for e in mine if e["event"] == "acked"]
    assert len(acked) == 4 and all(e["message_id"] in delivered for e in acked)
    for e in acked:
        d = delivered[e["message_id"]]
        assert (e["consumer_tag"], e["connection_id"]) == (d["consumer_tag"], d["connection_id"])
        assert e["ts_us"] >= d["ts_us"] and e["seq"] > d["seq"]
    [rej] = [e for e in mine if e["event"] == "rejected"]
    assert rej["requeue"] is False
    [dead] = [e for e in mine if e["event"] == "dead_lettered"]
    assert (dead["message_id"], dead["reason"], dead["routing_key"]) == (
        rej["message_id"],
        "rejected",
        "orders-dlq",
    )
    [removed] = [e for e in mine if e["event"] == "consumer_removed"]
    assert removed["reason"] in ("cancel", "channel-closed", "connection-closed")
    [deleted] = [e for e in mine if e["event"] == "queue_deleted"]
    assert deleted["reason"] == "client"
    [declared] = [e for e in mine if e["event"] == "queue_declared"]
    assert declared["detail"] == "shared" and declared["durable"] is False
    [bound] = [e for e in mine if e["event"] == "queue_bound" and e["exchange"] == "orders"]
    assert (bound["routing_key"], bound["detail"]) == ("new", "direct")
    # time is wall-clock microseconds
    assert abs(evs[0]["ts_us"] / 1e6 - time.time()) < 120


def test_slow_consumer_action_is_recorded_with_threshold_and_values(broker_factory, tmp_path):
    b = broker_factory(
        '<topic key="stocks.#"><consumer><messageCount>5</messageCount>'
        '<policy name="Delete"/></consumer></topic>',
        journal=True,
        period="600000",
    )
    with connect(b) as conn:
        ch = conn.channel()
        qname = ch.queue_declare("", exclusive=True)[0]
        ch.queue_bind(qname, "amq.topic", "stocks.ibm")
        ch.basic_qos(0, 1, False)
        held: list[Any] = []
        ch.basic_consume(qname, callback=held.append)
        pub = conn.channel()
        pub.tx_select()
        for _ in range(20):
            pub.basic_publish(amqp.Message(b"tick"), "amq.topic", "stocks.ibm")
        pub.tx_commit()
        deadline = time.monotonic() + 3
        while not held and time.monotonic() < deadline:
            conn.drain_events(timeout=0.2)
        assert b.running.housekeeping.run_job("slow-consumer")
        with pytest.raises(amqp.exceptions.ResourceError):
            while time.monotonic() < deadline + 3:
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
    b.stop()
    evs = rows(tmp_path / "journal")
    actions = [e for e in evs if e["event"] == "policy_action"]
    close = next(e for e in actions if e["action"] == "CloseConsumerChannels")
    assert (
        close["queue"],
        close["policy"],
        close["threshold"],
        close["configured"],
        close["measured"],
        close["outcome"],
        close["code"],
    ) == (qname, "Delete", "messageCount", 5.0, 20.0, "applied", 506)
    assert "messageCount 20 (limit 5)" in close["reason"]
    assert any(e["action"] == "DeleteQueue" for e in actions)


def test_without_a_journal_no_recorder_is_on_the_hot_path(broker_factory):
    b = broker_factory()
    host = b.running.plugins
    assert "plugbroker.plugins.journal" in host.names()
    assert not any(n.startswith("journal-recorder") for n in host.names())
    assert "plugbroker.plugins.journal" not in host.implementers("broker_message_published")
    assert journal_of(b.broker.api) is None


def test_a_reload_turns_the_journal_on_and_off(broker_factory, tmp_path):
    from brokerutil import write_config

    path = write_config(tmp_path, name="reload.xml")
    b = broker_factory(config_path=path)
    assert journal_of(b.broker.api) is None
    write_config(tmp_path, journal=True, name="reload.xml")
    assert b.call(lambda: b.running.reload(path)) is True
    assert journal_of(b.broker.api) is not None
    with kombu.Connection(b.url()) as conn:
        conn.SimpleQueue("after-reload").put({"x": 1})
    write_config(tmp_path, name="reload.xml")
    assert b.call(lambda: b.running.reload(path)) is True
    assert journal_of(b.broker.api) is None
    visible, hidden = files(tmp_path / "journal")
    assert visible and not hidden
    evs = rows(tmp_path / "journal")
    assert any(e["event"] == "published" and e["queue"] == "after-reload" for e in evs)
    # the journal opened with an inventory of what already existed
    assert any(e["event"] == "queue_declared" and e["reason"] == "existing" for e in evs) or any(
        e["event"] == "queue_declared" and e["queue"] == "after-reload" for e in evs
    )

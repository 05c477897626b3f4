"""The Graduated policy and the blast-radius budget with real clients.

A slow topic subscriber under Graduated is told, one check at a time: a log line, its prefetch
lowered, a basic.cancel (it re-consumes, as kombu and Celery do), then 506. A bystander on the
same broker publishes with confirms all the while and never notices. Checks run on demand
(``run_job``), so no test waits for a period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import amqp
import kombu
import pytest
from kombu.mixins import ConsumerMixin

from plugbroker.plugins.journal import read_journal

pytestmark = pytest.mark.e2e

KEY = "stocks.us.ibm"
TEXT = "Consuming too slow."


def graduated(blast: str = "", options: str = "") -> str:
    return (
        f"{blast}"
        '<topic key="stocks.us.*"><consumer><messageCount>5</messageCount>'
        f'<policy name="Graduated">{options}</policy></consumer></topic>'
    )


def connect(b) -> amqp.Connection:
    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5
    )
    conn.connect()
    return conn


def check(b) -> None:
    assert b.running.housekeeping.run_job("slow-consumer") is True


def publish(b, n: int) -> None:
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_select()
        for _ in range(n):
            ch.basic_publish(amqp.Message(b"x" * 10), "amq.topic", KEY)


def drain(conn: amqp.Connection, until: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.1)
        except TimeoutError:
            pass
    assert until(), "not within the time limit"


class Bystander:
    """Publishes with confirms to its own queue on a direct exchange until stopped."""

    def __init__(self, b) -> None:
        self.b = b
        self.confirmed = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            with connect(self.b) as conn:
                ch = conn.channel()
                ch.queue_declare("bystander", auto_delete=False)
                ch.confirm_select()
                while not self.stop.is_set():
                    ch.basic_publish(amqp.Message(b"b"), "", "bystander")
                    self.confirmed += 1
                    time.sleep(0.005)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Bystander:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def still_confirming(self) -> None:
        before = self.confirmed
        deadline = time.monotonic() + 3
        while self.confirmed <= before + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.error is None, self.error
        assert self.confirmed > before + 5


def consumer_prefetch(b, qname: str) -> list[int]:
    return b.call(lambda: [c.prefetch for c in b.broker.vhosts["/"].queues[qname].consumers])


def test_a_slow_subscriber_is_slowed_then_cancelled_then_closed(broker_factory, caplog):
    b = broker_factory(graduated(), period="600000")
    with Bystander(b) as bystander, connect(b) as conn:
        ch = conn.channel()
        # a named, non-durable subscription that outlives its consumer (auto-delete would go
        # with the cancel)
        qname = ch.queue_declare("ibm-watch", auto_delete=False)[0]
        ch.queue_bind(qname, "amq.topic", KEY)
        ch.basic_qos(0, 8, False)
        held: list[amqp.Message] = []
        cancelled: list[str] = []
        tag = ch.basic_consume(qname, callback=held.append, on_cancel=cancelled.append)
        publish(b, 12)
        drain(conn, lambda: len(held) == 8)

        with caplog.at_level(logging.INFO, logger="plugbroker.policy"):
            check(b)  # step 1: a log line only
        assert any("Graduated step 1 (log)" in r.getMessage() for r in caplog.records)
        assert consumer_prefetch(b, qname) == [8]
        bystander.still_confirming()

        check(b)  # step 2: the prefetch window halved
        assert consumer_prefetch(b, qname) == [4]
        bystander.still_confirming()

        check(b)  # step 3: basic.cancel; the channel stays open and the client re-consumes
        drain(conn, lambda: cancelled == [tag])
        assert ch.is_open
        ch.basic_consume(qname, callback=held.append)
        bystander.still_confirming()

        check(b)  # step 4: every channel consuming from it closed with 506
        with pytest.raises(amqp.exceptions.ResourceError) as err:
            drain(conn, lambda: False)
        assert err.value.reply_text == TEXT
        # the connection stays usable
        assert conn.channel().queue_declare(qname, passive=True)[0] == qname
        bystander.still_confirming()

        check(b)  # step 5: still over (nobody consumes): the subscription is deleted
        assert not b.call(lambda: qname in b.broker.vhosts["/"].queues)
        bystander.still_confirming()
    assert bystander.error is None and bystander.confirmed > 0


def test_the_budget_defers_the_third_action_and_reports_it(broker_factory, caplog, tmp_path):
    b = broker_factory(
        graduated('<blastRadius maxActionsPerMinute="2"/>'), period="600000", journal=True
    )
    with Bystander(b) as bystander, connect(b) as conn:
        ch = conn.channel()
        # a named, non-durable subscription that outlives its consumer (auto-delete would go
        # with the cancel)
        qname = ch.queue_declare("ibm-watch", auto_delete=False)[0]
        ch.queue_bind(qname, "amq.topic", KEY)
        ch.basic_qos(0, 8, False)
        held: list[amqp.Message] = []
        cancelled: list[str] = []
        ch.basic_consume(qname, callback=held.append, on_cancel=cancelled.append)
        publish(b, 12)
        drain(conn, lambda: len(held) == 8)
        check(b)  # log: does not count
        check(b)  # prefetch: 1st action
        assert consumer_prefetch(b, qname) == [4]
        check(b)  # cancel: 2nd action
        drain(conn, lambda: len(cancelled) == 1)
        ch.basic_consume(qname, callback=held.append)
        with caplog.at_level(logging.INFO, logger="plugbroker.policy"):
            check(b)  # 506: the 3rd action in the minute, deferred
            check(b)  # asked for again (not passed over to delete), deferred again
        reported = [
            r.getMessage() for r in caplog.records if "blast-radius budget" in r.getMessage()
        ]
        # the same decision at the next check is a repeat: logged (and journaled) once
        assert len(reported) == 1
        assert "CloseConsumerChannels deferred" in reported[0]
        assert "maxActionsPerMinute 2" in reported[0]
        # nothing happened to the subscriber: its channel is open and still consuming
        try:
            conn.drain_events(timeout=0.3)
        except TimeoutError:
            pass
        assert ch.is_open and len(b.call(lambda: b.broker.vhosts["/"].queues[qname].consumers)) == 1
        counts = b.call(lambda: b.broker.api.policy_action_counts())
        assert counts[("Graduated", "deferred")] == 2
        assert counts[("Graduated", "applied")] == 2
        bystander.still_confirming()
    b.stop()
    journal = read_journal(tmp_path / "journal").to_pylist()
    recorded = [(e["action"], e["outcome"]) for e in journal if e["event"] == "policy_action"]
    assert recorded == [
        ("LogOnly", "logged"),
        ("SetPrefetch", "applied"),
        ("CancelConsumer", "applied"),
        ("CloseConsumerChannels", "deferred"),
    ]


def test_kombu_consumes_again_after_the_cancel_step(broker_factory):
    """kombu raises ConsumerCancelled (a recoverable connection error) on the broker's
    basic.cancel; a ConsumerMixin (what Celery's consumer does too) reconnects and consumes
    again, and is then on its own: the queue stays at the step it reached."""
    b = broker_factory(graduated(), period="600000")
    exchange = kombu.Exchange("amq.topic", type="topic", passive=True)
    queue = kombu.Queue("kombu-watch", exchange, routing_key=KEY, durable=False)

    class Slow(ConsumerMixin):
        def __init__(self, connection: kombu.Connection) -> None:
            self.connection = connection
            self.held: list[kombu.Message] = []

        def get_consumers(self, consumer_cls, channel):  # type: ignore[no-untyped-def]
            return [
                consumer_cls(
                    queues=[queue],
                    callbacks=[lambda body, m: self.held.append(m)],
                    prefetch_count=8,
                )
            ]

    def consumers() -> list[tuple[str, str]]:
        return b.call(
            lambda: [
                (c.tag, c.channel.connection_id)
                for c in b.broker.vhosts["/"].queues["kombu-watch"].consumers
            ]
        )

    with kombu.Connection(b.url()) as conn:
        worker = Slow(conn)
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        try:
            deadline = time.monotonic() + 5
            while not b.call(lambda: "kombu-watch" in b.broker.vhosts["/"].queues):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            while not consumers():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            publish(b, 12)
            while len(worker.held) < 8:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            check(b)  # log
            check(b)  # prefetch
            before = consumers()
            check(b)  # cancel
            deadline = time.monotonic() + 10
            while consumers() in ([], before):
                assert time.monotonic() < deadline, "kombu did not consume again"
                time.sleep(0.05)
            assert len(consumers()) == 1
        finally:
            worker.should_stop = True
            t.join(10)

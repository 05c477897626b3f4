"""Fixtures for the Spark pipeline tests: one SparkSession and one recorded broker run for the
whole session.

The Spark tests need Java 17 or later; without it (no ``java`` on the PATH and no ``JAVA_HOME``,
or too old a one) they are skipped with that reason (:func:`plugbroker.analyze.preflight.java_problem`).
Java 17 is part of the documented set-up, so in CI they run.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import amqp
import kombu
import pytest
from brokerutil import BrokerThread, write_config

from plugbroker.analyze.preflight import java_problem

HERE = Path(__file__).parent


#: why Spark cannot start here (no Java, or one older than 17), or None
JAVA_PROBLEM = java_problem()


def java_available() -> bool:
    return JAVA_PROBLEM is None


NO_JAVA = f"skipped, Spark cannot start: {JAVA_PROBLEM}"


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if java_available():
        return
    skip = pytest.mark.skip(reason=NO_JAVA)
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE) and "spark" in item.fixturenames:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for every Spark test: 2 cores, 2 shuffle partitions, no UI,
    bound to the loopback interface."""
    if not java_available():
        pytest.skip(NO_JAVA)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("plugbroker-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        # tiny data: compiling generated code costs more than it saves
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# --------------------------------------------------------------------------- a recorded run

RUNNING_CONFIG = """
    <queue name="work">
      <isolation><ackTimeout>1s</ackTimeout><checkPeriod>10m</checkPeriod></isolation>
    </queue>
    <topic key="stocks.us.*">
      <consumer><messageCount>5</messageCount><policy name="Delete"/></consumer>
    </topic>
"""


@dataclass
class Recording:
    journal: Path
    config: Path
    work_published: int
    stalled_tag: str = ""
    good_tag: str = ""
    slow_queue: str = ""
    fast_queue: str = ""
    poison_deliveries: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


def _connect(b: BrokerThread) -> amqp.Connection:
    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5
    )
    conn.connect()
    return conn


def _drain(conns: list[amqp.Connection], until: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        for c in conns:
            try:
                c.drain_events(timeout=0.02)
            except TimeoutError:
                pass
    assert until(), "the recorded run did not reach its expected state in time"


def record_run(directory: Path) -> Recording:
    """A broker with the journal on, driven by kombu and py-amqp clients through:

    * ``work`` (shared, isolation ackTimeout 1 s): a kombu producer, a consumer that acks
      promptly and always rejects the poison message (requeue twice, then to the dead-letter
      queue ``work-DLQ``), and a consumer that stalls holding its prefetch of 3 until the
      isolation check takes its messages away;
    * ``stocks.us.*`` (slow-consumer messageCount 5, Delete): a subscriber that never acks gets
      20 messages in one transaction and is disconnected with 506; a subscriber to
      ``stocks.us.aapl`` keeps up and is left alone.
    """
    path = write_config(
        directory, RUNNING_CONFIG, journal=True, period="600000", name="running.xml"
    )
    b = BrokerThread(path).start()
    rec = Recording(journal=directory / "journal", config=path, work_published=0)
    try:
        with kombu.Connection(b.url()) as kc:
            jobs = kombu.Exchange("jobs", "direct", durable=False)
            work = kombu.Queue(
                "work",
                jobs,
                routing_key="work",
                durable=False,
                queue_arguments={
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": "work-DLQ",
                },
            )
            dlq = kombu.Queue("work-DLQ", durable=False)
            producer = kc.Producer()
            producer.publish(b"warm-up", exchange=jobs, routing_key="work", declare=[work, dlq])
            good_conn, stalled_conn = _connect(b), _connect(b)
            acked: list[int] = []
            poison: list[int] = []
            held: list[Any] = []

            g = good_conn.channel()
            g.basic_qos(0, 10, False)

            def good(m: amqp.Message) -> None:
                if m.body == b"poison":
                    count = int((m.headers or {}).get("x-delivery-count", 0))
                    poison.append(count)
                    g.basic_reject(m.delivery_tag, requeue=count < 2)
                    return
                time.sleep(0.001 * (len(acked) % 7))  # some spread in processing time
                g.basic_ack(m.delivery_tag)
                acked.append(1)

            rec.good_tag = g.basic_consume("work", consumer_tag="good", callback=good)
            s = stalled_conn.channel()
            s.basic_qos(0, 3, False)
            rec.stalled_tag = s.basic_consume("work", consumer_tag="stalled", callback=held.append)
            _drain([good_conn, stalled_conn], lambda: len(acked) + len(held) >= 1)
            for i in range(40):
                producer.publish(
                    b"poison" if i == 17 else f"job {i}".encode(), exchange=jobs, routing_key="work"
                )
            rec.work_published = 41
            _drain(
                [good_conn, stalled_conn],
                lambda: len(held) == 3 and len(acked) == 41 - 1 - 3 and len(poison) == 3,
            )
            time.sleep(1.3)  # the stalled consumer is now past its 1 s ack timeout
            assert b.running.housekeeping.run_job("isolation")
            _drain([good_conn, stalled_conn], lambda: len(acked) == 41 - 1)
            rec.poison_deliveries = len(poison)

            # topic subscriptions: one falls behind, one keeps up
            slow_conn, fast_conn = _connect(b), _connect(b)
            t = slow_conn.channel()
            rec.slow_queue = t.queue_declare("", exclusive=True)[0]
            t.queue_bind(rec.slow_queue, "amq.topic", "stocks.us.ibm")
            t.basic_qos(0, 1, False)
            ticks: list[Any] = []
            t.basic_consume(rec.slow_queue, callback=ticks.append)
            f = fast_conn.channel()
            rec.fast_queue = f.queue_declare("", exclusive=True)[0]
            f.queue_bind(rec.fast_queue, "amq.topic", "stocks.us.aapl")
            fast: list[Any] = []
            f.basic_consume(
                rec.fast_queue, callback=lambda m: (fast.append(1), f.basic_ack(m.delivery_tag))
            )
            pub = kc.channel()
            pub.tx_select()
            for i in range(20):
                pub.basic_publish(amqp.Message(b"ibm %d" % i), "amq.topic", "stocks.us.ibm")
            for i in range(5):
                pub.basic_publish(amqp.Message(b"aapl %d" % i), "amq.topic", "stocks.us.aapl")
            pub.tx_commit()
            _drain([slow_conn, fast_conn], lambda: len(ticks) == 1 and len(fast) == 5)
            time.sleep(0.6)
            assert b.running.housekeeping.run_job("slow-consumer")
            try:
                _drain([slow_conn], lambda: False, timeout=1.0)
            except amqp.exceptions.ResourceError as exc:
                rec.notes["506"] = (exc.reply_code, exc.reply_text)
            except AssertionError:
                pass
            for c in (good_conn, stalled_conn, fast_conn):
                c.close()
            with contextlib.suppress(OSError, amqp.exceptions.AMQPError):
                slow_conn.close()
    finally:
        b.stop()
    return rec


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return record_run(tmp_path_factory.mktemp("recorded"))


@pytest.fixture(scope="session")
def report_result(
    spark: Any, recording: Recording, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    from plugbroker.analyze import report

    return report(recording.journal, tmp_path_factory.mktemp("report"), spark=spark, quiet=True)

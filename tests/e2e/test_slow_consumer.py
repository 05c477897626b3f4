"""Slow-consumer policy end to end: the Qpid design's test dimensions with real clients.

Checks are run on demand (``run_job``) so a test does not wait for a period, except the
operator scenario at the end, which runs on the real scheduler with a 200 ms period.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

import amqp
import kombu
import pytest
from amqp.exceptions import NotFound, ResourceError

pytestmark = pytest.mark.e2e

KEY = "stocks.us.ibm"
TEXT = "Consuming too slow."


def topic_config(
    thresholds: str, policy: str = "Delete", delete_persistent: bool | None = None
) -> str:
    opts = ""
    if delete_persistent is not None:
        opts = (
            f'<options><option name="delete-persistent" '
            f'value="{str(delete_persistent).lower()}"/></options>'
        )
    return (
        f'<topic key="stocks.us.*"><consumer>{thresholds}'
        f'<policy name="{policy}">{opts}</policy></consumer></topic>'
    )


@pytest.fixture
def start(broker_factory):
    def start(thresholds: str = "<messageCount>5</messageCount>", **kw):
        plugins = kw.pop("plugins", "")
        period = kw.pop("period", "600000")
        return broker_factory(topic_config(thresholds, **kw), plugins=plugins, period=period)

    return start


def check(b) -> None:
    assert b.running.housekeeping.run_job("slow-consumer") is True


def connect(b) -> amqp.Connection:
    conn = amqp.Connection(
        host=f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5
    )
    conn.connect()
    return conn


def subscribe(
    conn: amqp.Connection,
    *,
    durable: bool = False,
    name: str = "",
    key: str = KEY,
    prefetch: int = 1,
) -> tuple[amqp.Channel, str]:
    ch = conn.channel()
    if durable:
        qname = ch.queue_declare(name, durable=True, auto_delete=False)[0]
    else:
        qname = ch.queue_declare(name, exclusive=True, auto_delete=True)[0]
    ch.queue_bind(qname, "amq.topic", key)
    ch.basic_qos(0, prefetch, False)
    return ch, qname


def publish(b, n: int, size: int = 10, key: str = KEY) -> None:
    with connect(b) as conn:
        ch = conn.channel()
        ch.confirm_select()
        for _i in range(n):
            ch.basic_publish(amqp.Message(b"x" * size), "amq.topic", key)


def queue_exists(b, name: str) -> bool:
    return b.call(lambda: name in b.broker.vhosts["/"].queues)


def drain_until(conn: amqp.Connection, cond, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass


def expect_506(conn: amqp.Connection, timeout: float = 3.0) -> ResourceError:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            continue
        except ResourceError as exc:
            return exc
    raise AssertionError("no 506 within the time limit")


def test_manual_ack_consumer_closed_with_506_queue_deleted_connection_usable(start):
    b = start("<messageCount>5</messageCount>")
    with connect(b) as slow_conn, connect(b) as fast_conn:
        slow, slow_q = subscribe(slow_conn)
        held = []
        slow.basic_consume(slow_q, callback=held.append)  # never acks
        fast, fast_q = subscribe(fast_conn, prefetch=100)
        got = []
        fast.basic_consume(
            fast_q, callback=lambda m: (got.append(m), m.channel.basic_ack(m.delivery_tag))
        )
        publish(b, 20)
        drain_until(fast_conn, lambda: len(got) == 20)
        drain_until(slow_conn, lambda: len(held) == 1)
        check(b)
        err = expect_506(slow_conn)
        assert err.reply_code == 506 and err.reply_text == TEXT
        assert not queue_exists(b, slow_q)
        # the connection survives: a new channel on it works
        ch = slow_conn.channel()
        assert ch.queue_declare("after-506", auto_delete=True)[0] == "after-506"
        # the fast consumer on the same topic was never touched
        assert queue_exists(b, fast_q)
        publish(b, 3)
        drain_until(fast_conn, lambda: len(got) == 23)
        assert len(got) == 23


def test_kombu_consumer_gets_resource_error_and_reopens_a_channel(start):
    b = start("<messageCount>5</messageCount>")
    with kombu.Connection(b.url()) as conn:
        exchange = kombu.Exchange("amq.topic", "topic", passive=True)
        q = kombu.Queue("kombu-slow", exchange, routing_key=KEY, durable=False, auto_delete=True)
        held = []
        consumer = conn.Consumer(q, callbacks=[lambda body, m: held.append(m)], prefetch_count=1)
        consumer.consume()
        publish(b, 10)
        deadline = time.monotonic() + 3
        while not held and time.monotonic() < deadline:
            conn.drain_events(timeout=1)
        check(b)
        with pytest.raises(ResourceError) as err:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.3)
                except TimeoutError:
                    pass
        assert err.value.reply_code == 506 and err.value.reply_text == TEXT
        channel = conn.channel()  # same kombu connection, a new channel
        producer = kombu.Producer(channel)
        producer.publish(
            "still-works",
            routing_key="kombu-after",
            declare=[kombu.Queue("kombu-after", auto_delete=True)],
        )
        assert kombu.Queue("kombu-after", channel=channel).get(no_ack=True).payload == "still-works"


def test_no_ack_consumer_that_stops_reading_is_closed_on_depth(start):
    # no-ack floods the consumer; once its socket and the broker's write buffer are full the
    # broker stops writing, messages back up in the queue and the depth threshold fires
    b = start("<depth>1MB</depth>")
    with connect(b) as conn:
        ch, qname = subscribe(conn, prefetch=0)
        ch.basic_consume(qname, no_ack=True, callback=lambda m: None)
        publish(b, 400, size=100_000)  # 40 MB that the client never reads
        depth = b.call(lambda: b.broker.vhosts["/"].queues[qname].bytes)
        assert depth > 1_000_000
        check(b)
        assert not queue_exists(b, qname)
        err = expect_506(conn, timeout=10)
        assert err.reply_code == 506


def test_transacted_consumer_commit_fails_with_506(start):
    b = start("<messageCount>5</messageCount>")
    with connect(b) as conn:
        ch, qname = subscribe(conn, prefetch=10)
        ch.tx_select()
        held = []
        ch.basic_consume(qname, callback=held.append)
        publish(b, 20)
        drain_until(conn, lambda: len(held) == 10)
        ch.basic_ack(held[0].delivery_tag)  # inside the transaction, not committed
        check(b)
        with pytest.raises(ResourceError) as err:
            ch.tx_commit()
        assert err.value.reply_code == 506 and err.value.reply_text == TEXT


def test_basic_get_poller_gets_506_on_its_next_operation(start):
    b = start("<messageCount>5</messageCount>")
    with connect(b) as conn:
        ch, qname = subscribe(conn)
        publish(b, 10)
        msg = ch.basic_get(qname)
        assert msg is not None  # polled once, not acked, and not keeping up
        check(b)
        with pytest.raises(ResourceError) as err:
            ch.basic_get(qname)
        assert err.value.reply_code == 506
        assert not queue_exists(b, qname)


def test_queue_without_consumer_is_deleted(start):
    b = start("<messageCount>5</messageCount>")
    with connect(b) as conn:
        ch = conn.channel()
        qname = ch.queue_declare("orphan", auto_delete=False)[0]
        ch.queue_bind(qname, "amq.topic", KEY)
        publish(b, 6)
        check(b)
        assert not queue_exists(b, "orphan")


@pytest.mark.parametrize("delete_persistent", [False, True])
def test_durable_subscription_follows_delete_persistent(start, caplog, delete_persistent):
    b = start("<messageCount>5</messageCount>", delete_persistent=delete_persistent)
    name = f"durable-sub-{delete_persistent}"
    caplog.set_level(logging.INFO, logger="plugbroker.policy")
    with connect(b) as conn:
        ch, qname = subscribe(conn, durable=True, name=name)
        held = []
        ch.basic_consume(qname, callback=held.append)
        publish(b, 10)
        drain_until(conn, lambda: len(held) == 1)
        check(b)
        if delete_persistent:
            assert expect_506(conn).reply_code == 506
            assert not queue_exists(b, name)
        else:
            assert queue_exists(b, name)
            # not disconnected: the consumer keeps working on the same channel
            ch.basic_ack(held[0].delivery_tag)
            drain_until(conn, lambda: len(held) == 2)
            assert len(held) == 2
            assert any(
                "spared" in r.getMessage() and "delete-persistent" in r.getMessage()
                for r in caplog.records
            )


def test_count_and_depth_together(start):
    b = start("<depth>1024</depth><messageCount>10</messageCount>")
    with connect(b) as conn:
        ch = conn.channel()
        ch.queue_declare("pair", auto_delete=False)
        ch.queue_bind("pair", "amq.topic", KEY)
        publish(b, 10, size=100)  # ten small messages: 1000 bytes, fine
        check(b)
        assert queue_exists(b, "pair")
        publish(b, 1, size=10)  # eleven: count passes
        check(b)
        assert not queue_exists(b, "pair")
        ch.queue_declare("pair2", auto_delete=False)
        ch.queue_bind("pair2", "amq.topic", KEY)
        publish(b, 3, size=400)  # three big ones: depth passes with count under ten
        check(b)
        assert not queue_exists(b, "pair2")


def test_message_age_threshold(start):
    b = start("<messageAge>200ms</messageAge>")
    with connect(b) as conn:
        ch = conn.channel()
        ch.queue_declare("aging", auto_delete=False)
        ch.queue_bind("aging", "amq.topic", KEY)
        publish(b, 1)
        check(b)
        assert queue_exists(b, "aging")
        time.sleep(0.3)
        check(b)
        assert not queue_exists(b, "aging")


def test_consumption_rate_floor_while_backlogged(start):
    b = start("<consumptionRate>50</consumptionRate>")
    with connect(b) as conn:
        ch, qname = subscribe(conn, prefetch=5)
        held = []
        ch.basic_consume(qname, callback=held.append)
        publish(b, 30)
        drain_until(conn, lambda: len(held) == 5)
        check(b)  # first look: no rate yet
        assert queue_exists(b, qname)
        time.sleep(0.2)
        check(b)  # no acks in 0.2 s with 25 waiting: under 50/s
        assert expect_506(conn).reply_code == 506


def test_rate_floor_counts_what_the_prefetch_holds_as_backlog(start):
    b = start("<consumptionRate>50</consumptionRate>")
    with connect(b) as conn:
        ch, qname = subscribe(conn, prefetch=100)  # its prefetch holds the whole backlog
        held: list[amqp.Message] = []
        ch.basic_consume(qname, callback=held.append)
        publish(b, 10)
        drain_until(conn, lambda: len(held) == 10)
        ready = b.call(lambda: b.broker.vhosts["/"].queues[qname].ready_count)
        assert ready == 0  # nothing waits in the queue: all ten are unacked
        check(b)  # first look: no rate yet
        ch.basic_ack(held[0].delivery_tag)  # one ack in 0.2 s: 5/s, under the 50/s floor
        time.sleep(0.2)
        check(b)
        assert expect_506(conn).reply_code == 506
        assert not queue_exists(b, qname)


def test_log_policy_is_a_dry_run(start, caplog):
    b = start("<messageCount>5</messageCount>", policy="Log")
    caplog.set_level(logging.INFO, logger="plugbroker.policy")
    with connect(b) as conn:
        ch, qname = subscribe(conn)
        held = []
        ch.basic_consume(qname, callback=held.append)
        publish(b, 10)
        drain_until(conn, lambda: len(held) == 1)
        check(b)
        assert queue_exists(b, qname)
        ch.basic_ack(held[0].delivery_tag)  # the channel is still open
        drain_until(conn, lambda: len(held) == 2)
        lines = [r.getMessage() for r in caplog.records if "log only" in r.getMessage()]
        assert lines and qname in lines[0] and "messageCount" in lines[0]
        # one delivered-unacked plus nine ready: ten held
        assert "configured 5" in lines[0] and "measured 10" in lines[0]
        assert held[0].delivery_info["consumer_tag"] in lines[0]


def test_custom_policy_from_the_howto_reduces_prefetch(start):
    examples = str(Path(__file__).resolve().parents[2] / "docs" / "examples")
    sys.path.insert(0, examples)
    try:
        b = start(
            "<messageCount>5</messageCount>",
            policy="ReducePrefetch",
            plugins="<plugins><plugin>prefetch_policy</plugin></plugins>",
        )
        with connect(b) as conn:
            ch, qname = subscribe(conn, prefetch=50)
            held = []
            ch.basic_consume(qname, callback=held.append)
            publish(b, 60)
            drain_until(conn, lambda: len(held) == 50)
            check(b)
            assert queue_exists(b, qname)
            assert b.call(lambda: b.broker.vhosts["/"].queues[qname].consumers[0].prefetch) == 10
    finally:
        sys.path.remove(examples)
        sys.modules.pop("prefetch_policy", None)


def test_operator_scenario_on_the_real_scheduler(start):
    """The seed's stocks.us.* example: a stalled subscriber on stocks.us.ibm is disconnected
    within one check period of crossing the threshold, a healthy one keeps receiving."""
    b = start("<messageCount>50</messageCount>", period="200")
    got: list[amqp.Message] = []
    stop = threading.Event()
    ready = threading.Event()

    def healthy() -> None:
        with connect(b) as conn:
            ch, qname = subscribe(conn, key="stocks.us.*", prefetch=100)
            ch.basic_consume(
                qname, callback=lambda m: (got.append(m), ch.basic_ack(m.delivery_tag))
            )
            ready.set()
            while not stop.is_set():
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass

    t = threading.Thread(target=healthy, daemon=True)
    t.start()
    assert ready.wait(5)
    try:
        with connect(b) as stalled_conn:
            stalled, stalled_q = subscribe(stalled_conn)
            stalled.basic_consume(stalled_q, callback=lambda m: None)
            publish(b, 60)
            crossed = time.monotonic()
            err = expect_506(stalled_conn, timeout=2.0)
            assert err.reply_text == TEXT
            assert time.monotonic() - crossed < 1.0  # a few 200 ms periods at most
            publish(b, 5)
            deadline = time.monotonic() + 3
            while len(got) < 65 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(got) == 65
            with pytest.raises(NotFound):
                stalled_conn.channel().queue_declare(stalled_q, passive=True)
    finally:
        stop.set()
        t.join(5)


# ---------------------------------------------------------------------------------- scope

#: a vhost-level <consumer> with a short age that may delete durable queues too (Celery's are
#: durable), and a queue with a retry path (the dead-letter plugin declares work-RETRY for it)
SCOPE = (
    '<consumer><messageAge>200ms</messageAge><policy name="Delete">'
    '<options><option name="delete-persistent" value="true"/></options></policy></consumer>'
    '<queue name="work" durable="false"><deadLetter><maxRedeliveries>2</maxRedeliveries>'
    "<retry><levels>5m</levels></retry></deadLetter></queue>"
)


def test_vhost_consumer_reaches_topic_subscriptions_only(broker_factory):
    b = broker_factory(SCOPE, period="600000")
    with kombu.Connection(b.url()) as kc, connect(b) as conn:
        # a Celery-style work queue: a direct exchange, a worker holding its message unacked
        celery = kombu.Queue("celery", kombu.Exchange("celery", "direct"), routing_key="celery")
        producer = kc.Producer()
        producer.publish(
            {"task": "t"}, exchange=celery.exchange, routing_key="celery", declare=[celery]
        )
        producer.publish({"task": "u"}, exchange=celery.exchange, routing_key="celery")
        held: list[kombu.Message] = []
        worker = kc.Consumer(celery, callbacks=[lambda body, m: held.append(m)], prefetch_count=1)
        worker.consume()
        kc.drain_events(timeout=2)
        assert len(held) == 1
        # the retry queue the broker declared, holding a 5-minute retry
        ch = conn.channel()
        ch.confirm_select()
        retry = amqp.Message(b"retry me", application_headers={"x-retry-level": 1})
        ch.basic_publish(retry, "", "work-RETRY")
        # a retry queue a client also bound to a topic exchange is still a retry target
        ch.queue_bind("work-RETRY", "amq.topic", "retries.#")
        # a DLQ bound to a topic exchange that a queue dead-letters into
        ch.queue_declare(
            "src",
            auto_delete=False,
            arguments={
                "x-dead-letter-exchange": "amq.topic",
                "x-dead-letter-routing-key": "dead.src",
            },
        )
        ch.queue_declare("src-dead", auto_delete=False)
        ch.queue_bind("src-dead", "amq.topic", "dead.#")
        ch.basic_publish(amqp.Message(b"dead"), "amq.topic", "dead.src")
        # a topic subscription with a slow consumer
        sub_ch, qname = subscribe(conn)
        got: list[amqp.Message] = []
        sub_ch.basic_consume(qname, callback=got.append)
        publish(b, 3)
        drain_until(conn, lambda: len(got) == 1)
        time.sleep(0.3)  # every queue now holds a message older than messageAge
        check(b)
        assert expect_506(conn).reply_code == 506
        assert not queue_exists(b, qname)
        for name in ("celery", "work-RETRY", "src-dead"):
            assert queue_exists(b, name), name
        assert b.call(lambda: b.broker.vhosts["/"].queues["work-RETRY"].message_count) == 1
        assert b.call(lambda: b.broker.vhosts["/"].queues["src-dead"].message_count) == 1
        # the worker was never touched: it acks and gets the next task on the same channel
        held[0].ack()
        kc.drain_events(timeout=2)
        assert [m.payload["task"] for m in held] == ["t", "u"]
        held[1].ack()


def test_queue_consumer_reaches_its_queue_however_it_is_bound(broker_factory):
    b = broker_factory(
        '<queue name="celery"><consumer><messageAge>200ms</messageAge><policy name="Delete">'
        '<options><option name="delete-persistent" value="true"/></options></policy>'
        "</consumer></queue>",
        period="600000",
    )
    with kombu.Connection(b.url()) as kc:
        celery = kombu.Queue("celery", kombu.Exchange("celery", "direct"), routing_key="celery")
        kc.Producer().publish(
            {"task": "t"}, exchange=celery.exchange, routing_key="celery", declare=[celery]
        )
        time.sleep(0.3)
        check(b)
        assert not queue_exists(b, "celery")

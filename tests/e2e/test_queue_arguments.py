"""Queue arguments a kombu/Celery user sends (SPEC section 3), checked with py-amqp.

TTLs, x-expires, length limits and overflow, dead-lettering with RabbitMQ's x-death record,
priorities and single active consumer. Every wait is bounded.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import amqp
import pytest
from brokerutil import drain_for, drain_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


@pytest.fixture
def conn(broker):
    c = amqp.Connection(
        f"127.0.0.1:{broker.port}", userid="guest", password="guest", connect_timeout=5
    )
    c.connect()
    yield c
    try:
        c.close()
    except Exception:
        pass


def declare(ch: amqp.Channel, name: str, **arguments: Any) -> None:
    ch.queue_declare(
        name, auto_delete=False, arguments={k.replace("_", "-"): v for k, v in arguments.items()}
    )


def count(conn: amqp.Connection, queue: str) -> int:
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).message_count
    finally:
        ch.close()


def publish(
    ch: amqp.Channel, body: Any, routing_key: str, exchange: str = "", **props: Any
) -> None:
    ch.basic_publish(amqp.Message(body, **props), exchange=exchange, routing_key=routing_key)


def get_all(ch: amqp.Channel, queue: str, limit: int = 50) -> list[amqp.Message]:
    out = []
    for _ in range(limit):
        m = ch.basic_get(queue, no_ack=True)
        if m is None:
            break
        out.append(m)
    return out


def wait_for_get(
    conn: amqp.Connection, ch: amqp.Channel, queue: str, timeout: float = 3.0
) -> amqp.Message:
    box: list[amqp.Message] = []

    def poll() -> bool:
        m = ch.basic_get(queue, no_ack=True)
        if m is not None:
            box.append(m)
        return bool(box)

    drain_until(conn, poll, timeout)
    return box[0]


def dlx_setup(ch: amqp.Channel, dlx: str = "dlx", dlq: str = "dlq", key: str = "dead") -> None:
    ch.exchange_declare(dlx, "direct", auto_delete=False)
    declare(ch, dlq)
    ch.queue_bind(dlq, dlx, key)


def death(m: amqp.Message) -> list[dict[str, Any]]:
    return m.properties["application_headers"]["x-death"]


# ------------------------------------------------------------------ TTL


def test_queue_message_ttl_expires_messages(conn):
    ch = conn.channel()
    declare(ch, "ttl-q", x_message_ttl=200)
    for i in range(3):
        publish(ch, f"t{i}", "ttl-q")
    assert count(conn, "ttl-q") == 3
    drain_until(conn, lambda: count(conn, "ttl-q") == 0, timeout=1.5)
    assert ch.basic_get("ttl-q") is None
    # a consumer never sees an expired message either
    publish(ch, "late", "ttl-q")
    drain_for(conn, 0.35)
    got: list[amqp.Message] = []
    ch.basic_consume("ttl-q", callback=got.append, no_ack=True)
    drain_for(conn, 0.3)
    assert got == []


def test_per_message_expiration(conn):
    ch = conn.channel()
    declare(ch, "exp-q")
    publish(ch, "short", "exp-q", expiration="150")
    publish(ch, "forever", "exp-q")
    assert count(conn, "exp-q") == 2
    drain_until(conn, lambda: count(conn, "exp-q") == 1, timeout=1.5)
    m = ch.basic_get("exp-q", no_ack=True)
    assert m.body == "forever"
    # the lower of queue TTL and per-message expiration wins
    declare(ch, "exp-q2", x_message_ttl=5000)
    publish(ch, "quick", "exp-q2", expiration="100")
    drain_until(conn, lambda: count(conn, "exp-q2") == 0, timeout=1.5)


def test_expired_message_dead_lettered_with_x_death(conn):
    ch = conn.channel()
    dlx_setup(ch)
    ch.exchange_declare("src-ex", "direct", auto_delete=False)
    declare(
        ch,
        "ttl-dl",
        x_message_ttl=100,
        x_dead_letter_exchange="dlx",
        x_dead_letter_routing_key="dead",
    )
    ch.queue_bind("ttl-dl", "src-ex", "orig-key")
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    publish(ch, "bye", "orig-key", exchange="src-ex", application_headers={"keep": "me"})
    m = wait_for_get(conn, ch, "dlq", timeout=2)
    assert m.body == "bye"
    assert m.delivery_info["exchange"] == "dlx"
    assert m.delivery_info["routing_key"] == "dead"
    headers = m.properties["application_headers"]
    assert headers["keep"] == "me"
    (d,) = headers["x-death"]
    assert d["count"] == 1
    assert d["reason"] == "expired"
    assert d["queue"] == "ttl-dl"
    assert d["exchange"] == "src-ex"
    assert d["routing-keys"] == ["orig-key"]
    assert isinstance(d["time"], dt.datetime)
    assert (
        before - dt.timedelta(seconds=2)
        <= d["time"].replace(tzinfo=None)
        <= before + dt.timedelta(seconds=5)
    )
    assert headers["x-first-death-reason"] == "expired"
    assert headers["x-first-death-queue"] == "ttl-dl"
    assert count(conn, "ttl-dl") == 0


def test_per_message_expiration_dead_letters_and_keeps_original_expiration(conn):
    ch = conn.channel()
    dlx_setup(ch)
    declare(ch, "exp-dl", x_dead_letter_exchange="dlx", x_dead_letter_routing_key="dead")
    publish(ch, "soon", "exp-dl", expiration="100")
    m = wait_for_get(conn, ch, "dlq", timeout=2)
    (d,) = death(m)
    assert d["reason"] == "expired"
    assert d["original-expiration"] == "100"
    assert "expiration" not in m.properties  # it does not expire again in the DLQ


def test_rejected_message_dead_lettered_and_count_increments(conn):
    ch = conn.channel()
    dlx_setup(ch)
    # no dead-letter routing key: the original routing key is kept
    ch.queue_bind("dlq", "dlx", "work-q")
    declare(ch, "work-q", x_dead_letter_exchange="dlx")
    publish(ch, "bad", "work-q", content_type="text/plain")
    m = ch.basic_get("work-q")
    ch.basic_reject(m.delivery_tag, requeue=False)
    dead = wait_for_get(conn, ch, "dlq")
    assert dead.delivery_info["routing_key"] == "work-q"
    (d,) = death(dead)
    assert (d["count"], d["reason"], d["queue"], d["exchange"], d["routing-keys"]) == (
        1,
        "rejected",
        "work-q",
        "",
        ["work-q"],
    )
    assert dead.properties["content_type"] == "text/plain"
    # republish the dead message as a client would (a retry), fail it again: count 2
    ch.basic_publish(amqp.Message(dead.body, **dead.properties), exchange="", routing_key="work-q")
    m = ch.basic_get("work-q")
    ch.basic_reject(m.delivery_tag, requeue=False)
    dead2 = wait_for_get(conn, ch, "dlq")
    (d2,) = death(dead2)
    assert d2["count"] == 2 and d2["reason"] == "rejected" and d2["queue"] == "work-q"


def test_requeue_does_not_dead_letter(conn):
    ch = conn.channel()
    dlx_setup(ch)
    declare(ch, "rq-q", x_dead_letter_exchange="dlx", x_dead_letter_routing_key="dead")
    publish(ch, "again", "rq-q")
    m = ch.basic_get("rq-q")
    ch.basic_reject(m.delivery_tag, requeue=True)
    m = ch.basic_get("rq-q", no_ack=True)
    assert m.body == "again" and m.delivery_info["redelivered"] is True
    assert ch.basic_get("dlq") is None


# ------------------------------------------------------------------ x-expires


def test_queue_expires_after_idle(broker, conn):
    ch = conn.channel()
    declare(ch, "idle-q", x_expires=400)
    start = time.monotonic()

    def exists() -> bool:
        return broker.call(lambda: "idle-q" in broker.broker.vhosts["/"].queues)

    assert exists()
    deadline = start + 2.0
    while exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    gone_after = time.monotonic() - start
    assert not exists()
    assert 0.3 <= gone_after <= 1.5, gone_after
    with pytest.raises(amqp.exceptions.NotFound):
        ch.queue_declare("idle-q", passive=True)


def test_queue_with_consumer_does_not_expire(conn):
    ch = conn.channel()
    declare(ch, "busy-q", x_expires=200)
    ch.basic_consume("busy-q", callback=lambda m: None)
    drain_for(conn, 0.6)
    assert count(conn, "busy-q") == 0  # still there (passive declare would raise 404)


# ------------------------------------------------------------------ max length


def test_max_length_drop_head_dead_letters_maxlen(conn):
    ch = conn.channel()
    dlx_setup(ch)
    declare(
        ch, "ml-q", x_max_length=2, x_dead_letter_exchange="dlx", x_dead_letter_routing_key="dead"
    )
    for i in range(4):
        publish(ch, f"m{i}", "ml-q")
    assert [m.body for m in get_all(ch, "ml-q")] == ["m2", "m3"]
    dead = get_all(ch, "dlq")
    assert [m.body for m in dead] == ["m0", "m1"]
    assert death(dead[0])[0]["reason"] == "maxlen"
    assert death(dead[0])[0]["queue"] == "ml-q"


def test_max_length_reject_publish_keeps_oldest(conn):
    ch = conn.channel()
    declare(ch, "mlr-q", x_max_length=2, x_overflow="reject-publish")
    for i in range(4):
        publish(ch, f"m{i}", "mlr-q")
    assert [m.body for m in get_all(ch, "mlr-q")] == ["m0", "m1"]
    # there is room again once consumed
    publish(ch, "m4", "mlr-q")
    assert [m.body for m in get_all(ch, "mlr-q")] == ["m4"]


def test_max_length_bytes(conn):
    ch = conn.channel()
    declare(ch, "mlb-q", x_max_length_bytes=10)
    for i in range(4):
        publish(ch, f"b{i}xx", "mlb-q")  # 4 bytes each: only two fit in 10
    assert [m.body for m in get_all(ch, "mlb-q")] == ["b2xx", "b3xx"]
    declare(ch, "mlbr-q", x_max_length_bytes=10, x_overflow="reject-publish")
    for i in range(4):
        publish(ch, f"b{i}xx", "mlbr-q")
    assert [m.body for m in get_all(ch, "mlbr-q")] == ["b0xx", "b1xx"]


def test_invalid_queue_argument_is_406(conn):
    ch = conn.channel()
    with pytest.raises(amqp.exceptions.PreconditionFailed):
        declare(ch, "bad-arg-q", x_max_length="ten")
    ch2 = conn.channel()
    with pytest.raises(amqp.exceptions.PreconditionFailed):
        declare(ch2, "bad-ov-q", x_overflow="explode")
    ch3 = conn.channel()
    declare(ch3, "quorum-q", x_queue_type="quorum")  # accepted


# ------------------------------------------------------------------ priority


def test_max_priority_orders_by_priority(conn):
    ch = conn.channel()
    declare(ch, "prio-q", x_max_priority=10)
    for body, prio in (("p1", 1), ("p5", 5), ("p9", 9), ("p0", 0), ("p5b", 5), ("p50", 50)):
        publish(ch, body, "prio-q", priority=prio)
    # a priority above the maximum counts as the maximum (10 > 9); FIFO within a level
    assert [m.body for m in get_all(ch, "prio-q")] == ["p50", "p9", "p5", "p5b", "p1", "p0"]
    # consumers see the same order
    for body, prio in (("a", 2), ("b", 7), ("c", 4)):
        publish(ch, body, "prio-q", priority=prio)
    got: list[amqp.Message] = []
    ch.basic_consume("prio-q", callback=got.append, no_ack=True)
    drain_until(conn, lambda: len(got) == 3)
    assert [m.body for m in got] == ["b", "c", "a"]


def test_without_max_priority_order_is_fifo(conn):
    ch = conn.channel()
    declare(ch, "fifo-q")
    for body, prio in (("p1", 1), ("p9", 9)):
        publish(ch, body, "fifo-q", priority=prio)
    assert [m.body for m in get_all(ch, "fifo-q")] == ["p1", "p9"]


# ------------------------------------------------------------------ single active consumer


def test_single_active_consumer(conn, broker):
    other = amqp.Connection(f"127.0.0.1:{broker.port}", connect_timeout=5)
    other.connect()
    try:
        ch1 = conn.channel()
        declare(ch1, "sac-q", x_single_active_consumer=True)
        got1: list[amqp.Message] = []
        got2: list[amqp.Message] = []
        tag1 = ch1.basic_consume("sac-q", callback=got1.append)
        ch2 = other.channel()
        ch2.basic_consume("sac-q", callback=got2.append)
        for i in range(4):
            publish(ch1, f"s{i}", "sac-q")
        drain_until(conn, lambda: len(got1) == 4)
        drain_for(other, 0.3)
        assert got2 == []
        # ack two, leave two unacked, cancel: the second consumer takes over, unacked
        # messages included
        ch1.basic_ack(got1[1].delivery_tag, multiple=True)
        ch1.basic_cancel(tag1)
        publish(ch1, "s4", "sac-q")
        # a cancelled consumer's unacked messages stay with its channel until it closes
        ch1.close()
        drain_until(other, lambda: len(got2) == 3)
        assert sorted(m.body for m in got2) == ["s2", "s3", "s4"]
        assert len(got1) == 4
    finally:
        other.close()

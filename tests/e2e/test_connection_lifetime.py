"""A closed connection is freed when it closes, by reference counting alone.

What a closed connection leaves for CPython's cycle collector is what the collector's full
passes must walk, and a full pass stops the event loop for as long as the heap is big: with
connections kept alive by cancelled timers (until they would have been due) and by their own
dispatch tables (a reference cycle), a client opening and dropping connections in a loop grew
the heap by thousands of objects a second and the bystander below waited up to 250 ms.

Each test runs its clients with the cycle collector disabled and checks, through weak
references taken on the broker's loop, that every server-side connection is gone once its
client has closed, however it closed. A bystander on another connection publishes persistent
messages with confirms throughout.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from rawclient import RawClient, deep_header_properties, publish_frames

from plugbroker.compiled import in_use


def connect(b: Any, **kw: Any) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest", **kw)
    conn.connect()
    return conn


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _record_opened(b: Any) -> list[weakref.ref[Any]]:
    """From now on, a weak reference to every connection the broker opens (taken as it opens:
    one the broker closes at once, such as a 502, would be gone before a later look)."""
    refs: list[weakref.ref[Any]] = []
    opened = b.broker.connection_opened

    def record(conn: Any) -> None:
        refs.append(weakref.ref(conn))
        opened(conn)

    b.broker.connection_opened = record
    return refs


def _wait_freed(b: Any, refs: list[weakref.ref[Any]], timeout: float = 5.0) -> list[str]:
    """Wait (bounded) until every referenced connection is freed; return those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        alive = b.call(lambda: [f"{r().id} {r().state}" for r in refs if r() is not None])
        if not alive or time.monotonic() > deadline:
            return list(alive)
        time.sleep(0.02)


def _clean_close(b: Any) -> amqp.Connection:
    c = connect(b, confirm_publish=True)
    ch = c.channel()
    ch.queue_declare("work", durable=True, auto_delete=False)
    ch.basic_publish(amqp.Message(b"persistent", delivery_mode=2), "", "work", timeout=5)
    ch2 = c.channel()
    ch2.queue_declare("", exclusive=True)
    ch2.basic_consume("work", callback=lambda m: None)
    c.drain_events(timeout=2)  # the delivery, left unacked
    return c


def _channel_error(b: Any) -> amqp.Connection:
    c = connect(b)
    ch = c.channel()
    with pytest.raises(amqp.exceptions.NotFound):
        ch.queue_declare("no-such-queue", passive=True)
    ch = c.channel()
    ch.tx_select()
    ch.basic_publish(amqp.Message(b"in a transaction"), "", "work")
    ch.tx_commit()
    return c


def _connection_error(b: Any) -> amqp.Connection:
    """A name that is not valid UTF-8: the broker closes the connection (502)."""
    c = connect(b)
    ch = c.channel()
    with pytest.raises(amqp.exceptions.AMQPError):
        ch.queue_declare("poison-\ud800", durable=True, auto_delete=False)
    return c


def _raw_open(b: Any) -> RawClient:
    raw = RawClient(b.port, timeout=2)
    raw.handshake()  # connection.open-ok read: the broker has the connection
    return raw


@pytest.mark.skipif(
    "plugbroker.session" in in_use(),
    reason="compiled build: a mypyc Connection cannot be weakly referenced, which this test needs",
)
def test_connections_are_freed_when_they_close_however_they_close(
    broker_factory: Any, no_cycle_collector: None
) -> None:
    b = broker_factory(store=True)
    bystander = connect(b, confirm_publish=True)
    bch = bystander.channel()
    bch.queue_declare("bystander", durable=True, auto_delete=False)
    sent = 0

    def bystander_publishes() -> None:
        nonlocal sent
        for _ in range(3):
            bch.basic_publish(amqp.Message(b"b", delivery_mode=2), "", "bystander", timeout=5)
            sent += 1

    refs = _record_opened(b)
    for _ in range(5):
        for c in [_clean_close(b), _channel_error(b)]:
            c.close()
        bystander_publishes()

        c = _connection_error(b)
        c.collect()  # the broker closed it: drop the socket without a close of our own

        with _raw_open(b) as raw:
            raw.send(publish_frames(1, "", "work", b"deep", deep_header_properties(700)))
            assert raw.expect_connection_close()[0] == 502

        dropped = connect(b)
        dropped.channel().basic_consume("work", callback=lambda m: None)
        dropped.sock.close()  # gone without a word, a consumer with a delivery left behind
        bystander_publishes()

    assert len(refs) == 25
    assert _wait_freed(b, refs) == []
    _, count, _ = bch.queue_declare("bystander", passive=True)
    assert count == sent
    bystander.close()

"""AMQP 0-9-1 protocol contract (SPEC section 3), checked with py-amqp against a real broker.

Every wait is bounded: ``drain_events(timeout=...)`` inside loops with a deadline.
"""

from __future__ import annotations

import datetime as dt
import socket
import struct
import threading
import time
from decimal import Decimal
from typing import Any

import amqp
import pytest
from amqp import exceptions as ex
from amqp.method_framing import frame_handler as default_frame_handler
from brokerutil import drain_for, drain_until

from plugbroker.codec import ServerCodec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]


# ------------------------------------------------------------------ helpers


@pytest.fixture
def connect(broker):
    """``connect(**kw)`` -> an open py-amqp connection to ``broker``; all closed at teardown."""
    opened: list[amqp.Connection] = []

    def make(b: Any = None, **kw: Any) -> amqp.Connection:
        target = b if b is not None else broker
        kw.setdefault("userid", "guest")
        kw.setdefault("password", "guest")
        c = amqp.Connection(f"127.0.0.1:{target.port}", connect_timeout=5, **kw)
        c.connect()
        opened.append(c)
        return c

    yield make
    for c in opened:
        try:
            c.close()
        except Exception:
            pass


def counts(conn: amqp.Connection, queue: str) -> tuple[int, int]:
    """(message_count, consumer_count) from a passive queue.declare on a fresh channel."""
    ch = conn.channel()
    try:
        ok = ch.queue_declare(queue, passive=True)
        return ok.message_count, ok.consumer_count
    finally:
        ch.close()


def basic_nack(ch: amqp.Channel, tag: int, multiple: bool = False, requeue: bool = True) -> None:
    """py-amqp has no basic_nack method; send the frame ourselves."""
    ch.send_method(amqp.spec.Basic.Nack, "Lbb", (tag, multiple, requeue))


def publish(
    ch: amqp.Channel, body: Any, routing_key: str, exchange: str = "", **props: Any
) -> None:
    ch.basic_publish(amqp.Message(body, **props), exchange=exchange, routing_key=routing_key)


# ------------------------------------------------------------------ publisher confirms


def test_confirm_select_acks_every_publish(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("conf-q")
    acked: set[int] = set()

    def on_ack(tag: int, multiple: bool) -> None:
        if multiple:
            acked.update(range(1, tag + 1))
        else:
            acked.add(tag)

    ch.events["basic_ack"].add(on_ack)
    ch.confirm_select()
    for i in range(5):
        publish(ch, f"m{i}", "conf-q")
    # unroutable messages are confirmed too
    publish(ch, "nowhere", "no-such-queue")
    drain_until(conn, lambda: acked >= set(range(1, 7)))
    assert acked == set(range(1, 7))
    assert counts(conn, "conf-q")[0] == 5


def test_connection_confirm_publish_waits_for_ack(connect):
    conn = connect(confirm_publish=True)
    ch = conn.channel()
    ch.queue_declare("conf-wait")
    for i in range(3):
        publish(ch, f"m{i}", "conf-wait")  # returns only once the broker confirmed
    assert counts(conn, "conf-wait") == (3, 0)


def test_reject_publish_overflow_nacks_publisher(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("rp-q", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    acks: list[int] = []
    nacks: list[int] = []
    settled = [0]

    def settle(into: list[int], tag: int, multiple: bool) -> None:
        # confirms due in one turn come as one ack with multiple=true (ended by a nack)
        into.extend(range(settled[0] + 1, tag + 1) if multiple else [tag])
        settled[0] = max(settled[0], tag)

    ch.events["basic_ack"].add(lambda tag, multiple: settle(acks, tag, multiple))
    ch.events["basic_nack"].add(lambda tag, multiple: settle(nacks, tag, multiple))
    ch.confirm_select()
    for i in range(4):
        publish(ch, f"m{i}", "rp-q")
    drain_until(conn, lambda: len(acks) + len(nacks) >= 4)
    assert sorted(acks) == [1, 2]
    assert sorted(nacks) == [3, 4]
    assert counts(conn, "rp-q")[0] == 2

    # the same through py-amqp's blocking confirm mode: MessageNacked
    conn2 = connect(confirm_publish=True)
    ch2 = conn2.channel()
    with pytest.raises(ex.MessageNacked):
        publish(ch2, "over", "rp-q")
    got = [ch.basic_get("rp-q", no_ack=True).body for _ in range(2)]
    assert got == ["m0", "m1"]


# ------------------------------------------------------------------ mandatory / return


def test_mandatory_unroutable_is_returned_with_312(connect):
    conn = connect()
    ch = conn.channel()
    returned: list[tuple[Any, str, str, amqp.Message]] = []
    ch.events["basic_return"].add(lambda exc, exch, rk, msg: returned.append((exc, exch, rk, msg)))
    ch.basic_publish(
        amqp.Message("lost", content_type="text/plain", application_headers={"h": 1}),
        exchange="amq.direct",
        routing_key="nobody-home",
        mandatory=True,
    )
    drain_until(conn, lambda: bool(returned))
    exc, exch, rk, msg = returned[0]
    assert exc.reply_code == 312
    assert "NO_ROUTE" in exc.reply_text
    assert (exch, rk) == ("amq.direct", "nobody-home")
    assert msg.body == "lost"
    assert msg.properties["content_type"] == "text/plain"
    assert msg.properties["application_headers"] == {"h": 1}

    # without mandatory nothing comes back
    returned.clear()
    ch.basic_publish(amqp.Message("lost2"), exchange="amq.direct", routing_key="nobody-home")
    drain_for(conn, 0.3)
    assert returned == []
    # a routed mandatory publish is not returned either
    ch.queue_declare("mand-q")
    ch.basic_publish(amqp.Message("kept"), exchange="", routing_key="mand-q", mandatory=True)
    drain_for(conn, 0.3)
    assert returned == []
    assert counts(conn, "mand-q")[0] == 1


# ------------------------------------------------------------------ basic.get


def test_basic_get_and_get_empty(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("get-q")
    for i in range(2):
        publish(ch, f"g{i}", "get-q", content_type="text/plain")
    m1 = ch.basic_get("get-q")
    assert m1 is not None and m1.body == "g0"
    assert m1.delivery_info["message_count"] == 1
    assert m1.delivery_info["redelivered"] is False
    assert m1.delivery_info["routing_key"] == "get-q"
    m2 = ch.basic_get("get-q")
    assert m2.body == "g1"
    assert m2.delivery_info["message_count"] == 0
    assert m2.delivery_tag == m1.delivery_tag + 1
    assert ch.basic_get("get-q") is None  # basic.get-empty
    ch.basic_ack(m2.delivery_tag, multiple=True)
    assert counts(conn, "get-q")[0] == 0
    ch.close()
    # acked with multiple: nothing is requeued when the channel closes
    assert counts(conn, "get-q")[0] == 0


def test_ack_of_unknown_tag_closes_channel_with_406(connect):
    conn = connect()
    ch = conn.channel()
    ch.basic_ack(99)
    with pytest.raises(ex.PreconditionFailed) as info:
        ch.queue_declare("after-bad-ack")
        drain_for(conn, 0.5)
    assert info.value.reply_code == 406
    ch2 = conn.channel()
    ch2.queue_declare("after-bad-ack")


# ------------------------------------------------------------------ qos


def _consume_collect(ch: amqp.Channel, queue: str, got: list[amqp.Message]) -> str:
    return ch.basic_consume(queue, callback=got.append)


def test_qos_per_consumer_limits_each_consumer(connect):
    conn = connect()
    ch = conn.channel()
    for q in ("qos-a", "qos-b"):
        ch.queue_declare(q)
        for i in range(5):
            publish(ch, f"{q}-{i}", q)
    ch.basic_qos(0, 2, False)
    got_a: list[amqp.Message] = []
    got_b: list[amqp.Message] = []
    _consume_collect(ch, "qos-a", got_a)
    _consume_collect(ch, "qos-b", got_b)
    drain_until(conn, lambda: len(got_a) >= 2 and len(got_b) >= 2)
    drain_for(conn, 0.3)
    assert (len(got_a), len(got_b)) == (2, 2)
    ch.basic_ack(got_a[0].delivery_tag)
    drain_until(conn, lambda: len(got_a) >= 3)
    drain_for(conn, 0.2)
    assert (len(got_a), len(got_b)) == (3, 2)
    assert [m.body for m in got_a] == ["qos-a-0", "qos-a-1", "qos-a-2"]


def test_qos_global_limits_the_channel(connect):
    conn = connect()
    ch = conn.channel()
    for q in ("qosg-a", "qosg-b"):
        ch.queue_declare(q)
        for i in range(5):
            publish(ch, f"{q}-{i}", q)
    ch.basic_qos(0, 3, True)
    got: list[amqp.Message] = []
    _consume_collect(ch, "qosg-a", got)
    _consume_collect(ch, "qosg-b", got)
    drain_until(conn, lambda: len(got) >= 3)
    drain_for(conn, 0.3)
    assert len(got) == 3
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    drain_until(conn, lambda: len(got) >= 6)
    drain_for(conn, 0.2)
    assert len(got) == 6
    assert counts(conn, "qosg-a")[0] + counts(conn, "qosg-b")[0] == 4


def test_basic_recover_requeues_with_redelivered(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("rec-q")
    publish(ch, "r1", "rec-q")
    got: list[amqp.Message] = []
    ch.basic_consume("rec-q", callback=got.append)
    drain_until(conn, lambda: len(got) == 1)
    assert got[0].delivery_info["redelivered"] is False
    ch.basic_recover(requeue=True)
    drain_until(conn, lambda: len(got) == 2)
    assert got[1].body == "r1"
    assert got[1].delivery_info["redelivered"] is True
    assert got[1].delivery_tag != got[0].delivery_tag
    ch.basic_ack(got[1].delivery_tag)
    drain_for(conn, 0.2)
    assert counts(conn, "rec-q")[0] == 0


def test_nack_requeue_then_reject_drop(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("nack-q")
    for i in range(3):
        publish(ch, f"n{i}", "nack-q")
    tags = [ch.basic_get("nack-q").delivery_tag for _ in range(3)]
    basic_nack(ch, tags[1], multiple=True, requeue=True)  # n0 and n1 back
    m = ch.basic_get("nack-q")
    assert m.body == "n0" and m.delivery_info["redelivered"] is True
    ch.basic_reject(m.delivery_tag, requeue=False)
    ch.basic_reject(tags[2], requeue=False)
    m = ch.basic_get("nack-q")
    assert m.body == "n1"
    ch.basic_ack(m.delivery_tag)
    assert ch.basic_get("nack-q") is None


# ------------------------------------------------------------------ queues


def test_exclusive_queue_locked_and_deleted_with_owner(connect):
    owner = connect()
    other = connect()
    och = owner.channel()
    och.queue_declare("excl-q", exclusive=True)
    publish(och, "mine", "excl-q")
    for attempt in (
        lambda c: c.queue_declare("excl-q", passive=True),
        lambda c: c.queue_declare("excl-q"),
        lambda c: c.basic_consume("excl-q", callback=lambda m: None),
        lambda c: c.basic_get("excl-q"),
        lambda c: c.queue_delete("excl-q"),
    ):
        ch = other.channel()
        with pytest.raises(ex.ResourceLocked) as info:
            attempt(ch)
        assert info.value.reply_code == 405
        assert "excl-q" in info.value.reply_text
    # the owner's channels are untouched
    assert och.basic_get("excl-q", no_ack=True).body == "mine"
    owner.close()
    ch = other.channel()
    with pytest.raises(ex.NotFound):
        ch.queue_declare("excl-q", passive=True)


def test_auto_delete_queue_goes_with_last_consumer(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("ad-q", auto_delete=True)
    t1 = ch.basic_consume("ad-q", callback=lambda m: None)
    t2 = ch.basic_consume("ad-q", callback=lambda m: None)
    ch.basic_cancel(t1)
    assert counts(conn, "ad-q") == (0, 1)
    ch.basic_cancel(t2)
    ch2 = conn.channel()
    with pytest.raises(ex.NotFound):
        ch2.queue_declare("ad-q", passive=True)


def test_server_named_queue(connect):
    conn = connect()
    ch = conn.channel()
    ok = ch.queue_declare("", exclusive=True)
    assert ok.queue.startswith("amq.gen-")
    assert ok.message_count == 0 and ok.consumer_count == 0
    ok2 = ch.queue_declare("", exclusive=True)
    assert ok2.queue != ok.queue
    publish(ch, "to-gen", ok.queue)
    assert ch.basic_get(ok.queue, no_ack=True).body == "to-gen"
    # the amq. prefix is reserved for the server
    with pytest.raises(ex.AccessRefused):
        ch.queue_declare("amq.mine")


def test_passive_declare_of_missing_queue_404_keeps_connection(connect):
    conn = connect()
    ch = conn.channel()
    with pytest.raises(ex.NotFound) as info:
        ch.queue_declare("nope", passive=True)
    assert info.value.reply_code == 404
    assert "nope" in info.value.reply_text
    # py-amqp re-opened the same channel id at once; both it and a new channel work
    ch.queue_declare("yes")
    ch3 = conn.channel()
    assert ch3.queue_declare("yes", passive=True).queue == "yes"
    assert conn.connected


def test_redeclare_with_different_arguments_406(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("redecl", arguments={"x-max-length": 10})
    ch.queue_declare("redecl", arguments={"x-max-length": 10})  # same: fine
    with pytest.raises(ex.PreconditionFailed) as info:
        ch.queue_declare("redecl", arguments={"x-max-length": 20})
    assert info.value.reply_code == 406
    assert "x-max-length" in info.value.reply_text
    with pytest.raises(ex.PreconditionFailed):
        ch.queue_declare("redecl", durable=True, arguments={"x-max-length": 10})
    # exchanges too
    ch.exchange_declare("redecl-ex", "direct")
    with pytest.raises(ex.PreconditionFailed):
        ch.exchange_declare("redecl-ex", "fanout")


def test_declare_ok_counts_are_accurate(connect):
    conn = connect()
    ch = conn.channel()
    ok = ch.queue_declare("cnt-q")
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    for i in range(5):
        publish(ch, f"c{i}", "cnt-q")
    assert counts(conn, "cnt-q") == (5, 0)
    cch = conn.channel()
    cch.basic_qos(0, 2, False)
    got: list[amqp.Message] = []
    cch.basic_consume("cnt-q", callback=got.append)
    cch2 = conn.channel()
    cch2.basic_qos(0, 1, False)
    cch2.basic_consume("cnt-q", callback=got.append)
    drain_until(conn, lambda: len(got) == 3)
    ok = ch.queue_declare("cnt-q")  # non-passive redeclare reports the same figures
    assert (ok.message_count, ok.consumer_count) == (2, 2)


def test_purge_and_delete_counts_and_conditions(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("pd-q", auto_delete=False)  # py-amqp's default is auto_delete=True
    for i in range(4):
        publish(ch, f"p{i}", "pd-q")
    assert ch.queue_purge("pd-q") == 4
    assert counts(conn, "pd-q")[0] == 0

    publish(ch, "x", "pd-q")
    with pytest.raises(ex.PreconditionFailed) as info:
        ch.queue_delete("pd-q", if_empty=True)
    assert info.value.reply_code == 406
    cch = conn.channel()
    consumed: list[amqp.Message] = []
    cch.basic_consume("pd-q", callback=consumed.append, no_ack=True)
    drain_until(conn, lambda: len(consumed) == 1)
    ch2 = conn.channel()
    with pytest.raises(ex.PreconditionFailed) as info:
        ch2.queue_delete("pd-q", if_unused=True)
    assert info.value.reply_code == 406
    assert counts(conn, "pd-q")[1] == 1  # still there
    publish(ch2, "y", "pd-q")
    publish(ch2, "z", "nothing")
    drain_until(conn, lambda: len(consumed) == 2)
    cch.close()
    ch3 = conn.channel()
    for i in range(2):
        publish(ch3, f"d{i}", "pd-q")
    assert ch3.queue_delete("pd-q") == 2
    with pytest.raises(ex.NotFound):
        ch3.queue_declare("pd-q", passive=True)


def test_consumer_gets_basic_cancel_when_queue_deleted(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("cancel-me")
    cancelled: list[str] = []
    tag = ch.basic_consume("cancel-me", callback=lambda m: None, on_cancel=cancelled.append)
    other = connect()
    assert other.channel().queue_delete("cancel-me") == 0
    drain_until(conn, lambda: bool(cancelled))
    assert cancelled == [tag]
    assert tag not in ch.callbacks
    # the channel stays usable
    ch.queue_declare("cancel-me-2")


def test_channel_reopen_after_broker_close_many_times(connect):
    conn = connect()
    ch = conn.channel()
    cid = ch.channel_id
    for i in range(10):
        with pytest.raises(ex.NotFound):
            ch.queue_declare(f"missing-{i}", passive=True)
        assert ch.channel_id == cid and ch.is_open
        ch.queue_declare(f"present-{i}", auto_delete=False)
    # an explicit re-open of a closed id, as clients that manage ids do
    ch.close()
    again = conn.channel(cid)
    assert again.queue_declare("present-0", passive=True).queue == "present-0"


# ------------------------------------------------------------------ tx


def test_tx_publish_visible_only_after_commit(connect):
    conn = connect()
    watcher = connect()
    ch = conn.channel()
    ch.queue_declare("tx-q")
    ch.tx_select()
    publish(ch, "t1", "tx-q")
    publish(ch, "t2", "tx-q")
    assert counts(watcher, "tx-q")[0] == 0
    ch.tx_commit()
    assert counts(watcher, "tx-q")[0] == 2
    publish(ch, "t3", "tx-q")
    ch.tx_rollback()
    ch.tx_commit()
    assert counts(watcher, "tx-q")[0] == 2


def test_tx_acks_apply_at_commit_only(connect):
    conn = connect()
    watcher = connect()
    setup = conn.channel()
    setup.queue_declare("txa-q")
    for i in range(2):
        publish(setup, f"a{i}", "txa-q")
    ch = conn.channel()
    ch.tx_select()
    m0 = ch.basic_get("txa-q")
    m1 = ch.basic_get("txa-q")
    ch.basic_ack(m0.delivery_tag)
    ch.tx_commit()  # a0 is gone for good
    ch.basic_ack(m1.delivery_tag)
    ch.tx_rollback()  # the ack of a1 is discarded: a1 stays unacked
    ch.close()  # ... so closing the channel requeues it
    wch = watcher.channel()
    m = wch.basic_get("txa-q", no_ack=True)
    assert m is not None and m.body == "a1"
    assert m.delivery_info["redelivered"] is True
    assert wch.basic_get("txa-q") is None


def test_tx_and_confirm_are_exclusive(connect):
    conn = connect()
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(ex.PreconditionFailed):
        ch.confirm_select()
    ch2 = conn.channel()
    with pytest.raises(ex.PreconditionFailed):
        ch2.tx_commit()


# ------------------------------------------------------------------ heartbeats


HB_LIMITS = "<limits><heartbeat>1s</heartbeat></limits>"


def test_heartbeat_negotiated_and_client_that_ticks_stays_connected(broker_factory, connect):
    b = broker_factory(limits=HB_LIMITS)
    conn = connect(b, heartbeat=1)
    assert conn.heartbeat == 1
    ch = conn.channel()
    ch.queue_declare("hb-q")
    recv_before = conn.bytes_recv
    deadline = time.monotonic() + 2.6
    while time.monotonic() < deadline:
        conn.heartbeat_tick()
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass
    assert conn.bytes_recv > recv_before  # the broker sent heartbeats while idle
    assert ch.queue_declare("hb-q", passive=True).queue == "hb-q"
    assert len(b.broker.connections) == 1


def _read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    hdr = _recv_exact(sock, 7)
    ftype, chan, size = struct.unpack(">BHI", hdr)
    payload = _recv_exact(sock, size + 1)
    assert payload[-1] == 0xCE
    return ftype, chan, payload[:-1]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("closed by broker")
        buf += chunk
    return buf


def _method_id(payload: bytes) -> tuple[int, int]:
    return struct.unpack(">HH", payload[:4])


def test_silent_client_is_dropped_after_two_heartbeat_intervals(broker_factory):
    b = broker_factory(limits=HB_LIMITS)
    sock = socket.create_connection(("127.0.0.1", b.port), timeout=5)
    try:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        assert _method_id(_read_frame(sock)[2]) == (10, 10)  # start
        sock.sendall(
            ServerCodec.encode_method(
                0,
                "connection.start_ok",
                {"product": "raw"},
                "PLAIN",
                b"\x00guest\x00guest",
                "en_US",
            )
        )
        ftype, _, payload = _read_frame(sock)
        assert _method_id(payload) == (10, 30)  # tune
        _chmax, _fmax, hb = struct.unpack(">HIH", payload[4:12])
        assert hb == 1
        sock.sendall(ServerCodec.encode_method(0, "connection.tune_ok", 0, 131072, 1))
        sock.sendall(ServerCodec.encode_method(0, "connection.open", "/", "", False))
        assert _method_id(_read_frame(sock)[2]) == (10, 41)  # open-ok
        opened = time.monotonic()
        # now silent: the broker still heartbeats us, then gives up on us
        heartbeats = 0
        sock.settimeout(4.5)
        closed_at = None
        while time.monotonic() - opened < 4.5:
            try:
                ftype, chan, _ = _read_frame(sock)
            except (ConnectionResetError, OSError):
                closed_at = time.monotonic()
                break
            if ftype == 8:
                assert chan == 0
                heartbeats += 1
        assert closed_at is not None, "broker kept a silent client connected"
        silent_for = closed_at - opened
        assert 1.5 <= silent_for <= 3.6, silent_for
        assert heartbeats >= 2  # every heartbeat/2 while idle
    finally:
        sock.close()
    deadline = time.monotonic() + 2
    while b.broker.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not b.broker.connections


def test_heartbeat_zero_is_accepted(broker_factory, connect):
    b = broker_factory(limits=HB_LIMITS)
    conn = connect(b, heartbeat=0)
    assert conn.heartbeat == 0
    ch = conn.channel()
    drain_for(conn, 2.2)  # no heartbeats either way; not dropped
    assert ch.queue_declare("hb0", passive=False).queue == "hb0"


# ------------------------------------------------------------------ blocked / auth / vhost


def test_connection_blocked_and_unblocked(broker, connect):
    events: list[tuple[str, Any]] = []
    conn = connect(
        on_blocked=lambda reason: events.append(("blocked", reason)),
        on_unblocked=lambda: events.append(("unblocked", None)),
    )
    broker.call(lambda: broker.broker.set_alarm("memory"))
    drain_until(conn, lambda: len(events) >= 1)
    assert events[0][0] == "blocked"  # py-amqp does not pass the broker's reason on
    # a connection opened during the alarm is told at once
    late: list[str] = []
    conn2 = connect(on_blocked=late.append)
    drain_until(conn2, lambda: bool(late))
    broker.call(lambda: broker.broker.set_alarm(None))
    drain_until(conn, lambda: len(events) >= 2)
    assert events[1] == ("unblocked", None)
    ch = conn.channel()
    ch.queue_declare("after-alarm")
    publish(ch, "ok", "after-alarm")
    assert counts(conn, "after-alarm")[0] == 1


def test_authentication_failure_is_access_refused(broker):
    c = amqp.Connection(
        f"127.0.0.1:{broker.port}", userid="guest", password="wrong", connect_timeout=5
    )
    with pytest.raises(ex.AccessRefused) as info:
        c.connect()
    assert info.value.reply_code == 403
    assert "ACCESS_REFUSED" in info.value.reply_text
    c2 = amqp.Connection(
        f"127.0.0.1:{broker.port}", userid="nobody", password="guest", connect_timeout=5
    )
    with pytest.raises(ex.AccessRefused):
        c2.connect()


def test_unknown_vhost_is_not_allowed(broker, connect):
    c = amqp.Connection(
        f"127.0.0.1:{broker.port}",
        userid="guest",
        password="guest",
        virtual_host="missing-vhost",
        connect_timeout=5,
    )
    with pytest.raises(ex.NotAllowed) as info:
        c.connect()
    assert info.value.reply_code == 530
    # the configured second vhost works and is separate from "/"
    conn = connect(virtual_host="other")
    ch = conn.channel()
    ch.queue_declare("only-in-other")
    root = connect()
    with pytest.raises(ex.NotFound):
        root.channel().queue_declare("only-in-other", passive=True)


def test_amqplain_login(broker, connect):
    conn = connect(login_method="AMQPLAIN")
    assert conn.channel().queue_declare("amqplain-q").queue == "amqplain-q"


# ------------------------------------------------------------------ shutdown


def test_graceful_shutdown_sends_connection_forced(broker_factory, connect):
    b = broker_factory()
    conn = connect(b)
    conn.channel().queue_declare("shut-q")
    stopper = threading.Thread(target=b.stop, daemon=True)
    stopper.start()
    try:
        with pytest.raises(ex.ConnectionForced) as info:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
        assert info.value.reply_code == 320
        assert "CONNECTION_FORCED" in info.value.reply_text
    finally:
        stopper.join(10)
    assert not stopper.is_alive()


# ------------------------------------------------------------------ content header round trip


def test_content_properties_round_trip(connect):
    # record the raw content-header frames the client receives
    raw_headers: list[bytes] = []

    def recording_frame_handler(connection: Any, callback: Any) -> Any:
        inner = default_frame_handler(connection, callback)

        def on_frame(frame: Any) -> Any:
            if frame[0] == 2:
                raw_headers.append(bytes(frame[2]))
            return inner(frame)

        return on_frame

    conn = connect(frame_handler=recording_frame_handler)
    ch = conn.channel()
    ch.queue_declare("props-q")
    ch.queue_declare("props-q2")
    headers = {
        "str": "välue",
        "int": 42,
        "neg": -7,
        "big": 2**40,
        "float": 1.5,
        "bool": True,
        "false": False,
        "none": None,
        "decimal": Decimal("12.345"),
        "ts": dt.datetime(2024, 5, 17, 12, 30, 45),
        "array": [1, "two", [3, 4], {"five": 5}, None, Decimal("-0.5")],
        "nested": {"a": {"b": {"c": [True, "deep"]}}, "empty": {}, "list": []},
    }
    props = dict(
        content_type="application/json",
        content_encoding="utf-8",
        application_headers=headers,
        delivery_mode=2,
        priority=3,
        correlation_id="corr-1",
        reply_to="reply-q",
        expiration="60000",
        message_id="mid-1",
        timestamp=1715949045,
        type="kind",
        user_id="guest",
        app_id="tests",
    )
    body = b"\x00\xffbinary body" * 100
    sent = amqp.Message(body, **props)
    wire_props = sent._serialize_properties()
    ch.basic_publish(sent, exchange="", routing_key="props-q")
    got: list[amqp.Message] = []
    ch.basic_consume("props-q", callback=got.append, no_ack=True)
    drain_until(conn, lambda: bool(got))
    m = got[0]
    assert m.body == body
    assert m.properties == props
    got_headers = m.properties["application_headers"]
    assert type(got_headers["decimal"]) is Decimal
    assert type(got_headers["ts"]) is dt.datetime
    assert type(got_headers["bool"]) is bool
    # byte for byte: class 60, weight 0, body size, then the properties exactly as sent
    assert raw_headers[-1] == struct.pack(">HHQ", 60, 0, len(body)) + wire_props
    # basic.get returns the same bytes
    ch.basic_publish(amqp.Message(body, **props), exchange="", routing_key="props-q2")
    m2 = ch.basic_get("props-q2", no_ack=True)
    assert m2.properties == props and m2.body == body
    assert raw_headers[-1] == struct.pack(">HHQ", 60, 0, len(body)) + wire_props


def test_large_body_split_across_frames(connect):
    conn = connect(frame_max=4096)
    ch = conn.channel()
    ch.queue_declare("big-q")
    body = bytes(range(256)) * 400  # 100 KB, many frames
    ch.basic_publish(amqp.Message(body), exchange="", routing_key="big-q")
    m = ch.basic_get("big-q", no_ack=True)
    assert m.body == body


def test_exclusive_consumer_refuses_others_with_403(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("xc-q", auto_delete=False)
    tag = ch.basic_consume("xc-q", callback=lambda m: None, exclusive=True)
    ch2 = conn.channel()
    with pytest.raises(ex.AccessRefused) as info:
        ch2.basic_consume("xc-q", callback=lambda m: None)
    assert info.value.reply_code == 403
    ch.basic_cancel(tag)
    ch3 = conn.channel()
    ch3.basic_consume("xc-q", callback=lambda m: None)
    ch4 = conn.channel()
    with pytest.raises(ex.AccessRefused):  # exclusive needs the queue to itself
        ch4.basic_consume("xc-q", callback=lambda m: None, exclusive=True)


def test_redeclare_with_other_exclusive_flag_is_resource_locked(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("shared-q", auto_delete=False)
    with pytest.raises(ex.ResourceLocked) as info:
        ch.queue_declare("shared-q", exclusive=True, auto_delete=False)
    assert info.value.reply_code == 405
    ch.queue_declare("own-excl-q", exclusive=True, auto_delete=False)
    with pytest.raises(ex.ResourceLocked):
        ch.queue_declare("own-excl-q", exclusive=False, auto_delete=False)
    assert ch.queue_declare("own-excl-q", exclusive=True, auto_delete=False).queue == "own-excl-q"


def test_invalid_expiration_is_406(connect):
    conn = connect()
    ch = conn.channel()
    ch.queue_declare("bad-exp-q", auto_delete=False)
    ch.basic_publish(amqp.Message("x", expiration="soon"), routing_key="bad-exp-q")
    with pytest.raises(ex.PreconditionFailed) as info:
        ch.queue_declare("bad-exp-q", passive=True)
    assert info.value.reply_code == 406
    assert counts(conn, "bad-exp-q")[0] == 0


@pytest.mark.parametrize("how", ["reject", "requeue-past-delivery-limit"])
def test_a_settle_without_requeue_frees_the_prefetch_slot(connect, how):
    conn = connect()
    ch = conn.channel()
    args = {"x-delivery-limit": 0} if how != "reject" else {}
    ch.queue_declare("slot", auto_delete=False, arguments=args)
    for i in range(3):
        ch.basic_publish(amqp.Message(f"m{i}"), routing_key="slot")
    ch.basic_qos(0, 1, False)
    got: list[amqp.Message] = []
    ch.basic_consume("slot", callback=got.append)
    drain_until(conn, lambda: len(got) == 1)
    tag = got[0].delivery_tag
    # requeue=True over a delivery limit of 0: the message is dropped, not requeued
    ch.basic_reject(tag, requeue=how != "reject")
    drain_until(conn, lambda: len(got) == 2, timeout=2.0)
    assert got[1].body == "m1"

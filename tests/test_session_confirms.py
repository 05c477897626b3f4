"""Publisher confirms coalesced per loop turn, checked on the wire without sockets.

A :class:`plugbroker.session.Connection` runs over a fake transport: the test feeds it the bytes a
client would send (built with the broker's own method table, :mod:`rawclient`), ends the loop
turn by hand (``Broker.end_of_turn``, as the server does after each read) and decodes every
frame the broker wrote. Confirms that fall due in one turn go out as one ``basic.ack`` with
``multiple=true`` for a run of consecutive sequence numbers; a nack, or a publish still waiting
for the disk, ends a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rawclient import (
    PROTOCOL_HEADER,
    decode_method,
    method_frame,
    parse_frames,
    plain_response,
    properties_bytes,
    publish_frames,
)

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.config import parse_config
from plugbroker.session import Connection
from plugbroker.store import MemoryStore

CONFIG = """<broker>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <virtualhost name="/"/>
</broker>"""

PERSISTENT = properties_bytes(delivery_mode=2)


class WireTransport:
    """Collects what the broker writes; counts writes (one per turn and connection)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes += 1

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class BatchStore(MemoryStore):
    """A durable store whose batches reach the disk only when the test says so."""

    durable = True

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] = []

    def after_durable(
        self, callback: Callable[[], None], on_failure: Callable[[], None] | None = None
    ) -> None:
        self.waiting.append(callback)

    def commit(self) -> None:
        """One batch is on disk: run its callbacks (on the loop, as the real store does)."""
        callbacks, self.waiting = self.waiting, []
        for cb in callbacks:
            cb()


class Client:
    """One connection, opened and with channel 1 in confirm mode."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.broker = Broker(parse_config(CONFIG), clock=ManualClock(), store=store)
        self.wire = WireTransport()
        self.conn = Connection(self.broker, self.wire, "127.0.0.1:40000")  # guest: loopback only
        self.seen = 0
        self.send(PROTOCOL_HEADER)
        self.expect("connection.start")
        self.send(
            method_frame(0, "connection.start_ok", {}, "PLAIN", plain_response(), "en_US")
            + method_frame(0, "connection.tune_ok", 0, 131072, 0)
            + method_frame(0, "connection.open", "/", "", False)
            + method_frame(1, "channel.open", "")
            + method_frame(1, "confirm.select", False)
        )
        assert self.names() == [
            "connection.tune",
            "connection.open_ok",
            "channel.open_ok",
            "confirm.select_ok",
        ]

    def send(self, data: bytes) -> None:
        """One read from the socket, then the end of the loop turn."""
        self.conn.data_received(data)
        self.broker.end_of_turn()

    def frames(self) -> list[tuple[str, tuple[Any, ...]]]:
        """Methods written since the last call (content frames shown as ``content``)."""
        frames, rest = parse_frames(bytes(self.wire.data[self.seen :]))
        assert rest == b""
        self.seen = len(self.wire.data)
        return [decode_method(p) if t == 1 else ("content", ()) for t, _ch, p in frames]

    def names(self) -> list[str]:
        return [name for name, _ in self.frames()]

    def expect(self, name: str) -> tuple[Any, ...]:
        got = self.frames()
        assert [n for n, _ in got] == [name], got
        return got[0][1]

    def declare(self, queue: str, **arguments: Any) -> None:
        self.send(
            method_frame(1, "queue.declare", 0, queue, False, True, False, False, False, arguments)
        )
        self.expect("queue.declare_ok")


def confirms(frames: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, int, bool]]:
    """``(ack|nack, tag, multiple)`` of each confirm, in order."""
    return [
        (name.removeprefix("basic."), args[0], args[1])
        for name, args in frames
        if name in ("basic.ack", "basic.nack")
    ]


def test_pipelined_publishes_in_one_read_get_one_multiple_ack() -> None:
    c = Client()
    c.declare("q")
    writes = c.wire.writes
    c.send(b"".join(publish_frames(1, "", "q", b"m%d" % i) for i in range(100)))
    assert confirms(c.frames()) == [("ack", 100, True)]
    assert c.wire.writes == writes + 1
    assert c.broker.vhosts["/"].queues["q"].ready_count == 100


def test_a_single_confirm_is_not_multiple() -> None:
    c = Client()
    c.declare("q")
    for seq in (1, 2, 3):
        c.send(publish_frames(1, "", "q", b"one"))
        assert confirms(c.frames()) == [("ack", seq, False)]


def test_a_nack_breaks_the_run() -> None:
    c = Client()
    c.declare("q")
    c.declare("full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    c.send(publish_frames(1, "", "full", b"fills it"))
    assert confirms(c.frames()) == [("ack", 1, False)]
    targets = ["q", "q", "full", "q", "q", "q", "full", "full", "q"]  # seqs 2..10
    c.send(b"".join(publish_frames(1, "", t, b"x") for t in targets))
    assert confirms(c.frames()) == [
        ("ack", 3, True),
        ("nack", 4, False),
        ("ack", 7, True),
        ("nack", 8, False),
        ("nack", 9, False),
        ("ack", 10, False),
    ]


def test_a_return_still_comes_before_the_confirm_of_its_publish() -> None:
    c = Client()
    c.declare("q")
    data = (
        publish_frames(1, "", "q", b"a")
        + publish_frames(1, "", "nowhere", b"b", mandatory=True)
        + publish_frames(1, "", "q", b"c")
    )
    c.send(data)
    assert c.frames() == [
        ("basic.return", (312, "NO_ROUTE", "", "nowhere")),
        ("content", ()),  # header
        ("content", ()),  # body
        ("basic.ack", (3, True)),
    ]


def test_confirms_due_before_a_channel_error_go_out_before_the_close() -> None:
    c = Client()
    c.declare("q")
    c.send(
        publish_frames(1, "", "q", b"a")
        + publish_frames(1, "", "q", b"b")
        + publish_frames(1, "no-such-exchange", "q", b"c")
    )
    got = c.frames()
    assert [n for n, _ in got] == ["basic.ack", "channel.close"]
    assert got[0][1] == (2, True)
    assert got[1][1][0] == 404


def test_confirms_due_before_another_reply_go_out_before_it() -> None:
    c = Client()
    c.declare("q")
    c.send(
        publish_frames(1, "", "q", b"a")
        + publish_frames(1, "", "q", b"b")
        + method_frame(1, "queue.declare", 0, "q", True, False, False, False, False, {})
        + publish_frames(1, "", "q", b"c")
    )
    got = c.frames()
    assert got[:2] == [("basic.ack", (2, True)), ("queue.declare_ok", ("q", 2, 0))]
    assert got[2:] == [("basic.ack", (3, False))]


def test_confirms_of_two_channels_coalesce_each_on_its_own() -> None:
    c = Client()
    c.declare("q")
    c.send(method_frame(2, "channel.open", "") + method_frame(2, "confirm.select", False))
    assert c.names() == ["channel.open_ok", "confirm.select_ok"]
    c.send(
        b"".join(
            publish_frames(1, "", "q", b"a") + publish_frames(2, "", "q", b"b") for _ in range(3)
        )
    )
    frames, _ = parse_frames(bytes(c.wire.data[c.seen :]))
    got = sorted((ch, decode_method(p)) for _t, ch, p in frames)
    assert got == [(1, ("basic.ack", (3, True))), (2, ("basic.ack", (3, True)))]


def test_one_store_batch_releases_one_multiple_ack() -> None:
    store = BatchStore()
    c = Client(store)
    c.declare("dq")  # durable
    c.send(b"".join(publish_frames(1, "", "dq", b"p", PERSISTENT) for _ in range(50)))
    assert confirms(c.frames()) == []  # not on disk yet
    store.commit()
    c.broker.end_of_turn()
    assert confirms(c.frames()) == [("ack", 50, True)]


def test_a_run_never_passes_a_publish_still_waiting_for_the_disk() -> None:
    store = BatchStore()
    c = Client(store)
    c.declare("dq")
    c.send(method_frame(1, "queue.declare", 0, "tq", False, False, False, False, False, {}))
    c.expect("queue.declare_ok")
    c.send(
        publish_frames(1, "", "tq", b"1")  # transient
        + publish_frames(1, "", "tq", b"2")
        + publish_frames(1, "", "dq", b"3", PERSISTENT)  # waits for the disk
        + publish_frames(1, "", "tq", b"4")
        + publish_frames(1, "", "tq", b"5")
    )
    # 1..2 may be one ack; 4 and 5 must not be acked with multiple=true while 3 is pending
    assert confirms(c.frames()) == [("ack", 2, True), ("ack", 4, False), ("ack", 5, False)]
    store.commit()
    c.broker.end_of_turn()
    assert confirms(c.frames()) == [("ack", 3, False)]
    # nothing pending any more: a run may start again
    c.send(publish_frames(1, "", "tq", b"6") + publish_frames(1, "", "dq", b"7", PERSISTENT))
    assert confirms(c.frames()) == [("ack", 6, False)]
    c.send(publish_frames(1, "", "tq", b"8"))
    assert confirms(c.frames()) == [("ack", 8, False)]
    store.commit()
    c.broker.end_of_turn()
    assert confirms(c.frames()) == [("ack", 7, False)]


def test_a_batch_that_lands_with_later_transient_confirms_coalesces_them_in_order() -> None:
    store = BatchStore()
    c = Client(store)
    c.declare("dq")
    c.send(method_frame(1, "queue.declare", 0, "tq", False, False, False, False, False, {}))
    c.expect("queue.declare_ok")
    c.send(
        publish_frames(1, "", "dq", b"1", PERSISTENT)
        + publish_frames(1, "", "dq", b"2", PERSISTENT)
    )
    assert confirms(c.frames()) == []
    # in one turn: two transient publishes arrive, then the batch with 1 and 2 lands
    c.conn.data_received(publish_frames(1, "", "tq", b"3") + publish_frames(1, "", "tq", b"4"))
    store.commit()
    c.broker.end_of_turn()
    assert confirms(c.frames()) == [("ack", 4, True)]


def test_confirms_of_a_channel_closed_meanwhile_are_dropped() -> None:
    store = BatchStore()
    c = Client(store)
    c.declare("dq")
    c.send(publish_frames(1, "", "dq", b"1", PERSISTENT))
    c.send(method_frame(1, "channel.close", 200, "bye", 0, 0))
    assert c.names() == ["channel.close_ok"]
    store.commit()
    c.broker.end_of_turn()
    assert c.frames() == []


@pytest.mark.parametrize("n", [1, 2, 7])
def test_py_amqp_reads_a_coalesced_ack(n: int) -> None:
    """py-amqp's own frame handler and argument decoder read what we write (the arguments
    its basic_ack event handlers are called with)."""
    from amqp.serialization import loads
    from rawclient import py_amqp_read

    c = Client()
    c.declare("q")
    c.send(b"".join(publish_frames(1, "", "q", b"x") for _ in range(n)))
    got = py_amqp_read(bytes(c.wire.data[c.seen :]))
    assert [(ch, sig) for ch, sig, _buf, _msg in got] == [(1, (60, 80))]
    args, _ = loads("Lb", got[0][2], 4)
    assert args == [n, n > 1]

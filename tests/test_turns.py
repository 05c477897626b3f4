"""Turn batching: a read ends its own turn, with no extra loop callback."""

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
    publish_frames,
)

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.compiled import in_use
from plugbroker.config import parse_config
from plugbroker.server import AMQPProtocol
from plugbroker.session import MAX_EVENTS_PER_TURN

CONFIG = """<broker>
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <virtualhost name="/"/>
</broker>"""


class RecordingLoop:
    """Stands in for the event loop: records what the broker asks to run later."""

    def __init__(self) -> None:
        self.soon: list[Callable[..., Any]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.soon.append(fn)


class StreamTransport:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else None


Wired = tuple[Broker, RecordingLoop, AMQPProtocol, StreamTransport]


@pytest.fixture
def wired() -> Wired:
    b = Broker(parse_config(CONFIG), clock=ManualClock())
    loop = RecordingLoop()
    b.loop = loop  # type: ignore[assignment]
    proto = AMQPProtocol(b)
    transport = StreamTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    return b, loop, proto, transport


def test_a_read_writes_its_answer_without_scheduling_a_callback(wired: Wired) -> None:
    b, loop, proto, transport = wired
    proto.data_received(PROTOCOL_HEADER)
    frames, _ = parse_frames(bytes(transport.data))
    assert [decode_method(p)[0] for _t, _c, p in frames] == ["connection.start"]
    assert b.end_of_turn not in loop.soon


def test_outside_a_read_the_turn_is_a_loop_callback(wired: Wired) -> None:
    b, loop, proto, transport = wired
    conn = proto.conn
    assert conn is not None
    conn.send(0, "connection.blocked", "test")  # e.g. from a timer or another thread's call
    assert loop.soon == [b.end_of_turn]
    assert transport.data == b""
    loop.soon.pop()()
    assert transport.data != b""


@pytest.mark.skipif(
    "plugbroker.session" in in_use(),
    reason="compiled build: a compiled Connection's methods cannot be patched on an instance",
)
def test_a_read_that_raises_still_ends_its_turn(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, loop, proto, transport = wired
    conn = proto.conn
    assert conn is not None

    def boom(data: bytes) -> None:
        conn.send(0, "connection.blocked", "test")
        raise RuntimeError("bug")

    monkeypatch.setattr(conn, "data_received", boom)
    with pytest.raises(RuntimeError):
        proto.data_received(b"x")
    assert transport.data != b""  # the turn ended: its output was written
    # and later work is scheduled again as usual
    conn.send(0, "connection.unblocked")
    assert loop.soon == [b.end_of_turn]


def test_the_turn_budget_is_carried_across_reads(wired: Wired) -> None:
    """libuv (uvloop) reads a readable socket up to 32 times in one loop iteration: a flood
    arriving in many small reads must still yield the loop once its budget is used."""
    _b, loop, proto, transport = wired
    paused: list[bool] = []
    transport.pause_reading = lambda: paused.append(True)  # type: ignore[method-assign]
    proto.data_received(PROTOCOL_HEADER)
    start_ok = method_frame(0, "connection.start_ok", {}, "PLAIN", plain_response(), "en_US")
    proto.data_received(start_ok)
    proto.data_received(method_frame(0, "connection.tune_ok", 0, 131072, 0))
    proto.data_received(method_frame(0, "connection.open", "/", "", False))
    proto.data_received(method_frame(1, "channel.open", ""))
    conn = proto.conn
    assert conn is not None and conn.state.name == "OPEN"
    one = publish_frames(1, "", "nowhere", b"x")  # one publish per read
    reads = 0
    while not paused and reads < MAX_EVENTS_PER_TURN:
        proto.data_received(one)
        reads += 1
    assert paused, "a publish per read never used up the turn's budget"
    assert conn.process in loop.soon  # it carries on at the next turn
    assert conn.turn_used == 0
    loop.soon.remove(conn.process)
    conn.process()  # the next turn: nothing buffered, reading resumes, the budget is fresh
    assert not conn.reading_paused

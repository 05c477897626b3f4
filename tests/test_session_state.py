"""The connection state machine: the table on its own, then a real Connection over a fake
transport walked into every state and handed every trigger (no sockets, no loop, manual clock).
"""

from __future__ import annotations

from typing import Any

import pytest
from rawclient import decode_method, method_frame, parse_frames, plain_response

from plugbroker import session
from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.codec import events as ev
from plugbroker.codec.frames import PROTOCOL_HEADER
from plugbroker.codec.ids import (
    CONNECTION_UPDATE_SECRET,
    NO_METHOD,
    QUEUE_DECLARE,
    MethodId,
)
from plugbroker.config import parse_config
from plugbroker.errors import COMMAND_INVALID, NOT_IMPLEMENTED, ConnectionError_
from plugbroker.session import Connection
from plugbroker.session_state import (
    CLIENT_TRIGGERS,
    CONNECTION_METHODS,
    DISCARDING,
    HANDSHAKE,
    LIVE,
    REFUSED_CODE,
    TRANSITIONS,
    ConnectionState,
    Trigger,
    channel_zero_trigger,
    next_state,
)

S = ConnectionState
T = Trigger

CONFIG = """<broker>
  <users><user name="guest" password="guest" vhosts="/"/>
    <user name="victim" password="pw" vhosts="/"/><user name="bystander" password="pw" vhosts="/"/>
  </users>
  <virtualhost name="/"/>
</broker>"""


# ------------------------------------------------------------------ the table alone


def test_the_handshake_is_one_path_from_header_to_open() -> None:
    state = S.AWAIT_HEADER
    for trigger in (T.HEADER, T.START_OK, T.TUNE_OK, T.OPEN):
        nxt = next_state(state, trigger)
        assert nxt is not None
        # no other handshake step is allowed in this state
        others = {T.HEADER, T.START_OK, T.TUNE_OK, T.OPEN} - {trigger}
        assert all(next_state(state, o) is None for o in others), state
        state = nxt
    assert state is S.OPEN


def test_closed_is_final_and_every_live_state_can_end() -> None:
    assert not [key for key in TRANSITIONS if key[0] is S.CLOSED]
    for s in LIVE:
        assert next_state(s, T.DROP) is S.CLOSED
        assert next_state(s, T.LOST) is S.CLOSED
        assert next_state(s, T.HEARTBEAT) is s


def test_only_open_carries_channel_traffic() -> None:
    assert [s for s in S if next_state(s, T.CHANNEL_METHOD) is not None] == [S.OPEN]
    assert next_state(S.OPEN, T.CHANNEL_METHOD) is S.OPEN


def test_closing_waits_for_close_or_close_ok_only() -> None:
    allowed = {t for t in CLIENT_TRIGGERS if next_state(S.CLOSING, t) is not None}
    assert allowed == {T.CLOSE, T.CLOSE_OK, T.HEARTBEAT}
    assert next_state(S.CLOSING, T.CLOSE) is S.CLOSED
    assert next_state(S.CLOSING, T.CLOSE_OK) is S.CLOSED
    assert next_state(S.CLOSING, T.SEND_CLOSE) is None
    assert DISCARDING == {S.CLOSING}


def test_stray_methods_are_never_allowed() -> None:
    assert all(next_state(s, T.STRAY) is None for s in S)
    assert channel_zero_trigger(ev.QueueDeclare) is T.STRAY
    assert channel_zero_trigger(ev.UnexpectedMethod) is T.STRAY
    for cls, trigger in CONNECTION_METHODS.items():
        assert channel_zero_trigger(cls) is trigger
        assert cls.NAME == trigger.value  # type: ignore[attr-defined]


def test_every_state_is_reachable() -> None:
    seen = {S.AWAIT_HEADER}
    frontier = [S.AWAIT_HEADER]
    while frontier:
        s = frontier.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is s and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(S)
    assert HANDSHAKE == {S.AWAIT_HEADER, S.AWAIT_START_OK, S.AWAIT_TUNE_OK, S.AWAIT_OPEN}
    assert REFUSED_CODE == COMMAND_INVALID == 503


# ------------------------------------------------------------------ a Connection over a fake wire


class FakeTransport:
    """What the asyncio adapter gives the session: collects writes, records close/pause."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.data += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def methods(self) -> list[tuple[int, str, tuple[Any, ...]]]:
        """The method frames written since the last call, as ``(channel, name, args)``."""
        frames, rest = parse_frames(bytes(self.data))
        assert rest == b""
        self.data.clear()
        out = []
        for ftype, channel, payload in frames:
            if ftype == 1:
                name, args = decode_method(payload)
                out.append((channel, name, args))
        return out


def _start_ok() -> bytes:
    return method_frame(0, "connection.start_ok", {}, "PLAIN", plain_response(), "en_US")


#: bytes that bring a fresh connection into each state (CLOSING and CLOSED are made below)
_STEPS = {
    S.AWAIT_HEADER: b"",
    S.AWAIT_START_OK: PROTOCOL_HEADER,
    S.AWAIT_TUNE_OK: PROTOCOL_HEADER + _start_ok(),
    S.AWAIT_OPEN: PROTOCOL_HEADER
    + _start_ok()
    + method_frame(0, "connection.tune_ok", 0, 131072, 0),
    S.OPEN: PROTOCOL_HEADER
    + _start_ok()
    + method_frame(0, "connection.tune_ok", 0, 131072, 0)
    + method_frame(0, "connection.open", "/", "", False)
    + method_frame(1, "channel.open", ""),
}


class World:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.broker = Broker(parse_config(CONFIG), clock=self.clock)
        self.transport = FakeTransport()
        self.conn = Connection(self.broker, self.transport, "127.0.0.1:40000")

    def feed(self, data: bytes) -> None:
        self.conn.data_received(data)
        self.broker.end_of_turn()

    def into(self, state: ConnectionState) -> Connection:
        """Walk the connection into ``state`` the way a client and the broker would."""
        if state in _STEPS:
            self.feed(_STEPS[state])
        elif state is S.CLOSING:
            self.feed(_STEPS[S.OPEN])
            self.conn.force_close("test")
        else:
            self.feed(_STEPS[S.OPEN])
            self.conn.connection_lost()
        assert self.conn.state is state
        self.transport.methods()  # forget the handshake's output
        return self.conn


#: one event per client trigger, as the codec would hand it over
EVENTS: dict[Trigger, Any] = {
    T.HEADER: ev.ProtocolHeader(True, PROTOCOL_HEADER),
    T.BAD_HEADER: ev.ProtocolHeader(False, b"GET / HT"),
    T.START_OK: ev.ConnectionStartOk(0, {}, "PLAIN", plain_response(), "en_US"),
    T.TUNE_OK: ev.ConnectionTuneOk(0, 0, 131072, 0),
    T.OPEN: ev.ConnectionOpen(0, "/", "", False),
    T.CLOSE: ev.ConnectionClose(0, 200, "bye", 0, 0),
    T.CLOSE_OK: ev.ConnectionCloseOk(0),
    T.UPDATE_SECRET: ev.ConnectionUpdateSecret(0, b"secret", "rotate"),
    T.STRAY: ev.QueueDeclare(0, "q", False, False, False, False, False, {}),
    T.CHANNEL_METHOD: ev.BasicQos(1, 0, 10, False),
    T.HEARTBEAT: ev.Heartbeat(0),
}

#: the method id a refusal of each trigger's event carries
EVENT_IDS: dict[Trigger, MethodId] = {
    t: getattr(e, "ID", NO_METHOD) for t, e in EVENTS.items() if t is not T.STRAY
} | {T.STRAY: QUEUE_DECLARE}

#: what the broker writes when the table allows the trigger (method names, in order)
ANSWERS: dict[tuple[ConnectionState, Trigger], list[str]] = {
    (S.AWAIT_START_OK, T.START_OK): ["connection.tune"],
    (S.AWAIT_OPEN, T.OPEN): ["connection.open_ok"],
    (S.OPEN, T.CHANNEL_METHOD): ["basic.qos_ok"],
    (S.CLOSING, T.CLOSE): ["connection.close_ok"],
    **{(s, T.CLOSE): ["connection.close_ok"] for s in HANDSHAKE - {S.AWAIT_HEADER}},
    (S.OPEN, T.CLOSE): ["connection.close_ok"],
}

# What each client trigger does in each state, written out by hand. Rows and cells name
# states by letter (H await-header, S await-start-ok, T await-tune-ok, A await-open, O open,
# C closing, X closed); a cell is the state the trigger leads to, 503 / 540 the code it is
# refused with (540: allowed, but not supported), "." that it is discarded, "-" that nothing
# is read any more.
_GRID = """
     header  bad  start  tune  open  close  close-ok  secret  stray  channel  heartbeat
H    S       X    503    503   503   503    503       503     503    503      H
S    503     503  T      503   503   X      S         503     503    503      S
T    503     503  503    A     503   X      T         503     503    503      T
A    503     503  503    503   O     X      A         503     503    503      A
O    503     503  503    503   503   X      O         540     503    O        O
C    .       .    .      .     .     X      X         .       .      .        C
X    -       -    -      -     -     -      -         -       -      -        -
"""
_COLUMNS = {
    "header": T.HEADER,
    "bad": T.BAD_HEADER,
    "start": T.START_OK,
    "tune": T.TUNE_OK,
    "open": T.OPEN,
    "close": T.CLOSE,
    "close-ok": T.CLOSE_OK,
    "secret": T.UPDATE_SECRET,
    "stray": T.STRAY,
    "channel": T.CHANNEL_METHOD,
    "heartbeat": T.HEARTBEAT,
}
_LETTERS = {
    "H": S.AWAIT_HEADER,
    "S": S.AWAIT_START_OK,
    "T": S.AWAIT_TUNE_OK,
    "A": S.AWAIT_OPEN,
    "O": S.OPEN,
    "C": S.CLOSING,
    "X": S.CLOSED,
}


def _expected() -> dict[tuple[ConnectionState, Trigger], ConnectionState | str]:
    header, *rows = _GRID.strip().splitlines()
    triggers = [_COLUMNS[c] for c in header.split()]
    out: dict[tuple[ConnectionState, Trigger], ConnectionState | str] = {}
    for row in rows:
        state, *cells = row.split()
        for trigger, cell in zip(triggers, cells, strict=True):
            out[(_LETTERS[state], trigger)] = _LETTERS.get(cell, cell)
    return out


EXPECTED = _expected()
_MATRIX = sorted(EXPECTED, key=lambda k: (list(S).index(k[0]), k[1].value))


def test_the_grid_covers_every_state_and_client_trigger_and_agrees_with_the_table() -> None:
    assert set(EVENTS) == CLIENT_TRIGGERS
    assert set(EXPECTED) == {(s, t) for s in S for t in CLIENT_TRIGGERS}
    for (state, trigger), outcome in EXPECTED.items():
        target = next_state(state, trigger)
        if outcome in ("503", ".", "-"):
            assert target is None, (state, trigger)
        elif outcome == "540":
            assert target is state, (state, trigger)
        else:
            assert target is outcome, (state, trigger)
    assert all(key in TRANSITIONS for key in ANSWERS)


@pytest.mark.parametrize("state,trigger", _MATRIX, ids=lambda x: x.value)
def test_every_state_and_client_trigger(state: ConnectionState, trigger: Trigger) -> None:
    w = World()
    conn = w.into(state)
    outcome = EXPECTED[(state, trigger)]
    event = EVENTS[trigger]
    if outcome == "-":
        # nothing is read once closed; the connection ignores what still comes
        w.feed(method_frame(0, "connection.close_ok"))
        assert conn.state is S.CLOSED and not w.transport.data
        return
    if outcome == ".":
        conn.handle(event)  # discarded: after our close only close and close-ok count
        assert conn.state is state
        assert w.transport.methods() == []
        return
    if outcome == "503":
        with pytest.raises(ConnectionError_) as info:
            conn.handle(event)
        assert info.value.code == COMMAND_INVALID
        assert info.value.method == EVENT_IDS[trigger]
        assert conn.state is state
        return
    if outcome == "540":  # allowed by the protocol, not supported here
        with pytest.raises(ConnectionError_) as info:
            conn.handle(event)
        assert info.value.code == NOT_IMPLEMENTED
        assert info.value.method == CONNECTION_UPDATE_SECRET
        assert conn.state is state
        return
    assert isinstance(outcome, ConnectionState)
    target = outcome
    conn.handle(event)
    w.broker.end_of_turn()
    assert conn.state is target
    if trigger is T.BAD_HEADER:  # answered with our own header, then closed
        assert bytes(w.transport.data) == PROTOCOL_HEADER and w.transport.closed
        return
    names = [name for _, name, _ in w.transport.methods()]
    if trigger is T.HEADER:
        assert names == ["connection.start"]
    else:
        assert names == ANSWERS.get((state, trigger), [])
    if target is S.CLOSED:
        assert w.transport.closed


@pytest.mark.parametrize("state", list(S), ids=lambda s: s.value)
def test_a_refusal_through_the_wire_closes_with_503(state: ConnectionState) -> None:
    """The same refusal end to end: a stray method on channel 0 as bytes."""
    w = World()
    conn = w.into(state)
    w.feed(method_frame(0, "queue.declare", 0, "q", False, False, False, False, False, {}))
    if state is S.AWAIT_HEADER:
        # the codec wants the protocol header first: these bytes are not one
        assert bytes(w.transport.data) == PROTOCOL_HEADER
        assert conn.state is S.CLOSED and w.transport.closed
        return
    sent = w.transport.methods()
    if state in (S.CLOSING, S.CLOSED):
        assert sent == [] and conn.state is state
    else:
        assert sent == [(0, "connection.close", (503, sent[0][2][1], 50, 10))]
        assert "unexpected queue.declare on channel 0" in sent[0][2][1]
        assert conn.state is S.CLOSING


@pytest.mark.parametrize("state", list(S), ids=lambda s: s.value)
def test_broker_send_close(state: ConnectionState) -> None:
    w = World()
    conn = w.into(state)
    conn.close(320, "CONNECTION_FORCED - test")
    target = next_state(state, T.SEND_CLOSE)
    sent = w.transport.methods()
    if target is None:  # closing or closed already: nothing more to say
        assert conn.state is state and sent == []
    elif state is S.AWAIT_HEADER:  # nobody to wait for: dropped at once
        assert conn.state is S.CLOSED and w.transport.closed
    else:
        assert conn.state is target is S.CLOSING
        assert [name for _, name, _ in sent] == ["connection.close"]
        assert not w.transport.closed


@pytest.mark.parametrize("state", list(S), ids=lambda s: s.value)
def test_broker_drop_and_transport_lost(state: ConnectionState) -> None:
    for how in ("drop", "lost"):
        w = World()
        conn = w.into(state)
        was_closed = w.transport.closed
        if how == "drop":
            conn._drop()
            target = next_state(state, T.DROP)
        else:
            conn.connection_lost()
            target = next_state(state, T.LOST)
        assert conn.state is (target or state) is (S.CLOSED if state in LIVE else state)
        if how == "drop" and state in LIVE:
            assert w.transport.closed
        if state is S.CLOSED:
            assert w.transport.closed is was_closed


@pytest.mark.parametrize("state", sorted(HANDSHAKE, key=lambda s: s.value), ids=lambda s: s.value)
def test_handshake_timeout_drops(state: ConnectionState) -> None:
    w = World()
    conn = w.into(state)
    w.clock.advance(w.broker.limits.handshake_timeout + 0.1)
    w.broker.timers.run_due()
    assert conn.state is S.CLOSED and w.transport.closed


def test_the_handshake_timer_stops_once_open() -> None:
    w = World()
    conn = w.into(S.OPEN)
    w.clock.advance(w.broker.limits.handshake_timeout + 0.1)
    w.broker.timers.run_due()
    assert conn.state is S.OPEN and not w.transport.closed


def test_closing_without_close_ok_drops_after_the_timeout() -> None:
    w = World()
    conn = w.into(S.CLOSING)
    w.broker.timers.run_due()
    assert conn.state is S.CLOSING
    w.clock.advance(w.broker.close_timeout + 0.1)
    w.broker.timers.run_due()
    assert conn.state is S.CLOSED and w.transport.closed


def test_close_ok_in_closing_closes_at_once() -> None:
    w = World()
    conn = w.into(S.CLOSING)
    w.feed(method_frame(0, "connection.close_ok"))
    assert conn.state is S.CLOSED and w.transport.closed


def test_channel_traffic_while_closing_is_discarded() -> None:
    w = World()
    conn = w.into(S.CLOSING)
    w.feed(method_frame(1, "basic.qos", 0, 10, False) + method_frame(0, "tx.select"))
    assert conn.state is S.CLOSING and w.transport.methods() == []


def test_channel_traffic_before_open_is_503() -> None:
    w = World()
    conn = w.into(S.AWAIT_OPEN)
    w.feed(method_frame(1, "basic.qos", 0, 10, False))
    (sent,) = w.transport.methods()
    assert sent[1] == "connection.close"
    code, text, class_id, method_id = sent[2]
    assert (code, class_id, method_id) == (503, 60, 10)
    assert "basic.qos before the connection was opened" in text
    assert conn.state is S.CLOSING


def test_login_refused_without_auth_failure_close_drops() -> None:
    w = World()
    conn = w.into(S.AWAIT_START_OK)
    w.feed(method_frame(0, "connection.start_ok", {}, "PLAIN", plain_response("x", "y"), "en_US"))
    # the answer to a failed login waits (login throttling); meanwhile the connection is closing
    assert conn.state is S.CLOSING and not w.transport.closed
    w.clock.advance(w.broker.limits.login_failure_delay)
    w.broker.timers.run_due()
    assert conn.state is S.CLOSED and w.transport.closed


def test_login_refused_with_auth_failure_close_sends_403() -> None:
    w = World()
    conn = w.into(S.AWAIT_START_OK)
    props = {"capabilities": {"authentication_failure_close": True}}
    w.feed(method_frame(0, "connection.start_ok", props, "PLAIN", plain_response("x"), "en_US"))
    assert w.transport.methods() == []
    w.clock.advance(w.broker.limits.login_failure_delay)
    w.broker.timers.run_due()
    (sent,) = w.transport.methods()
    assert sent[1] == "connection.close" and sent[2][0] == 403 and sent[2][2:] == (10, 11)
    assert conn.state is S.CLOSING


def test_a_failed_login_answer_is_delayed_more_each_time_and_input_meanwhile_is_discarded() -> None:
    w = World()
    props = {"capabilities": {"authentication_failure_close": True}}
    base = w.broker.limits.login_failure_delay
    for attempt in range(3):
        w.transport = FakeTransport()
        w.conn = Connection(w.broker, w.transport, f"127.0.0.1:{40001 + attempt}")
        conn = w.into(S.AWAIT_START_OK)
        w.feed(method_frame(0, "connection.start_ok", props, "PLAIN", plain_response("x"), "en_US"))
        # a pipelined tune-ok learns nothing sooner: it is discarded, not answered with 503
        w.feed(method_frame(0, "connection.tune_ok", 0, 131072, 0))
        delay = base * 2**attempt
        w.clock.advance(delay * 0.99)
        w.broker.timers.run_due()
        assert w.transport.methods() == [], attempt
        w.clock.advance(delay * 0.02)
        w.broker.timers.run_due()
        (sent,) = w.transport.methods()
        assert sent[1] == "connection.close" and sent[2][0] == 403
        assert conn.state is S.CLOSING


def test_a_server_only_method_on_a_channel_is_503_not_valid_from_a_client() -> None:
    w = World()
    conn = w.into(S.OPEN)
    w.feed(method_frame(1, "basic.qos_ok"))
    (sent,) = w.transport.methods()
    assert sent[1] == "connection.close"
    assert sent[2][0] == 503 and sent[2][2:] == (60, 11)
    assert "basic.qos_ok is not valid on a channel from a client" in sent[2][1]
    assert conn.state is S.CLOSING


def test_every_client_method_has_a_place_in_the_session() -> None:
    handled = set(session._HANDLERS) | set(CONNECTION_METHODS) | {ev.ChannelOpen, ev.Publish}
    assert handled == set(ev.CLIENT_METHODS)


def _attempt(w: World, port: int, user: str, password: str) -> tuple[Connection, FakeTransport]:
    """A login of ``user`` from 10.0.0.9."""
    t = FakeTransport()
    conn = Connection(w.broker, t, f"10.0.0.9:{port}")
    conn.data_received(
        PROTOCOL_HEADER
        + method_frame(
            0, "connection.start_ok", {}, "PLAIN", plain_response(user, password), "en_US"
        )
    )
    return conn, t


def test_a_guesser_locks_out_only_the_user_it_guesses_and_only_from_its_address() -> None:
    w = World()
    throttle = w.broker.login_throttle
    waiting = [_attempt(w, 41000 + i, "victim", f"guess{i}") for i in range(throttle.max_pending)]
    assert all(c.state is S.CLOSING and not t.closed for c, t in waiting)
    assert throttle.under_attack("victim", "10.0.0.9")
    # one more guess would wait too: it is refused at once instead (nothing more is held) ...
    conn, t = _attempt(w, 42000, "victim", "guess")
    assert conn.state is S.CLOSED and t.closed and throttle.turned_away_total == 1
    # ... and so is the right password of the user under attack: a guess is never confirmed
    conn, t = _attempt(w, 42001, "victim", "pw")
    assert conn.state is S.CLOSED and t.closed and throttle.turned_away_total == 2
    # another user's right password from the same address goes in at once
    conn, t = _attempt(w, 42002, "bystander", "pw")
    assert conn.state is S.AWAIT_TUNE_OK and not t.closed
    assert throttle.turned_away_total == 2
    # once the refusals are answered, the attacked user is still refused from there, late
    w.clock.advance(throttle.cap + w.broker.close_timeout + 0.1)
    w.broker.timers.run_due()
    assert all(c.state is S.CLOSED and tr.closed for c, tr in waiting)
    conn, t = _attempt(w, 42003, "victim", "pw")
    assert conn.state is S.CLOSING and not t.closed and throttle.locked_total == 1
    # until its record is forgotten
    w.clock.advance(throttle.forget_after + 1)
    w.broker.timers.run_due()
    conn, t = _attempt(w, 42004, "victim", "pw")
    assert conn.state is S.AWAIT_TUNE_OK and not t.closed

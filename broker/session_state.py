"""The connection's state machine: its states, what moves it, and one transition table.

A connection walks the AMQP handshake (protocol header → ``connection.start`` / ``start-ok`` →
``tune`` / ``tune-ok`` → ``open``), serves channels while ``OPEN``, and ends in ``CLOSED``,
either directly or through ``CLOSING`` (the broker sent ``connection.close`` and waits a bounded
time for ``close-ok``). Everything that can move it is a :class:`Trigger`: the client's frames
and the broker's own decisions (closing, dropping the socket, the socket going away).

:data:`TRANSITIONS` is the whole protocol in one table, ``(state, trigger) → next state``.
:class:`plugbroker.session.Connection` consults it for every frame and changes ``state`` only
through it (``Connection._advance``). A client trigger that is not in the table breaks the
protocol: it is refused with :data:`REFUSED_CODE` (503 COMMAND_INVALID), except in ``CLOSING``,
where the spec says to discard everything but ``connection.close`` and ``close-ok``
(:data:`DISCARDING`). A broker trigger that is not in the table is a no-op (the connection is
already on its way out).

Like the codec, this module does no I/O and holds no state: it is data and two small functions,
tested without a connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Final

from plugbroker.codec.events import (
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
    ConnectionUpdateSecret,
)
from plugbroker.errors import COMMAND_INVALID


class ConnectionState(Enum):
    #: a socket is open; the 8-byte protocol header has not arrived
    AWAIT_HEADER = "await-header"
    #: connection.start sent
    AWAIT_START_OK = "await-start-ok"
    #: the client logged in; connection.tune sent
    AWAIT_TUNE_OK = "await-tune-ok"
    #: limits agreed; waiting for connection.open (the virtual host)
    AWAIT_OPEN = "await-open"
    #: channels may be opened and used
    OPEN = "open"
    #: the broker sent connection.close and waits for close-ok
    CLOSING = "closing"
    #: the socket is closed or being closed; nothing more is read
    CLOSED = "closed"


class Trigger(Enum):
    # --- from the client
    #: the AMQP 0-9-1 protocol header
    HEADER = "header"
    #: any other first bytes (answered with our header, then the socket is closed)
    BAD_HEADER = "bad-header"
    START_OK = "connection.start_ok"
    TUNE_OK = "connection.tune_ok"
    OPEN = "connection.open"
    CLOSE = "connection.close"
    CLOSE_OK = "connection.close_ok"
    UPDATE_SECRET = "connection.update_secret"
    #: any other method on channel 0 (a channel-level method, or one only servers send)
    STRAY = "stray-method"
    #: a method or a publish on a channel above 0
    CHANNEL_METHOD = "channel-method"
    HEARTBEAT = "heartbeat"
    # --- from the broker
    #: the broker sends connection.close (an error, a login refused, shutdown, admin)
    SEND_CLOSE = "send-close"
    #: the broker closes the socket without (more of) a close handshake: close-ok timed out,
    #: the handshake timed out, heartbeats were missed, a login refused silently
    DROP = "drop"
    #: the transport reports the socket gone
    LOST = "lost"


S = ConnectionState
T = Trigger

#: states before OPEN: the handshake timer runs
HANDSHAKE: Final = frozenset({S.AWAIT_HEADER, S.AWAIT_START_OK, S.AWAIT_TUNE_OK, S.AWAIT_OPEN})
#: every state but CLOSED
LIVE: Final = frozenset(S) - {S.CLOSED}
#: triggers that come from the client's bytes (the rest are the broker's own)
CLIENT_TRIGGERS: Final = frozenset(T) - {T.SEND_CLOSE, T.DROP, T.LOST}
#: states that silently discard a client trigger the table does not allow
DISCARDING: Final = frozenset({S.CLOSING})
#: the reply code for a client trigger the table does not allow
REFUSED_CODE: Final = COMMAND_INVALID

_AFTER_HEADER: Final = (S.AWAIT_START_OK, S.AWAIT_TUNE_OK, S.AWAIT_OPEN, S.OPEN)

TRANSITIONS: Final[Mapping[tuple[ConnectionState, Trigger], ConnectionState]] = MappingProxyType(
    {
        # the handshake, one step at a time
        (S.AWAIT_HEADER, T.HEADER): S.AWAIT_START_OK,
        (S.AWAIT_HEADER, T.BAD_HEADER): S.CLOSED,
        (S.AWAIT_START_OK, T.START_OK): S.AWAIT_TUNE_OK,
        (S.AWAIT_TUNE_OK, T.TUNE_OK): S.AWAIT_OPEN,
        (S.AWAIT_OPEN, T.OPEN): S.OPEN,
        # open: channel traffic; update-secret is valid here (and answered 540, unsupported)
        (S.OPEN, T.CHANNEL_METHOD): S.OPEN,
        (S.OPEN, T.UPDATE_SECRET): S.OPEN,
        # the client closes: at any point after the header, or in answer to our close
        **{(s, T.CLOSE): S.CLOSED for s in (*_AFTER_HEADER, S.CLOSING)},
        # a close-ok nobody asked for is ignored; the one we wait for ends the connection
        **{(s, T.CLOSE_OK): s for s in _AFTER_HEADER},
        (S.CLOSING, T.CLOSE_OK): S.CLOSED,
        # heartbeats are welcome whenever something is listening
        **{(s, T.HEARTBEAT): s for s in LIVE},
        # the broker's side
        **{(s, T.SEND_CLOSE): S.CLOSING for s in (S.AWAIT_HEADER, *_AFTER_HEADER)},
        **{(s, T.DROP): S.CLOSED for s in LIVE},
        **{(s, T.LOST): S.CLOSED for s in LIVE},
    }
)

#: the trigger of each connection-class method a client sends on channel 0
CONNECTION_METHODS: Final[Mapping[type[object], Trigger]] = MappingProxyType(
    {
        ConnectionStartOk: T.START_OK,
        ConnectionTuneOk: T.TUNE_OK,
        ConnectionOpen: T.OPEN,
        ConnectionClose: T.CLOSE,
        ConnectionCloseOk: T.CLOSE_OK,
        ConnectionUpdateSecret: T.UPDATE_SECRET,
    }
)


def next_state(state: ConnectionState, trigger: Trigger) -> ConnectionState | None:
    """Where ``trigger`` takes a connection in ``state``; None when the table does not allow it."""
    return TRANSITIONS.get((state, trigger))


def channel_zero_trigger(event_type: type[object]) -> Trigger:
    """The trigger of a method arriving on channel 0 (:attr:`Trigger.STRAY` unless it is one
    of the connection methods a client sends)."""
    return CONNECTION_METHODS.get(event_type, T.STRAY)


__all__ = [
    "CLIENT_TRIGGERS",
    "CONNECTION_METHODS",
    "DISCARDING",
    "HANDSHAKE",
    "LIVE",
    "REFUSED_CODE",
    "TRANSITIONS",
    "ConnectionState",
    "Trigger",
    "channel_zero_trigger",
    "next_state",
]

"""The AMQP 0-9-1 method table.

Each method has its id (a named constant from :mod:`plugbroker.codec.ids`), a name, its argument
names and a py-amqp serialization format (``b`` bit, ``o`` octet, ``B`` short, ``l`` long, ``L``
long long, ``s`` shortstr, ``S``/``x`` longstr as text/bytes, ``F`` table). Argument tables are
encoded and decoded with :mod:`amqp.serialization`; only the four hot methods (publish,
deliver, ack, and the content header) have hand-written fast paths in
:mod:`plugbroker.codec.frames`, checked against this table by the tests.

A method a client may send also has its event class (:mod:`plugbroker.codec.events`); the table
checks at import that the class's fields are the method's arguments, and
:meth:`MethodSpec.event_of` builds the event from decoded arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from amqp.serialization import dumps, loads

from plugbroker.codec import ids
from plugbroker.codec.events import CLIENT_METHODS, MethodEvent, UnexpectedMethod
from plugbroker.codec.ids import MethodId
from plugbroker.codec.tables import MAX_DEPTH, MIN_LEVEL_BYTES, too_deep
from plugbroker.errors import NOT_IMPLEMENTED, SYNTAX_ERROR, ConnectionError_


@dataclass(frozen=True, slots=True)
class MethodSpec:
    sig: MethodId
    name: str
    fmt: str
    args: tuple[str, ...]
    #: the method is followed by a content header and body
    content: bool = False
    #: the event class of a method clients send; None for one only servers send
    event: type[MethodEvent] | None = None
    #: leading arguments the event leaves out (the deprecated ``reserved`` ticket)
    skip: int = 0

    @property
    def class_id(self) -> int:
        return self.sig.class_id

    @property
    def method_id(self) -> int:
        return self.sig.method_id

    def event_of(self, channel: int, args: tuple[Any, ...]) -> MethodEvent | UnexpectedMethod:
        """The event for this method with decoded ``args`` (as :func:`decode_args` returns them)."""
        cls = self.event
        if cls is None:
            return UnexpectedMethod(channel, self.sig, self.name, args)
        return cls(channel, *args[self.skip :])


#: arguments shorter than this cannot nest tables past MAX_DEPTH
_DEEP_MIN = MAX_DEPTH * MIN_LEVEL_BYTES

_EVENTS: dict[MethodId, type[MethodEvent]] = {cls.ID: cls for cls in CLIENT_METHODS}


def _m(sig: MethodId, name: str, fmt: str, args: str = "", content: bool = False) -> MethodSpec:
    names = tuple(args.split()) if args else ()
    if len(names) != len(fmt):
        raise AssertionError(f"{name}: {len(fmt)} fields in format, {len(names)} names")
    skip = 1 if names[:1] == ("reserved",) else 0
    event = _EVENTS.get(sig)
    if event is not None:
        have = tuple(f.name for f in fields(event))
        wanted = ("channel", *names[skip:])
        # a content method's event also carries its content (Publish: size, properties, body)
        if event.NAME != name or (have[: len(wanted)] if content else have) != wanted:
            raise AssertionError(f"{name}: {event.__name__} has fields {have}")
    return MethodSpec(sig, name, fmt, names, content, event, skip)


_TABLE = (
    # connection
    _m(
        ids.CONNECTION_START,
        "connection.start",
        "ooFSS",
        "version_major version_minor server_properties mechanisms locales",
    ),
    _m(
        ids.CONNECTION_START_OK,
        "connection.start_ok",
        "Fsxs",
        "client_properties mechanism response locale",
    ),
    _m(ids.CONNECTION_SECURE, "connection.secure", "x", "challenge"),
    _m(ids.CONNECTION_SECURE_OK, "connection.secure_ok", "x", "response"),
    _m(ids.CONNECTION_TUNE, "connection.tune", "BlB", "channel_max frame_max heartbeat"),
    _m(ids.CONNECTION_TUNE_OK, "connection.tune_ok", "BlB", "channel_max frame_max heartbeat"),
    _m(ids.CONNECTION_OPEN, "connection.open", "ssb", "virtual_host capabilities insist"),
    _m(ids.CONNECTION_OPEN_OK, "connection.open_ok", "s", "known_hosts"),
    _m(
        ids.CONNECTION_CLOSE, "connection.close", "BsBB", "reply_code reply_text class_id method_id"
    ),
    _m(ids.CONNECTION_CLOSE_OK, "connection.close_ok", ""),
    _m(ids.CONNECTION_BLOCKED, "connection.blocked", "s", "reason"),
    _m(ids.CONNECTION_UNBLOCKED, "connection.unblocked", ""),
    _m(ids.CONNECTION_UPDATE_SECRET, "connection.update_secret", "xs", "new_secret reason"),
    _m(ids.CONNECTION_UPDATE_SECRET_OK, "connection.update_secret_ok", ""),
    # channel
    _m(ids.CHANNEL_OPEN, "channel.open", "s", "out_of_band"),
    _m(ids.CHANNEL_OPEN_OK, "channel.open_ok", "x", "channel_id"),
    _m(ids.CHANNEL_FLOW, "channel.flow", "b", "active"),
    _m(ids.CHANNEL_FLOW_OK, "channel.flow_ok", "b", "active"),
    _m(ids.CHANNEL_CLOSE, "channel.close", "BsBB", "reply_code reply_text class_id method_id"),
    _m(ids.CHANNEL_CLOSE_OK, "channel.close_ok", ""),
    # exchange
    _m(
        ids.EXCHANGE_DECLARE,
        "exchange.declare",
        "BssbbbbbF",
        "reserved exchange type passive durable auto_delete internal nowait arguments",
    ),
    _m(ids.EXCHANGE_DECLARE_OK, "exchange.declare_ok", ""),
    _m(ids.EXCHANGE_DELETE, "exchange.delete", "Bsbb", "reserved exchange if_unused nowait"),
    _m(ids.EXCHANGE_DELETE_OK, "exchange.delete_ok", ""),
    _m(
        ids.EXCHANGE_BIND,
        "exchange.bind",
        "BsssbF",
        "reserved destination source routing_key nowait arguments",
    ),
    _m(ids.EXCHANGE_BIND_OK, "exchange.bind_ok", ""),
    _m(
        ids.EXCHANGE_UNBIND,
        "exchange.unbind",
        "BsssbF",
        "reserved destination source routing_key nowait arguments",
    ),
    _m(ids.EXCHANGE_UNBIND_OK, "exchange.unbind_ok", ""),
    # queue
    _m(
        ids.QUEUE_DECLARE,
        "queue.declare",
        "BsbbbbbF",
        "reserved queue passive durable exclusive auto_delete nowait arguments",
    ),
    _m(ids.QUEUE_DECLARE_OK, "queue.declare_ok", "sll", "queue message_count consumer_count"),
    _m(
        ids.QUEUE_BIND,
        "queue.bind",
        "BsssbF",
        "reserved queue exchange routing_key nowait arguments",
    ),
    _m(ids.QUEUE_BIND_OK, "queue.bind_ok", ""),
    _m(ids.QUEUE_PURGE, "queue.purge", "Bsb", "reserved queue nowait"),
    _m(ids.QUEUE_PURGE_OK, "queue.purge_ok", "l", "message_count"),
    _m(ids.QUEUE_DELETE, "queue.delete", "Bsbbb", "reserved queue if_unused if_empty nowait"),
    _m(ids.QUEUE_DELETE_OK, "queue.delete_ok", "l", "message_count"),
    _m(ids.QUEUE_UNBIND, "queue.unbind", "BsssF", "reserved queue exchange routing_key arguments"),
    _m(ids.QUEUE_UNBIND_OK, "queue.unbind_ok", ""),
    # basic
    _m(ids.BASIC_QOS, "basic.qos", "lBb", "prefetch_size prefetch_count global_"),
    _m(ids.BASIC_QOS_OK, "basic.qos_ok", ""),
    _m(
        ids.BASIC_CONSUME,
        "basic.consume",
        "BssbbbbF",
        "reserved queue consumer_tag no_local no_ack exclusive nowait arguments",
    ),
    _m(ids.BASIC_CONSUME_OK, "basic.consume_ok", "s", "consumer_tag"),
    _m(ids.BASIC_CANCEL, "basic.cancel", "sb", "consumer_tag nowait"),
    _m(ids.BASIC_CANCEL_OK, "basic.cancel_ok", "s", "consumer_tag"),
    _m(
        ids.BASIC_PUBLISH,
        "basic.publish",
        "Bssbb",
        "reserved exchange routing_key mandatory immediate",
        content=True,
    ),
    _m(
        ids.BASIC_RETURN,
        "basic.return",
        "Bsss",
        "reply_code reply_text exchange routing_key",
        content=True,
    ),
    _m(
        ids.BASIC_DELIVER,
        "basic.deliver",
        "sLbss",
        "consumer_tag delivery_tag redelivered exchange routing_key",
        content=True,
    ),
    _m(ids.BASIC_GET, "basic.get", "Bsb", "reserved queue no_ack"),
    _m(
        ids.BASIC_GET_OK,
        "basic.get_ok",
        "Lbssl",
        "delivery_tag redelivered exchange routing_key message_count",
        content=True,
    ),
    _m(ids.BASIC_GET_EMPTY, "basic.get_empty", "s", "cluster_id"),
    _m(ids.BASIC_ACK, "basic.ack", "Lb", "delivery_tag multiple"),
    _m(ids.BASIC_REJECT, "basic.reject", "Lb", "delivery_tag requeue"),
    _m(ids.BASIC_RECOVER_ASYNC, "basic.recover_async", "b", "requeue"),
    _m(ids.BASIC_RECOVER, "basic.recover", "b", "requeue"),
    _m(ids.BASIC_RECOVER_OK, "basic.recover_ok", ""),
    _m(ids.BASIC_NACK, "basic.nack", "Lbb", "delivery_tag multiple requeue"),
    # confirm
    _m(ids.CONFIRM_SELECT, "confirm.select", "b", "nowait"),
    _m(ids.CONFIRM_SELECT_OK, "confirm.select_ok", ""),
    # tx
    _m(ids.TX_SELECT, "tx.select", ""),
    _m(ids.TX_SELECT_OK, "tx.select_ok", ""),
    _m(ids.TX_COMMIT, "tx.commit", ""),
    _m(ids.TX_COMMIT_OK, "tx.commit_ok", ""),
    _m(ids.TX_ROLLBACK, "tx.rollback", ""),
    _m(ids.TX_ROLLBACK_OK, "tx.rollback_ok", ""),
)

METHODS: dict[tuple[int, int], MethodSpec] = {m.sig: m for m in _TABLE}
if set(_EVENTS) - set(METHODS):
    raise AssertionError(f"event classes for unknown methods: {set(_EVENTS) - set(METHODS)}")
BY_NAME: dict[str, MethodSpec] = {m.name: m for m in _TABLE}
CLASS_IDS = frozenset(m.class_id for m in _TABLE)


def lookup(class_id: int, method_id: int) -> MethodSpec:
    """The spec of a method, or a 540/503 connection error naming the unknown ids."""
    try:
        return METHODS[(class_id, method_id)]
    except KeyError:
        if class_id in CLASS_IDS:
            raise ConnectionError_(
                NOT_IMPLEMENTED,
                f"unknown method {method_id} of class {class_id}",
                MethodId(class_id, method_id),
            ) from None
        raise ConnectionError_(
            NOT_IMPLEMENTED,
            f"unknown class {class_id} (method {method_id})",
            MethodId(class_id, method_id),
        ) from None


def _check_depth(spec: MethodSpec, payload: bytes | memoryview, offset: int) -> None:
    """Find each table argument's offset (skipping the arguments before it) and refuse one
    nesting deeper than MAX_DEPTH. Malformed arguments are left to the decoder."""
    pos = offset
    prev = ""
    try:
        for kind in spec.fmt:
            if kind == "b":
                if prev != "b":
                    pos += 1  # consecutive bits share one octet
                prev = kind
                continue
            prev = kind
            if kind == "F":
                if too_deep(payload, pos):
                    raise ConnectionError_(
                        SYNTAX_ERROR,
                        f"field tables nested deeper than {MAX_DEPTH} levels in the "
                        f"arguments of {spec.name}",
                        spec.sig,
                    )
                pos += 4 + int.from_bytes(payload[pos : pos + 4], "big")
            elif kind == "s":
                pos += 1 + payload[pos]
            elif kind in "Sx":
                pos += 4 + int.from_bytes(payload[pos : pos + 4], "big")
            elif kind == "o":
                pos += 1
            elif kind == "B":
                pos += 2
            elif kind == "l":
                pos += 4
            elif kind == "L":
                pos += 8
    except IndexError:
        return


def decode_args(spec: MethodSpec, payload: bytes | memoryview, offset: int = 4) -> tuple[Any, ...]:
    """Decode a method's arguments; a short or overlong payload is a 502 SYNTAX_ERROR."""
    if not spec.fmt:
        if len(payload) != offset:
            raise ConnectionError_(
                SYNTAX_ERROR, f"trailing bytes after the arguments of {spec.name}", spec.sig
            )
        return ()
    if "F" in spec.fmt and len(payload) > _DEEP_MIN:
        # scan the tables' nesting before py-amqp's recursive decoder sees them
        _check_depth(spec, payload, offset)
    try:
        values, end = loads(spec.fmt, payload, offset)
    except UnicodeDecodeError:
        raise ConnectionError_(
            SYNTAX_ERROR,
            f"a short string that is not valid UTF-8 in the arguments of {spec.name}",
            spec.sig,
        ) from None
    except Exception as exc:  # struct.error, IndexError, RecursionError, ...
        raise ConnectionError_(
            SYNTAX_ERROR, f"malformed arguments for {spec.name}: {exc.__class__.__name__}", spec.sig
        ) from None
    if end > len(payload):
        raise ConnectionError_(SYNTAX_ERROR, f"truncated arguments for {spec.name}", spec.sig)
    if end < len(payload):
        raise ConnectionError_(
            SYNTAX_ERROR, f"trailing bytes after the arguments of {spec.name}", spec.sig
        )
    problem = _text_problem(spec.fmt, values)
    if problem:
        raise ConnectionError_(SYNTAX_ERROR, f"{problem} in the arguments of {spec.name}", spec.sig)
    return tuple(values)


def _text_problem(fmt: str, values: list[Any]) -> str:
    """What is wrong with the text of decoded arguments ("" when nothing): a short string or a
    string in a table that is not UTF-8 (py-amqp decodes with ``surrogatepass``, so a lone
    surrogate comes through), a field name that is not UTF-8, or tables nested deeper than
    :data:`MAX_DEPTH`."""
    for kind, v in zip(fmt, values, strict=True):
        if kind == "s" or kind == "S":
            if not _utf8(v):
                return "a short string that is not valid UTF-8"
        elif kind == "F":
            problem = _table_problem(v)
            if problem:
                return problem
    return ""


def _utf8(s: Any) -> bool:
    if not isinstance(s, str):
        return False
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _table_problem(table: Any) -> str:
    """Walk a decoded table with an explicit stack (no recursion, whatever the depth)."""
    stack: list[tuple[Any, int]] = [(table, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            if depth > MAX_DEPTH:
                return f"field tables nested deeper than {MAX_DEPTH} levels"
            for k, x in v.items():
                if not _utf8(k):
                    return "a field name that is not valid UTF-8"
                stack.append((x, depth + 1))
        elif isinstance(v, list):
            if depth > MAX_DEPTH:
                return f"field tables nested deeper than {MAX_DEPTH} levels"
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, str) and not _utf8(v):
            return "a string that is not valid UTF-8"
    return ""


def encode_args(spec: MethodSpec, args: tuple[Any, ...] | list[Any]) -> bytes:
    """Encode a method's class/method ids and arguments (the method frame payload)."""
    head = spec.class_id.to_bytes(2, "big") + spec.method_id.to_bytes(2, "big")
    if not spec.fmt:
        return head
    body: bytes = dumps(spec.fmt, list(args))
    return head + body

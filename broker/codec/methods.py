"""The AMQP 0-9-1 method table.

Each method has a name, its argument names and a py-amqp serialization format (``b`` bit,
``o`` octet, ``B`` short, ``l`` long, ``L`` long long, ``s`` shortstr, ``S``/``x`` longstr as
text/bytes, ``F`` table). Argument tables are encoded and decoded with
:mod:`amqp.serialization`; only the four hot methods (publish, deliver, ack, and the content
header) have hand-written fast paths in :mod:`broker.codec.frames`, checked against this table
by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amqp.serialization import dumps, loads

from broker.errors import NOT_IMPLEMENTED, SYNTAX_ERROR, ConnectionError_


@dataclass(frozen=True, slots=True)
class MethodSpec:
    class_id: int
    method_id: int
    name: str
    fmt: str
    args: tuple[str, ...]
    #: the method is followed by a content header and body
    content: bool = False

    @property
    def sig(self) -> tuple[int, int]:
        return (self.class_id, self.method_id)


def _m(
    cid: int, mid: int, name: str, fmt: str, args: str = "", content: bool = False
) -> MethodSpec:
    names = tuple(args.split()) if args else ()
    if len(names) != len(fmt):
        raise AssertionError(f"{name}: {len(fmt)} fields in format, {len(names)} names")
    return MethodSpec(cid, mid, name, fmt, names, content)


_TABLE = (
    # connection
    _m(
        10,
        10,
        "connection.start",
        "ooFSS",
        "version_major version_minor server_properties mechanisms locales",
    ),
    _m(10, 11, "connection.start_ok", "Fsxs", "client_properties mechanism response locale"),
    _m(10, 20, "connection.secure", "x", "challenge"),
    _m(10, 21, "connection.secure_ok", "x", "response"),
    _m(10, 30, "connection.tune", "BlB", "channel_max frame_max heartbeat"),
    _m(10, 31, "connection.tune_ok", "BlB", "channel_max frame_max heartbeat"),
    _m(10, 40, "connection.open", "ssb", "virtual_host capabilities insist"),
    _m(10, 41, "connection.open_ok", "s", "known_hosts"),
    _m(10, 50, "connection.close", "BsBB", "reply_code reply_text class_id method_id"),
    _m(10, 51, "connection.close_ok", ""),
    _m(10, 60, "connection.blocked", "s", "reason"),
    _m(10, 61, "connection.unblocked", ""),
    _m(10, 70, "connection.update_secret", "xs", "new_secret reason"),
    _m(10, 71, "connection.update_secret_ok", ""),
    # channel
    _m(20, 10, "channel.open", "s", "out_of_band"),
    _m(20, 11, "channel.open_ok", "x", "channel_id"),
    _m(20, 20, "channel.flow", "b", "active"),
    _m(20, 21, "channel.flow_ok", "b", "active"),
    _m(20, 40, "channel.close", "BsBB", "reply_code reply_text class_id method_id"),
    _m(20, 41, "channel.close_ok", ""),
    # exchange
    _m(
        40,
        10,
        "exchange.declare",
        "BssbbbbbF",
        "reserved exchange type passive durable auto_delete internal nowait arguments",
    ),
    _m(40, 11, "exchange.declare_ok", ""),
    _m(40, 20, "exchange.delete", "Bsbb", "reserved exchange if_unused nowait"),
    _m(40, 21, "exchange.delete_ok", ""),
    _m(
        40,
        30,
        "exchange.bind",
        "BsssbF",
        "reserved destination source routing_key nowait arguments",
    ),
    _m(40, 31, "exchange.bind_ok", ""),
    _m(
        40,
        40,
        "exchange.unbind",
        "BsssbF",
        "reserved destination source routing_key nowait arguments",
    ),
    _m(40, 51, "exchange.unbind_ok", ""),
    # queue
    _m(
        50,
        10,
        "queue.declare",
        "BsbbbbbF",
        "reserved queue passive durable exclusive auto_delete nowait arguments",
    ),
    _m(50, 11, "queue.declare_ok", "sll", "queue message_count consumer_count"),
    _m(50, 20, "queue.bind", "BsssbF", "reserved queue exchange routing_key nowait arguments"),
    _m(50, 21, "queue.bind_ok", ""),
    _m(50, 30, "queue.purge", "Bsb", "reserved queue nowait"),
    _m(50, 31, "queue.purge_ok", "l", "message_count"),
    _m(50, 40, "queue.delete", "Bsbbb", "reserved queue if_unused if_empty nowait"),
    _m(50, 41, "queue.delete_ok", "l", "message_count"),
    _m(50, 50, "queue.unbind", "BsssF", "reserved queue exchange routing_key arguments"),
    _m(50, 51, "queue.unbind_ok", ""),
    # basic
    _m(60, 10, "basic.qos", "lBb", "prefetch_size prefetch_count global_"),
    _m(60, 11, "basic.qos_ok", ""),
    _m(
        60,
        20,
        "basic.consume",
        "BssbbbbF",
        "reserved queue consumer_tag no_local no_ack exclusive nowait arguments",
    ),
    _m(60, 21, "basic.consume_ok", "s", "consumer_tag"),
    _m(60, 30, "basic.cancel", "sb", "consumer_tag nowait"),
    _m(60, 31, "basic.cancel_ok", "s", "consumer_tag"),
    _m(
        60,
        40,
        "basic.publish",
        "Bssbb",
        "reserved exchange routing_key mandatory immediate",
        content=True,
    ),
    _m(60, 50, "basic.return", "Bsss", "reply_code reply_text exchange routing_key", content=True),
    _m(
        60,
        60,
        "basic.deliver",
        "sLbss",
        "consumer_tag delivery_tag redelivered exchange routing_key",
        content=True,
    ),
    _m(60, 70, "basic.get", "Bsb", "reserved queue no_ack"),
    _m(
        60,
        71,
        "basic.get_ok",
        "Lbssl",
        "delivery_tag redelivered exchange routing_key message_count",
        content=True,
    ),
    _m(60, 72, "basic.get_empty", "s", "cluster_id"),
    _m(60, 80, "basic.ack", "Lb", "delivery_tag multiple"),
    _m(60, 90, "basic.reject", "Lb", "delivery_tag requeue"),
    _m(60, 100, "basic.recover_async", "b", "requeue"),
    _m(60, 110, "basic.recover", "b", "requeue"),
    _m(60, 111, "basic.recover_ok", ""),
    _m(60, 120, "basic.nack", "Lbb", "delivery_tag multiple requeue"),
    # confirm
    _m(85, 10, "confirm.select", "b", "nowait"),
    _m(85, 11, "confirm.select_ok", ""),
    # tx
    _m(90, 10, "tx.select", ""),
    _m(90, 11, "tx.select_ok", ""),
    _m(90, 20, "tx.commit", ""),
    _m(90, 21, "tx.commit_ok", ""),
    _m(90, 30, "tx.rollback", ""),
    _m(90, 31, "tx.rollback_ok", ""),
)

METHODS: dict[tuple[int, int], MethodSpec] = {m.sig: m for m in _TABLE}
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
                (class_id, method_id),
            ) from None
        raise ConnectionError_(
            NOT_IMPLEMENTED, f"unknown class {class_id} (method {method_id})", (class_id, method_id)
        ) from None


def decode_args(spec: MethodSpec, payload: bytes | memoryview, offset: int = 4) -> tuple[Any, ...]:
    """Decode a method's arguments; a short or overlong payload is a 502 SYNTAX_ERROR."""
    if not spec.fmt:
        if len(payload) != offset:
            raise ConnectionError_(
                SYNTAX_ERROR, f"trailing bytes after the arguments of {spec.name}", spec.sig
            )
        return ()
    try:
        values, end = loads(spec.fmt, payload, offset)
    except Exception as exc:  # struct.error, IndexError, UnicodeDecodeError, ...
        raise ConnectionError_(
            SYNTAX_ERROR, f"malformed arguments for {spec.name}: {exc.__class__.__name__}", spec.sig
        ) from None
    if end > len(payload):
        raise ConnectionError_(SYNTAX_ERROR, f"truncated arguments for {spec.name}", spec.sig)
    if end < len(payload):
        raise ConnectionError_(
            SYNTAX_ERROR, f"trailing bytes after the arguments of {spec.name}", spec.sig
        )
    if "F" in spec.fmt and not all(_text_keys(v) for v in values):
        # py-amqp hands back a field name that is not UTF-8 as bytes; the spec says UTF-8
        raise ConnectionError_(
            SYNTAX_ERROR,
            f"a field name in the arguments of {spec.name} is not UTF-8 (or "
            "tables nest more than 100 deep)",
            spec.sig,
        )
    return tuple(values)


def _text_keys(v: Any, depth: int = 0) -> bool:
    """Every field name in a (nested) table is a str."""
    if isinstance(v, dict):
        return depth < 100 and all(
            isinstance(k, str) and _text_keys(x, depth + 1) for k, x in v.items()
        )
    if isinstance(v, list):
        return depth < 100 and all(_text_keys(x, depth + 1) for x in v)
    return True


def encode_args(spec: MethodSpec, args: tuple[Any, ...] | list[Any]) -> bytes:
    """Encode a method's class/method ids and arguments (the method frame payload)."""
    head = spec.class_id.to_bytes(2, "big") + spec.method_id.to_bytes(2, "big")
    if not spec.fmt:
        return head
    return head + dumps(spec.fmt, list(args))

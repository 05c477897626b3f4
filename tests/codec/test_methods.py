"""The method table: every method round-trips, and it agrees with py-amqp's own formats."""

from __future__ import annotations

import datetime as dt
import inspect
import random
from decimal import Decimal
from typing import Any

import pytest
from rawclient import method_frame, py_amqp_channel

from plugbroker.codec import events
from plugbroker.codec.events import UnexpectedMethod
from plugbroker.codec.frames import NEED_DATA, PROTOCOL_HEADER, ServerCodec
from plugbroker.codec.methods import BY_NAME, METHODS, decode_args, encode_args, lookup
from plugbroker.errors import ConnectionError_

ALL = sorted(METHODS.values(), key=lambda m: m.sig)


def _value(rng: random.Random, code: str) -> Any:
    if code == "b":
        return rng.random() < 0.5
    if code == "o":
        return rng.choice([0, 1, 255, rng.randrange(256)])
    if code == "B":
        return rng.choice([0, 1, 65535, rng.randrange(65536)])
    if code == "l":
        return rng.choice([0, 2**32 - 1, rng.randrange(2**32)])
    if code == "L":
        return rng.choice([0, 2**64 - 1, rng.randrange(2**64)])
    if code == "s":
        s = "".join(rng.choice("abc.#*-_é中") for _ in range(rng.randint(0, 60)))
        return s.encode()[:255].decode("utf-8", "ignore")
    if code == "S":
        return "".join(rng.choice("xyz é") for _ in range(rng.randint(0, 300)))
    if code == "x":
        return rng.randbytes(rng.randint(0, 300))
    if code == "F":
        return _table(rng, 2)
    raise AssertionError(code)


def _table(rng: random.Random, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(rng.randint(0, 5)):
        kind = rng.randrange(9 if depth else 7)
        key = f"k{i}-{rng.randrange(1000)}"
        if kind == 0:
            out[key] = rng.randrange(-(2**31), 2**31)
        elif kind == 1:
            out[key] = rng.randrange(-(2**63), 2**63)
        elif kind == 2:
            out[key] = "v" * rng.randint(0, 20)
        elif kind == 3:
            out[key] = rng.random() < 0.5
        elif kind == 4:
            out[key] = None
        elif kind == 5:
            out[key] = rng.random()
        elif kind == 6:
            out[key] = dt.datetime(2024, 1, 2, 3, 4, 5)
        elif kind == 7:
            out[key] = _table(rng, depth - 1)
        else:
            out[key] = [1, "two", _table(rng, depth - 1)]
    return out


def _args(rng: random.Random, fmt: str) -> tuple[Any, ...]:
    return tuple(_value(rng, c) for c in fmt)


def test_the_table_is_consistent() -> None:
    assert len(METHODS) == len(BY_NAME) == len(ALL)
    for spec in ALL:
        assert len(spec.args) == len(spec.fmt)
        assert set(spec.fmt) <= set("boBlLsSxF")
        assert spec.name.split(".")[0] in {
            "connection",
            "channel",
            "exchange",
            "queue",
            "basic",
            "confirm",
            "tx",
        }
    content = {m.name for m in ALL if m.content}
    assert content == {"basic.publish", "basic.return", "basic.deliver", "basic.get_ok"}


@pytest.mark.parametrize("spec", ALL, ids=lambda m: m.name)
def test_every_method_round_trips(spec: Any) -> None:
    rng = random.Random(spec.class_id * 1000 + spec.method_id)
    for _ in range(25):
        args = _args(rng, spec.fmt)
        payload = encode_args(spec, args)
        assert payload[:4] == spec.class_id.to_bytes(2, "big") + spec.method_id.to_bytes(2, "big")
        got = decode_args(spec, payload)
        assert got == args
        assert lookup(*spec.sig) is spec


@pytest.mark.parametrize(
    "spec", [m for m in ALL if not m.content or m.name == "basic.publish"], ids=lambda m: m.name
)
def test_every_client_method_through_the_codec(spec: Any) -> None:
    """Method frames for every method decode to the same arguments through the codec."""
    rng = random.Random(spec.method_id)
    args = _args(rng, spec.fmt)
    payload = encode_args(spec, args)
    codec = ServerCodec()
    codec.receive_data(
        PROTOCOL_HEADER + b"\x01\x00\x03" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    )
    codec.next_event()
    ev = codec.next_event()
    if spec.name == "basic.publish":
        assert ev is NEED_DATA  # waits for its content header
        return
    assert ev == spec.event_of(3, args)
    if spec.event is None:
        assert ev == UnexpectedMethod(3, spec.sig, spec.name, args)
    else:
        assert type(ev) is spec.event
        assert tuple(getattr(ev, f) for f in spec.args[spec.skip :]) == args[spec.skip :]


@pytest.mark.parametrize("spec", [m for m in ALL if m.fmt], ids=lambda m: m.name)
def test_every_truncation_is_502(spec: Any) -> None:
    rng = random.Random(spec.method_id + 7)
    payload = encode_args(spec, _args(rng, spec.fmt))
    for n in range(4, len(payload)):
        with pytest.raises(ConnectionError_) as info:
            decode_args(spec, payload[:n])
        assert info.value.code == 502
        assert info.value.method == spec.sig
        assert spec.name in info.value.text


@pytest.mark.parametrize("spec", ALL, ids=lambda m: m.name)
def test_garbage_arguments_never_raise_anything_but_502(spec: Any) -> None:
    rng = random.Random(spec.method_id + 99)
    good = encode_args(spec, _args(rng, spec.fmt))
    for i in range(300):
        if i % 2 and len(good) > 4:
            b = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(4, len(b))] = rng.randrange(256)
            payload = bytes(b)
        else:
            payload = good[:4] + rng.randbytes(rng.randint(0, 40))
        try:
            got = decode_args(spec, payload)
        except ConnectionError_ as e:
            assert e.code == 502
        else:
            assert len(got) == len(spec.fmt)


def test_no_argument_methods_reject_trailing_bytes() -> None:
    spec = BY_NAME["tx.select"]
    assert decode_args(spec, encode_args(spec, ())) == ()
    with pytest.raises(ConnectionError_) as info:
        decode_args(spec, encode_args(spec, ()) + b"\x00")
    assert info.value.code == 502


def test_unknown_methods_are_540() -> None:
    with pytest.raises(ConnectionError_) as info:
        lookup(50, 12)
    assert info.value.code == 540 and info.value.method == (50, 12)
    assert "unknown method 12 of class 50" in info.value.text
    with pytest.raises(ConnectionError_) as info:
        lookup(70, 10)
    assert info.value.code == 540 and "unknown class 70" in info.value.text


def test_tables_keep_their_types() -> None:
    spec = BY_NAME["queue.declare"]
    args = (
        0,
        "q",
        False,
        True,
        False,
        False,
        False,
        {
            "x-message-ttl": 1000,
            "x-max-length": 2**40,
            "x-dead-letter-exchange": "dlx",
            "x-single-active-consumer": True,
            "x-list": [1, "a", None],
            "x-dec": Decimal("1.5"),
            "x-nested": {"a": {"b": 1}},
        },
    )
    got = decode_args(spec, encode_args(spec, args))
    assert got == args
    assert type(got[7]["x-single-active-consumer"]) is bool


# ------------------------------------------------------------------ py-amqp interop

#: py-amqp method -> our method name, for the methods py-amqp sends as a client
_CLIENT_SENDS = {
    "exchange_declare": "exchange.declare",
    "exchange_delete": "exchange.delete",
    "exchange_bind": "exchange.bind",
    "exchange_unbind": "exchange.unbind",
    "queue_bind": "queue.bind",
    "queue_unbind": "queue.unbind",
    "queue_declare": "queue.declare",
    "queue_delete": "queue.delete",
    "queue_purge": "queue.purge",
    "basic_ack": "basic.ack",
    "basic_cancel": "basic.cancel",
    "basic_consume": "basic.consume",
    "basic_get": "basic.get",
    "_basic_publish": "basic.publish",
    "basic_qos": "basic.qos",
    "basic_reject": "basic.reject",
    "close": "channel.close",
}


def _norm(fmt: str) -> str:
    return fmt.replace("x", "S")  # longstr as bytes or as text: the same wire format


@pytest.mark.parametrize("pyname,name", sorted(_CLIENT_SENDS.items()))
def test_formats_match_what_py_amqp_sends(pyname: str, name: str) -> None:
    import amqp

    argsig = inspect.signature(getattr(amqp.Channel, pyname)).parameters["argsig"].default
    assert _norm(argsig) == _norm(BY_NAME[name].fmt)


def test_connection_formats_match_py_amqp() -> None:
    import amqp

    params = lambda fn: inspect.signature(fn).parameters["argsig"].default  # noqa: E731
    assert _norm(params(amqp.Connection._on_start)) == _norm(BY_NAME["connection.start_ok"].fmt)
    assert params(amqp.Connection._on_tune) == BY_NAME["connection.tune_ok"].fmt
    assert params(amqp.Connection._on_tune_sent) == BY_NAME["connection.open"].fmt
    assert params(amqp.Connection.close) == BY_NAME["connection.close"].fmt


def test_formats_match_what_py_amqp_reads() -> None:
    """Every server method py-amqp parses is parsed with (a prefix of) our format."""
    import amqp

    checked = 0
    for cls in (amqp.Connection, amqp.Channel):
        for sig, m in cls._METHODS.items():
            if not m.args or sig == (10, 20):
                continue  # py-amqp reads connection.secure's longstr as a shortstr; never sent
            ours = METHODS[sig].fmt
            assert _norm(ours).startswith(_norm(m.args)), (sig, ours, m.args)
            checked += 1
    assert checked >= 15


def test_py_amqp_client_calls_decode_as_sent() -> None:
    """A real py-amqp Channel writes its frames into a fake wire; the codec reads them."""
    import amqp

    ch, wire = py_amqp_channel(channel_id=9)
    ch.exchange_declare(
        "ex",
        "topic",
        durable=True,
        auto_delete=False,
        nowait=True,
        arguments={"alternate-exchange": "ae"},
    )
    ch.exchange_bind("dst", "src", "a.#", nowait=True)
    ch.exchange_unbind("dst", "src", "a.#", nowait=True)
    ch.exchange_delete("ex", if_unused=True, nowait=True)
    ch.queue_declare(
        "q",
        durable=True,
        exclusive=False,
        auto_delete=False,
        nowait=True,
        arguments={"x-queue-type": "quorum"},
    )
    ch.queue_bind("q", "ex", "k", nowait=True)
    ch.queue_purge("q", nowait=True)
    ch.queue_delete("q", if_unused=True, if_empty=True, nowait=True)
    ch.basic_consume(
        "q",
        consumer_tag="ct",
        no_ack=True,
        exclusive=True,
        nowait=True,
        arguments={"x-priority": 3},
        callback=lambda m: None,
    )
    ch.basic_cancel("ct", nowait=True)
    ch.basic_ack(42, multiple=True)
    ch.basic_reject(43, requeue=False)
    wire.write(method_frame(9, "basic.nack", 44, True, True))  # py-amqp has no basic_nack
    ch.basic_recover_async(requeue=True)
    ch.confirm_select(nowait=True)
    ch.basic_publish(amqp.Message(b"body", content_type="text/plain"), "ex", "k")
    codec = ServerCodec()
    codec.receive_data(PROTOCOL_HEADER + wire.take())
    evs = []
    while (ev := codec.next_event()) is not NEED_DATA:
        evs.append(ev)
    assert not codec.buffered()
    assert evs[1:-1] == [
        events.ExchangeDeclare(
            9, "ex", "topic", False, True, False, False, True, {"alternate-exchange": "ae"}
        ),
        events.ExchangeBind(9, "dst", "src", "a.#", True, {}),
        events.ExchangeUnbind(9, "dst", "src", "a.#", True, {}),
        events.ExchangeDelete(9, "ex", True, True),
        events.QueueDeclare(9, "q", False, True, False, False, True, {"x-queue-type": "quorum"}),
        events.QueueBind(9, "q", "ex", "k", True, {}),
        events.QueuePurge(9, "q", True),
        events.QueueDelete(9, "q", True, True, True),
        events.BasicConsume(9, "q", "ct", False, True, True, True, {"x-priority": 3}),
        events.BasicCancel(9, "ct", True),
        events.BasicAck(9, 42, True),
        events.BasicReject(9, 43, False),
        events.BasicNack(9, 44, True, True),
        events.BasicRecoverAsync(9, True),
        events.ConfirmSelect(9, True),
    ]
    pub = evs[-1]
    assert (pub.exchange, pub.routing_key, pub.body) == ("ex", "k", b"body")


@pytest.mark.parametrize("table", [{b"\xff": 1}, {"a": {b"x-\xfe": 1}}, {"a": [1, {b"\xff": 2}]}])
def test_field_names_that_are_not_utf8_are_502(table: dict[Any, Any]) -> None:
    spec = BY_NAME["queue.bind"]
    payload = encode_args(spec, (0, "q", "ex", "k", False, table))
    with pytest.raises(ConnectionError_) as info:
        decode_args(spec, payload)
    assert info.value.code == 502 and "not valid UTF-8" in info.value.text


def test_deeply_nested_tables_are_refused_not_crashed() -> None:
    spec = BY_NAME["queue.declare"]
    table: dict[str, Any] = {}
    for _ in range(150):
        table = {"n": table}
    payload = encode_args(spec, (0, "q", False, False, False, False, False, table))
    with pytest.raises(ConnectionError_) as info:
        decode_args(spec, payload)
    assert info.value.code == 502


# ------------------------------------------------------------------ ids and typed events


def test_every_method_has_its_named_id_and_no_id_is_spare() -> None:
    from plugbroker.codec import ids

    for spec in ALL:
        assert getattr(ids, spec.name.upper().replace(".", "_")) == spec.sig
        assert isinstance(spec.sig, ids.MethodId)
        assert (spec.class_id, spec.method_id) == spec.sig
    named = {v for k, v in vars(ids).items() if isinstance(v, ids.MethodId) and k != "NO_METHOD"}
    assert named == set(METHODS)


def test_client_events_match_the_table() -> None:
    import dataclasses

    assert len({cls.ID for cls in events.CLIENT_METHODS}) == len(events.CLIENT_METHODS)
    for cls in events.CLIENT_METHODS:
        spec = METHODS[cls.ID]
        assert spec.event is cls and spec.name == cls.NAME
        names = tuple(f.name for f in dataclasses.fields(cls))
        assert names[0] == "channel"
        if spec.content:
            assert names[1 : 1 + len(spec.args) - spec.skip] == spec.args[spec.skip :]
        else:
            assert names[1:] == spec.args[spec.skip :]
    # server-only methods have no class; basic.publish is the only client content method
    assert {m.name for m in ALL if m.event is not None and m.content} == {"basic.publish"}
    assert METHODS[(50, 11)].event is None


def test_events_are_frozen_and_slotted() -> None:
    import dataclasses

    e = events.QueueBind(1, "q", "ex", "k", False, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.queue = "other"  # type: ignore[misc]
    assert not hasattr(e, "__dict__")
    assert e == events.QueueBind(1, "q", "ex", "k", False, {})
    assert e.ID == (50, 20) and e.NAME == "queue.bind"


def test_a_server_only_method_from_a_client_decodes_as_unexpected() -> None:
    codec = ServerCodec()
    codec.receive_data(PROTOCOL_HEADER + method_frame(2, "queue.declare_ok", "q", 3, 1))
    codec.next_event()
    assert codec.next_event() == UnexpectedMethod(2, (50, 11), "queue.declare_ok", ("q", 3, 1))

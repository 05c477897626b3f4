"""The events the codec hands the session: frozen, slotted dataclasses with named fields.

Every method a client may send has its own class here (``QueueBind(channel, queue, exchange,
routing_key, nowait, arguments)``). Each class names its method with two class attributes,
``ID`` (a :class:`~plugbroker.codec.ids.MethodId`) and ``NAME`` (``"queue.bind"``); its fields are
the method's arguments in wire order, after ``channel``, without the ``reserved`` (ticket)
argument. :mod:`plugbroker.codec.methods` checks at import that every class agrees with the method
table, so a field cannot drift from the wire format.

A method in the table that the broker never takes from a client (``queue.declare_ok``, or
``connection.secure_ok`` when no challenge was sent) decodes as :class:`UnexpectedMethod`, so
that the session can refuse it with the code that fits where it arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from plugbroker.codec import ids
from plugbroker.codec.ids import MethodId

#: an AMQP field table as py-amqp decodes it
FieldTable = dict[str, Any]


# ------------------------------------------------------------------ frames that are not methods


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """The 8-byte greeting; ``ok`` is false when it is not AMQP 0-9-1."""

    ok: bool
    data: bytes


@dataclass(frozen=True, slots=True)
class Heartbeat:
    channel: int


# ------------------------------------------------------------------ methods


@dataclass(frozen=True, slots=True)
class MethodEvent:
    """A method from the client on ``channel``; subclasses add the method's arguments."""

    ID: ClassVar[MethodId]
    NAME: ClassVar[str]

    channel: int


@dataclass(frozen=True, slots=True)
class UnexpectedMethod:
    """A well-formed method the broker does not take from a client (servers send it)."""

    channel: int
    method_id: MethodId
    name: str
    args: tuple[Any, ...]


# connection


@dataclass(frozen=True, slots=True)
class ConnectionStartOk(MethodEvent):
    ID = ids.CONNECTION_START_OK
    NAME = "connection.start_ok"

    client_properties: FieldTable
    mechanism: str
    response: bytes
    locale: str


@dataclass(frozen=True, slots=True)
class ConnectionTuneOk(MethodEvent):
    ID = ids.CONNECTION_TUNE_OK
    NAME = "connection.tune_ok"

    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class ConnectionOpen(MethodEvent):
    ID = ids.CONNECTION_OPEN
    NAME = "connection.open"

    virtual_host: str
    capabilities: str
    insist: bool


@dataclass(frozen=True, slots=True)
class ConnectionClose(MethodEvent):
    ID = ids.CONNECTION_CLOSE
    NAME = "connection.close"

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ConnectionCloseOk(MethodEvent):
    ID = ids.CONNECTION_CLOSE_OK
    NAME = "connection.close_ok"


@dataclass(frozen=True, slots=True)
class ConnectionUpdateSecret(MethodEvent):
    ID = ids.CONNECTION_UPDATE_SECRET
    NAME = "connection.update_secret"

    new_secret: bytes
    reason: str


# channel


@dataclass(frozen=True, slots=True)
class ChannelOpen(MethodEvent):
    ID = ids.CHANNEL_OPEN
    NAME = "channel.open"

    out_of_band: str


@dataclass(frozen=True, slots=True)
class ChannelFlow(MethodEvent):
    ID = ids.CHANNEL_FLOW
    NAME = "channel.flow"

    active: bool


@dataclass(frozen=True, slots=True)
class ChannelClose(MethodEvent):
    ID = ids.CHANNEL_CLOSE
    NAME = "channel.close"

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ChannelCloseOk(MethodEvent):
    ID = ids.CHANNEL_CLOSE_OK
    NAME = "channel.close_ok"


# exchange


@dataclass(frozen=True, slots=True)
class ExchangeDeclare(MethodEvent):
    ID = ids.EXCHANGE_DECLARE
    NAME = "exchange.declare"

    exchange: str
    type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    nowait: bool
    arguments: FieldTable


@dataclass(frozen=True, slots=True)
class ExchangeDelete(MethodEvent):
    ID = ids.EXCHANGE_DELETE
    NAME = "exchange.delete"

    exchange: str
    if_unused: bool
    nowait: bool


@dataclass(frozen=True, slots=True)
class ExchangeBind(MethodEvent):
    ID = ids.EXCHANGE_BIND
    NAME = "exchange.bind"

    destination: str
    source: str
    routing_key: str
    nowait: bool
    arguments: FieldTable


@dataclass(frozen=True, slots=True)
class ExchangeUnbind(MethodEvent):
    ID = ids.EXCHANGE_UNBIND
    NAME = "exchange.unbind"

    destination: str
    source: str
    routing_key: str
    nowait: bool
    arguments: FieldTable


# queue


@dataclass(frozen=True, slots=True)
class QueueDeclare(MethodEvent):
    ID = ids.QUEUE_DECLARE
    NAME = "queue.declare"

    queue: str
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    nowait: bool
    arguments: FieldTable


@dataclass(frozen=True, slots=True)
class QueueBind(MethodEvent):
    ID = ids.QUEUE_BIND
    NAME = "queue.bind"

    queue: str
    exchange: str
    routing_key: str
    nowait: bool
    arguments: FieldTable


@dataclass(frozen=True, slots=True)
class QueuePurge(MethodEvent):
    ID = ids.QUEUE_PURGE
    NAME = "queue.purge"

    queue: str
    nowait: bool


@dataclass(frozen=True, slots=True)
class QueueDelete(MethodEvent):
    ID = ids.QUEUE_DELETE
    NAME = "queue.delete"

    queue: str
    if_unused: bool
    if_empty: bool
    nowait: bool


@dataclass(frozen=True, slots=True)
class QueueUnbind(MethodEvent):
    ID = ids.QUEUE_UNBIND
    NAME = "queue.unbind"

    queue: str
    exchange: str
    routing_key: str
    arguments: FieldTable


# basic


@dataclass(frozen=True, slots=True)
class BasicQos(MethodEvent):
    ID = ids.BASIC_QOS
    NAME = "basic.qos"

    prefetch_size: int
    prefetch_count: int
    global_: bool


@dataclass(frozen=True, slots=True)
class BasicConsume(MethodEvent):
    ID = ids.BASIC_CONSUME
    NAME = "basic.consume"

    queue: str
    consumer_tag: str
    no_local: bool
    no_ack: bool
    exclusive: bool
    nowait: bool
    arguments: FieldTable


@dataclass(frozen=True, slots=True)
class BasicCancel(MethodEvent):
    ID = ids.BASIC_CANCEL
    NAME = "basic.cancel"

    consumer_tag: str
    nowait: bool


@dataclass(frozen=True, slots=True)
class Publish(MethodEvent):
    """A complete basic.publish: the method, its content header and its body, as one event."""

    ID = ids.BASIC_PUBLISH
    NAME = "basic.publish"

    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    body_size: int
    #: raw property flags and property list of the content header, passed through unchanged
    properties: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class BasicGet(MethodEvent):
    ID = ids.BASIC_GET
    NAME = "basic.get"

    queue: str
    no_ack: bool


@dataclass(frozen=True, slots=True)
class BasicAck(MethodEvent):
    ID = ids.BASIC_ACK
    NAME = "basic.ack"

    delivery_tag: int
    multiple: bool


@dataclass(frozen=True, slots=True)
class BasicReject(MethodEvent):
    ID = ids.BASIC_REJECT
    NAME = "basic.reject"

    delivery_tag: int
    requeue: bool


@dataclass(frozen=True, slots=True)
class BasicRecoverAsync(MethodEvent):
    ID = ids.BASIC_RECOVER_ASYNC
    NAME = "basic.recover_async"

    requeue: bool


@dataclass(frozen=True, slots=True)
class BasicRecover(MethodEvent):
    ID = ids.BASIC_RECOVER
    NAME = "basic.recover"

    requeue: bool


@dataclass(frozen=True, slots=True)
class BasicNack(MethodEvent):
    ID = ids.BASIC_NACK
    NAME = "basic.nack"

    delivery_tag: int
    multiple: bool
    requeue: bool


# confirm and tx


@dataclass(frozen=True, slots=True)
class ConfirmSelect(MethodEvent):
    ID = ids.CONFIRM_SELECT
    NAME = "confirm.select"

    nowait: bool


@dataclass(frozen=True, slots=True)
class TxSelect(MethodEvent):
    ID = ids.TX_SELECT
    NAME = "tx.select"


@dataclass(frozen=True, slots=True)
class TxCommit(MethodEvent):
    ID = ids.TX_COMMIT
    NAME = "tx.commit"


@dataclass(frozen=True, slots=True)
class TxRollback(MethodEvent):
    ID = ids.TX_ROLLBACK
    NAME = "tx.rollback"


#: every method a client may send, one class each (basic.publish arrives as :class:`Publish`)
CLIENT_METHODS: tuple[type[MethodEvent], ...] = (
    ConnectionStartOk,
    ConnectionTuneOk,
    ConnectionOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionUpdateSecret,
    ChannelOpen,
    ChannelFlow,
    ChannelClose,
    ChannelCloseOk,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeBind,
    ExchangeUnbind,
    QueueDeclare,
    QueueBind,
    QueuePurge,
    QueueDelete,
    QueueUnbind,
    BasicQos,
    BasicConsume,
    BasicCancel,
    Publish,
    BasicGet,
    BasicAck,
    BasicReject,
    BasicRecoverAsync,
    BasicRecover,
    BasicNack,
    ConfirmSelect,
    TxSelect,
    TxCommit,
    TxRollback,
)

#: what :meth:`plugbroker.codec.ServerCodec.next_event` returns (besides ``NEED_DATA``)
Event = ProtocolHeader | Heartbeat | MethodEvent | UnexpectedMethod

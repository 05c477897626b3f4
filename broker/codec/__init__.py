"""The sans-IO AMQP 0-9-1 codec: bytes in, events out; methods in, bytes out."""

from broker.codec.events import (
    CLIENT_METHODS,
    Event,
    Heartbeat,
    MethodEvent,
    ProtocolHeader,
    Publish,
    UnexpectedMethod,
)
from broker.codec.frames import NEED_DATA, PROTOCOL_HEADER, ServerCodec
from broker.codec.ids import MethodId
from broker.codec.methods import BY_NAME, METHODS, MethodSpec

__all__ = [
    "BY_NAME",
    "CLIENT_METHODS",
    "METHODS",
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "Event",
    "Heartbeat",
    "MethodEvent",
    "MethodId",
    "MethodSpec",
    "ProtocolHeader",
    "Publish",
    "ServerCodec",
    "UnexpectedMethod",
]

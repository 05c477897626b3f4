"""The sans-IO AMQP 0-9-1 codec: bytes in, events out; methods in, bytes out."""

from plugbroker.codec.events import (
    CLIENT_METHODS,
    Event,
    Heartbeat,
    MethodEvent,
    ProtocolHeader,
    Publish,
    UnexpectedMethod,
)
from plugbroker.codec.frames import NEED_DATA, PROTOCOL_HEADER, ServerCodec
from plugbroker.codec.ids import MethodId
from plugbroker.codec.methods import BY_NAME, METHODS, MethodSpec

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

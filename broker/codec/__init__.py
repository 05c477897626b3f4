"""The sans-IO AMQP 0-9-1 codec: bytes in, events out; methods in, bytes out."""

from broker.codec.frames import (
    NEED_DATA,
    PROTOCOL_HEADER,
    Heartbeat,
    Method,
    ProtocolHeader,
    Publish,
    ServerCodec,
)
from broker.codec.methods import BY_NAME, METHODS, MethodSpec

__all__ = [
    "BY_NAME",
    "METHODS",
    "NEED_DATA",
    "PROTOCOL_HEADER",
    "Heartbeat",
    "Method",
    "MethodSpec",
    "ProtocolHeader",
    "Publish",
    "ServerCodec",
]

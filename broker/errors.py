"""AMQP reply codes and the errors that carry them.

A :class:`ChannelError` closes one channel; a :class:`ConnectionError_` closes the connection.
Both know the code to send and the method that caused them, so the layer that catches them can
answer with the right ``channel.close`` / ``connection.close`` without guessing.
"""

from __future__ import annotations

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    200: "REPLY_SUCCESS",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}

SLOW_CONSUMER_TEXT = "Consuming too slow."


class AMQPError(Exception):
    """An error with an AMQP reply code.

    :param code: the reply code to send.
    :param text: the reply text; says what was wrong in words a client user can act on.
    :param method: ``(class_id, method_id)`` of the method that failed, or ``(0, 0)``.
    """

    connection_level = False

    def __init__(
        self, code: int, text: str, method: tuple[int, int] = (0, 0), channel: int = 0
    ) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text
        self.method = method
        #: the channel the error belongs to (for channel errors raised below the session)
        self.channel = channel

    @property
    def reply_text(self) -> str:
        name = REPLY_NAMES.get(self.code, str(self.code))
        return f"{name} - {self.text}"

    def __str__(self) -> str:
        return self.reply_text


class ChannelError(AMQPError):
    """Closes the channel the method came on; the connection stays up."""


class ConnectionError_(AMQPError):
    """Closes the whole connection."""

    connection_level = True


class FrameError(ConnectionError_):
    """The peer broke the framing rules (501/505 family); raised by the codec."""


#: the longest name (queue, exchange, routing key) AMQP can carry: a short string
MAX_NAME_BYTES = 255


def name_problem(name: str) -> str:
    """What makes ``name`` unusable as a queue or exchange name ("" when nothing): text that is
    not valid UTF-8 (a lone surrogate, as py-amqp decodes with ``surrogatepass``) or longer
    than a short string's 255 bytes. The codec refuses such names on the wire; callers that
    take names from elsewhere (the admin API, plugins) check with this."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long, more than {MAX_NAME_BYTES}"
    return ""

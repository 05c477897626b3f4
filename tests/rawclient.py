"""A tiny AMQP 0-9-1 client for tests: frame builders (pure) and a raw socket client.

The frame builders use the broker's own method table (:func:`plugbroker.codec.methods.encode_args`)
so a test can say ``method_frame(1, "queue.declare", 0, "q", False, ...)`` and get exactly the
bytes a client would send. :func:`parse_frames` splits server output back into frames, and
:func:`decode_method` turns a method frame payload into ``(name, args)``.

:class:`RawClient` speaks just enough over a socket to reach an open channel (protocol header,
start-ok PLAIN guest/guest, tune-ok, open, channel.open) and then lets the test send anything,
well formed or not, and read what the broker answers.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import time
from typing import Any

from amqp.serialization import dumps

from plugbroker.codec.methods import BY_NAME, METHODS, decode_args, encode_args

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"

# ---------------------------------------------------------------- pure frame builders


def frame(
    ftype: int, channel: int, payload: bytes, size: int | None = None, end: bytes = FRAME_END
) -> bytes:
    """One frame; ``size`` and ``end`` may be overridden to build broken frames."""
    n = len(payload) if size is None else size
    return struct.pack(">BHI", ftype, channel, n) + payload + end


def method_payload(name: str, *args: Any) -> bytes:
    spec = BY_NAME[name]
    if len(args) != len(spec.fmt):
        raise TypeError(f"{name} takes {len(spec.fmt)} arguments ({' '.join(spec.args)})")
    return encode_args(spec, args)


def method_frame(channel: int, name: str, *args: Any) -> bytes:
    return frame(1, channel, method_payload(name, *args))


def raw_method_frame(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


def header_payload(
    body_size: int, properties: bytes = b"\x00\x00", class_id: int = 60, weight: int = 0
) -> bytes:
    return struct.pack(">HHQ", class_id, weight, body_size) + properties


def header_frame(
    channel: int, body_size: int, properties: bytes = b"\x00\x00", class_id: int = 60
) -> bytes:
    return frame(2, channel, header_payload(body_size, properties, class_id))


def body_frame(channel: int, data: bytes) -> bytes:
    return frame(3, channel, data)


def heartbeat_frame(channel: int = 0) -> bytes:
    return frame(8, channel, b"")


def publish_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: bytes = b"\x00\x00",
    *,
    mandatory: bool = False,
    immediate: bool = False,
    frame_max: int = 131072,
) -> bytes:
    """basic.publish + content header + body frames split at ``frame_max``."""
    out = [
        method_frame(channel, "basic.publish", 0, exchange, routing_key, mandatory, immediate),
        header_frame(channel, len(body), properties),
    ]
    room = frame_max - 8
    for i in range(0, len(body), room):
        out.append(body_frame(channel, body[i : i + room]))
    return b"".join(out)


def properties_bytes(**props: Any) -> bytes:
    """Raw basic properties (flags + list) as py-amqp serialises them."""
    from amqp.basic_message import Message

    m = Message()
    m.properties = {k: v for k, v in props.items() if v is not None}
    return bytes(m._serialize_properties())


def plain_response(user: str = "guest", password: str = "guest") -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def amqplain_response(user: str = "guest", password: str = "guest") -> bytes:
    return dumps("F", [{"LOGIN": user, "PASSWORD": password}])[4:]


# ---------------------------------------------------------------- parsing server output


def parse_frames(data: bytes) -> tuple[list[tuple[int, int, bytes]], bytes]:
    """Complete frames ``(type, channel, payload)`` in ``data`` and the unparsed rest."""
    frames = []
    pos = 0
    while len(data) - pos >= 7:
        ftype, channel, size = struct.unpack_from(">BHI", data, pos)
        end = pos + 7 + size
        if len(data) <= end:
            break
        if data[end] != 0xCE:
            raise AssertionError(f"server frame without frame-end at {end}: {data[end]:#x}")
        frames.append((ftype, channel, bytes(data[pos + 7 : end])))
        pos = end + 1
    return frames, bytes(data[pos:])


def decode_method(payload: bytes) -> tuple[str, tuple[Any, ...]]:
    class_id, method_id = struct.unpack_from(">HH", payload)
    spec = METHODS[(class_id, method_id)]
    return spec.name, decode_args(spec, payload)


# ---------------------------------------------------------------- the socket client


class Closed(Exception):
    """The broker closed the socket."""


class RawClient:
    """A blocking socket client that reads frames and sends whatever bytes it is given."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.frame_max = 131072
        self.eof = False

    # -- raw I/O

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no data from the broker in time")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no data from the broker in time") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise Closed("broker closed the connection")
        self.buf += data

    def read_bytes(self, n: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            self._recv(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self, timeout: float | None = None) -> tuple[int, int, bytes]:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            frames, _ = parse_frames(self.buf)
            if frames:
                _ftype, _channel, payload = frames[0]
                self.buf = self.buf[8 + len(payload) :]
                return frames[0]
            self._recv(deadline)

    def read_method(
        self, timeout: float | None = None, skip_heartbeats: bool = True
    ) -> tuple[int, str, tuple[Any, ...]]:
        """The next method frame as ``(channel, name, args)`` (content frames are skipped)."""
        while True:
            ftype, channel, payload = self.read_frame(timeout)
            if ftype == 1:
                name, args = decode_method(payload)
                return channel, name, args
            if ftype == 8 and not skip_heartbeats:
                return channel, "heartbeat", ()

    def expect(self, name: str, timeout: float | None = None) -> tuple[int, tuple[Any, ...]]:
        channel, got, args = self.read_method(timeout)
        if got != name:
            raise AssertionError(f"expected {name}, got {got} {args!r}")
        return channel, args

    def wait_closed(self, timeout: float | None = None) -> bool:
        """True when the broker closes the socket within ``timeout`` (data is discarded)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            while True:
                self._recv(deadline)
                self.buf = b""
        except Closed:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- protocol

    def method(self, channel: int, name: str, *args: Any) -> None:
        self.send(method_frame(channel, name, *args))

    def handshake(
        self,
        vhost: str = "/",
        *,
        frame_max: int | None = None,
        heartbeat: int = 0,
        channel: int | None = 1,
    ) -> dict[str, Any]:
        """Protocol header .. connection.open (.. channel.open); returns the tune arguments."""
        self.send(PROTOCOL_HEADER)
        _, start = self.expect("connection.start")
        assert "PLAIN" in start[3].split()
        self.method(
            0,
            "connection.start_ok",
            {
                "product": "rawclient",
                "capabilities": {
                    "consumer_cancel_notify": True,
                    "authentication_failure_close": True,
                },
            },
            "PLAIN",
            plain_response(),
            "en_US",
        )
        _, (channel_max, server_frame_max, _hb) = self.expect("connection.tune")
        self.frame_max = frame_max or server_frame_max
        self.method(0, "connection.tune_ok", channel_max, self.frame_max, heartbeat)
        self.method(0, "connection.open", vhost, "", False)
        self.expect("connection.open_ok")
        if channel is not None:
            self.open_channel(channel)
        return {"channel_max": channel_max, "frame_max": server_frame_max}

    def open_channel(self, channel: int) -> None:
        self.method(channel, "channel.open", "")
        ch, _ = self.expect("channel.open_ok")
        assert ch == channel

    def expect_connection_close(self, timeout: float | None = None) -> tuple[int, str, int, int]:
        """Read until connection.close; answer close-ok; return its arguments."""
        while True:
            _channel, name, args = self.read_method(timeout)
            if name == "connection.close":
                try:
                    self.method(0, "connection.close_ok")
                except OSError:
                    pass
                return args  # type: ignore[return-value]

    def expect_channel_close(self, timeout: float | None = None) -> tuple[int, int, str, int, int]:
        """Read until channel.close; answer close-ok; return ``(channel, *args)``."""
        while True:
            channel, name, args = self.read_method(timeout)
            if name == "connection.close":
                raise AssertionError(f"expected channel.close, got connection.close {args!r}")
            if name == "channel.close":
                self.method(channel, "channel.close_ok")
                return (channel, *args)  # type: ignore[return-value]


# ---------------------------------------------------------------- py-amqp over a fake wire


class FakeWire:
    """Stands in for py-amqp's transport: collects what the client writes."""

    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: Any) -> None:
        self.out += bytes(data)

    def having_timeout(self, timeout: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def take(self) -> bytes:
        data = bytes(self.out)
        self.out.clear()
        return data


def py_amqp_channel(channel_id: int = 1, frame_max: int = 131072) -> tuple[Any, FakeWire]:
    """A real py-amqp ``Channel`` whose frames land in a :class:`FakeWire` (no socket).

    Call its methods with ``nowait=True`` where they have it (nothing answers); every call
    leaves exactly the bytes py-amqp would put on a socket in ``wire``.
    """
    import warnings

    import amqp
    from amqp.method_framing import frame_writer

    wire = FakeWire()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn = amqp.Connection(frame_max=frame_max)
    conn.frame_max = frame_max
    conn._transport = wire
    conn.frame_writer = frame_writer(conn, wire)
    ch = amqp.Channel(conn, channel_id)
    ch.is_open = True
    return ch, wire


def py_amqp_read(data: bytes) -> list[tuple[int, tuple[int, int], bytes, Any]]:
    """Feed server output to py-amqp's own frame handler; ``(channel, sig, args, message)``."""
    from amqp.method_framing import frame_handler

    class _Conn:
        bytes_recv = 0

    got: list[tuple[int, tuple[int, int], bytes, Any]] = []
    on_frame = frame_handler(_Conn(), lambda ch, sig, buf, msg: got.append((ch, sig, buf, msg)))
    frames, rest = parse_frames(data)
    assert rest == b"", f"{len(rest)} trailing bytes"
    for f in frames:
        on_frame(f)
    return got


def nested_table(depth: int, *, arrays: bool = False) -> bytes:
    """A field table (with its 4-byte length) nested ``depth`` levels deep, built without
    recursion: ``{"n": {"n": ... {}}}``; with ``arrays`` every second level is a one-element
    array instead of a table (the outermost is always a table)."""
    kinds = ["A" if arrays and i % 2 else "F" for i in range(depth)]
    payload = b""  # the contents of the innermost container: empty
    for level in range(depth - 1, 0, -1):
        item = kinds[level].encode() + struct.pack(">I", len(payload)) + payload
        payload = item if kinds[level - 1] == "A" else b"\x01n" + item
    return struct.pack(">I", len(payload)) + payload


def deep_header_properties(depth: int) -> bytes:
    """Basic properties with a headers table ``depth`` deep and delivery_mode 2."""
    flags = (1 << 13) | (1 << 12)
    return struct.pack(">H", flags) + nested_table(depth) + b"\x02"


def raw_from(source: str, port: int, timeout: float = 5.0) -> RawClient:
    """A :class:`RawClient` connected to 127.0.0.1:``port`` from ``source`` (another loopback
    address: another peer, for the broker)."""
    raw = RawClient.__new__(RawClient)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    raw.sock, raw.timeout, raw.buf, raw.frame_max, raw.eof = sock, timeout, b"", 131072, False
    return raw


# ---------------------------------------------------------------- admin HTTP from an address


def http_from(source: str, port: int, user: str, password: str) -> socket.socket:
    """An admin request with HTTP Basic ``user:password`` sent from ``source`` (a loopback
    address); the socket, to read the answer from when it comes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    cred = base64.b64encode(f"{user}:{password}".encode()).decode()
    sock.sendall(
        f"GET /api/whoami HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {cred}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    return sock


def http_answer(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Status, headers and JSON body of the answer on ``sock`` (read until it closes)."""
    data = b""
    for _ in range(1000):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)

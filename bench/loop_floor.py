"""What one request/answer round trip costs an event loop that does nothing else.

A server process whose protocol answers every read with 21 bytes (the size of a basic.ack
frame), on asyncio's loop and on uvloop's, as a plain ``Protocol`` (each read a new bytes
object) and as a ``BufferedProtocol`` (reads into one buffer allocated once); a blocking
client sends ``--size`` bytes (a 1 KiB publish is about 1,100) and waits for the answer,
``--count`` times. It prints the server's CPU (user and system, from ``/proc/<pid>/stat``) per
round trip: the floor under plugbroker's figure for a publisher that waits for each confirm,
or a consumer that acks one by one.

Run: ``python3 bench/loop_floor.py [--count 20000] [--size 1100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

ANSWER = b"\x01" * 21


class _Answer(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.transport.write(ANSWER)


class _BufferedAnswer(asyncio.BufferedProtocol):
    buffer = memoryview(bytearray(256 * 1024))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.transport.write(ANSWER)


KINDS = ("asyncio", "asyncio-buffered", "uvloop", "uvloop-buffered")


def serve(kind: str, port: int) -> None:
    loop_name, _, buffered = kind.partition("-")
    loop: asyncio.AbstractEventLoop
    if loop_name == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    protocol = _BufferedAnswer if buffered else _Answer
    loop.run_until_complete(loop.create_server(protocol, "127.0.0.1", port))
    loop.run_forever()


def cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(kind: str, count: int, size: int) -> tuple[float, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b"x" * size
        for _ in range(200):  # warm-up
            sock.sendall(request)
            sock.recv(64)
        u0, s0 = cpu(proc.pid)
        for _ in range(count):
            sock.sendall(request)
            sock.recv(64)
        u1, s1 = cpu(proc.pid)
        sock.close()
        return (u1 - u0) / count * 1e6, (s1 - s0) / count * 1e6
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1100, help="request bytes")
    ap.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    print("| loop and protocol | user µs | system µs | CPU µs per round trip |")
    print("|---|---:|---:|---:|")
    for name in KINDS:
        user, system = measure(name, args.count, args.size)
        print(f"| {name} | {user:.1f} | {system:.1f} | {user + system:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The codec and the session on the hot path, in process: no sockets, no event loop.

Two measurements, each the best of ``--repeat`` runs over ``--count`` messages:

* ``codec``: :class:`plugbroker.codec.ServerCodec` parses a buffer of ``basic.publish`` (method,
  content header, 64-byte body) and a buffer of ``basic.ack`` frames; ns per event.
* ``session``: one :class:`plugbroker.session.Connection` over a fake transport, a
  :class:`plugbroker.app.Broker` on a manual clock. ``publish`` feeds the publishes (parse, dispatch,
  route, enqueue); ``deliver`` starts a consumer and runs the turn that delivers them all;
  ``ack`` feeds one ``basic.ack`` per delivery. µs per message.
* ``requeue``: the same queue delivered to a consumer that is then cancelled; ``reject`` feeds
  one ``basic.reject`` with requeue per delivery, in delivery order (each message goes back to
  its original position, behind the ones requeued before it); ``redeliver`` starts a consumer
  and runs the turn that delivers them all again. µs per message.

Times are process CPU time (``time.process_time``), so other work on a shared machine inflates
them less than wall time would.

``--permissioned`` logs in as a user whose write and read patterns are not ``.*``, so every
publish, consume and get goes through the permission check (a memo lookup after the first).

Run: ``python3 bench/session_bench.py [--count N] [--repeat R] [--permissioned]``.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.codec import NEED_DATA, ServerCodec
from plugbroker.codec.methods import BY_NAME, encode_args
from plugbroker.config import parse_config
from plugbroker.session import Connection

CONFIG = r"""<broker>
  <users>
    <user name="guest" password="guest" vhosts="/"/>
    <user name="bencher" password="bencher">
      <permission vhost="/" configure="^bench$" write="^amq\.default$" read="^bench$"/>
    </user>
  </users>
  <virtualhost name="/"/>
</broker>"""

BODY = b"x" * 64


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def _method(channel: int, name: str, *args: Any) -> bytes:
    return _frame(1, channel, encode_args(BY_NAME[name], args))


def _publish(channel: int, routing_key: str) -> bytes:
    return (
        _method(channel, "basic.publish", 0, "", routing_key, False, False)
        + _frame(2, channel, struct.pack(">HHQ", 60, 0, len(BODY)) + b"\x00\x00")
        + _frame(3, channel, BODY)
    )


def _acks(channel: int, count: int) -> bytes:
    return b"".join(_method(channel, "basic.ack", tag, False) for tag in range(1, count + 1))


class _Transport:
    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _feed(conn: Connection, data: bytes, chunk: int = 65536) -> None:
    for i in range(0, len(data), chunk):
        conn.data_received(data[i : i + chunk])


def codec_ns(data: bytes, events: int) -> float:
    codec = ServerCodec()
    codec.receive_data(b"AMQP\x00\x00\x09\x01")
    codec.next_event()
    codec.receive_data(data)
    t0 = time.process_time()
    n = 0
    while codec.next_event() is not NEED_DATA:
        n += 1
    elapsed = time.process_time() - t0
    assert n == events, (n, events)
    return elapsed / events * 1e9


def session_us(count: int, user: str = "guest") -> dict[str, float]:
    broker = Broker(parse_config(CONFIG), clock=ManualClock())
    conn = Connection(broker, _Transport(), "127.0.0.1:5672")
    login = f"\x00{user}\x00{user}".encode()
    _feed(
        conn,
        b"AMQP\x00\x00\x09\x01"
        + _method(0, "connection.start_ok", {}, "PLAIN", login, "en_US")
        + _method(0, "connection.tune_ok", 2047, 131072, 0)
        + _method(0, "connection.open", "/", "", False)
        + _method(1, "channel.open", "")
        + _method(1, "queue.declare", 0, "bench", False, False, False, False, False, {}),
    )
    broker.end_of_turn()
    publishes = b"".join(_publish(1, "bench") for _ in range(count))
    acks = _acks(1, count)
    out: dict[str, float] = {}
    t0 = time.process_time()
    _feed(conn, publishes)
    broker.end_of_turn()
    out["publish"] = (time.process_time() - t0) / count * 1e6
    q = broker.vhosts["/"].queues["bench"]
    assert q.ready_count == count, q.ready_count
    t0 = time.process_time()
    _feed(conn, _method(1, "basic.consume", 0, "bench", "", False, False, False, False, {}))
    broker.end_of_turn()
    out["deliver"] = (time.process_time() - t0) / count * 1e6
    t0 = time.process_time()
    _feed(conn, acks)
    broker.end_of_turn()
    out["ack"] = (time.process_time() - t0) / count * 1e6
    assert not conn.channels[1].unacked and not q.ready_count
    return out


def requeue_us(count: int) -> dict[str, float]:
    broker = Broker(parse_config(CONFIG), clock=ManualClock())
    conn = Connection(broker, _Transport(), "127.0.0.1:5672")
    _feed(
        conn,
        b"AMQP\x00\x00\x09\x01"
        + _method(0, "connection.start_ok", {}, "PLAIN", b"\x00guest\x00guest", "en_US")
        + _method(0, "connection.tune_ok", 2047, 131072, 0)
        + _method(0, "connection.open", "/", "", False)
        + _method(1, "channel.open", "")
        + _method(1, "queue.declare", 0, "bench", False, False, False, False, False, {}),
    )
    _feed(conn, b"".join(_publish(1, "bench") for _ in range(count)))
    broker.end_of_turn()
    _feed(conn, _method(1, "basic.consume", 0, "bench", "c1", False, False, False, False, {}))
    broker.end_of_turn()
    _feed(conn, _method(1, "basic.cancel", "c1", False))
    broker.end_of_turn()
    rejects = b"".join(_method(1, "basic.reject", tag, True) for tag in range(1, count + 1))
    out: dict[str, float] = {}
    t0 = time.process_time()
    _feed(conn, rejects)
    broker.end_of_turn()
    out["reject"] = (time.process_time() - t0) / count * 1e6
    q = broker.vhosts["/"].queues["bench"]
    assert q.ready_count == count, q.ready_count
    t0 = time.process_time()
    _feed(conn, _method(1, "basic.consume", 0, "bench", "c2", False, False, False, False, {}))
    broker.end_of_turn()
    out["redeliver"] = (time.process_time() - t0) / count * 1e6
    assert not q.ready_count and len(conn.channels[1].unacked) == count
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--permissioned",
        action="store_true",
        help="log in as a user with patterns (write ^amq\\.default$, read ^bench$) instead of "
        "guest's .* on everything: what the permission checks cost",
    )
    a = ap.parse_args(argv)
    publishes = b"".join(_publish(1, "bench") for _ in range(a.count))
    acks = _acks(1, a.count)
    pub = min(codec_ns(publishes, a.count) for _ in range(a.repeat))
    ack = min(codec_ns(acks, a.count) for _ in range(a.repeat))
    print(f"codec   publish {pub:8.0f} ns/event   ack {ack:8.0f} ns/event")
    user = "bencher" if a.permissioned else "guest"
    runs = [session_us(a.count, user) for _ in range(a.repeat)]
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    print(
        f"session publish {best['publish']:8.2f} µs/msg   deliver {best['deliver']:8.2f} µs/msg"
        f"   ack {best['ack']:8.2f} µs/msg"
    )
    runs = [requeue_us(a.count) for _ in range(a.repeat)]
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    print(
        f"requeue reject  {best['reject']:8.2f} µs/msg   redeliver {best['redeliver']:6.2f} µs/msg"
    )


if __name__ == "__main__":
    main()

"""Delayed delivery at scale: how late do a million pending delayed messages fire?

    python3 bench/delayed_bench.py [--messages 1000000] [--spread 10]

Runs the broker's own path in-process on a real asyncio loop: an ``x-delayed-message`` exchange
(``x-delayed-type: direct``) bound to a queue, every message published through
``VirtualHost.hold_delayed`` with an ``x-delay`` spread uniformly over ``--spread`` seconds
(after a head start longer than the scheduling takes, so all are pending at once). Each
release records how late it fired (loop time minus its due time). Prints p50/p99/max
lateness, how many were pending at the peak, and the broker's RSS. Retry-queue holds and
nack backoff use the same timer heap.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plugbroker.app import Broker
from plugbroker.codec import properties as P
from plugbroker.config import ConfigElementRegistry, parse_config
from plugbroker.domain.message import Message
from plugbroker.domain.vhost import VirtualHost


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--spread", type=float, default=10.0)
    ap.add_argument(
        "--head-start",
        type=float,
        default=12.0,
        help="seconds before the first is due: must exceed the scheduling time, "
        "or the loop is still busy scheduling when they come due",
    )
    args = ap.parse_args()

    async def run() -> None:
        broker = Broker(parse_config("<broker/>", registry=ConfigElementRegistry()))
        broker.attach_loop(asyncio.get_running_loop())
        vh = broker.vhosts["/"]
        ex = vh.declare_exchange(
            "delayed", "x-delayed-message", arguments={"x-delayed-type": "direct"}
        )
        q, _ = vh.declare_queue("later")
        vh.bind(ex, q, "k", {})
        lateness: list[float] = []
        due_of: dict[int, float] = {}
        original = VirtualHost._release_delayed

        def release(self: VirtualHost, exchange: object, msg: Message) -> None:
            lateness.append(broker.clock.monotonic() - due_of.pop(msg.id))
            original(self, exchange, msg)  # type: ignore[arg-type]

        VirtualHost._release_delayed = release  # type: ignore[method-assign]
        rnd = random.Random(7)
        raw = P.encode({"delivery_mode": 1})
        t0 = time.perf_counter()
        start = broker.clock.monotonic()
        for _ in range(args.messages):
            delay = args.head_start + rnd.random() * args.spread
            m = Message.from_publish(vh.ids.next(), "delayed", "k", raw, b"x" * 16, 16, start, 0.0)
            due_of[m.id] = broker.clock.monotonic() + delay  # as hold_delayed counts it
            vh.hold_delayed(ex, m, delay)  # type: ignore[arg-type]
        scheduled = time.perf_counter() - t0
        peak = vh.delayed_pending
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"scheduled {args.messages} delayed messages in {scheduled:.1f} s "
            f"({args.messages / scheduled:,.0f}/s); pending at peak: {peak}; "
            f"RSS {rss_mb:,.0f} MB"
        )
        deadline = time.monotonic() + args.head_start + args.spread + 30
        while len(lateness) < args.messages and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            # keep the queue small, in small bites: a purge of 20,000 messages would itself
            # stall the loop ~20 ms and be charged to the timers that fire next
            q.purge()
        ms = sorted(x * 1000 for x in lateness)
        print(
            f"fired {len(ms)}: lateness p50 {statistics.median(ms):.2f} ms, "
            f"p99 {ms[int(len(ms) * 0.99) - 1]:.2f} ms, max {ms[-1]:.2f} ms"
        )

    asyncio.run(run())


if __name__ == "__main__":
    main()

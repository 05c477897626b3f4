"""One full slow-consumer check over many queues: snapshot on the loop + policy evaluation.

    python3 bench/slow_consumer_bench.py [--queues 10000] [--messages 1000000] [--rounds 20]

Builds a broker in-process (no sockets), declares the queues, each bound to amq.topic under a
<topic> policy with every threshold set, fills them, gives every tenth queue a consumer, then
times ``Broker.snapshot()`` and ``plugbroker.plugins.slow_consumer.evaluate`` separately. What it prints is
the cost of one housekeeping check; it must not grow with the number of messages.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.config import parse_config
from plugbroker.domain.message import Message
from plugbroker.plugins.slow_consumer import delete_policy, evaluate, log_policy

CONFIG = """<broker><virtualhost name="/">
  <topic key="bench.#"><consumer>
    <depth>1GB</depth><messageAge>1h</messageAge><messageCount>1000000</messageCount>
    <consumptionRate>0.001</consumptionRate><policy name="Delete"/>
  </consumer></topic>
</virtualhost></broker>"""


class _Channel:
    id = 1
    connection_id = "bench"
    unheard = False

    def can_deliver(self) -> bool:
        return False  # hold everything: the queues keep their backlog

    def deliver(self, *a: object) -> None:
        raise AssertionError

    def consumer_cancelled_by_broker(self, c: object) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    clock = ManualClock()
    broker = Broker(parse_config(CONFIG), clock=clock)  # the built-in plugins parse <consumer>
    vh = broker.vhosts["/"]
    topic = vh.exchanges["amq.topic"]
    raw = P.encode({"delivery_mode": 1})
    body = b"x" * 64
    per_queue = args.messages // args.queues
    t0 = time.perf_counter()
    for i in range(args.queues):
        q, _ = vh.declare_queue(f"sub-{i}")
        vh.bind(topic, q, f"bench.{i}", {})
        if i % 10 == 0:
            q.add_consumer(
                f"c{i}", _Channel(), no_ack=False, exclusive=False, prefetch=0, arguments={}
            )
        for _ in range(per_queue):
            q.enqueue(
                Message.from_publish(
                    vh.ids.next(),
                    "amq.topic",
                    f"bench.{i}",
                    raw,
                    body,
                    len(body),
                    clock.monotonic(),
                    clock.time(),
                )
            )
    broker._dirty.clear()
    fill = time.perf_counter() - t0
    total = sum(len(q.held) for q in vh.queues.values())
    print(f"setup: {args.queues} queues, {total} messages held, {fill:.1f} s to fill")
    policies = {"Delete": delete_policy, "Log": log_policy}
    queues = list(vh.queues.values())

    def check_rounds(acks_per_round: int) -> tuple[list[float], list[float], int]:
        state: dict = {}
        snap_t, eval_t = [], []
        actions: list = []
        for _ in range(args.rounds):
            clock.advance(1.0)
            for q in queues:  # consumers that keep up (not timed)
                q.acks_total += acks_per_round
            t0 = time.perf_counter()
            snap = broker.snapshot()
            t1 = time.perf_counter()
            actions = evaluate(snap, state, policies.__getitem__)
            t2 = time.perf_counter()
            snap_t.append((t1 - t0) * 1e3)
            eval_t.append((t2 - t1) * 1e3)
        return snap_t, eval_t, len(actions)

    def report(label: str, snap_t: list[float], eval_t: list[float], n: int) -> None:
        both = [a + b for a, b in zip(snap_t, eval_t)]
        print(
            f"{label}: snapshot {statistics.median(snap_t):6.2f} ms + evaluate "
            f"{statistics.median(eval_t):6.2f} ms = full check median "
            f"{statistics.median(both):6.2f} ms (min {min(both):6.2f} ms), {n} actions"
        )

    report("healthy (no threshold crossed)", *check_rounds(1000))
    # nothing acks: from the second round every queue is under its consumption-rate floor, so
    # the Delete policy runs for every queue - the worst case
    report("worst case (every queue trips) ", *check_rounds(0))
    print(f"({args.queues} queues, {total} messages)")


if __name__ == "__main__":
    main()

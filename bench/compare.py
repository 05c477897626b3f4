"""plugbroker against RabbitMQ in one run: broker CPU µs per message, and the ratio.

Absolute CPU times differ between machines (and between minutes on a shared one), so what this
reports is the **ratio** of plugbroker's broker CPU per message to RabbitMQ's, measured in the
same run with the same clients and the phases of ``throughput.py``.

It starts plugbroker once per ``--loop`` (a subprocess each, ``PLUGBROKER_LOOP``), once per
``--baseline DIR`` (another tree, e.g. an unpacked ``git archive`` of an older commit, on
``--baseline-loop``) for before/after figures, and measures those and a running RabbitMQ
(``--rabbitmq-url`` with ``--rabbitmq-pid``, its ``beam.smp``). Rounds are interleaved: each
round runs every phase on every broker back to back, so load from elsewhere on the machine
falls on all of them alike. Each figure is the median over ``--repeat`` rounds; each ratio is
taken within a round, then the median of those.

Run::

    PID=$(rabbitmqctl -n "$RABBITMQ_NODENAME" eval 'os:getpid().' | tr -d '"')
    python3 bench/compare.py --rabbitmq-url amqp://guest:guest@127.0.0.1:25691// \\
        --rabbitmq-pid "$PID" --loop asyncio uvloop --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput as tp

RABBIT = "RabbitMQ"


@dataclass
class Target:
    label: str
    url: str
    pid: int | None
    own: tp.OwnBroker | None = None
    #: (mode, size) -> one Result per round
    results: dict[tuple[str, int], list[tp.Result]] = field(default_factory=dict)

    def cpu_us(self, key: tuple[str, int]) -> list[float]:
        return [r.cpu / r.count * 1e6 for r in self.results.get(key, []) if r.cpu and r.count]

    def split_us(self, key: tuple[str, int]) -> tuple[list[float], list[float]]:
        """user and system µs per message, one of each per round."""
        rs = [r for r in self.results.get(key, []) if r.cpu_split is not None and r.count]
        return (
            [r.cpu_split.user / r.count * 1e6 for r in rs if r.cpu_split],
            [r.cpu_split.system / r.count * 1e6 for r in rs if r.cpu_split],
        )


def median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rabbitmq-url", help="a running RabbitMQ (or any AMQP 0-9-1 broker)")
    ap.add_argument("--rabbitmq-pid", type=int, help="its pid (beam.smp), for the CPU column")
    ap.add_argument(
        "--loop",
        nargs="+",
        default=["asyncio", "uvloop"],
        choices=("asyncio", "uvloop", "auto"),
        help="start one plugbroker per event loop named",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="also run the plugbroker tree in this directory (repeatable)",
    )
    ap.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PYTHON",
        help="also run the plugbroker installed for this interpreter (a venv's bin/python, "
        "e.g. a pure-Python and a compiled build side by side), on each --loop; repeatable",
    )
    ap.add_argument(
        "--baseline-loop",
        choices=("asyncio", "uvloop", "auto"),
        help="PLUGBROKER_LOOP for the baseline trees (a tree that predates it ignores it)",
    )
    ap.add_argument("--size", type=int, nargs="+", default=[1024], help="body bytes")
    ap.add_argument("--count", type=int, default=20000, help="messages per phase")
    ap.add_argument(
        "--mode", nargs="+", choices=tp.MODES + ("all",), default=["all"], help="one or more"
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds; figures are medians")
    ap.add_argument("--json", type=Path, help="write every single figure here")
    args = ap.parse_args(argv)

    modes = tp.MODES if "all" in args.mode else tuple(args.mode)
    targets: list[Target] = []
    try:
        for tree in args.baseline:
            own = tp.OwnBroker(root=tree.resolve(), loop=args.baseline_loop)
            targets.append(Target(f"baseline ({tree.name})", own.url, own.pid, own))
        for loop in args.loop:
            own = tp.OwnBroker(loop=loop)
            targets.append(Target(f"plugbroker ({loop})", own.url, own.pid, own))
            for py in args.python:
                own = tp.OwnBroker(loop=loop, python=py)
                venv = Path(py).parent.parent.name
                targets.append(Target(f"plugbroker ({loop}, {venv})", own.url, own.pid, own))
        if args.rabbitmq_url:
            targets.append(Target(RABBIT, args.rabbitmq_url, args.rabbitmq_pid))
        for t in targets:
            tp.warm_up(t.url)
        for rnd in range(1, args.repeat + 1):
            for size in args.size:
                for mode in modes:
                    for t in targets:
                        r = tp.RUNNERS[mode](t.url, t.pid, size, args.count)
                        t.results.setdefault((mode, size), []).append(r)
                        print(
                            f"  round {rnd} {mode:16s} {size:5d} B  {t.label:24s} "
                            f"{r.rate:10,.0f} msg/s  cpu {r.cpu_us():>6s} µs/msg "
                            f"({r.split_us()} user/sys)  {r.note}",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        for t in targets:
            if t.own is not None:
                t.own.stop()

    rabbit = next((t for t in targets if t.label == RABBIT), None)
    ours = [t for t in targets if t is not rabbit]
    print(
        f"\nbroker CPU µs per message, median of {args.repeat} rounds "
        f"({args.count} messages per phase); ratio = plugbroker / RabbitMQ within a round"
    )
    head = ["mode", "body", *(t.label for t in targets)]
    if rabbit is not None:
        head += [f"ratio {t.label.removeprefix('plugbroker ')}" for t in ours]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for size in args.size:
        for mode in modes:
            key = (mode, size)
            row = [mode, f"{size} B", *(fmt(median_or_none(t.cpu_us(key))) for t in targets)]
            if rabbit is not None:
                base = rabbit.cpu_us(key)
                for t in ours:
                    mine = t.cpu_us(key)
                    ratios = [a / b for a, b in zip(mine, base) if b]
                    row.append(fmt(median_or_none(ratios), ".2f"))
            print("| " + " | ".join(row) + " |")
    print("\nbroker CPU split, median µs per message: user (Python, interpreter) / system (kernel)")
    print("| mode | body | " + " | ".join(t.label for t in targets) + " |")
    print("|---|" + "---:|" * (len(targets) + 1))
    for size in args.size:
        for mode in modes:
            user, system = zip(*(t.split_us((mode, size)) for t in targets))
            cells = [
                f"{fmt(median_or_none(u))} / {fmt(median_or_none(y))}" for u, y in zip(user, system)
            ]
            print(f"| {mode} | {size} B | " + " | ".join(cells) + " |")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\nmsg/s, median")
    print("| mode | body | " + " | ".join(t.label for t in targets) + " |")
    print("|---|" + "---:|" * (len(targets) + 1))
    for size in args.size:
        for mode in modes:
            key = (mode, size)
            rates = [
                fmt(median_or_none([r.rate for r in t.results.get(key, [])]), ",.0f")
                for t in targets
            ]
            print(f"| {mode} | {size} B | " + " | ".join(rates) + " |")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    t.label: {
                        f"{m} {s}": [
                            {
                                "count": r.count,
                                "seconds": r.seconds,
                                "cpu": r.cpu,
                                "user": r.cpu_split.user if r.cpu_split else None,
                                "system": r.cpu_split.system if r.cpu_split else None,
                                "note": r.note,
                            }
                            for r in rs
                        ]
                        for (m, s), rs in t.results.items()
                    }
                    for t in targets
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

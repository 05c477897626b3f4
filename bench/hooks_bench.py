"""What a per-message hook costs the core: nobody listening vs one trivial plugin.

The core's pattern for every per-message hook is::

    if (h := host.message_acked) is not None:
        h(vhost=..., queue=..., consumer_tag=..., connection_id=..., channel_id=..., message=...)

This measures, per call, that pattern with no implementation (the attribute is ``None``), the
same with one plugin whose implementation does nothing, and, for comparison, calling pluggy's
``pm.hook.broker_message_acked(...)`` unconditionally with no implementation (what the ``None``
attribute saves) and a bare Python function call with the same keyword arguments.

Run: ``python3 bench/hooks_bench.py [--number N] [--repeat R]``; prints ns/call (best of R).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pluggy

from plugbroker import hookspecs
from plugbroker.hookimpl import PROJECT_NAME, hookimpl
from plugbroker.pluginhost import PluginHost


class _Message:
    __slots__ = ("id",)

    def __init__(self) -> None:
        self.id = 1


class _TrivialPlugin:
    @hookimpl
    def broker_message_acked(self, message: Any) -> None:
        pass


def _core_pattern(host: PluginHost, msg: _Message) -> Callable[[], None]:
    def step() -> None:
        if (h := host.message_acked) is not None:
            h(vhost="/", queue="q", consumer_tag="c", connection_id="1", channel_id=1, message=msg)

    return step


def _measure(fn: Callable[[], None], number: int, repeat: int) -> float:
    """Best-of-``repeat`` ns per call of ``fn``, minus the cost of calling an empty ``fn``."""

    def empty() -> None:
        pass

    best = min(timeit.repeat(fn, number=number, repeat=repeat))
    base = min(timeit.repeat(empty, number=number, repeat=repeat))
    return (best - base) / number * 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=1_000_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings; the best is kept")
    args = parser.parse_args(argv)
    msg = _Message()

    idle = PluginHost()
    busy = PluginHost()
    busy.register(_TrivialPlugin(), "trivial")
    pm = pluggy.PluginManager(
        PROJECT_NAME
    )  # bare pluggy: the unconditional call the pattern avoids
    pm.add_hookspecs(hookspecs)
    raw_caller = pm.hook.broker_message_acked

    def unconditional() -> None:
        raw_caller(
            vhost="/", queue="q", consumer_tag="c", connection_id="1", channel_id=1, message=msg
        )

    def plain(
        vhost: str, queue: str, consumer_tag: str, connection_id: str, channel_id: int, message: Any
    ) -> None:
        pass

    def direct() -> None:
        plain(vhost="/", queue="q", consumer_tag="c", connection_id="1", channel_id=1, message=msg)

    rows = [
        ("no plugin: `if (h := host.message_acked) is not None`", _core_pattern(idle, msg)),
        ("one trivial plugin, same pattern", _core_pattern(busy, msg)),
        ("no plugin, pm.hook.broker_message_acked(...) called anyway", unconditional),
        ("reference: plain Python function, same kwargs", direct),
    ]
    print(f"python {sys.version.split()[0]}, {args.number} calls x best of {args.repeat}")
    for label, fn in rows:
        print(f"{_measure(fn, args.number, args.repeat):8.1f} ns/call  {label}")


if __name__ == "__main__":
    main()

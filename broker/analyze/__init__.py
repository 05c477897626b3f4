"""The Spark pipeline over the event journal: ``report``, ``backtest`` and ``recommend``.

Runnable as ``plugbroker analyze ...`` (see :mod:`plugbroker.analyze.cli`) and from Python::

    from plugbroker.analyze import report, backtest, recommend

    report("events/", "out/")                             # tables + out/report.html
    result = backtest("events/", "candidate.xml")          # what the candidate would have done
    print(recommend("events/").xml)                        # thresholds as an XML snippet

Each function takes an optional ``spark`` session; without one it uses the active session or
starts one with no master set in code, so ``local[*]`` is the default and ``spark-submit
--master`` or the ``MASTER`` environment variable choose a cluster. Importing this package does
not import pyspark; the functions do.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def report(journal: Any, out: Any, **kw: Any) -> Any:
    """Per-queue and per-consumer figures as tables and an HTML page; see :mod:`.report`."""
    from plugbroker.analyze.report import report as run

    return run(journal, out, **kw)


def backtest(journal: Any, config: Any, **kw: Any) -> Any:
    """Replay the journal against a candidate config; see :mod:`.backtest`."""
    from plugbroker.analyze.backtest import backtest as run

    return run(journal, config, **kw)


def recommend(journal: Any, **kw: Any) -> Any:
    """Thresholds from what the journal shows, as an XML snippet; see :mod:`.recommend`."""
    from plugbroker.analyze.recommend import recommend as run

    return run(journal, **kw)


__all__ = ["backtest", "recommend", "report"]


class _Package(types.ModuleType):
    """Keeps ``plugbroker.analyze.report`` (and ``backtest``, ``recommend``) the functions above.

    Importing a submodule sets it as an attribute of its package, which would replace the
    function of the same name as soon as anything imported ``plugbroker.analyze.report`` (the CLI,
    ``recommend`` running its backtest ...), and ``from plugbroker.analyze import report`` would
    then give a module. The submodules stay importable by their full names."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in __all__ and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

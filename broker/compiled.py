"""The optional compiled build (mypyc): which modules it compiles and which are in use here.

``PLUGBROKER_COMPILE=1 pip install .`` compiles :data:`HOT_PATH` (setup.py reads the list from
this file, which therefore imports nothing but the standard library); a plain install compiles
nothing. A compiled module is an extension module beside its ``.py`` file, and Python imports
the extension first. ``plugbroker run`` logs what :func:`in_use` finds.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

#: the modules the compiled build compiles: the codec, the session, the domain, routing (the
#: codec's event dataclasses and the domain's ready lists are left out: mypyc cannot take them
#: as they are, see docs/operations.md)
HOT_PATH: tuple[str, ...] = (
    "plugbroker.codec.frames",
    "plugbroker.codec.ids",
    "plugbroker.codec.methods",
    "plugbroker.codec.properties",
    "plugbroker.codec.tables",
    "plugbroker.session",
    "plugbroker.session_state",
    "plugbroker.routing",
    "plugbroker.domain.exchange",
    "plugbroker.domain.fate",
    "plugbroker.domain.message",
    "plugbroker.domain.queue",
    "plugbroker.domain.timers",
    "plugbroker.domain.vhost",
)


def in_use() -> list[str]:
    """The modules of :data:`HOT_PATH` that import as compiled extension modules here."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for name in HOT_PATH:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and spec.origin.endswith(suffixes):
            found.append(name)
    return found


def describe() -> str:
    """One line for the log: pure Python, or how many compiled modules are in use."""
    found = in_use()
    if not found:
        return "pure Python (no compiled modules; PLUGBROKER_COMPILE=1 pip install . builds them)"
    if len(found) == len(HOT_PATH):
        return f"compiled (mypyc): all {len(HOT_PATH)} hot-path modules"
    missing = ", ".join(n for n in HOT_PATH if n not in found)
    return (
        f"partly compiled (mypyc): {len(found)} of {len(HOT_PATH)} modules; interpreted: {missing}"
    )

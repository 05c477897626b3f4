"""The marker plugins decorate their hook implementations with.

Kept apart from :mod:`plugbroker.hookspecs` so a plugin module imports one small name::

    from plugbroker.hookimpl import hookimpl

    @hookimpl
    def broker_queue_deleted(vhost: str, queue: str, reason: str) -> None: ...

Built-in plugins (``plugbroker.pluginhost.BUILTIN_PLUGINS``) write ``@hookimpl(trylast=True)`` so that
a third-party implementation of the same hook runs first and, for a firstresult hook, wins.
"""

from __future__ import annotations

import pluggy

#: The pluggy project name; hook specs and implementations must agree on it.
PROJECT_NAME = "plugbroker"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = ["PROJECT_NAME", "hookimpl"]

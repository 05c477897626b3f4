"""What plugins register: named policies and housekeeping jobs.

The plugin host hands each plugin's ``broker_register`` hook a :class:`Registrar` bound to that
plugin (tox's ``tox_register_tox_env(register)`` idea), so every registration knows who made it:
a clash names both plugins, a failing job is logged with its plugin's name, and unregistering a
plugin takes exactly its registrations away.

A policy is stored as given (a function ``evaluate(snapshot, state, now) -> list[Action]``, an
object with an ``evaluate`` method, a class...): its calling convention is agreed between the
plugin that registers it and the job that uses it, not imposed here.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.housekeeping import JobContext

#: Name under which registrations made directly on :class:`Registry` (not through a plugin's
#: ``broker_register``) are attributed.
CORE = "<core>"


class PluginError(Exception):
    """A plugin cannot be loaded, is malformed, or is referred to but missing.

    The message always names the plugin, module, hook or policy involved, and where it was named,
    so the operator can fix the configuration without reading a traceback.
    """


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """A registered policy and the plugin that registered it."""

    name: str
    plugin: str
    policy: Any


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A housekeeping job as registered; :mod:`broker.housekeeping` schedules it.

    ``period`` (seconds) wins over ``period_key``; ``period_key`` names a configured duration
    (e.g. ``"isolation.checkPeriod"``) that the housekeeping pool resolves from the configuration;
    with neither, the job runs at the ``<housekeeping><period>``.
    """

    name: str
    plugin: str
    func: Callable[[JobContext], None]
    period: float | None = None
    period_key: str | None = None


class Registry:
    """All policies and jobs registered by all plugins, keyed by globally unique name."""

    def __init__(self) -> None:
        self._policies: dict[str, PolicyEntry] = {}
        self._jobs: dict[str, JobSpec] = {}
        self._backoffs: dict[str, PolicyEntry] = {}

    # -- registration -----------------------------------------------------------------------------

    def register_policy(self, name: str, policy: Any, *, plugin: str = CORE) -> None:
        """Make ``policy`` available as ``<policy name="{name}">``.

        :raises PluginError: the name is empty or already registered (naming both plugins).
        """
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a policy with an empty name")
        if policy is None:
            raise PluginError(f"plugin {plugin!r} registered policy {name!r} as None")
        if (seen := self._policies.get(name)) is not None:
            raise PluginError(
                f"policy {name!r} is registered twice: by plugin {seen.plugin!r} "
                f"and by plugin {plugin!r}"
            )
        self._policies[name] = PolicyEntry(name, plugin, policy)

    def register_job(
        self,
        name: str,
        func: Callable[[JobContext], None],
        *,
        period: float | None = None,
        period_key: str | None = None,
        plugin: str = CORE,
    ) -> None:
        """Add a housekeeping job; see :class:`JobSpec` for how its period is chosen.

        :raises PluginError: bad name, non-callable, non-positive period, or a name already
            registered (naming both plugins).
        """
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a housekeeping job with an empty name")
        if not callable(func):
            raise PluginError(
                f"plugin {plugin!r} registered housekeeping job {name!r} with {func!r}, "
                "which is not callable"
            )
        if period is not None and not (math.isfinite(period) and period > 0):
            raise PluginError(
                f"plugin {plugin!r} registered housekeeping job {name!r} with period {period!r}; "
                "a period is a positive number of seconds"
            )
        if (seen := self._jobs.get(name)) is not None:
            raise PluginError(
                f"housekeeping job {name!r} is registered twice: by plugin {seen.plugin!r} "
                f"and by plugin {plugin!r}"
            )
        self._jobs[name] = JobSpec(name, plugin, func, period, period_key)

    def register_backoff(
        self, name: str, factory: Callable[[dict[str, str]], Any], *, plugin: str = CORE
    ) -> None:
        """Make ``<backoff type="{name}">`` usable: ``factory(params)`` gets the element's
        ``<param name value>`` pairs as strings and returns an object whose
        ``next(redelivery_count) -> seconds`` gives the delay (PIP-106's interface).

        :raises PluginError: empty, non-callable or already registered (naming both plugins).
        """
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a backoff with an empty name")
        if not callable(factory):
            raise PluginError(
                f"plugin {plugin!r} registered backoff {name!r} with {factory!r}, "
                "which is not callable"
            )
        if (seen := self._backoffs.get(name)) is not None:
            raise PluginError(
                f"backoff {name!r} is registered twice: by plugin {seen.plugin!r} "
                f"and by plugin {plugin!r}"
            )
        self._backoffs[name] = PolicyEntry(name, plugin, factory)

    def backoff(self, name: str) -> Callable[[dict[str, str]], Any]:
        entry = self._backoffs.get(name)
        if entry is None:
            raise PluginError(
                f"backoff {name!r} is not registered by any plugin (registered: "
                f"{', '.join(sorted(self._backoffs)) or 'none'})"
            )
        return entry.policy

    def backoff_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._backoffs))

    def for_plugin(self, plugin: str) -> Registrar:
        """The view handed to ``plugin``'s ``broker_register`` hook."""
        return Registrar(self, plugin)

    def remove_plugin(self, plugin: str) -> None:
        """Forget everything ``plugin`` registered (on unregister, or when its load failed)."""
        self._policies = {k: v for k, v in self._policies.items() if v.plugin != plugin}
        self._jobs = {k: v for k, v in self._jobs.items() if v.plugin != plugin}
        self._backoffs = {k: v for k, v in self._backoffs.items() if v.plugin != plugin}

    # -- lookup -----------------------------------------------------------------------------------

    def policy(self, name: str) -> Any:
        """The policy registered under ``name``.

        :raises PluginError: nobody registered it; the message lists what is registered.
        """
        entry = self._policies.get(name)
        if entry is None:
            raise PluginError(unknown_policy_message(name, self.policy_names()))
        return entry.policy

    def policy_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._policies))

    def jobs(self) -> tuple[JobSpec, ...]:
        """Jobs in registration order."""
        return tuple(self._jobs.values())

    def job(self, name: str) -> JobSpec:
        try:
            return self._jobs[name]
        except KeyError:
            raise PluginError(
                f"no housekeeping job named {name!r}; registered: "
                f"{', '.join(sorted(self._jobs)) or '(none)'}"
            ) from None


class Registrar:
    """A plugin's handle on the :class:`Registry`: the same calls, attributed to the plugin."""

    __slots__ = ("_registry", "plugin")

    def __init__(self, registry: Registry, plugin: str) -> None:
        self._registry = registry
        #: the name of the plugin this registrar registers for
        self.plugin = plugin

    def register_policy(self, name: str, policy: Any) -> None:
        """Make ``policy`` usable as ``<policy name="{name}">``; a clash names both plugins."""
        self._registry.register_policy(name, policy, plugin=self.plugin)

    def register_job(
        self,
        name: str,
        func: Callable[[JobContext], None],
        *,
        period: float | None = None,
        period_key: str | None = None,
    ) -> None:
        """Run ``func(ctx)`` on the housekeeping pool every ``period`` seconds.

        :param period: seconds between runs; wins over ``period_key``.
        :param period_key: a configured duration such as ``"isolation.checkPeriod"`` to take the
            period from; without either, ``<housekeeping><period>`` applies.
        """
        self._registry.register_job(
            name, func, period=period, period_key=period_key, plugin=self.plugin
        )

    def register_backoff(self, name: str, factory: Callable[[dict[str, str]], Any]) -> None:
        """Make ``<backoff type="{name}">`` usable; ``factory(params)`` returns an object with
        ``next(redelivery_count) -> seconds``."""
        self._registry.register_backoff(name, factory, plugin=self.plugin)


def unknown_policy_message(name: str, known: tuple[str, ...], where: str = "") -> str:
    """One wording for "nobody registered this policy", with a did-you-mean."""
    text = f"policy {name!r}{' ' + where if where else ''} is not registered by any plugin"
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        text += f"; did you mean {close[0]!r}?"
    text += f" (registered policies: {', '.join(known) or 'none'})"
    return text


__all__ = [
    "CORE",
    "JobSpec",
    "PluginError",
    "PolicyEntry",
    "Registrar",
    "Registry",
    "unknown_policy_message",
]

"""What plugins register: named policies, policy jobs, plain housekeeping jobs and backoffs.

The plugin host hands each plugin's ``broker_register`` hook a :class:`Registrar` bound to that
plugin (tox's ``tox_register_tox_env(register)`` idea), so every registration knows who made it:
a clash names both plugins, a failing job is logged with its plugin's name, and unregistering a
plugin takes exactly its registrations away.

Every entry is typed by the contract of :mod:`plugbroker.policy`:

* a **named policy** is a :data:`~plugbroker.policy.NamedPolicy`, ``policy(trigger) ->
  list[Action]``, chosen by ``<policy name>`` in the XML;
* a **policy job** is a :class:`~plugbroker.policy.Policy`, ``evaluate(snapshot, state, policies)
  -> list[Action]``, with the section element its snapshot asks for. The housekeeping pool runs
  it in the broker and the backtest replays it over the journal, both found through
  :meth:`Registry.policy_jobs`, whoever registered it;
* a **plain job** is ``func(ctx)`` on the housekeeping pool, for periodic work that is not a
  policy (it gets a :class:`plugbroker.housekeeping.JobContext`).

Policy jobs and plain jobs share one namespace of job names.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from plugbroker.housekeeping import JobContext
    from plugbroker.policy import NamedPolicy, Policy

#: Name under which registrations made directly on :class:`Registry` (not through a plugin's
#: ``broker_register``) are attributed.
CORE = "<core>"

#: ``factory(params) -> backoff``: ``params`` are the ``<param name value>`` pairs of a
#: ``<backoff type>`` element; the backoff's ``next(redelivery_count)`` gives a delay in seconds.
BackoffFactory: TypeAlias = Callable[[dict[str, str]], Any]


class PluginError(Exception):
    """A plugin cannot be loaded, is malformed, or is referred to but missing.

    The message always names the plugin, module, hook or policy involved, and where it was named,
    so the operator can fix the configuration without reading a traceback.
    """


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """A registered named policy and the plugin that registered it."""

    name: str
    plugin: str
    policy: NamedPolicy


@dataclass(frozen=True, slots=True)
class BackoffEntry:
    """A registered ``<backoff type>`` and the plugin that registered it."""

    name: str
    plugin: str
    factory: BackoffFactory


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A plain housekeeping job, ``func(ctx)``, as registered; :mod:`plugbroker.housekeeping` runs it.

    ``period`` (seconds) wins over ``period_key``; ``period_key`` names a configured duration
    (e.g. ``"isolation.checkPeriod"``) that the housekeeping pool resolves from the configuration;
    with neither, the job runs at the ``<housekeeping><period>`` (see :func:`resolve_period`).
    """

    name: str
    plugin: str
    func: Callable[[JobContext], None]
    period: float | None = None
    period_key: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyJobSpec:
    """A policy job as registered: a :class:`~plugbroker.policy.Policy` and the section it reads.

    ``section`` is the element (``"consumer"``, ``"isolation"``, a plugin's own) whose queues its
    snapshot holds; ``None`` means every queue. Periods as for :class:`JobSpec`.
    """

    name: str
    plugin: str
    policy: Policy
    section: str | None
    period: float | None = None
    period_key: str | None = None


#: any housekeeping job
Job: TypeAlias = JobSpec | PolicyJobSpec


def resolve_period(
    job: Job, default: float, period_for: Callable[[str], float | None] | None
) -> float:
    """A job's period in seconds: its own ``period``, else the configured duration its
    ``period_key`` names (``period_for(key)``, ``None`` when not configured), else ``default``.

    The housekeeping pool and the backtest both schedule jobs with this.

    :raises PluginError: the configured duration is not positive.
    """
    if job.period is not None:
        return job.period
    if job.period_key is not None and period_for is not None:
        value = period_for(job.period_key)
        if value is not None:
            if not value > 0:
                raise PluginError(
                    f"housekeeping job {job.name!r} of plugin {job.plugin!r}: "
                    f"{job.period_key} resolves to {value!r}; a period must be positive"
                )
            return float(value)
    return default


class Registry:
    """All policies, jobs and backoffs registered by all plugins, keyed by globally unique name."""

    def __init__(self) -> None:
        self._policies: dict[str, PolicyEntry] = {}
        self._jobs: dict[str, Job] = {}
        self._backoffs: dict[str, BackoffEntry] = {}

    # -- registration -----------------------------------------------------------------------------

    def register_policy(self, name: str, policy: NamedPolicy, *, plugin: str = CORE) -> None:
        """Make ``policy`` available as ``<policy name="{name}">``.

        :raises PluginError: the name is empty, the policy is not callable, or the name is
            already registered (naming both plugins).
        """
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a policy with an empty name")
        if not callable(policy):
            raise PluginError(
                f"plugin {plugin!r} registered policy {name!r} as {policy!r}, which is not "
                "callable; a named policy is a function policy(trigger) -> list[Action]"
            )
        if (seen := self._policies.get(name)) is not None:
            raise PluginError(
                f"policy {name!r} is registered twice: by plugin {seen.plugin!r} "
                f"and by plugin {plugin!r}"
            )
        self._policies[name] = PolicyEntry(name, plugin, policy)

    def register_policy_job(
        self,
        name: str,
        policy: Policy,
        *,
        section: str | None,
        period: float | None = None,
        period_key: str | None = None,
        plugin: str = CORE,
    ) -> None:
        """Add a policy job: ``policy(snapshot, state, policies)`` over the queues of ``section``.

        :param section: the section element whose queues the snapshot holds (``None``: all).
        :raises PluginError: bad name, non-callable, bad section, non-positive period, or a job
            name already registered (naming both plugins).
        """
        self._check_job(name, policy, period, plugin)
        if section is not None and (not isinstance(section, str) or not section):
            raise PluginError(
                f"plugin {plugin!r} registered policy job {name!r} with section {section!r}; "
                "a section is an element name such as 'consumer', or None for every queue"
            )
        self._jobs[name] = PolicyJobSpec(name, plugin, policy, section, period, period_key)

    def register_job(
        self,
        name: str,
        func: Callable[[JobContext], None],
        *,
        period: float | None = None,
        period_key: str | None = None,
        plugin: str = CORE,
    ) -> None:
        """Add a plain housekeeping job ``func(ctx)``; see :class:`JobSpec` for its period.

        For a policy, use :meth:`register_policy_job`: the backtest replays those, not these.

        :raises PluginError: bad name, non-callable, non-positive period, or a name already
            registered (naming both plugins).
        """
        self._check_job(name, func, period, plugin)
        self._jobs[name] = JobSpec(name, plugin, func, period, period_key)

    def _check_job(self, name: str, func: object, period: float | None, plugin: str) -> None:
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

    def register_backoff(self, name: str, factory: BackoffFactory, *, plugin: str = CORE) -> None:
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
        self._backoffs[name] = BackoffEntry(name, plugin, factory)

    def backoff(self, name: str) -> BackoffFactory:
        entry = self._backoffs.get(name)
        if entry is None:
            raise PluginError(
                f"backoff {name!r} is not registered by any plugin (registered: "
                f"{', '.join(sorted(self._backoffs)) or 'none'})"
            )
        return entry.factory

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

    def policy(self, name: str) -> NamedPolicy:
        """The named policy registered under ``name`` (a :data:`~plugbroker.policy.PolicyLookup`).

        :raises PluginError: nobody registered it; the message lists what is registered.
        """
        entry = self._policies.get(name)
        if entry is None:
            raise PluginError(unknown_policy_message(name, self.policy_names()))
        return entry.policy

    def policy_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._policies))

    def jobs(self) -> tuple[Job, ...]:
        """Every housekeeping job, policy jobs and plain jobs, in registration order."""
        return tuple(self._jobs.values())

    def policy_jobs(self) -> tuple[PolicyJobSpec, ...]:
        """The policy jobs, in registration order: what the backtest replays."""
        return tuple(j for j in self._jobs.values() if isinstance(j, PolicyJobSpec))

    def job(self, name: str) -> Job:
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

    def register_policy(self, name: str, policy: NamedPolicy) -> None:
        """Make ``policy(trigger) -> list[Action]`` usable as ``<policy name="{name}">``; a clash
        names both plugins."""
        self._registry.register_policy(name, policy, plugin=self.plugin)

    def register_policy_job(
        self,
        name: str,
        policy: Policy,
        *,
        section: str | None,
        period: float | None = None,
        period_key: str | None = None,
    ) -> None:
        """Run ``policy(snapshot, state, policies) -> list[Action]`` on the housekeeping pool
        over the queues of ``section``, and in the backtest over the journal.

        :param section: the section element (``"consumer"``, or one your plugin adds with
            ``broker_add_config_elements``) whose queues the snapshot holds; ``None``: every queue.
        :param period: seconds between runs; wins over ``period_key``.
        :param period_key: a configured duration such as ``"isolation.checkPeriod"`` to take the
            period from; without either, ``<housekeeping><period>`` applies.
        """
        self._registry.register_policy_job(
            name,
            policy,
            section=section,
            period=period,
            period_key=period_key,
            plugin=self.plugin,
        )

    def register_job(
        self,
        name: str,
        func: Callable[[JobContext], None],
        *,
        period: float | None = None,
        period_key: str | None = None,
    ) -> None:
        """Run ``func(ctx)`` on the housekeeping pool every ``period`` seconds: periodic work that
        is not a policy (a policy is a :meth:`register_policy_job`).

        :param period: seconds between runs; wins over ``period_key``.
        :param period_key: a configured duration such as ``"isolation.checkPeriod"`` to take the
            period from; without either, ``<housekeeping><period>`` applies.
        """
        self._registry.register_job(
            name, func, period=period, period_key=period_key, plugin=self.plugin
        )

    def register_backoff(self, name: str, factory: BackoffFactory) -> None:
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
    "BackoffEntry",
    "BackoffFactory",
    "Job",
    "JobSpec",
    "PluginError",
    "PolicyEntry",
    "PolicyJobSpec",
    "Registrar",
    "Registry",
    "resolve_period",
    "unknown_policy_message",
]

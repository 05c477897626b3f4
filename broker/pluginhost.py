"""The broker's one door to pluggy: loads plugins, validates them, and exposes the hooks.

Core code never touches ``pm.hook``. For every hook ``broker_X`` in :mod:`plugbroker.hookspecs` the
host has an attribute ``X`` holding the hook's :class:`pluggy.HookCaller` while at least one
plugin implements it, and ``None`` while none does. The attributes are recomputed whenever a
plugin is registered or unregistered, so the hot path pays one attribute load and one ``is None``
test for a hook nobody listens to::

    if (h := host.message_acked) is not None:
        h(vhost=vhost, queue=queue, consumer_tag=tag, connection_id=cid, channel_id=ch,
          message=msg)

A firstresult caller returns the first non-``None`` result (or ``None``). The one exception is
``broker_register``: the host calls it itself, once per plugin as that plugin is registered, with a
:class:`~plugbroker.registry.Registrar` bound to the plugin (so clashes and job failures name it).

Where plugins come from, in this order (the same hooks for all of them):

1. :data:`BUILTIN_PLUGINS`, the broker's own policy plugins (datasette's ``DEFAULT_PLUGINS``);
2. modules named in the configuration's ``<plugins><plugin>module</plugin></plugins>``;
3. the ``plugbroker.plugins`` entry point group of installed distributions.

pluggy calls implementations last-registered-first, and built-ins mark theirs ``trylast=True``,
so a third-party plugin runs before the built-ins and wins every firstresult decision.

A plugin is blocked, i.e. never imported, by naming it (module name or entry point name) in
``PluginHost(blocked=...)`` (the config's ``<plugin enabled="false">``) or in the comma-separated
environment variable ``PLUGBROKER_BLOCK_PLUGINS``.

Registration, unregistration and every hook call happen on the broker's event loop thread.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import inspect
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from plugbroker import hookspecs
from plugbroker.hookimpl import PROJECT_NAME
from plugbroker.hookwatch import HookWatch
from plugbroker.registry import PluginError, Registry, unknown_policy_message

if TYPE_CHECKING:
    from pluggy import HookCaller

    from plugbroker.config import ConfigElementRegistry

log = logging.getLogger(__name__)

#: Module names of the built-in plugins, registered before any other plugin through the same
#: hooks third parties use. Their hookimpls should use ``@hookimpl(trylast=True)`` so that a
#: user's plugin runs first and wins firstresult decisions.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "plugbroker.plugins.slow_consumer",
    "plugbroker.plugins.isolation",
    "plugbroker.plugins.dead_letter",
    "plugbroker.plugins.journal",
)

#: Entry point group under which installed distributions announce plugin modules.
ENTRY_POINT_GROUP = "plugbroker.plugins"

#: Environment variable with comma-separated plugin names (module or entry point) not to load.
BLOCK_ENV = "PLUGBROKER_BLOCK_PLUGINS"

_PREFIX = "broker_"

#: Hooks that run before the broker serves anyone (they build and read the configuration): an
#: exception in one stops the start. Every other hook is contained (see ``PluginHost._contained``):
#: an exception is logged and counted, never propagated into the delivery, settle, declare, close
#: or alarm that fired it, and a decision hook's failing implementation counts as no answer.
START_HOOKS: frozenset[str] = frozenset({"broker_add_config_elements", "broker_configure"})

#: Hooks the host calls itself instead of exposing an attribute for the core.
HOST_CALLED_HOOKS: frozenset[str] = frozenset({"broker_register"})


#: a plugin module that keeps state per broker defines this: the host registers what it returns
#: (a fresh object for each plugin host) instead of the module itself
FACTORY_NAME = "make_plugin"


def instantiate(plugin: object) -> object:
    """The object to register for a loaded plugin: ``plugin.make_plugin()`` when a module
    defines it (state per broker, e.g. several brokers in one test process), else ``plugin``."""
    if inspect.ismodule(plugin):
        factory = getattr(plugin, FACTORY_NAME, None)
        if callable(factory):
            return factory()
    return plugin


def hookspec_names() -> tuple[str, ...]:
    """Names of every hook spec in :mod:`plugbroker.hookspecs`, in source order."""
    marker = f"{PROJECT_NAME}_spec"
    specs = [
        (fn.__code__.co_firstlineno, name)
        for name, fn in vars(hookspecs).items()
        if name.startswith(_PREFIX) and inspect.isfunction(fn) and hasattr(fn, marker)
    ]
    return tuple(name for _, name in sorted(specs))


#: hook spec name -> host attribute name (``broker_message_acked`` -> ``message_acked``)
HOOK_ATTRS: Mapping[str, str] = {
    name: name[len(_PREFIX) :] for name in hookspec_names() if name not in HOST_CALLED_HOOKS
}


class PluginHost:
    """Typed facade over a :class:`pluggy.PluginManager` for project ``plugbroker``."""

    # One attribute per hook (see the module docstring); declared so type checkers know them.
    # tests/test_pluginhost.py checks this list against broker/hookspecs.py.
    add_config_elements: HookCaller | None
    configure: HookCaller | None
    startup: HookCaller | None
    shutdown: HookCaller | None
    config_reloaded: HookCaller | None
    alarm_changed: HookCaller | None
    connection_opened: HookCaller | None
    connection_closed: HookCaller | None
    queue_declared: HookCaller | None
    queue_deleted: HookCaller | None
    queue_bound: HookCaller | None
    queue_unbound: HookCaller | None
    consumer_added: HookCaller | None
    consumer_removed: HookCaller | None
    consumer_isolated: HookCaller | None
    consumer_released: HookCaller | None
    message_published: HookCaller | None
    message_delivered: HookCaller | None
    delivery_touched: HookCaller | None
    message_acked: HookCaller | None
    message_rejected: HookCaller | None
    message_redelivered: HookCaller | None
    message_timed_out: HookCaller | None
    message_dead_lettered: HookCaller | None
    message_enqueued: HookCaller | None
    message_removed: HookCaller | None
    message_expired: HookCaller | None
    message_dropped: HookCaller | None
    reject_decision: HookCaller | None
    select_consumer: HookCaller | None
    redelivery_delay: HookCaller | None
    delivery_limit: HookCaller | None
    dead_letter_target: HookCaller | None
    policy_action: HookCaller | None

    def __init__(self, *, blocked: Iterable[str] = (), watch: HookWatch | None = None) -> None:
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        #: times every contained hook call against ``<limits><hookBudget>``
        self.watch = watch if watch is not None else HookWatch()
        self._pm.add_hookspecs(hookspecs)
        env = os.environ.get(BLOCK_ENV, "")
        self._blocked = frozenset(n.strip() for n in (*blocked, *env.split(",")) if n and n.strip())
        #: policies and jobs registered by the plugins' ``broker_register``
        self.registry = Registry()
        #: (plugin, hook) -> how many times a contained hook implementation raised
        self.hook_failures: dict[tuple[str, str], int] = {}
        self._refresh()

    # -- loading ----------------------------------------------------------------------------------

    def load(
        self,
        modules: Sequence[str] = (),
        *,
        builtins: Sequence[str] = BUILTIN_PLUGINS,
        entry_points: bool = True,
        origin: str = "the configuration",
    ) -> tuple[str, ...]:
        """Import and register the built-ins, ``modules`` and the entry point plugins.

        Each plugin is validated as it is registered and its ``broker_register`` fills
        :attr:`registry`. Loading stops at the first bad plugin with a :class:`PluginError`
        (plugins registered before it stay registered). Plugins already registered are skipped,
        so calling ``load`` again after a reload only adds what is new.

        :param modules: module names from ``<plugins><plugin>``.
        :param builtins: built-in plugin modules; tests pass ``()``.
        :param entry_points: whether to load the ``plugbroker.plugins`` entry point group.
        :param origin: where ``modules`` were named (the config file path), for error messages.
        :return: the names of the plugins registered by this call.
        """
        added: list[str] = []
        for name in builtins:
            if (got := self._load_module(name, "BUILTIN_PLUGINS")) is not None:
                added.append(got)
        for name in modules:
            if (got := self._load_module(name, origin)) is not None:
                added.append(got)
        if entry_points:
            added.extend(self._load_entry_points())
        try:
            # Every plugin was checked as it came in; this only guards against a plugin that
            # registered hook implementations behind the host's back.
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc)) from exc
        return tuple(added)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register a plugin object or module directly (tests, embedding).

        The plugin is checked like a loaded one and its ``broker_register`` runs at once.

        :return: the name it is registered under, or ``None`` when that name is blocked.
        :raises PluginError: the plugin is malformed, or its registrations clash.
        """
        name = name or self._pm.get_canonical_name(plugin)
        if self.is_blocked(name):
            log.info("plugin %r is blocked; not registering it", name)
            return None
        return self._register(plugin, name, "registered programmatically")

    def unregister(self, name: str) -> None:
        """Remove a plugin, its hook implementations, and its policies and jobs."""
        if self._pm.get_plugin(name) is None:
            raise PluginError(
                f"no plugin named {name!r} is registered (registered: {', '.join(self.names())})"
            )
        self._pm.unregister(name=name)
        self.registry.remove_plugin(name)
        self._refresh()

    def names(self) -> tuple[str, ...]:
        """Registered plugin names, in registration order."""
        return tuple(n for n, p in self._pm.list_name_plugin() if p is not None)

    def is_blocked(self, *names: str) -> bool:
        """Whether any of ``names`` (a module or entry point name) is blocked."""
        return any(n in self._blocked for n in names)

    def implementers(self, hook: str) -> tuple[str, ...]:
        """Names of the plugins implementing ``hook``, in the order pluggy calls them."""
        caller: HookCaller | None = getattr(self._pm.hook, hook, None)
        if caller is None:
            return ()
        return tuple(i.plugin_name for i in reversed(caller.get_hookimpls()))

    # -- configuration ----------------------------------------------------------------------------

    def config_registry(self) -> ConfigElementRegistry:
        """The configuration language the registered plugins add, built as every load needs it.

        A fresh :class:`~plugbroker.config.ConfigElementRegistry` filled by every plugin's
        ``broker_add_config_elements`` (the built-in plugins' sections included), then told the
        policy and backoff names registered in ``broker_register`` (:meth:`declare_policies`).
        """
        from plugbroker.config import ConfigElementRegistry

        registry = ConfigElementRegistry()
        if self.add_config_elements is not None:
            self.add_config_elements(registry=registry)
        self.declare_policies(registry)
        return registry

    def declare_policies(self, config_registry: Any) -> None:
        """Tell the config registry every policy and backoff name plugins registered.

        A section's parser refuses a ``<policy name>`` nobody registered (it asks the registry),
        so the core calls this after ``add_config_elements`` and before parsing: a plugin
        registers a policy once, in ``broker_register``, and the XML can use it. A name the
        registry refuses (``ValueError``: one differing only in case from a registered one) is
        left out.
        """
        for name in self.registry.policy_names():
            if config_registry.has_policy(name):
                continue
            try:
                config_registry.register_policy(name)
            except ValueError as exc:
                log.debug("policy %r is not declared to the configuration: %s", name, exc)
        for name in self.registry.backoff_names():
            if not config_registry.has_backoff(name):
                config_registry.register_backoff(name)

    def verify_policies(self, config: Any) -> None:
        """Refuse a configuration whose ``<policy name>`` nobody registered.

        :raises PluginError: one line per unknown policy, naming it, the file, and where it is
            used.
        """
        known = self.registry.policy_names()
        file = _config_file(config)
        problems = [
            unknown_policy_message(name, known, where=f"used in {file}{line} at {where}")
            for name, where, line in _policy_uses(config)
            if name not in known
        ]
        if problems:
            raise PluginError("\n".join(problems))

    # -- internals --------------------------------------------------------------------------------

    def _load_module(self, modname: str, origin: str) -> str | None:
        if self.is_blocked(modname):
            log.info("plugin module %r (%s) is blocked; not loading it", modname, origin)
            return None
        if self._pm.get_plugin(modname) is not None:
            return None
        try:
            module = importlib.import_module(modname)
        except Exception as exc:
            raise PluginError(
                f"plugin module {modname!r} named in {origin} could not be imported: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return self._register(instantiate(module), modname, f"named in {origin}")

    def _load_entry_points(self) -> Iterator[str]:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if self.is_blocked(ep.name, ep.module):
                log.info("plugin entry point %r (%s) is blocked; not loading it", ep.name, ep.value)
                continue
            if self._pm.get_plugin(ep.name) is not None:
                continue  # the same distribution seen twice on sys.path
            dist = ep.dist
            where = f"entry point {ep.name!r} = {ep.value!r} in group {ENTRY_POINT_GROUP!r}"
            if dist is not None:
                where += f" of distribution {dist.name} {dist.version}"
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {where} could not be loaded: {type(exc).__name__}: {exc}"
                ) from exc
            if (got := self._register(instantiate(plugin), ep.name, where)) is not None:
                yield got

    def _register(self, plugin: object, name: str, origin: str) -> str | None:
        if self._pm.is_registered(plugin):
            # e.g. a module named in the XML that is also an installed entry point
            log.debug("plugin %r (%s) is already registered", name, origin)
            return None
        try:
            self._pm.register(plugin, name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise PluginError(f"plugin {name!r} ({origin}) cannot be registered: {detail}") from exc
        try:
            self._check_hooks(plugin, name)
            self._fill_registry(plugin, name)
        except BaseException:
            self._pm.unregister(plugin)
            self.registry.remove_plugin(name)
            raise
        finally:
            self._refresh()
        log.info("plugin %r registered (%s)", name, origin)
        return name

    def _check_hooks(self, plugin: object, name: str) -> None:
        """Refuse implementations of hooks that do not exist and hooks that lack ``@hookimpl``."""
        for caller in self._pm.get_hookcallers(plugin) or ():
            if caller.has_spec() or all(i.optionalhook for i in caller.get_hookimpls()):
                continue
            text = f"plugin {name!r} implements {caller.name!r}, which is not a plugbroker hook"
            close = difflib.get_close_matches(caller.name, hookspec_names(), n=1)
            raise PluginError(text + (f"; did you mean {close[0]!r}?" if close else ""))
        for attr in dir(plugin):
            if not attr.startswith(_PREFIX) or attr not in self._pm.hook.__dict__:
                continue
            if inspect.isroutine(getattr(plugin, attr, None)) and (
                self._pm.parse_hookimpl_opts(plugin, attr) is None
            ):
                raise PluginError(
                    f"plugin {name!r} defines {attr!r} without @hookimpl, so it would never be "
                    "called; decorate it (from plugbroker.hookimpl import hookimpl)"
                )

    def _fill_registry(self, plugin: object, name: str) -> None:
        registrar = self.registry.for_plugin(name)
        for impl in self._pm.hook.broker_register.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            if impl.wrapper or impl.hookwrapper:
                raise PluginError(f"plugin {name!r}: broker_register cannot be a hook wrapper")
            try:
                impl.function(*(registrar for _ in impl.argnames))
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"plugin {name!r} failed in broker_register: {type(exc).__name__}: {exc}"
                ) from exc

    def _refresh(self) -> None:
        hook = self._pm.hook
        for spec, attr in HOOK_ATTRS.items():
            caller: HookCaller = getattr(hook, spec)
            impls = caller.get_hookimpls()
            if not impls:
                setattr(self, attr, None)
            elif spec not in START_HOOKS:
                setattr(self, attr, self._contained(spec, caller, impls))
            elif len(impls) == 1 and not (impls[0].hookwrapper or impls[0].wrapper):
                setattr(self, attr, _direct(impls[0]))
            else:
                setattr(self, attr, caller)

    def _contained(self, spec: str, caller: HookCaller, impls: Sequence[Any]) -> Any:
        """A hook whose implementations cannot hurt the broker.

        An exception in one is logged (once per plugin and hook, with its traceback; later ones
        are counted in :attr:`hook_failures`) and the other implementations still run; in a
        firstresult (decision) hook a failing implementation counts as no answer, so the next
        one decides, or the broker's default when none does. Every call is timed by
        :attr:`watch` (the hook watchdog). Wrappers keep pluggy, contained and timed as a
        whole (a failure there gives the default decision)."""
        failures = self.hook_failures
        watch = self.watch
        timer = watch.timer
        first = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))

        def failed(plugin: str) -> None:
            key = (plugin, spec)
            n = failures.get(key, 0) + 1
            failures[key] = n
            if n == 1:
                log.exception(
                    "plugin %r: its %s hook raised; the broker carries on without it%s (further "
                    "failures of this hook are counted, not logged)",
                    plugin,
                    spec,
                    " and takes the default decision" if first else "",
                )

        if any(i.hookwrapper or i.wrapper for i in impls):
            names = ", ".join(sorted({i.plugin_name for i in impls}))

            def call_pluggy(**kwargs: Any) -> Any:
                t0 = watch.enter(names, spec)
                try:
                    return caller(**kwargs)
                except Exception:
                    failed(names)
                    return None if first else []
                finally:
                    watch.leave(names, spec, t0)

            call_pluggy.caller = caller  # type: ignore[attr-defined]  # pluggy stays in charge
            return call_pluggy
        # pluggy's order: the last of get_hookimpls() runs first
        plan = [(i.function, tuple(i.argnames), i.plugin_name) for i in reversed(impls)]
        if len(plan) == 1:
            fn, argnames, plugin = plan[0]

            def call_one(**kwargs: Any) -> Any:
                # HookWatch.enter and .leave, inlined: this runs several times per message
                t0 = timer()
                watch.current = (plugin, spec, t0)
                try:
                    return fn(*[kwargs[n] for n in argnames])
                except Exception:
                    failed(plugin)
                    return None
                finally:
                    watch.current = None
                    took = timer() - t0
                    if took > watch.budget > 0:
                        watch.over(plugin, spec, took)

            call_one.__name__ = getattr(fn, "__name__", "hook")
            return call_one

        def call_each(**kwargs: Any) -> Any:
            results = []  # what pluggy returns: the results that are not None
            for fn, argnames, plugin in plan:
                t0 = timer()
                watch.current = (plugin, spec, t0)
                try:
                    r = fn(*[kwargs[n] for n in argnames])
                except Exception:
                    failed(plugin)
                    continue
                finally:
                    watch.current = None
                    took = timer() - t0
                    if took > watch.budget > 0:
                        watch.over(plugin, spec, took)
                if r is not None:
                    if first:
                        return r
                    results.append(r)
            return None if first else results

        return call_each


def builtin_config_registry() -> ConfigElementRegistry:
    """The configuration elements, policies and backoff types of the built-in plugins alone.

    What :func:`plugbroker.config.parse_config` uses when it is given no registry: a host with only
    :data:`BUILTIN_PLUGINS` (less any blocked through :data:`BLOCK_ENV`), asked the way the
    runner asks its own host.
    """
    host = PluginHost()
    host.load(entry_points=False, origin="the built-in plugins")
    return host.config_registry()


def _direct(impl: Any) -> Any:
    """Call a hook's only implementation without pluggy's dispatch.

    Measured: pluggy calls a one-implementation hook in about 1.3-1.7 µs, the implementation
    itself often costs a fifth of that; per-message hooks run several times per message. With a
    single implementation the outcome is the same as pluggy's: it gets the arguments it declares
    (a subset of the spec's, by name), a firstresult hook returns its result, a notification's
    result is not used. Wrappers keep pluggy (they need its machinery). The host recomputes this
    whenever a plugin is registered or unregistered, so a second implementation puts pluggy
    back in charge.
    """
    fn = impl.function
    names = tuple(impl.argnames)

    def call(**kwargs: Any) -> Any:
        return fn(*[kwargs[n] for n in names])

    call.__name__ = getattr(fn, "__name__", "hook")
    call.__doc__ = f"direct call of {impl.plugin_name}'s only implementation"
    return call


# -- reading policy names out of a configuration -------------------------------------------------
#
# Walk ``config.vhosts`` → ``defaults`` / ``queues`` / ``topics`` → each section (an entry of a
# mapping such as ``plugbroker.config.Sections``, or a field) carrying ``.policy.name``. Duck-typed so
# that the walk does not break when the configuration model grows a field.


def _config_file(config: Any) -> str:
    for attr in ("source", "path", "file", "filename"):
        value = getattr(config, attr, None)
        if value:
            return str(value)
    return "the configuration"


def _named(container: Any) -> Iterator[tuple[str | None, Any]]:
    if isinstance(container, Mapping):
        for key, value in container.items():
            yield str(key), value
    elif isinstance(container, (list, tuple, set, frozenset)):
        for item in container:
            yield _label(item), item


def _label(obj: Any) -> str | None:
    for attr in ("name", "key", "pattern"):
        value = getattr(obj, attr, None)
        if isinstance(value, str):
            return value
    return None


def _members(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        yield from ((str(k), v) for k, v in obj.items())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        yield from ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif hasattr(obj, "__dict__"):
        yield from vars(obj).items()


def _sections(scope: Any) -> Iterator[tuple[str, Any]]:
    """A scope's sections: its members, and the entries of members that are mappings."""
    for name, value in _members(scope):
        if isinstance(value, Mapping):
            yield from ((str(k), v) for k, v in value.items())
        else:
            yield name, value


def _policy_uses(config: Any) -> Iterator[tuple[str, str, str]]:
    """``(policy name, where, ":line" or "")`` for every ``<policy>`` in ``config``."""
    for vname, vhost in _named(getattr(config, "vhosts", None)):
        at = f"<virtualhost name={vname!r}>"
        scopes = [(at, getattr(vhost, "defaults", None))]
        scopes += [
            (f"{at} <queue name={n!r}>", s) for n, s in _named(getattr(vhost, "queues", None))
        ]
        scopes += [
            (f"{at} <topic key={k!r}>", s) for k, s in _named(getattr(vhost, "topics", None))
        ]
        for where, scope in scopes:
            if scope is None:
                continue
            for element, section in _sections(scope):
                policy = getattr(section, "policy", None)
                name = getattr(policy, "name", None)
                if isinstance(name, str):
                    line = getattr(policy, "line", None) or getattr(scope, "line", None)
                    yield name, f"{where} <{element}>", f":{line}" if isinstance(line, int) else ""


__all__ = [
    "BLOCK_ENV",
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "HOOK_ATTRS",
    "HOST_CALLED_HOOKS",
    "PluginError",
    "PluginHost",
    "Registry",
    "builtin_config_registry",
    "hookspec_names",
]

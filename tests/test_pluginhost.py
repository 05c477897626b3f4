"""PluginHost: where plugins come from, how bad ones are refused, and the hot hook attributes."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from plugbroker.decisions import RejectDecision
from plugbroker.hookimpl import hookimpl
from plugbroker.pluginhost import (
    BLOCK_ENV,
    ENTRY_POINT_GROUP,
    HOOK_ATTRS,
    HOST_CALLED_HOOKS,
    PluginError,
    PluginHost,
    hookspec_names,
)
from plugbroker.policy import Action, PolicyLookup, PolicyState, Snapshot
from plugbroker.registry import Registrar, Registry

MakeModule = Callable[..., str]


@pytest.fixture(autouse=True)
def _no_env_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BLOCK_ENV, raising=False)


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeModule]:
    """Write a plugin module on a temporary sys.path entry; forget it afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def make(source: str, name: str | None = None) -> str:
        name = name or f"pb_plugin_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        created.append(name)
        return name

    yield make
    for name in created:
        sys.modules.pop(name, None)


COUNTING_PLUGIN = """
    from plugbroker.hookimpl import hookimpl
    calls = []

    @hookimpl
    def broker_queue_declared(vhost, queue, durable, arguments):
        calls.append((vhost, queue))

    @hookimpl
    def broker_register(registry):
        registry.register_policy("Counting", lambda trigger: [])
"""

BROKEN_ON_IMPORT = """
    raise RuntimeError("this module must never be imported")
"""


def _host(**kwargs: Any) -> PluginHost:
    return PluginHost(**kwargs)


# -- loading -------------------------------------------------------------------------------------


def test_loads_a_module_by_name_and_its_hooks_become_callable(make_module: MakeModule) -> None:
    mod = make_module(COUNTING_PLUGIN)
    host = _host()
    assert host.load([mod], builtins=(), entry_points=False) == (mod,)
    assert host.names() == (mod,)
    caller = host.queue_declared
    assert caller is not None
    caller(vhost="/", queue="q", durable=True, arguments={})
    assert sys.modules[mod].calls == [("/", "q")]  # type: ignore[attr-defined]
    assert host.registry.policy_names() == ("Counting",)


def test_loading_again_registers_nothing_twice(make_module: MakeModule) -> None:
    mod = make_module(COUNTING_PLUGIN)
    host = _host()
    host.load([mod], builtins=(), entry_points=False)
    assert host.load([mod], builtins=(), entry_points=False) == ()
    assert host.names() == (mod,)


def test_builtins_load_first_through_the_same_hooks(make_module: MakeModule) -> None:
    builtin = make_module(COUNTING_PLUGIN)
    user = make_module("from plugbroker.hookimpl import hookimpl\n")
    host = _host()
    host.load([user], builtins=(builtin,), entry_points=False)
    assert host.names() == (builtin, user)


def test_import_failure_names_module_origin_and_error() -> None:
    host = _host()
    with pytest.raises(PluginError) as err:
        host.load(
            ["no_such_pkg.policies"], builtins=(), entry_points=False, origin="config/foo.xml"
        )
    assert str(err.value) == (
        "plugin module 'no_such_pkg.policies' named in config/foo.xml could not be imported: "
        "ModuleNotFoundError: No module named 'no_such_pkg'"
    )
    assert host.names() == ()


def test_error_raised_while_importing_is_reported(make_module: MakeModule) -> None:
    mod = make_module(BROKEN_ON_IMPORT)
    with pytest.raises(
        PluginError,
        match=rf"plugin module '{mod}' named in the configuration "
        r"could not be imported: RuntimeError: this module must never be imported",
    ):
        _host().load([mod], builtins=(), entry_points=False)


# -- entry points --------------------------------------------------------------------------------


def _dist(tmp_path: Path, module: str, ep_name: str = "acme") -> None:
    info = tmp_path / "acme_policies-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-policies\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{ep_name} = {module}\n")
    importlib.invalidate_caches()


def test_loads_an_entry_point_plugin(make_module: MakeModule, tmp_path: Path) -> None:
    mod = make_module(COUNTING_PLUGIN)
    _dist(tmp_path, mod)
    host = _host()
    assert "acme" in host.load(builtins=(), entry_points=True)
    assert "acme" in host.names()
    assert host.queue_declared is not None
    assert host.registry.policy_names() == ("Counting",)


def test_entry_point_and_config_naming_the_same_module_register_it_once(
    make_module: MakeModule, tmp_path: Path
) -> None:
    mod = make_module(COUNTING_PLUGIN)
    _dist(tmp_path, mod)
    host = _host()
    host.load([mod], builtins=(), entry_points=True)
    assert mod in host.names() and "acme" not in host.names()


def test_entry_point_import_failure_names_the_distribution(
    make_module: MakeModule, tmp_path: Path
) -> None:
    mod = make_module(BROKEN_ON_IMPORT)
    _dist(tmp_path, mod)
    with pytest.raises(PluginError) as err:
        _host().load(builtins=(), entry_points=True)
    text = str(err.value)
    assert f"plugin entry point 'acme' = '{mod}' in group 'plugbroker.plugins'" in text
    assert "of distribution acme-policies 1.2 could not be loaded: RuntimeError" in text


def test_entry_points_are_skipped_when_asked(make_module: MakeModule, tmp_path: Path) -> None:
    _dist(tmp_path, make_module(BROKEN_ON_IMPORT))
    host = _host()
    host.load(builtins=(), entry_points=False)
    assert host.names() == ()


# -- blocking ------------------------------------------------------------------------------------


def test_block_by_name_never_imports_the_module(make_module: MakeModule) -> None:
    bad = make_module(BROKEN_ON_IMPORT)
    good = make_module(COUNTING_PLUGIN)
    host = _host(blocked=[bad])
    host.load([bad, good], builtins=(bad,), entry_points=False)
    assert host.names() == (good,)
    assert bad not in sys.modules


def test_block_by_env_var_covers_modules_and_entry_points(
    make_module: MakeModule, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = make_module(BROKEN_ON_IMPORT)
    ep_bad = make_module(BROKEN_ON_IMPORT)
    _dist(tmp_path, ep_bad, ep_name="acme")
    monkeypatch.setenv(BLOCK_ENV, f" {bad} , acme,,")
    host = _host()
    host.load([bad], builtins=(), entry_points=True)
    assert host.names() == ()
    assert host.is_blocked("acme") and host.is_blocked(bad) and not host.is_blocked("other")


def test_entry_point_blocked_by_its_module_name(make_module: MakeModule, tmp_path: Path) -> None:
    ep_bad = make_module(BROKEN_ON_IMPORT)
    _dist(tmp_path, ep_bad)
    host = _host(blocked=[ep_bad])
    host.load(builtins=(), entry_points=True)
    assert "acme" not in host.names()


def test_programmatic_register_respects_blocking() -> None:
    class Plugin:
        @hookimpl
        def broker_startup(self, broker: object) -> None: ...

    host = _host(blocked=["p"])
    assert host.register(Plugin(), "p") is None
    assert host.startup is None


# -- malformed plugins ----------------------------------------------------------------------------


def test_misspelled_hook_is_refused_with_a_suggestion(make_module: MakeModule) -> None:
    mod = make_module("""
        from plugbroker.hookimpl import hookimpl

        @hookimpl
        def broker_queue_declard(vhost, queue, durable, arguments):
            pass
    """)
    host = _host()
    with pytest.raises(PluginError) as err:
        host.load([mod], builtins=(), entry_points=False)
    assert str(err.value) == (
        f"plugin '{mod}' implements 'broker_queue_declard', which is not a plugbroker hook; "
        "did you mean 'broker_queue_declared'?"
    )
    assert host.names() == ()  # not left half-registered


def test_hook_without_marker_is_refused() -> None:
    class Plugin:
        def broker_queue_deleted(self, vhost: str, queue: str, reason: str) -> None: ...

    host = _host()
    with pytest.raises(
        PluginError,
        match="plugin 'forgetful' defines 'broker_queue_deleted' "
        "without @hookimpl, so it would never be called",
    ):
        host.register(Plugin(), "forgetful")
    assert host.names() == ()


def test_hookimpl_with_an_unknown_argument_is_refused() -> None:
    class Plugin:
        @hookimpl
        def broker_queue_deleted(self, vhost: str, queue: str, why: str) -> None: ...

    with pytest.raises(
        PluginError,
        match=r"plugin 'typo' \(registered programmatically\) "
        r"cannot be registered: .*\{'why'\}",
    ):
        _host().register(Plugin(), "typo")


def test_failing_broker_register_unregisters_the_plugin() -> None:
    class Plugin:
        @hookimpl
        def broker_register(self, registry: Registrar) -> None:
            registry.register_job("half", lambda ctx: None)
            raise KeyError("oops")

        @hookimpl
        def broker_startup(self, broker: object) -> None: ...

    host = _host()
    with pytest.raises(PluginError, match="plugin 'p' failed in broker_register: KeyError"):
        host.register(Plugin(), "p")
    assert host.names() == () and host.startup is None and host.registry.jobs() == ()


# -- the registry --------------------------------------------------------------------------------


def _policy_plugin(name: str, job: str | None = None) -> object:
    class Plugin:
        @hookimpl
        def broker_register(self, registry: Registrar) -> None:
            self.registrar = registry
            registry.register_policy(name, lambda trigger: [])
            if job:
                registry.register_job(job, lambda ctx: None, period=2.0)

    return Plugin()


def test_broker_register_gets_a_registrar_bound_to_its_plugin() -> None:
    host = _host()
    plugin = _policy_plugin("Fast", job="tick")
    host.register(plugin, "acme")
    assert plugin.registrar.plugin == "acme"  # type: ignore[attr-defined]
    (job,) = host.registry.jobs()
    assert (job.name, job.plugin, job.period, job.period_key) == ("tick", "acme", 2.0, None)


def test_duplicate_policy_names_both_plugins_and_keeps_the_first() -> None:
    host = _host()
    host.register(_policy_plugin("Delete"), "first")
    with pytest.raises(PluginError) as err:
        host.register(_policy_plugin("Delete"), "second")
    assert str(err.value) == (
        "policy 'Delete' is registered twice: by plugin 'first' and by plugin 'second'"
    )
    assert host.names() == ("first",)
    assert host.registry.policy_names() == ("Delete",)


def test_duplicate_job_names_both_plugins() -> None:
    host = _host()
    host.register(_policy_plugin("A", job="check"), "first")
    with pytest.raises(
        PluginError,
        match="job 'check' is registered twice: by plugin 'first' and by plugin 'second'",
    ):
        host.register(_policy_plugin("B", job="check"), "second")


def test_unregister_takes_away_hooks_policies_and_jobs() -> None:
    host = _host()
    host.register(_policy_plugin("Slow", job="j"), "acme")
    host.unregister("acme")
    assert host.registry.policy_names() == () and host.registry.jobs() == ()
    with pytest.raises(PluginError, match="no plugin named 'acme' is registered"):
        host.unregister("acme")


def test_registry_refuses_bad_jobs() -> None:
    reg = Registry()
    with pytest.raises(PluginError, match="not callable"):
        reg.register_job("j", "nope", plugin="p")  # type: ignore[arg-type]
    with pytest.raises(PluginError, match="period 0"):
        reg.register_job("j", lambda ctx: None, period=0, plugin="p")
    with pytest.raises(PluginError, match="empty name"):
        reg.register_policy("", lambda trigger: [], plugin="p")
    with pytest.raises(PluginError, match="policy 'P' as 42, which is not callable"):
        reg.register_policy("P", 42, plugin="p")  # type: ignore[arg-type]


def test_unknown_policy_lookup_suggests_a_name() -> None:
    reg = Registry()
    reg.register_policy("ReducePrefetch", lambda trigger: [], plugin="p")
    with pytest.raises(
        PluginError,
        match=r"policy 'ReducePrefech' is not registered by any "
        r"plugin; did you mean 'ReducePrefetch'\? \(registered policies: ",
    ):
        reg.policy("ReducePrefech")


def _no_actions(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]:
    return []


def test_policy_jobs_are_listed_apart_and_share_the_job_names() -> None:
    class Plugin:
        @hookimpl
        def broker_register(self, registry: Registrar) -> None:
            registry.register_job("plain", lambda ctx: None)
            registry.register_policy_job("mine", _no_actions, section="prefetchCap", period=5.0)
            registry.register_policy_job("all", _no_actions, section=None, period_key="k.p")

    host = _host()
    host.register(Plugin(), "acme")
    assert [j.name for j in host.registry.jobs()] == ["plain", "mine", "all"]
    mine, every = host.registry.policy_jobs()
    assert (mine.plugin, mine.policy, mine.section, mine.period) == (
        "acme",
        _no_actions,
        "prefetchCap",
        5.0,
    )
    assert (every.section, every.period, every.period_key) == (None, None, "k.p")
    assert host.registry.job("mine") is mine
    with pytest.raises(PluginError, match="job 'plain' is registered twice"):
        host.registry.register_policy_job("plain", _no_actions, section=None, plugin="other")
    host.unregister("acme")
    assert host.registry.jobs() == () and host.registry.policy_jobs() == ()


def test_registry_refuses_bad_policy_jobs() -> None:
    reg = Registry()
    with pytest.raises(PluginError, match="job 'j' with 'nope', which is not callable"):
        reg.register_policy_job("j", "nope", section=None, plugin="p")  # type: ignore[arg-type]
    with pytest.raises(PluginError, match="period -1"):
        reg.register_policy_job("j", _no_actions, section=None, period=-1, plugin="p")
    with pytest.raises(PluginError, match="policy job 'j' with section ''"):
        reg.register_policy_job("j", _no_actions, section="", plugin="p")
    with pytest.raises(PluginError, match="empty name"):
        reg.register_policy_job("", _no_actions, section="consumer", plugin="p")
    assert reg.jobs() == ()


def test_the_builtin_policies_are_policy_jobs_over_their_sections() -> None:
    host = _host()
    host.load([], entry_points=False)
    jobs = {j.name: j for j in host.registry.policy_jobs()}
    assert {n: (j.plugin, j.section, j.period, j.period_key) for n, j in jobs.items()} == {
        "slow-consumer": ("plugbroker.plugins.slow_consumer", "consumer", None, None),
        "isolation": ("plugbroker.plugins.isolation", "isolation", None, "isolation.checkPeriod"),
    }
    from plugbroker.plugins import isolation, slow_consumer

    assert jobs["slow-consumer"].policy is slow_consumer.evaluate
    assert jobs["isolation"].policy is isolation.evaluate


# -- hot attributes and calling ------------------------------------------------------------------


def test_every_hook_has_a_declared_attribute() -> None:
    declared = set(PluginHost.__annotations__)
    expected = {HOOK_ATTRS[n] for n in hookspec_names() if n not in HOST_CALLED_HOOKS}
    assert expected <= declared
    assert set(hookspec_names()) == set(HOOK_ATTRS) | HOST_CALLED_HOOKS
    host = _host()
    assert all(getattr(host, attr) is None for attr in expected)


def test_hot_attribute_is_none_without_impl_and_set_with_one() -> None:
    seen: list[int] = []

    class Acked:
        @hookimpl
        def broker_message_acked(self, message: int) -> None:
            seen.append(message)

    host = _host()
    assert host.message_acked is None
    host.register(Acked(), "acked")
    assert host.message_acked is not None
    host.message_acked(
        vhost="/", queue="q", consumer_tag="c", connection_id="1", channel_id=1, message=7
    )
    assert seen == [7]
    assert host.message_delivered is None  # only what is implemented is set
    host.unregister("acked")
    assert host.message_acked is None


def test_notifications_reach_every_plugin() -> None:
    got: list[str] = []

    def plugin(tag: str) -> object:
        class P:
            @hookimpl
            def broker_queue_deleted(self, queue: str, reason: str) -> None:
                got.append(f"{tag}:{queue}:{reason}")

        return P()

    host = _host()
    host.register(plugin("a"), "a")
    host.register(plugin("b"), "b")
    assert host.queue_deleted is not None
    assert host.queue_deleted(vhost="/", queue="q", reason="client", messages=0) == []
    assert sorted(got) == ["a:q:client", "b:q:client"]


def _decider(result: RejectDecision | None, *, trylast: bool = False) -> object:
    class P:
        @hookimpl(trylast=trylast)
        def broker_reject_decision(self, requeue: bool) -> RejectDecision | None:
            return result

    return P()


def test_firstresult_returns_the_first_non_none() -> None:
    host = _host()
    host.register(_decider(RejectDecision("drop")), "deciding")
    host.register(_decider(None), "abstaining")  # registered last, so asked first
    caller = host.reject_decision
    assert caller is not None
    got = caller(vhost="/", queue="q", message=None, requeue=True, delivery_count=1)
    assert got == RejectDecision("drop")


def test_firstresult_all_none_means_core_default() -> None:
    host = _host()
    host.register(_decider(None), "a")
    assert host.reject_decision is not None
    assert (
        host.reject_decision(vhost="/", queue="q", message=None, requeue=True, delivery_count=1)
        is None
    )


def test_a_user_plugin_beats_a_trylast_builtin(make_module: MakeModule) -> None:
    builtin = make_module("""
        from plugbroker.decisions import RejectDecision
        from plugbroker.hookimpl import hookimpl

        @hookimpl(trylast=True)
        def broker_reject_decision(requeue):
            return RejectDecision("dead-letter")
    """)
    host = _host()
    host.load(builtins=(builtin,), entry_points=False)
    host.register(_decider(RejectDecision("requeue", delay=2.0)), "user")
    assert host.implementers("broker_reject_decision") == ("user", builtin)
    assert host.reject_decision is not None
    got = host.reject_decision(vhost="/", queue="q", message=None, requeue=True, delivery_count=1)
    assert got == RejectDecision("requeue", delay=2.0)


# -- verify_policies -----------------------------------------------------------------------------


@dataclass
class _Policy:
    name: str
    line: int | None = None


@dataclass
class _Consumer:
    policy: _Policy | None = None
    depth: int | None = None


@dataclass
class _Scope:
    name: str = ""
    consumer: _Consumer | None = None


@dataclass
class _VHost:
    name: str
    defaults: _Scope = field(default_factory=_Scope)
    queues: dict[str, _Scope] = field(default_factory=dict)
    topics: list[Any] = field(default_factory=list)


@dataclass
class _Config:
    path: str
    vhosts: dict[str, _VHost]


def test_verify_policies_accepts_registered_names() -> None:
    host = _host()
    host.register(_policy_plugin("Delete"), "slow")
    cfg = _Config(
        "b.xml", {"/": _VHost("/", defaults=_Scope(consumer=_Consumer(_Policy("Delete"))))}
    )
    host.verify_policies(cfg)  # no exception
    host.verify_policies(_Config("empty.xml", {}))


def test_verify_policies_names_policy_file_and_place() -> None:
    host = _host()
    host.register(_policy_plugin("Delete"), "slow")

    @dataclass
    class Topic:
        key: str
        consumer: _Consumer

    vhost = _VHost(
        "/",
        queues={"work": _Scope("work", _Consumer(_Policy("Delete")))},
        topics=[Topic("stocks.us.*", _Consumer(_Policy("Dlete", line=42)))],
    )
    vhost.defaults = _Scope(consumer=_Consumer(_Policy("Sleep")))
    with pytest.raises(PluginError) as err:
        host.verify_policies(_Config("config/broker.xml", {"/": vhost}))
    assert str(err.value).splitlines() == [
        (
            "policy 'Sleep' used in config/broker.xml at <virtualhost name='/'> <consumer> is not "
            "registered by any plugin (registered policies: Delete)"
        ),
        (
            "policy 'Dlete' used in config/broker.xml:42 at <virtualhost name='/'> "
            "<topic key='stocks.us.*'> <consumer> is not registered by any plugin; "
            "did you mean 'Delete'? (registered policies: Delete)"
        ),
    ]


def test_verify_policies_reads_plain_objects_and_mappings() -> None:
    class Obj:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    cfg = Obj(
        source="x.xml",
        vhosts=[Obj(name="v", queues={"q": {"consumer": Obj(policy=Obj(name="Nope"))}})],
    )
    with pytest.raises(
        PluginError,
        match=r"policy 'Nope' used in x.xml at <virtualhost "
        r"name='v'> <queue name='q'> <consumer>",
    ):
        _host().verify_policies(cfg)


def test_verify_policies_on_a_real_parsed_config() -> None:
    from plugbroker.config import parse_config

    xml = """<broker>
      <virtualhost name="/">
        <consumer><messageCount>10</messageCount><policy name="Log"/></consumer>
        <topic key="stocks.us.*">
          <consumer><messageCount>50</messageCount><policy name="Delete"/></consumer>
        </topic>
      </virtualhost>
    </broker>"""
    config = parse_config(xml, "config/broker.xml", source=Path("config/broker.xml"))
    host = _host()
    host.register(_policy_plugin("Log"), "slow")
    with pytest.raises(PluginError) as err:
        host.verify_policies(config)
    assert str(err.value) == (
        "policy 'Delete' used in config/broker.xml:4 at <virtualhost name='/'> "
        "<topic key='stocks.us.*'> <consumer> is not registered by any plugin "
        "(registered policies: Log)"
    )
    host.register(_policy_plugin("Delete"), "slow-delete")
    host.verify_policies(config)


def test_declared_policies_become_usable_in_the_xml() -> None:
    from plugbroker.config import ConfigElementRegistry, ConfigError, parse_config
    from plugbroker.plugins import slow_consumer_config

    xml = """<broker><virtualhost name="/"><topic key="a.*"><consumer>
      <messageCount>50</messageCount><policy name="ReducePrefetch"/>
    </consumer></topic></virtualhost></broker>"""
    config_registry = ConfigElementRegistry()
    slow_consumer_config.add_config_elements(config_registry)  # <consumer>, as its hook does
    with pytest.raises(ConfigError, match="ReducePrefetch"):
        parse_config(xml, registry=config_registry)
    host = _host()
    host.register(_policy_plugin("ReducePrefetch"), "prefetch")
    host.register(_policy_plugin("Delete"), "slow")
    host.declare_policies(config_registry)
    config = parse_config(xml, registry=config_registry)
    host.verify_policies(config)
    assert config_registry.has_policy("ReducePrefetch")


# -- the single-implementation fast path ----------------------------------------------------------


def test_a_single_implementation_is_called_directly_with_the_arguments_it_declares() -> None:
    import types

    import pluggy

    from plugbroker.hookimpl import hookimpl as impl

    seen: list[tuple[str, int]] = []
    one = types.ModuleType("one_delay")

    @impl
    def broker_redelivery_delay(queue, delivery_count):  # a subset of the spec's arguments
        seen.append((queue, delivery_count))
        return 2.5

    one.broker_redelivery_delay = broker_redelivery_delay  # type: ignore[attr-defined]
    host = PluginHost()
    host.register(one, "one_delay")
    h = host.redelivery_delay
    assert not isinstance(h, pluggy.HookCaller)  # the direct path
    assert h(vhost="/", queue="q", message=None, delivery_count=3) == 2.5  # firstresult value
    assert seen == [("q", 3)]

    two = types.ModuleType("two_delay")

    @impl
    def broker_redelivery_delay(vhost, queue, message, delivery_count):
        return None

    two.broker_redelivery_delay = broker_redelivery_delay  # type: ignore[attr-defined]
    host.register(two, "two_delay")
    # among two the host still decides as pluggy would: the first answer that is not None
    assert not isinstance(host.redelivery_delay, pluggy.HookCaller)
    assert host.redelivery_delay(vhost="/", queue="q", message=None, delivery_count=1) == 2.5
    host.unregister("two_delay")
    assert not isinstance(host.redelivery_delay, pluggy.HookCaller)


def test_a_wrapper_keeps_pluggy_in_charge() -> None:
    import types

    import pluggy

    from plugbroker.hookimpl import hookimpl as impl

    mod = types.ModuleType("wrapping")

    @impl(wrapper=True)
    def broker_message_acked(vhost, queue, consumer_tag, connection_id, channel_id, message):
        return (yield)

    mod.broker_message_acked = broker_message_acked  # type: ignore[attr-defined]
    host = PluginHost()
    host.register(mod, "wrapping")
    # a notification hook: pluggy runs it, inside the host's containment
    assert isinstance(getattr(host.message_acked, "caller", None), pluggy.HookCaller)

"""docs/hooks.md and the policy-plugin how-to stay true to the code (datasette's test_docs idea)."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from plugbroker import hookspecs
from plugbroker.clock import ManualClock
from plugbroker.hookimpl import PROJECT_NAME
from plugbroker.housekeeping import Housekeeping
from plugbroker.pluginhost import BLOCK_ENV, PluginHost, hookspec_names
from plugbroker.policy import (
    Action,
    Breach,
    ConsumerView,
    QueueView,
    SetPrefetch,
    Snapshot,
    Trigger,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLE = DOCS / "examples" / "prefetch_policy.py"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _normalise(signature: str) -> str:
    flat = " ".join(signature.split())
    return flat.replace("( ", "(").replace(", )", ")").replace(",)", ")")


def _spec_signature(name: str) -> str:
    sig = inspect.signature(getattr(hookspecs, name))
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


def _documented_hooks() -> dict[str, str]:
    """``### broker_x`` heading -> the section's text, up to the next heading."""
    text = (DOCS / "hooks.md").read_text()
    parts = re.split(r"^### (broker_\w+)\s*$", text, flags=re.MULTILINE)
    sections = dict(zip(parts[1::2], parts[2::2]))
    return {
        name: re.split(r"^#{1,3} ", body, flags=re.MULTILINE)[0] for name, body in sections.items()
    }


DOCUMENTED = _documented_hooks()


@pytest.mark.parametrize("name", hookspec_names())
def test_hook_is_documented_with_its_signature(name: str) -> None:
    assert name in DOCUMENTED, f"{name} is missing from docs/hooks.md"
    blocks = FENCE.findall(DOCUMENTED[name])
    assert blocks and blocks[0][0] == "python", f"{name}: signature block first"
    assert _normalise(blocks[0][1]) == _spec_signature(name)
    assert len(blocks) >= 2, f"{name}: an example after the signature"


@pytest.mark.parametrize("name", hookspec_names())
def test_documented_kind_matches_firstresult(name: str) -> None:
    kind = re.search(r"^\*\*Kind:\*\* (.+)$", DOCUMENTED[name], re.MULTILINE)
    assert kind is not None, f"{name}: no **Kind:** line"
    firstresult = getattr(hookspecs, name).__dict__[f"{PROJECT_NAME}_spec"]["firstresult"]
    assert ("firstresult" in kind.group(1)) is firstresult
    assert "**Called:**" in DOCUMENTED[name]


def test_docs_document_no_hook_that_does_not_exist() -> None:
    assert sorted(set(DOCUMENTED) - set(hookspec_names())) == []


# -- the how-to and its example plugin ------------------------------------------------------------


def test_howto_shows_the_example_file_verbatim() -> None:
    howto = (DOCS / "write-a-policy-plugin.md").read_text()
    assert EXAMPLE.read_text() in [body for lang, body in FENCE.findall(howto) if lang == "python"]


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    monkeypatch.delenv(BLOCK_ENV, raising=False)
    import prefetch_policy

    yield prefetch_policy
    sys.modules.pop("prefetch_policy", None)


def test_howto_test_snippet_runs(example: Any) -> None:
    howto = (DOCS / "write-a-policy-plugin.md").read_text()
    section = howto.split("## 2.", 1)[1].split("\n## ", 1)[0]
    ((_, code),) = FENCE.findall(section)
    namespace: dict[str, Any] = {}
    exec(compile(code, "write-a-policy-plugin.md", "exec"), namespace)
    tests = sorted(name for name in namespace if name.startswith("test_"))
    assert tests == [
        "test_backlogged_queue_gets_smaller_windows",
        "test_the_job_acts_on_queues_over_the_threshold_only",
    ]
    for name in tests:
        namespace[name]()


def test_howto_section_parser_runs() -> None:
    """The how-to's section parser, registered as its snippet says, parses the page's own XML
    and fails with the errors the page quotes."""
    from plugbroker.config import ConfigElementRegistry, ConfigError, parse_config

    howto = (DOCS / "write-a-policy-plugin.md").read_text()
    section = howto.split("### A section of your own", 1)[1].split("\n#", 1)[0]
    blocks = FENCE.findall(section)
    code = next(body for lang, body in blocks if "def parse_prefetch_cap" in body)
    xml = next(body for lang, body in blocks if lang == "xml")
    assert 'registry.register("prefetchCap", parse_prefetch_cap)' in section
    namespace: dict[str, Any] = {}
    exec(compile(code, "write-a-policy-plugin.md", "exec"), namespace)
    registry = ConfigElementRegistry()
    registry.register("prefetchCap", namespace["parse_prefetch_cap"])
    vh = parse_config(f"<broker>{xml}</broker>", registry=registry).vhosts["/"]
    cap = namespace["PrefetchCap"]
    assert vh.resolve("work")["prefetchCap"] == cap(threshold=50, prefetch=5)
    assert vh.resolve("other")["prefetchCap"] == cap(threshold=1000, prefetch=10)
    bad = (
        "<broker>\n<virtualhost name='/'>\n<queue name='q'><prefetchCap>\n"
        "<prefetch>0</prefetch></prefetchCap></queue></virtualhost></broker>"
    )
    with pytest.raises(ConfigError) as err:
        parse_config(bad, "config/broker.xml", registry=registry)
    assert f"`{err.value}`" in section  # the page quotes the error word for word
    with pytest.raises(ConfigError) as err:
        parse_config(f"<broker>{xml}</broker>", registry=ConfigElementRegistry())
    assert str(err.value).endswith(": no plugin registered it")
    assert f"`{err.value.message}`" in " ".join(section.split())


def _consumer(tag: str, prefetch: int, no_ack: bool = False) -> ConsumerView:
    return ConsumerView(
        tag=tag,
        connection_id="conn-1",
        channel_id=1,
        unacked=0,
        last_ack=None,
        first_delivery=None,
        isolated=False,
        prefetch=prefetch,
        no_ack=no_ack,
    )


def _queue(name: str, count: int, consumers: Sequence[ConsumerView]) -> QueueView:
    return QueueView(
        vhost="/",
        name=name,
        durable=False,
        auto_delete=False,
        exclusive=False,
        subscription_type="shared",
        message_count=count,
        message_bytes=count * 10,
        ready_count=count,
        unacked_count=0,
        oldest_arrival=None,
        acks_total=0,
        consumers=tuple(consumers),
        bindings=(),
    )


def test_example_policy_on_a_trigger(example: Any) -> None:
    consumers = [
        _consumer("unlimited", 0),
        _consumer("wide", 50),
        _consumer("at-target", 10),
        _consumer("narrow", 5),
        _consumer("autoack", 0, no_ack=True),
    ]
    q = _queue("backlogged", example.THRESHOLD + 1, consumers)
    breach = Breach("messageCount", example.THRESHOLD, example.THRESHOLD + 1)
    actions = example.reduce_prefetch(Trigger(q, (breach,), {}, 0.0, "ReducePrefetch"))
    assert [(a.queue, a.consumer_tag, a.prefetch) for a in actions] == [
        ("backlogged", "unlimited", 10),
        ("backlogged", "wide", 10),
    ]
    assert all(isinstance(a, SetPrefetch) and a.policy == "ReducePrefetch" for a in actions)
    assert (actions[0].threshold, actions[0].configured, actions[0].measured) == (
        "messageCount",
        example.THRESHOLD,
        example.THRESHOLD + 1,
    )


def test_example_job_acts_only_on_queues_over_the_threshold(example: Any) -> None:
    consumers = [_consumer("c", 0)]
    snap = Snapshot(
        taken_at=0.0,
        queues=(
            _queue("at-threshold", example.THRESHOLD, consumers),
            _queue("backlogged", example.THRESHOLD + 1, consumers),
        ),
    )
    broker = _Broker(snap)
    host = PluginHost()
    host.load(["prefetch_policy"], builtins=(), entry_points=False)
    hk = Housekeeping(host.registry, broker, threads=1)
    try:
        assert hk.run_job("reduce-prefetch") is True
    finally:
        hk.stop(wait=1.0)
    assert [(a.queue, a.consumer_tag) for a in broker.applied] == [("backlogged", "c")]


class _Broker:
    def __init__(self, snapshot: Snapshot) -> None:
        self.clock = ManualClock()
        self._snapshot = snapshot
        self.applied: list[Action] = []

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def snapshot(self, vhost: str | None = None) -> Snapshot:
        return self._snapshot

    def apply_actions(self, actions: Sequence[Action], streaks: Any = None) -> list[str]:
        self.applied.extend(actions)
        return ["applied"] * len(actions)


def test_example_plugin_loads_by_module_name_and_its_job_applies_actions(example: Any) -> None:
    host = PluginHost()
    host.load(["prefetch_policy"], builtins=(), entry_points=False)
    assert host.registry.policy("ReducePrefetch") is example.reduce_prefetch
    (job,) = host.registry.jobs()
    assert host.registry.policy_jobs() == (job,)
    assert (job.name, job.plugin, job.period) == ("reduce-prefetch", "prefetch_policy", None)
    assert job.policy is example.evaluate and job.section is None

    broker = _Broker(Snapshot(0.0, (_queue("work", 5000, [_consumer("c", 100)]),)))
    hk = Housekeeping(host.registry, broker, threads=1)
    try:
        assert hk.run_job("reduce-prefetch") is True
    finally:
        hk.stop(wait=1.0)
    (action,) = broker.applied
    assert isinstance(action, SetPrefetch)
    assert (action.consumer_tag, action.prefetch) == ("c", 10)
    assert hk.stats("reduce-prefetch").failures == 0

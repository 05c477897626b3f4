"""The element registry: which names plugins may take, and how policy names are kept."""

from __future__ import annotations

import pytest
from configutil import throttle_parser

from plugbroker.config import ConfigElementRegistry, builtin_registry


def test_registry_refuses_builtin_and_duplicate_names() -> None:
    reg = ConfigElementRegistry()
    for name in ("queue", "listen", "virtualhost", "broker", "topic"):
        with pytest.raises(ValueError, match="built-in"):
            reg.register(name, throttle_parser)
    reg.register("x", throttle_parser)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x", throttle_parser)
    # the built-in sections and policies belong to the built-in plugins, which took them first
    builtins = builtin_registry()
    with pytest.raises(ValueError, match="already registered"):
        builtins.register("consumer", throttle_parser)
    with pytest.raises(ValueError, match="differs only in case from 'Delete'"):
        builtins.register_policy("delete")
    assert reg.get("x") is throttle_parser and reg.config_element("x") is throttle_parser
    assert reg.get("nope") is None


def test_policy_and_backoff_names_are_kept_once() -> None:
    reg = ConfigElementRegistry()
    reg.register_policy("ReducePrefetch")
    reg.register_policy("ReducePrefetch")  # the plugin host declares every name it has
    reg.register_backoff("linear")
    reg.register_backoff("linear")
    assert reg.has_policy("ReducePrefetch") and reg.has_backoff("linear")
    with pytest.raises(ValueError, match="differs only in case"):
        reg.register_policy("reduceprefetch")
    for register in (reg.register_policy, reg.register_backoff):
        with pytest.raises(ValueError, match="needs a name"):
            register("")


def test_register_checks_level_and_parser() -> None:
    reg = ConfigElementRegistry()
    with pytest.raises(ValueError, match="level must be"):
        reg.register("x", throttle_parser, level="queue")
    with pytest.raises(TypeError, match="must be callable"):
        reg.register("x", "not a parser")  # type: ignore[arg-type]
    reg.register("statsd", throttle_parser, level="broker")
    assert reg.broker_element("statsd") is throttle_parser and reg.get("statsd") is None
    assert reg.broker_names == frozenset({"statsd"}) and reg.section_names == frozenset()


def test_reach_marks_topic_subscription_only_sections() -> None:
    from plugbroker.config import REACH_TOPIC_SUBSCRIPTIONS

    reg = ConfigElementRegistry()
    reg.register("throttle", throttle_parser)
    reg.register("lag", throttle_parser, reach=REACH_TOPIC_SUBSCRIPTIONS)
    assert reg.topic_only_sections == frozenset({"lag"})
    with pytest.raises(ValueError, match="reach must be"):
        reg.register("x", throttle_parser, reach="queues")
    with pytest.raises(ValueError, match="reach must be"):
        reg.register("y", throttle_parser, level="broker", reach=REACH_TOPIC_SUBSCRIPTIONS)
    # the built-in <consumer> is one
    from plugbroker.config import builtin_registry

    assert "consumer" in builtin_registry().topic_only_sections

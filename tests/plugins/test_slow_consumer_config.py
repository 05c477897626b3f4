"""<consumer>, parsed by the slow-consumer plugin: thresholds, the policy and its options."""

from __future__ import annotations

import pytest
from configutil import ROOT, fails, wrap

from plugbroker.config import (
    ConfigElementRegistry,
    PolicyRef,
    UnparsedSection,
    load_config,
    parse_config,
)
from plugbroker.pluginhost import PluginHost
from plugbroker.plugins.slow_consumer_config import (
    POLICIES,
    SECTION,
    SlowConsumerConfig,
    add_config_elements,
    parse_consumer,
)


def test_slow_consumer_example_is_the_seed() -> None:
    vh = load_config(ROOT / "config/examples/slow-consumer-topic.xml").vhosts["/"]
    topic = vh.topics[0]
    assert (topic.key, topic.exchange) == ("stocks.us.*", "amq.topic")
    c = topic.sections["consumer"]
    assert isinstance(c, SlowConsumerConfig)
    assert (c.depth, c.message_age, c.message_count, c.consumption_rate) == (
        4235264,
        600.0,
        50,
        100.0,
    )
    assert c.policy.name == "Delete" and c.policy.flag("delete-persistent") is True
    assert dict(c.policy.options) == {"delete-persistent": "true"}
    assert c.thresholds() == (
        ("depth", 4235264),
        ("messageAge", 600.0),
        ("messageCount", 50),
        ("consumptionRate", 100.0),
    )


@pytest.mark.parametrize(
    ("section", "element", "fragment"),
    [
        ('<consumer><policy name="Delete"/></consumer>', "consumer", "sets no threshold"),
        (
            "<consumer><depth>1</depth></consumer>",
            "consumer",
            "missing required child element <policy>",
        ),
        (
            '<consumer><depth>1</depth><policy name="Throttle"/></consumer>',
            "policy",
            "policy 'Throttle' is not built in",
        ),
        (
            '<consumer><consumptionRate>0</consumptionRate><policy name="Log"/></consumer>',
            "consumptionRate",
            "greater than 0",
        ),
        (
            '<consumer><depth>1</depth><policy name="Delete"><options>'
            '<option name="delete-persistant" value="true"/></options></policy></consumer>',
            "option",
            "not an option of policy Delete",
        ),
        (
            '<consumer><depth>1</depth><policy name="Delete"><options>'
            '<option name="delete-persistent" value="yes"/></options></policy></consumer>',
            "option",
            "takes true or false",
        ),
        (
            '<consumer><depth>1</depth><policy name="Graduated"><options>'
            '<option name="max-step" value="explode"/></options></policy></consumer>',
            "option",
            "max-step takes one of log, prefetch, cancel, close, delete",
        ),
        (
            '<consumer><depth>1</depth><policy name="Graduated"><options>'
            '<option name="prefetch-divisor" value="1"/></options></policy></consumer>',
            "option",
            "prefetch-divisor takes a whole number of 2 or more",
        ),
        (
            '<consumer><depth>1</depth><policy name="Delete"><options>'
            '<option name="max-step" value="cancel"/></options></policy></consumer>',
            "option",
            "not an option of policy Delete",
        ),
    ],
)
def test_consumer_range_and_rule_errors(section: str, element: str, fragment: str) -> None:
    err = fails(wrap(f'<queue name="q">\n{section}\n</queue>'))
    assert err.file == "config/bad.xml" and err.element == element, str(err)
    assert err.line == 4, str(err)
    assert f"config/bad.xml:4: <{element}>: " in str(err) and fragment in str(err), str(err)


def test_the_plugin_brings_consumer_and_its_policy_names_through_its_hooks() -> None:
    host = PluginHost()
    host.load(builtins=("plugbroker.plugins.slow_consumer",), entry_points=False)
    registry = host.config_registry()
    assert registry.section_names == frozenset({SECTION})
    assert registry.get(SECTION) is parse_consumer
    assert host.registry.policy_names() == tuple(sorted(POLICIES))  # what <policy name> takes


def test_consumer_parsed_with_only_this_plugin_registered() -> None:
    registry = ConfigElementRegistry()
    add_config_elements(registry)
    cfg = parse_config(
        wrap(
            "<consumer><depth>4MB</depth><policy name='delete'><options>"
            "<option name='delete-persistent' value='TRUE'/></options></policy></consumer>\n"
            "<isolation><ackTimeout>5m</ackTimeout></isolation>"
        ),
        registry=registry,
    )
    defaults = cfg.vhosts["/"].defaults
    assert defaults["consumer"] == SlowConsumerConfig(
        depth=4 * 1024 * 1024, policy=PolicyRef("Delete", {"delete-persistent": "true"})
    )
    assert isinstance(defaults["isolation"], UnparsedSection)  # its plugin is not here
    err = fails(
        wrap("<consumer><depth>1</depth>\n<policy name='Mine'/></consumer>"), registry=registry
    )
    assert str(err) == (
        "config/bad.xml:4: <policy>: attribute name: policy 'Mine' is not built in "
        "(Delete, Log, Graduated) and no plugin registered it"
    )
    registry.register_policy("Mine")
    ok = parse_config(
        wrap(
            "<consumer><depth>1</depth><policy name='Mine'><options><option name='x' "
            "value='YES'/></options></policy></consumer>"
        ),
        registry=registry,
    )
    assert ok.vhosts["/"].defaults["consumer"].policy == PolicyRef("Mine", {"x": "YES"})


def test_graduated_is_built_in_with_its_options() -> None:
    xml = wrap(
        '<topic key="stocks.#"><consumer><messageCount>5</messageCount>'
        '<policy name="graduated"><options><option name="max-step" value="Close"/>'
        '<option name="prefetch-divisor" value="04"/>'
        '<option name="delete-persistent" value="1"/></options></policy></consumer></topic>'
    )
    c = parse_config(xml).vhosts["/"].topics[0].sections["consumer"]
    assert c.policy.name == "Graduated"
    assert dict(c.policy.options) == {
        "max-step": "close",
        "prefetch-divisor": "4",
        "delete-persistent": "true",
    }

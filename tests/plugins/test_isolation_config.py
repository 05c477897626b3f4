"""<isolation>, parsed by the isolation plugin: ack timeout, ratio, shared queues only."""

from __future__ import annotations

import pytest
from configutil import ROOT, assert_located, fails, wrap

from plugbroker.config import load_config, parse_config
from plugbroker.pluginhost import PluginHost
from plugbroker.plugins.isolation_config import SECTION, IsolationConfig, parse_isolation


def test_shared_isolation_example() -> None:
    vh = load_config(ROOT / "config/examples/shared-isolation.xml").vhosts["/"]
    q = vh.queues["work"]
    assert q.subscription == "shared" and q.durable is True and q.declare
    iso = q.sections["isolation"]
    assert iso == IsolationConfig(
        ack_timeout=300.0, max_isolated_ratio=0.6, check_period=30.0, max_unacked_per_consumer=1000
    )
    assert iso.max_isolated(5) == 3 and iso.max_isolated(1) == 0
    assert iso.poison_deliveries == 3  # the default
    assert vh.resolve("other")["isolation"].ack_timeout == 900.0


def test_ratio_out_of_range() -> None:
    err = fails(
        wrap(
            '<queue name="q"><isolation><ackTimeout>5m</ackTimeout>'
            "\n\n<maxIsolatedRatio>1.5</maxIsolatedRatio></isolation></queue>"
        )
    )
    assert_located(err, 5, "maxIsolatedRatio", "1.5 is too large", "at most 1")


@pytest.mark.parametrize(
    ("section", "element", "fragment"),
    [
        (
            "<isolation><ackTimeout>0</ackTimeout></isolation>",
            "ackTimeout",
            "must be greater than 0s",
        ),
        (
            "<isolation><ackTimeout>1s</ackTimeout><checkPeriod>0s</checkPeriod></isolation>",
            "checkPeriod",
            "greater than 0s",
        ),
        (
            "<isolation><ackTimeout>1s</ackTimeout><maxUnackedPerConsumer>0</maxUnackedPerConsumer></isolation>",
            "maxUnackedPerConsumer",
            "whole number of 1 or more",
        ),
        (
            "<isolation><ackTimeout>1s</ackTimeout><poisonDeliveries>1</poisonDeliveries></isolation>",
            "poisonDeliveries",
            "must be 0 (off) or at least 2",
        ),
        (
            "<isolation><ackTimeout>1s</ackTimeout><poisonDeliveries>-1</poisonDeliveries></isolation>",
            "poisonDeliveries",
            "",
        ),
    ],
)
def test_isolation_range_and_rule_errors(section: str, element: str, fragment: str) -> None:
    err = fails(wrap(f'<queue name="q">\n{section}\n</queue>'))
    assert err.file == "config/bad.xml" and err.element == element, str(err)
    assert err.line == 4, str(err)
    assert f"config/bad.xml:4: <{element}>: " in str(err) and fragment in str(err), str(err)


def test_isolation_on_exclusive_queue_is_an_error() -> None:
    err = fails(
        wrap(
            '<queue name="q" subscription="exclusive">\n<isolation>'
            "<ackTimeout>5m</ackTimeout></isolation></queue>"
        )
    )
    assert_located(err, 4, "isolation", "shared queues only")


def test_isolation_cap() -> None:
    assert IsolationConfig(1.0, max_isolated_ratio=0.29).max_isolated(100) == 29
    assert IsolationConfig(1.0, max_isolated_ratio=0.0).max_isolated(10) == 0
    assert IsolationConfig(1.0, max_isolated_ratio=1.0).max_isolated(7) == 7


def test_the_plugin_brings_isolation_through_its_hook() -> None:
    host = PluginHost()
    host.load(builtins=("plugbroker.plugins.isolation",), entry_points=False)
    registry = host.config_registry()
    assert registry.section_names == frozenset({SECTION})
    assert registry.get(SECTION) is parse_isolation


@pytest.mark.parametrize(
    "container",
    [
        '<queue name="q">{}</queue>',
        '<queue name="q" subscription="shared">{}</queue>',
        '<topic key="a.#">{}</topic>',
        "{}",
    ],
)
def test_isolation_is_accepted_where_the_queues_may_be_shared(container: str) -> None:
    section = "<isolation><ackTimeout>5m</ackTimeout></isolation>"
    cfg = parse_config(wrap(container.format(section)))
    # and it reaches the queue: a shared queue named q, bound to amq.topic with a.b
    pol = cfg.vhosts["/"].resolve("q", [("amq.topic", "topic", "a.b")])
    iso = pol.get(SECTION)
    assert iso is not None and iso.ack_timeout == 300.0 and iso.poison_deliveries == 3


@pytest.mark.parametrize("subscription", ["key_shared", "failover"])
def test_isolation_is_refused_on_a_queue_that_is_not_shared(subscription: str) -> None:
    err = fails(
        wrap(
            f'<queue name="q" subscription="{subscription}">\n'
            "<isolation><ackTimeout>5m</ackTimeout></isolation></queue>"
        )
    )
    assert str(err) == (
        "config/bad.xml:4: <isolation>: isolation applies to shared queues only, and queue "
        f"'q' has subscription {subscription}"
    )


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("2", 2), ("5", 5)])
def test_poison_deliveries(value: str, expected: int) -> None:
    vh = parse_config(
        wrap(
            '<queue name="q"><isolation><ackTimeout>5m</ackTimeout>'
            f"<poisonDeliveries>{value}</poisonDeliveries></isolation></queue>"
        )
    ).vhosts["/"]
    iso = vh.queues["q"].sections["isolation"]
    assert iso.poison_deliveries == expected
    assert ("poisonDeliveries " + (value if expected else "off")) in iso.describe()


@pytest.mark.parametrize(
    ("element", "expected"),
    [
        ("", ("eta",)),  # Celery's protocol-2 header by default
        ("<etaHeaders>x-not-before  eta x-not-before</etaHeaders>", ("x-not-before", "eta")),
        ("<etaHeaders/>", ()),  # off
    ],
)
def test_eta_headers(element: str, expected: tuple[str, ...]) -> None:
    vh = parse_config(
        wrap(f'<queue name="q"><isolation><ackTimeout>5m</ackTimeout>{element}</isolation></queue>')
    ).vhosts["/"]
    iso = vh.queues["q"].sections["isolation"]
    assert iso.eta_headers == expected
    assert ("etaHeaders " + (" ".join(expected) or "off")) in iso.describe()


def test_an_eta_header_name_over_255_bytes_is_refused_with_its_line() -> None:
    err = fails(
        wrap(
            '<queue name="q"><isolation><ackTimeout>5m</ackTimeout>\n\n'
            f"<etaHeaders>{'h' * 300}</etaHeaders></isolation></queue>"
        )
    )
    assert_located(err, 5, "etaHeaders", "over 255 bytes")

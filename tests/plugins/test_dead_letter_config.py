"""<deadLetter>, parsed by the dead-letter plugin: limit, DLQ, retry queue, nack backoff."""

from __future__ import annotations

import pytest
from configutil import ROOT, fails, wrap

from plugbroker.config import load_config, parse_config
from plugbroker.pluginhost import PluginHost
from plugbroker.plugins.dead_letter_config import (
    BACKOFF_TYPES,
    SECTION,
    BackoffConfig,
    DeadLetterConfig,
    RetryConfig,
    parse_dead_letter,
)
from plugbroker.retry import DEFAULT_LEVELS, MAX_DELAY, MIN_DELAY
from plugbroker.retry import DEFAULT_LEVELS as DEFAULT_RETRY_LEVELS


def test_retry_dlq_example() -> None:
    vh = load_config(ROOT / "config/examples/retry-dlq.xml").vhosts["/"]
    dl = vh.queues["orders"].sections["deadLetter"]
    assert isinstance(dl, DeadLetterConfig)
    assert dl.max_redeliveries == 16 and dl.dlq_name("orders") == "orders-DLQ"
    assert dl.retry is not None and dl.retry.queue_name("orders") == "orders-RETRY"
    assert dl.retry.levels == DEFAULT_RETRY_LEVELS and len(DEFAULT_RETRY_LEVELS) == 18
    assert dl.backoff == BackoffConfig("exponential", min=1.0, max=60.0, multiplier=2.0)
    assert [dl.backoff.next_delay(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert vh.resolve("invoices")["deadLetter"].dlq_name("invoices") == "invoices-DLQ"
    assert vh.exchanges[0].name == "orders" and vh.exchanges[0].durable


@pytest.mark.parametrize(
    ("section", "element", "fragment"),
    [
        (
            "<deadLetter><retry><levels>1s 500ms</levels></retry></deadLetter>",
            "levels",
            "level 2 is 500ms",
        ),
        (
            "<deadLetter><retry><levels>1s 11d</levels></retry></deadLetter>",
            "levels",
            "at most 10d (864000s)",
        ),
        (
            "<deadLetter><maxRedeliveries>-1</maxRedeliveries></deadLetter>",
            "maxRedeliveries",
            "whole number of 0 or more",
        ),
        (
            '<deadLetter><backoff type="exponential"><min>'
            "10s</min><max>1s</max></backoff></deadLetter>",
            "max",
            "smaller than min",
        ),
        (
            '<deadLetter><backoff type="exponential">'
            "<multiplier>0.5</multiplier></backoff></deadLetter>",
            "multiplier",
            "too small",
        ),
        (
            '<deadLetter><backoff type="fixed"><multiplier>2</multiplier></backoff></deadLetter>',
            "multiplier",
            "does not apply to backoff type fixed",
        ),
        (
            '<deadLetter><backoff type="random"/></deadLetter>',
            "backoff",
            "backoff type 'random' is not built in",
        ),
        (
            "<deadLetter><queue>a</queue><queueTemplate>{queue}.dlq</queueTemplate></deadLetter>",
            "queueTemplate",
            "not both",
        ),
        (
            "<deadLetter><queueTemplate>{name}-DLQ</queueTemplate></deadLetter>",
            "queueTemplate",
            "the placeholders are {queue}, {exchange}, {vhost}",
        ),
        ("<deadLetter><queue>q</queue></deadLetter>", "deadLetter", "would be the queue itself"),
    ],
)
def test_dead_letter_range_and_rule_errors(section: str, element: str, fragment: str) -> None:
    err = fails(wrap(f'<queue name="q">\n{section}\n</queue>'))
    assert err.file == "config/bad.xml" and err.element == element, str(err)
    assert err.line == 4, str(err)
    assert f"config/bad.xml:4: <{element}>: " in str(err) and fragment in str(err), str(err)


def test_backoff_and_retry_helpers() -> None:
    assert BackoffConfig("fixed", delay=5.0).next_delay(3) == 5.0
    levels = BackoffConfig("levels", levels=(1.0, 2.0, 3.0))
    assert [levels.next_delay(n) for n in range(5)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    vh = parse_config(
        wrap(
            '<queue name="q"><deadLetter><retry><levels>1s 5s</levels></retry></deadLetter></queue>'
        )
    ).vhosts["/"]
    retry = vh.queues["q"].sections["deadLetter"].retry
    assert (retry.level_delay(1), retry.level_delay(2), retry.level_delay(9)) == (1.0, 5.0, 5.0)


def test_the_plugin_brings_dead_letter_through_its_hook() -> None:
    host = PluginHost()
    host.load(builtins=("plugbroker.plugins.dead_letter",), entry_points=False)
    registry = host.config_registry()
    assert registry.section_names == frozenset({SECTION})
    assert registry.get(SECTION) is parse_dead_letter


def test_the_retry_numbers_are_the_retry_contracts() -> None:
    assert RetryConfig().levels is DEFAULT_LEVELS
    assert (
        parse_config(wrap("<deadLetter><retry/></deadLetter>"))
        .vhosts["/"]
        .defaults["deadLetter"]
        .retry.levels
        is DEFAULT_LEVELS
    )
    # the bounds themselves are accepted: 1 s and 10 days
    parse_config(wrap("<deadLetter><retry><levels>1s 10d</levels></retry></deadLetter>"))
    assert (MIN_DELAY, MAX_DELAY) == (1.0, 864_000.0)
    assert all(BackoffConfig(t).builtin for t in BACKOFF_TYPES)
    assert not BackoffConfig("jittered").builtin


def test_queue_names_are_checked_only_under_a_queue() -> None:
    vh = parse_config(
        wrap(
            "<deadLetter><queue>all-DLQ</queue><retry/></deadLetter>\n"
            '<queue name="q"><deadLetter><queueTemplate>{vhost}.{queue}.dead</queueTemplate>'
            "</deadLetter></queue>",
            vhost="prod",
        )
    ).vhosts["prod"]
    assert vh.defaults["deadLetter"].dlq_name("x") == "all-DLQ"
    dl = vh.queues["q"].sections["deadLetter"]
    assert dl.dlq_name("q", vhost="prod") == "prod.q.dead"
    assert dl.describe_for("q") == dl.describe("q") == "maxRedeliveries 16, DLQ /.q.dead"
    err = fails(
        wrap(
            '<queue name="q">\n<deadLetter><retry><queue>q-DLQ</queue></retry></deadLetter></queue>'
        )
    )
    assert str(err) == (
        "config/bad.xml:4: <deadLetter>: the retry queue of 'q' ('q-DLQ') must differ from the "
        "queue and its dead-letter queue"
    )


# --------------------------------------------------------------------------- targets by name


def _vhost(body: str):
    from plugbroker.config import parse_config

    xml = (
        '<broker><listen host="127.0.0.1" port="0"/><users><user name="guest" password="guest" '
        f'vhosts="/"/></users><virtualhost name="/">{body}</virtualhost></broker>'
    )
    return parse_config(xml, "t.xml").vhosts["/"]


def test_the_queues_a_configuration_names_as_targets_are_known_by_name() -> None:
    from plugbroker.plugins.dead_letter_config import target_role

    vc = _vhost(
        '<queue name="work"><deadLetter><queue>work-dead</queue>'
        "<retry><queue>work-again</queue></retry></deadLetter></queue>"
        '<queue name="jobs"><deadLetter><retry/></deadLetter></queue>'
    )
    assert "work" in (target_role(vc, "work-dead") or "")
    assert target_role(vc, "work-again") is not None
    assert target_role(vc, "jobs-DLQ") is not None and target_role(vc, "jobs-RETRY") is not None
    # a section for one queue names that queue's targets only
    for name in ("work", "jobs", "other-DLQ", "other-RETRY", "work-DLQ"):
        assert target_role(vc, name) is None, name
    # a vhost default applies to any queue: any name its template makes
    vc = _vhost("<deadLetter><queueTemplate>dead.{vhost}.{queue}</queueTemplate></deadLetter>")
    assert target_role(vc, "dead./.orders") is not None
    assert target_role(vc, "dead.other.orders") is None and target_role(vc, "orders") is None

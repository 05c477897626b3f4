"""The model: read-only values, per-section resolution (queue > topic > virtualhost), describe()."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from configutil import ROOT, Throttle, wrap

from plugbroker.config import (
    DEFAULT_TOPIC_EXCHANGE,
    BrokerConfig,
    ConfigElementRegistry,
    ResolvedPolicy,
    TopicConfig,
    TopicMatcher,
    UnparsedSection,
    load_config,
    parse_config,
)
from plugbroker.config.model import describe_section
from plugbroker.domain.exchange import topic_matches
from plugbroker.plugins.slow_consumer_config import SlowConsumerConfig


def test_model_is_read_only() -> None:
    cfg = load_config(ROOT / "config/examples/slow-consumer-topic.xml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.listen_port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.vhosts["x"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.vhosts["/"].topics[0].sections["consumer"].policy.options["x"] = "y"  # type: ignore[index]


def test_brokerconfig_defaults_without_a_file() -> None:
    cfg = BrokerConfig()
    assert cfg.listen_port == 5672 and "/" in cfg.vhosts and "guest" in cfg.users


# ---------------------------------------------------------------------------------------------
# resolution: queue > topic > virtualhost, per section
# ---------------------------------------------------------------------------------------------

PRECEDENCE = wrap(
    """<exchange name="orders" type="topic" durable="true"/>
<exchange name="plain" type="direct"/>
<consumer><messageCount>1000</messageCount><policy name="Log"/></consumer>
<deadLetter><maxRedeliveries>3</maxRedeliveries></deadLetter>
<isolation><ackTimeout>1h</ackTimeout></isolation>
<queue name="work">
  <deadLetter><maxRedeliveries>7</maxRedeliveries></deadLetter>
</queue>
<topic key="stocks.us.*">
  <consumer><messageCount>50</messageCount><policy name="Delete"/></consumer>
  <deadLetter><maxRedeliveries>9</maxRedeliveries></deadLetter>
</topic>
<topic key="stocks.#">
  <consumer><messageCount>500</messageCount><policy name="Log"/></consumer>
  <isolation><ackTimeout>5m</ackTimeout></isolation>
</topic>
<topic key="orders.*" exchange="orders">
  <consumer><messageCount>5</messageCount><policy name="Log"/></consumer>
</topic>
<topic key="#">
  <consumer><messageCount>99</messageCount><policy name="Log"/></consumer>
</topic>"""
)


@pytest.fixture
def vh() -> Any:
    return parse_config(PRECEDENCE).vhosts["/"]


def counts(p: ResolvedPolicy) -> tuple[int | None, int | None, float | None]:
    return (
        p["consumer"].message_count,
        p["deadLetter"].max_redeliveries,
        p["isolation"].ack_timeout,
    )


def test_vhost_defaults_apply_without_bindings_except_consumer(vh: Any) -> None:
    p = vh.resolve("unbound")
    # <consumer> reaches topic subscriptions only: an unbound queue is not one
    assert "consumer" not in p
    assert (p["deadLetter"].max_redeliveries, p["isolation"].ack_timeout) == (3, 3600.0)
    assert set(p.source.values()) == {"virtualhost /"}
    assert p.subscription is None


def test_vhost_consumer_reaches_a_queue_bound_to_any_topic_exchange(vh: Any) -> None:
    # no <topic> matches "bonds" on amq.topic except '#': use an exchange without one
    p = vh.resolve("sub", [("orders", "topic", "bonds.x"), ("plain", "direct", "k")])
    assert counts(p) == (1000, 3, 3600.0)
    assert p.source["consumer"] == "virtualhost /"


@pytest.mark.parametrize(
    "bindings",
    [
        [],  # the default exchange only (a Celery-style work queue)
        [("amq.direct", "direct", "work")],
        [("amq.fanout", "fanout", "")],
        [("amq.headers", "headers", "")],
    ],
)
def test_vhost_consumer_never_reaches_a_queue_without_a_topic_binding(
    vh: Any, bindings: list[tuple[str, str, str]]
) -> None:
    p = vh.resolve("celery", bindings)
    assert "consumer" not in p and "isolation" in p and "deadLetter" in p


def test_dead_letter_and_retry_targets_are_reached_by_consumer_only_by_name() -> None:
    vh = parse_config(
        wrap(
            """<consumer><messageAge>1m</messageAge><policy name="Delete"/></consumer>
<topic key="#"><consumer><messageCount>5</messageCount><policy name="Delete"/></consumer>
  <isolation><ackTimeout>1h</ackTimeout></isolation></topic>
<queue name="audit-DLQ"><consumer><messageCount>9</messageCount><policy name="Log"/></consumer>
</queue>"""
        )
    ).vhosts["/"]
    topic = [("amq.topic", "topic", "orders.dead")]
    # a topic subscription: the first matching <topic> wins
    assert vh.resolve("sub", topic)["consumer"].message_count == 5
    # the same bindings on a dead-letter or retry target: neither <topic> nor the vhost reaches
    # it with <consumer>; other sections still apply
    p = vh.resolve("orders-DLQ", topic, dead_letter_target=True)
    assert "consumer" not in p and p["isolation"].ack_timeout == 3600.0
    # <queue name> always reaches its queue
    named = vh.resolve("audit-DLQ", topic, dead_letter_target=True)
    assert named["consumer"].message_count == 9
    assert named.source["consumer"] == "queue audit-DLQ"


def test_queue_wins_per_section_and_topic_supplies_the_rest(vh: Any) -> None:
    p = vh.resolve("work", [("amq.topic", "topic", "stocks.us.nyse")])
    assert counts(p) == (50, 7, 300.0)
    assert dict(p.source) == {
        "deadLetter": "queue work",
        "consumer": "topic stocks.us.* on amq.topic",
        "isolation": "topic stocks.# on amq.topic",
    }


def test_first_matching_topic_in_document_order(vh: Any) -> None:
    # stocks.us.* comes before stocks.# and # ; all three match
    assert (
        vh.resolve("s", [("amq.topic", "topic", "stocks.us.nyse")])["consumer"].message_count == 50
    )
    # only stocks.# and # match two words after stocks
    assert (
        vh.resolve("s", [("amq.topic", "topic", "stocks.eu.lse.x")])["consumer"].message_count
        == 500
    )
    # several bindings: the topic order decides, not the binding order
    p = vh.resolve("s", [("amq.topic", "topic", "bonds"), ("amq.topic", "topic", "stocks.us.x")])
    assert p["consumer"].message_count == 50


def test_hash_matches_zero_words_and_star_exactly_one(vh: Any) -> None:
    # '#' matches zero words: stocks.# matches "stocks"
    p = vh.resolve("s", [("amq.topic", "topic", "stocks")])
    assert (
        p["consumer"].message_count == 500 and p.source["consumer"] == "topic stocks.# on amq.topic"
    )
    # '*' is exactly one word: stocks.us.* matches neither stocks.us nor stocks.us.a.b
    assert vh.resolve("s", [("amq.topic", "topic", "stocks.us")])["consumer"].message_count == 500
    assert (
        vh.resolve("s", [("amq.topic", "topic", "stocks.us.a.b")])["consumer"].message_count == 500
    )


def test_binding_key_equal_to_pattern_matches(vh: Any) -> None:
    p = vh.resolve("s", [("amq.topic", "topic", "stocks.us.*")])
    assert p.source["consumer"] == "topic stocks.us.* on amq.topic"


def test_exchange_defaults_to_amq_topic_and_must_match(vh: Any) -> None:
    # orders.* is configured on exchange "orders"; the same key on amq.topic does not match it
    assert vh.resolve("o", [("orders", "topic", "orders.new")])["consumer"].message_count == 5
    p = vh.resolve("o", [("amq.topic", "topic", "orders.new")])
    assert p.source["consumer"] == "topic # on amq.topic"
    # stocks.us.* is on amq.topic (the default), not on "orders"
    assert vh.resolve("o", [("orders", "topic", "stocks.us.x")])["consumer"].message_count == 1000


def test_direct_exchange_binding_never_matches_a_topic(vh: Any) -> None:
    p = vh.resolve(
        "d", [("amq.topic", "direct", "stocks.us.x"), ("plain", "direct", "stocks.us.x")]
    )
    assert "consumer" not in p  # no topic binding: not a topic subscription
    assert (p["deadLetter"].max_redeliveries, p["isolation"].ack_timeout) == (3, 3600.0)
    assert set(p.source.values()) == {"virtualhost /"}


def test_resolve_accepts_any_iterable_and_reports_subscription() -> None:
    vh = parse_config(wrap('<queue name="k" subscription="key_shared"/>')).vhosts["/"]
    p = vh.resolve("k", (b for b in [("amq.topic", "topic", "x")]))
    assert p.subscription == "key_shared" and dict(p) == {}


def test_resolved_policy_is_a_read_only_mapping(vh: Any) -> None:
    p = vh.resolve("work", [("amq.topic", "topic", "bonds")])
    assert set(p) == {"deadLetter", "consumer", "isolation"} and len(p) == 3
    assert isinstance(p["consumer"], SlowConsumerConfig)
    with pytest.raises(AttributeError):
        p.queue = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p["x"] = 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#.z", "z", True),
        ("#.z", "a.b.z", True),
        ("#.z", "a.b", False),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
        ("a.#.z", "a.b.c", False),
        ("#", "", True),
        ("#", "anything.at.all", True),
        ("*", "", False),
        ("*", "one", True),
        ("*.*", "one", False),
        ("#.#", "a", True),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
        ("plain.key", "plain.key", True),
        ("plain.key", "plain.keys", False),
        ("a.b", "a.*", False),
    ],
)
def test_topic_matcher(pattern: str, key: str, expected: bool) -> None:
    assert TopicMatcher(pattern).matches(key) is expected


# ---------------------------------------------------------------------------------------------
# describe()
# ---------------------------------------------------------------------------------------------


def test_describe_lists_policies_and_their_sources(vh: Any) -> None:
    cfg = parse_config(PRECEDENCE, source_name="x.xml")
    text = cfg.describe()
    lines = text.splitlines()
    assert "virtualhost /" in lines
    assert "  exchange orders: topic, durable" in lines
    assert "  queue work (subscription shared (default)):" in lines
    work = lines.index("  queue work (subscription shared (default)):")
    block = "\n".join(lines[work : work + 5])
    assert "deadLetter  maxRedeliveries 7, DLQ work-DLQ  <- queue work" in block
    assert "consumer" not in block.split("if bound")[0]  # no binding: not a subscription
    assert "that topic supplies: consumer, isolation" in block
    assert "if it is a topic subscription, virtualhost / supplies: consumer" in block
    assert (
        "  topic stocks.us.* on amq.topic (queues bound to amq.topic with a key it matches):"
        in lines
    )
    assert "    consumer    messageCount 50, policy Delete" in lines
    assert "  topic orders.* on orders (queues bound to orders with a key it matches):" in lines
    reach = lines.index("  reach of <consumer> (topic subscriptions only, except by <queue name>):")
    assert lines[reach + 1 : reach + 3] == [
        "    virtualhost /: queues bound to a topic exchange; never one bound only to direct, "
        "fanout or the default exchange; never a dead-letter or retry target",
        "    topic stocks.us.* on amq.topic: queues bound to amq.topic with a key it matches; "
        "never a dead-letter or retry target",
    ]


def test_describe_shows_broker_settings() -> None:
    text = load_config(ROOT / "config/examples/retry-dlq.xml").describe()
    assert "listen 127.0.0.1:5672" in text
    assert "backoff exponential min 1s max 1m multiplier 2" in text
    assert "retry queue orders-RETRY levels 1s 5s 10s" in text
    assert "deadLetter  maxRedeliveries 5, DLQ {queue}-DLQ" in text


def throttle(policy: ResolvedPolicy) -> Throttle:
    value = policy["throttle"]
    assert isinstance(value, Throttle)
    return value


def test_plugin_sections_resolve_with_the_same_precedence(registry: ConfigElementRegistry) -> None:
    vh = parse_config(
        wrap(
            "<throttle><rate>1</rate></throttle>\n"
            '<queue name="q"><throttle><rate>3</rate></throttle></queue>\n'
            '<topic key="t.#"><throttle><rate>2</rate></throttle></topic>'
        ),
        registry=registry,
    ).vhosts["/"]
    bound = [("amq.topic", "topic", "t.x")]
    assert throttle(vh.resolve("q", bound)).rate == 3.0
    assert throttle(vh.resolve("other", bound)).rate == 2.0
    p = vh.resolve("other", [("amq.topic", "topic", "u.x")])
    assert throttle(p).rate == 1.0 and p.source["throttle"] == "virtualhost /"


@pytest.mark.parametrize("pattern", ["a.*", "a.#", "#.z", "a.#.z", "*.*", "#.#", "a.*.#", "#", "*"])
@pytest.mark.parametrize("key", ["a", "z", "a.b", "a.z", "a.b.z", "a.b.c.z", "x.y", "a.*", "a..z"])
def test_topic_matcher_reads_patterns_as_the_router_does(pattern: str, key: str) -> None:
    """One algorithm: for every non-empty key, a <topic> pattern and the router agree."""
    assert TopicMatcher(pattern).matches(key) is topic_matches(pattern, key)


def test_describe_section_uses_describe_for_when_the_queue_is_known() -> None:
    class PerQueue:
        def describe(self) -> str:
            return "DLQ {queue}-DLQ"

        def describe_for(self, queue: str) -> str:
            return f"DLQ {queue}-DLQ"

    class Broken:
        def describe(self) -> str:
            raise RuntimeError("boom")

    assert describe_section(PerQueue()) == "DLQ {queue}-DLQ"
    assert describe_section(PerQueue(), "work") == "DLQ work-DLQ"
    assert "its describe() failed: RuntimeError('boom')" in describe_section(Broken(), "work")
    assert describe_section(3) == "3"
    policy = ResolvedPolicy("work", {"deadLetter": PerQueue()}, {"deadLetter": "queue work"}, None)
    assert policy.describe() == "deadLetter  DLQ work-DLQ  <- queue work"


def test_unparsed_section_and_default_topic_exchange() -> None:
    section = UnparsedSection("isolation", 7)
    assert describe_section(section) == (
        "not parsed: no loaded plugin handles <isolation>, so it has no effect"
    )
    assert DEFAULT_TOPIC_EXCHANGE == "amq.topic"
    assert TopicConfig("a.#").exchange == DEFAULT_TOPIC_EXCHANGE

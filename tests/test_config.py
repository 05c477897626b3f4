# mypy: disable-error-code="union-attr"
"""The XML configuration: validation, located errors, plugin elements, policy resolution."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.config import (
    BrokerConfig,
    ConfigElementRegistry,
    ConfigError,
    ParseContext,
    ResolvedPolicy,
    TopicMatcher,
    builtin_registry,
    default_config_path,
    load_config,
    load_default,
    parse_config,
)
from broker.retry import DEFAULT_LEVELS as DEFAULT_RETRY_LEVELS
from plugins.dead_letter_config import BackoffConfig, DeadLetterConfig
from plugins.isolation_config import IsolationConfig
from plugins.slow_consumer_config import SlowConsumerConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.xml"))


def wrap(body: str, vhost: str = "/") -> str:
    """A minimal config whose line 3 is the first line of ``body``."""
    return f'<broker>\n<virtualhost name="{vhost}">\n{body}\n</virtualhost>\n</broker>\n'


def fails(xml: str, name: str = "config/bad.xml", **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(xml, name, **kw)
    return info.value


def assert_located(err: ConfigError, line: int, element: str, *fragments: str) -> None:
    text = str(err)
    assert err.file == "config/bad.xml" and err.line == line and err.element == element, text
    assert text.startswith(f"config/bad.xml:{line}: <{element}>: "), text
    for fragment in fragments:
        assert fragment in text, text


# ---------------------------------------------------------------------------------------------
# shipped files
# ---------------------------------------------------------------------------------------------


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"slow-consumer-topic.xml", "shared-isolation.xml", "retry-dlq.xml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.source == path
    assert "/" in cfg.vhosts
    assert cfg.describe()


def test_default_config() -> None:
    assert default_config_path() == ROOT / "config" / "default.xml"
    cfg = load_default()
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 5672)
    assert cfg.store_path == Path("data/")
    assert cfg.users["guest"].password == "guest" and cfg.users["guest"].vhosts == ("/",)
    assert cfg.housekeeping_threads == 4 and cfg.housekeeping_period == 30.0
    vh = cfg.vhosts["/"]
    assert not vh.defaults and not vh.queues and not vh.topics
    assert dict(vh.resolve("anything", [("amq.topic", "topic", "a.b")])) == {}


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


def test_shared_isolation_example() -> None:
    vh = load_config(ROOT / "config/examples/shared-isolation.xml").vhosts["/"]
    q = vh.queues["work"]
    assert q.subscription == "shared" and q.durable is True and q.declare
    iso = q.sections["isolation"]
    assert iso == IsolationConfig(
        ack_timeout=300.0, max_isolated_ratio=0.6, check_period=30.0, max_unacked_per_consumer=1000
    )
    assert iso.max_isolated(5) == 3 and iso.max_isolated(1) == 0
    assert vh.resolve("other")["isolation"].ack_timeout == 900.0


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


# ---------------------------------------------------------------------------------------------
# values and defaults
# ---------------------------------------------------------------------------------------------


def test_defaults_of_every_section() -> None:
    cfg = parse_config(
        wrap(
            '<queue name="q">\n'
            "<isolation><ackTimeout>5m</ackTimeout></isolation>\n"
            '<deadLetter><retry/><backoff type="levels"/></deadLetter>\n'
            '<consumer><messageCount>10</messageCount><policy name="log"/></consumer>\n'
            "</queue>"
        )
    )
    assert cfg.limits.heartbeat == 60.0 and cfg.limits.frame_max == 131072
    assert cfg.limits.channel_max == 2047 and cfg.limits.handshake_timeout == 10.0
    assert cfg.limits.max_message_size == 128 * 1024 * 1024
    assert cfg.users["guest"].vhosts == ("/",)  # no <users>: guest/guest, as RabbitMQ
    s = cfg.vhosts["/"].queues["q"].sections
    assert s["isolation"] == IsolationConfig(300.0, 0.6, 30.0, 50000)
    dl = s["deadLetter"]
    assert (dl.max_redeliveries, dl.queue, dl.queue_template) == (16, None, "{queue}-DLQ")
    assert dl.retry.queue is None and dl.retry.queue_name("q") == "q-RETRY"
    assert dl.retry.levels == DEFAULT_RETRY_LEVELS
    assert dl.backoff.levels == DEFAULT_RETRY_LEVELS and dl.backoff.next_delay(100) == 7200.0
    assert (
        s["consumer"].policy.name == "Log"
        and s["consumer"].policy.flag("delete-persistent") is False
    )
    assert cfg.vhosts["/"].queues["q"].durable is None and not cfg.vhosts["/"].queues["q"].declare


def test_broker_level_settings() -> None:
    cfg = parse_config(
        "<broker>\n"
        '<listen host="0.0.0.0" port="0"/>\n'
        '<store path="/var/lib/pb"/>\n'
        '<journal path="events/"/>\n'
        '<users><user name="a" password="pw" vhosts="/ prod"/>'
        '<user name="b" password=""/></users>\n'
        "<housekeeping><threads>2</threads><period>1.5s</period></housekeeping>\n"
        "<plugins><plugin>my_company.policies</plugin>"
        '<plugin enabled="false">slow_consumer</plugin></plugins>\n'
        "<limits><heartbeat>0</heartbeat><frameMax>128KB</frameMax><channelMax>0</channelMax>"
        "<handshakeTimeout>3s</handshakeTimeout><maxMessageSize>1MB</maxMessageSize></limits>\n"
        '<virtualhost name="/"/><virtualhost name="prod">'
        '<exchange name="delayed" type="x-delayed-message" delayedType="topic"/></virtualhost>\n'
        "</broker>"
    )
    assert (cfg.listen_host, cfg.listen_port) == ("0.0.0.0", 0)
    assert cfg.store_path == Path("/var/lib/pb") and cfg.journal_path == Path("events")
    assert cfg.users["a"].vhosts == ("/", "prod") and cfg.users["a"].can_access("prod")
    assert cfg.users["b"].vhosts == ("/",)
    assert (cfg.housekeeping_threads, cfg.housekeeping_period) == (2, 1.5)
    assert cfg.plugins == ("my_company.policies",) and cfg.blocked_plugins == frozenset(
        {"slow_consumer"}
    )
    lim = cfg.limits
    assert (
        lim.heartbeat,
        lim.frame_max,
        lim.channel_max,
        lim.handshake_timeout,
        lim.max_message_size,
    ) == (
        0.0,
        131072,
        0,
        3.0,
        1024 * 1024,
    )
    ex = cfg.vhosts["prod"].exchanges[0]
    assert ex.type == "x-delayed-message" and dict(ex.arguments) == {"x-delayed-type": "topic"}


def test_empty_users_means_nobody() -> None:
    assert dict(parse_config("<broker><users/></broker>").users) == {}


def test_model_is_read_only() -> None:
    cfg = load_config(ROOT / "config/examples/slow-consumer-topic.xml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.listen_port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.vhosts["x"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.vhosts["/"].topics[0].sections["consumer"].policy.options["x"] = "y"  # type: ignore[index]


def test_str_input_with_encoding_declaration() -> None:
    cfg = parse_config(
        '<?xml version="1.0" encoding="UTF-8"?>\n<broker><listen port="1"/></broker>'
    )
    assert cfg.listen_port == 1


def test_brokerconfig_defaults_without_a_file() -> None:
    cfg = BrokerConfig()
    assert cfg.listen_port == 5672 and "/" in cfg.vhosts and "guest" in cfg.users


# ---------------------------------------------------------------------------------------------
# errors: every one names file, line and element
# ---------------------------------------------------------------------------------------------


def test_misspelled_element_in_section() -> None:
    err = fails(
        wrap(
            '<topic key="stocks.us.*">\n<consumer>\n<maessageAge>'
            '600000</maessageAge>\n<policy name="Delete"/>\n</consumer>\n</topic>'
        )
    )
    assert_located(
        err,
        5,
        "maessageAge",
        "unexpected element <maessageAge> under <consumer>",
        "did you mean <messageAge>?",
    )


def test_seed_typo_is_malformed_xml() -> None:
    """The Qpid design's own example has <maessageAge>...</messageAge>: a syntax error."""
    err = fails(
        wrap(
            '<topic key="stocks.us.*">\n<consumer>\n<maessageAge>'
            "600000</messageAge>\n</consumer>\n</topic>"
        )
    )
    assert_located(err, 5, "maessageAge", "malformed XML", "</messageAge>")


def test_malformed_xml_unclosed() -> None:
    err = fails('<broker>\n<virtualhost name="/">\n<queue name="q">\n</virtualhost>\n</broker>\n')
    assert err.file == "config/bad.xml" and err.line == 4 and err.element == "queue"
    assert "malformed XML" in str(err) and str(err).startswith("config/bad.xml:4: <queue>: ")


def test_empty_document() -> None:
    err = fails("")
    assert err.file == "config/bad.xml" and err.line == 1 and "malformed XML" in str(err)


def test_bad_duration() -> None:
    err = fails(
        wrap(
            '<queue name="q">\n<consumer>\n<messageAge>'
            '10 minutes</messageAge>\n<policy name="Log"/></consumer></queue>'
        )
    )
    assert str(err) == (
        "config/bad.xml:5: <messageAge>: '10 minutes' is not a duration "
        "(use ms or a number with ms|s|m|h|d)"
    )


def test_bad_size() -> None:
    err = fails(
        wrap(
            '<queue name="q"><consumer>\n<depth>4 MB</depth><policy name="Log"/></consumer></queue>'
        )
    )
    assert_located(err, 4, "depth", "'4 MB' is not a size")


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
    ],
)
def test_range_and_rule_errors(section: str, element: str, fragment: str) -> None:
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


def test_bad_attribute_values() -> None:
    err = fails(wrap('<queue name="q" subscription="round-robin"/>'))
    assert_located(
        err,
        3,
        "queue",
        "attribute subscription",
        "'round-robin' is not one of: shared, exclusive, failover, key_shared",
    )
    err = fails(wrap('<queue name="q" durabel="true"/>'))
    assert_located(err, 3, "queue", "unknown attribute 'durabel'", "did you mean 'durable'?")
    err = fails(wrap("<queue/>"))
    assert_located(err, 3, "queue", "attribute name is required")
    err = fails('<broker>\n<listen port="70000"/></broker>')
    assert_located(err, 2, "listen", "attribute port", "0 to 65535")


def test_unknown_section_element_without_plugin() -> None:
    err = fails(wrap('<queue name="q">\n<throttle rate="5"/>\n</queue>'))
    assert_located(
        err, 4, "throttle", "unknown element <throttle> under <queue>: no plugin registered it"
    )
    err = fails(wrap('<queue name="q">\n<consumr/>\n</queue>'))
    assert_located(err, 4, "consumr", "no plugin registered it", "did you mean <consumer>?")
    err = fails("<broker>\n<statsd/></broker>")
    assert_located(err, 2, "statsd", "unknown element <statsd> under <broker>")


def test_misplaced_builtin_elements() -> None:
    assert_located(fails(wrap("<listen/>")), 3, "listen", "belongs directly under <broker>")
    assert_located(
        fails(wrap('<queue name="a">\n<queue name="b"/></queue>')),
        4,
        "queue",
        "belongs directly under <virtualhost>",
    )
    assert_located(
        fails("<broker>\n<consumer><depth>1</depth><policy name='Log'/></consumer></broker>"),
        2,
        "consumer",
        "put it under <virtualhost>, <queue> or <topic>",
    )


def test_duplicates() -> None:
    assert_located(
        fails(wrap('<queue name="q"><deadLetter/>\n<deadLetter/></queue>')),
        4,
        "deadLetter",
        "appears more than once",
        "first on line 3",
    )
    assert_located(
        fails(wrap('<queue name="q"/>\n<queue name="q"/>')), 4, "queue", "configured twice"
    )
    assert_located(
        fails(wrap('<topic key="a.*"/>\n<topic key="a.*"/>')), 4, "topic", "configured twice"
    )
    assert_located(fails("<broker><listen/>\n<listen/></broker>"), 2, "listen", "more than once")


def test_topic_key_and_exchange_rules() -> None:
    assert_located(fails(wrap('<topic key="stocks.us*"/>')), 3, "topic", "whole words")
    err = fails(wrap('<exchange name="orders" type="direct"/>\n<topic key="a" exchange="orders"/>'))
    assert_located(err, 4, "topic", "is a direct exchange")
    assert_located(
        fails(wrap('<topic key="a" exchange="amq.fanout"/>')), 3, "topic", "is a fanout exchange"
    )
    ok = parse_config(
        wrap(
            '<exchange name="d" type="x-delayed-message" delayedType="topic"/>'
            '\n<topic key="a.*" exchange="d"/>'
        )
    )
    assert ok.vhosts["/"].topics[0].exchange == "d"
    assert_located(
        fails(wrap('<exchange name="amq.mine" type="topic"/>')), 3, "exchange", "reserved"
    )
    assert_located(
        fails(wrap('<exchange name="d" type="x-delayed-message"/>')),
        3,
        "exchange",
        "delayedType is required",
    )


def test_user_with_undeclared_vhost() -> None:
    err = fails('<broker><users>\n<user name="a" password="b" vhosts="/ x"/></users></broker>')
    assert_located(err, 2, "user", "virtualhost 'x', which is not declared")


def test_heartbeat_whole_seconds_and_frame_min() -> None:
    assert_located(
        fails("<broker><limits>\n<heartbeat>1.5s</heartbeat></limits></broker>"),
        2,
        "heartbeat",
        "whole seconds",
    )
    assert_located(
        fails("<broker><limits>\n<frameMax>100</frameMax></limits></broker>"),
        2,
        "frameMax",
        "at least",
    )


def test_wrong_root() -> None:
    assert_located(fails('<queue name="x"/>'), 1, "queue", "root element must be <broker>")


def test_schema_reports_all_errors() -> None:
    err = fails(wrap('<queue name="q" subscription="x"/>\n<queue name="r" durable="maybe"/>'))
    assert [e.line for e in err.all()] == [3, 4]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.xml")
    assert str(tmp_path / "nope.xml") in str(info.value) and "cannot read" in str(info.value)


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.xml"
    path.write_text(
        wrap(
            '<queue name="q"><consumer>\n<messageAge>'
            '10 minutes</messageAge><policy name="Log"/></consumer></queue>'
        )
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:4: <messageAge>: '10 minutes' is not a duration")


# ---------------------------------------------------------------------------------------------
# plugin elements
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throttle:
    rate: float
    window: float
    burst: int

    def describe(self) -> str:
        return f"rate {self.rate:g}/s"


def throttle_parser(el: Any, ctx: ParseContext) -> Throttle:
    rate = ctx.number(el, "rate", minimum=0.0, exclusive_min=True)
    if rate is None:
        raise ctx.error(el, "<rate> is required")
    return Throttle(rate, ctx.duration(el, "window", 1.0), ctx.size(el, "burst", 0))


@pytest.fixture
def registry() -> ConfigElementRegistry:
    reg = builtin_registry()  # what the plugin host hands the loader: built-in plugins' too
    reg.register("throttle", throttle_parser)
    reg.register(
        "statsd", lambda el, ctx: {"port": int(ctx.attr(el, "port", "8125"))}, level="broker"
    )
    reg.register_policy("Throttle")
    reg.register_backoff("jittered")
    return reg


def test_plugin_element_accepted_and_parsed(registry: ConfigElementRegistry) -> None:
    cfg = parse_config(
        '<broker>\n<statsd port="9999"/>\n<virtualhost name="/">\n'
        "<throttle><rate>50</rate><burst>1KB</burst></throttle>\n"
        '<queue name="q"><throttle><rate>5</rate><window>10s</window></throttle>'
        '<consumer><depth>1MB</depth><policy name="Throttle"><options>'
        '<option name="x" value="y"/></options></policy></consumer>'
        '<deadLetter><backoff type="jittered"><min>1s</min>'
        '<param name="jitter" value="0.2"/></backoff></deadLetter>'
        "</queue>\n"
        "</virtualhost></broker>",
        registry=registry,
    )
    vh = cfg.vhosts["/"]
    assert vh.queues["q"].sections["throttle"] == Throttle(5.0, 10.0, 0)
    assert vh.defaults["throttle"] == Throttle(50.0, 1.0, 1024)
    assert vh.resolve("other")["throttle"] == Throttle(50.0, 1.0, 1024)
    assert cfg.extensions["statsd"] == {"port": 9999}
    c = vh.queues["q"].sections["consumer"]
    assert c.policy.name == "Throttle" and c.policy.option("x") == "y"
    b = vh.queues["q"].sections["deadLetter"].backoff
    assert (
        b.type == "jittered"
        and not b.builtin
        and dict(b.params) == {"jitter": "0.2"}
        and b.min == 1.0
    )
    with pytest.raises(ValueError):
        b.next_delay(1)
    assert "throttle    rate 5/s" in cfg.describe()


def test_plugin_parser_errors_are_located(registry: ConfigElementRegistry) -> None:
    err = fails(
        wrap(
            '<queue name="q">\n<throttle>\n<window>'
            "10 minutes</window><rate>1</rate></throttle></queue>"
        ),
        registry=registry,
    )
    assert_located(err, 5, "window", "'10 minutes' is not a duration")
    err = fails(wrap('<queue name="q">\n<throttle/></queue>'), registry=registry)
    assert_located(err, 4, "throttle", "<rate> is required")
    # a broker-level plugin element placed in a queue, and a section placed under <broker>
    assert_located(
        fails(wrap('<queue name="q">\n<statsd/></queue>'), registry=registry),
        4,
        "statsd",
        "directly under <broker>",
    )
    assert_located(
        fails("<broker>\n<throttle/></broker>", registry=registry),
        2,
        "throttle",
        "put it under <virtualhost>",
    )


def test_plugin_parser_crash_is_located() -> None:
    reg = ConfigElementRegistry()
    reg.register("boom", lambda el, ctx: 1 / 0)
    err = fails(wrap('<queue name="q">\n<boom/></queue>'), registry=reg)
    assert_located(err, 4, "boom", "ZeroDivisionError")


def test_builtin_sections_stay_strict_with_plugins(registry: ConfigElementRegistry) -> None:
    err = fails(
        wrap(
            '<queue name="q"><consumer>\n<maessageAge>'
            '1</maessageAge><policy name="Log"/></consumer></queue>'
        ),
        registry=registry,
    )
    assert_located(err, 4, "maessageAge", "unexpected element")


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


def test_vhost_defaults_apply_without_bindings(vh: Any) -> None:
    p = vh.resolve("unbound")
    assert counts(p) == (1000, 3, 3600.0)
    assert set(p.source.values()) == {"virtualhost /"}
    assert p.subscription is None


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
    assert counts(p) == (1000, 3, 3600.0)
    assert set(p.source.values()) == {"virtualhost /"}


def test_resolve_accepts_any_iterable_and_reports_subscription() -> None:
    vh = parse_config(wrap('<queue name="k" subscription="key_shared"/>')).vhosts["/"]
    p = vh.resolve("k", (b for b in [("amq.topic", "topic", "x")]))
    assert p.subscription == "key_shared" and dict(p) == {}


def test_resolved_policy_is_a_read_only_mapping(vh: Any) -> None:
    p = vh.resolve("work")
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
    assert "consumer    messageCount 1000, policy Log  <- virtualhost /" in block
    assert "that topic supplies: consumer, isolation" in block
    assert (
        "  topic stocks.us.* on amq.topic (queues bound to amq.topic with a key it matches):"
        in lines
    )
    assert "    consumer    messageCount 50, policy Delete" in lines
    assert "  topic orders.* on orders (queues bound to orders with a key it matches):" in lines


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


def test_isolation_cap_and_backoff_helpers() -> None:
    assert IsolationConfig(1.0, max_isolated_ratio=0.29).max_isolated(100) == 29
    assert IsolationConfig(1.0, max_isolated_ratio=0.0).max_isolated(10) == 0
    assert IsolationConfig(1.0, max_isolated_ratio=1.0).max_isolated(7) == 7
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


def test_user_with_no_vhosts_is_an_error() -> None:
    err = fails('<broker><users>\n<user name="a" password="b" vhosts=" "/></users></broker>')
    assert_located(err, 2, "user", "at least one virtualhost")


SPEC_EXAMPLE = """<broker>
  <listen host="127.0.0.1" port="5672"/>
  <store path="data/"/>                         <!-- embedded durable store -->
  <users><user name="guest" password="guest" vhosts="/"/></users>
  <housekeeping><threads>4</threads><period>30000</period></housekeeping>
  <plugins><plugin>my_company.policies</plugin></plugins>   <!-- extra plugin modules -->
  <journal path="events/"/>                    <!-- event journal for the pipeline -->

  <virtualhost name="/">
    <exchange name="orders" type="topic" durable="true"/>
    <queue name="work" durable="true">           <!-- policies for one queue by name -->
      <isolation>
        <ackTimeout>300000</ackTimeout>
        <maxIsolatedRatio>0.6</maxIsolatedRatio>
        <checkPeriod>30000</checkPeriod>
      </isolation>
      <deadLetter>
        <maxRedeliveries>16</maxRedeliveries>
        <queue>work-DLQ</queue>                  <!-- default: {queue}-DLQ -->
        <retry><queue>work-RETRY</queue>
               <levels>1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h</levels></retry>
        <backoff type="exponential"><min>1s</min><max>60s</max><multiplier>2</multiplier></backoff>
      </deadLetter>
    </queue>
    <topic key="stocks.us.*">                    <!-- policies for topic subscriptions -->
      <consumer>
        <depth>4235264</depth>
        <messageAge>600000</messageAge>
        <messageCount>50</messageCount>
        <consumptionRate>100</consumptionRate>   <!-- msgs/s floor while backlogged -->
        <policy name="Delete">
          <options><option name="delete-persistent" value="true"/></options>
        </policy>
      </consumer>
    </topic>
  </virtualhost>
</broker>
"""


def test_spec_section_4_example() -> None:
    cfg = parse_config(SPEC_EXAMPLE, "spec.xml")
    assert cfg.plugins == ("my_company.policies",) and cfg.journal_path == Path("events")
    vh = cfg.vhosts["/"]
    p = vh.resolve("work", [("amq.topic", "topic", "stocks.us.nyse"), ("orders", "topic", "x")])
    assert p["isolation"].ack_timeout == 300.0 and p["isolation"].check_period == 30.0
    assert p["deadLetter"].dlq_name("work") == "work-DLQ"
    assert p["deadLetter"].retry.queue_name("work") == "work-RETRY"
    assert p["consumer"].message_age == 600.0
    assert dict(p.source) == {
        "isolation": "queue work",
        "deadLetter": "queue work",
        "consumer": "topic stocks.us.* on amq.topic",
    }

"""Pass 3: the core elements, plugin elements by their parsers, and the entry points."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from configutil import EXAMPLES, ROOT, Throttle, assert_located, fails, wrap

from plugbroker.config import (
    ConfigElementRegistry,
    ConfigError,
    PolicyRef,
    UnparsedSection,
    builtin_registry,
    default_config_path,
    load_config,
    load_default,
    parse_config,
)
from plugbroker.plugins.isolation_config import IsolationConfig
from plugbroker.registry import PluginError
from plugbroker.retry import DEFAULT_LEVELS as DEFAULT_RETRY_LEVELS
from plugbroker.runner import load_plugins

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
    guest = cfg.users["guest"]
    assert guest.check_password("guest") and guest.vhosts == ("/",)
    assert guest.password is None and guest.password_hash is not None  # no plain text shipped
    assert guest.tags == {"administrator"} and guest.loopback_only
    assert cfg.housekeeping_threads == 4 and cfg.housekeeping_period == 30.0
    vh = cfg.vhosts["/"]
    assert not vh.defaults and not vh.queues and not vh.topics
    assert dict(vh.resolve("anything", [("amq.topic", "topic", "a.b")])) == {}


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


# ---------------------------------------------------------------------------------------------
# errors in the core elements: every one names file, line and element
# ---------------------------------------------------------------------------------------------


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


def test_blast_radius_is_read_checked_and_placed() -> None:
    vh = parse_config(
        wrap('<blastRadius maxActionsPerMinute="2" maxConsumersAffected="10"/>')
    ).vhosts["/"]
    assert vh.blast_radius is not None
    assert (vh.blast_radius.max_actions_per_minute, vh.blast_radius.max_consumers_affected) == (
        2,
        10,
    )
    shown = parse_config(wrap('<blastRadius maxActionsPerMinute="2"/>')).describe()
    assert "  blastRadius: at most 2 action(s) a minute (all policies together)" in shown
    only = parse_config(wrap('<blastRadius maxConsumersAffected="3"/>')).vhosts["/"]
    assert only.blast_radius is not None and only.blast_radius.max_actions_per_minute is None
    assert parse_config(wrap("")).vhosts["/"].blast_radius is None
    assert_located(fails(wrap("<blastRadius/>")), 3, "blastRadius", "sets no limit")
    assert_located(
        fails(wrap('<blastRadius maxActionsPerMinute="0"/>')),
        3,
        "blastRadius",
        "maxActionsPerMinute",
    )
    assert_located(
        fails(
            wrap('<blastRadius maxActionsPerMinute="2"/>\n<blastRadius maxActionsPerMinute="3"/>')
        ),
        4,
        "blastRadius",
        "appears more than once",
    )
    assert_located(
        fails(wrap('<queue name="q"><blastRadius maxActionsPerMinute="2"/></queue>')),
        3,
        "blastRadius",
        "belongs directly under <virtualhost>",
    )


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


def test_user_with_no_vhosts_is_an_error() -> None:
    err = fails('<broker><users>\n<user name="a" password="b" vhosts=" "/></users></broker>')
    assert_located(err, 2, "user", "at least one virtualhost")


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


# ---------------------------------------------------------------------------------------------
# SPEC section 4
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# the core alone, and built-in plugins switched off
# ---------------------------------------------------------------------------------------------

EVERY_CORE_ELEMENT = """<broker>
  <listen host="127.0.0.1" port="0"/>
  <store path="data/" sync="full"/>
  <users><user name="u" password="p" vhosts="/ other"/></users>
  <housekeeping><threads>2</threads><period>5s</period></housekeeping>
  <plugins><plugin enabled="false">plugbroker.plugins.slow_consumer</plugin></plugins>
  <journal path="events/"/>
  <limits><heartbeat>30s</heartbeat></limits>
  <admin port="0"/>
  <virtualhost name="/">
    <exchange name="orders" type="topic" durable="true"/>
    <queue name="work" durable="true" subscription="key_shared"/>
    <topic key="orders.#" exchange="orders"/>
  </virtualhost>
  <virtualhost name="other"/>
</broker>"""


def test_the_core_parses_a_file_without_plugin_sections_with_no_plugin_registered() -> None:
    cfg = parse_config(EVERY_CORE_ELEMENT, "core.xml", registry=ConfigElementRegistry())
    assert (cfg.store_sync, cfg.housekeeping_period, cfg.limits.heartbeat) == ("full", 5.0, 30.0)
    assert (
        cfg.blocked_plugins == frozenset({"plugbroker.plugins.slow_consumer"})
        and cfg.admin is not None
    )
    vh = cfg.vhosts["/"]
    assert vh.queues["work"].declare and vh.queues["work"].subscription == "key_shared"
    assert vh.topics[0].exchange == "orders" and not vh.topics[0].sections
    p = vh.resolve("work", [("orders", "topic", "orders.new")])
    assert dict(p) == {} and p.subscription == "key_shared"
    assert set(cfg.vhosts) == {"/", "other"} and cfg.describe()


SECTIONS = (
    '<consumer><messageCount>5</messageCount><policy name="Delete"/></consumer>\n'
    "<isolation><ackTimeout>0</ackTimeout></isolation>\n"
    "<deadLetter><maxRedeliveries>3</maxRedeliveries></deadLetter>"
)


def test_without_a_registry_the_built_in_plugins_elements_are_known() -> None:
    reg = builtin_registry()
    assert {"consumer", "isolation", "deadLetter"} <= reg.section_names
    assert reg.has_policy("Delete") and reg.has_policy("Log")
    valid = SECTIONS.replace("<ackTimeout>0<", "<ackTimeout>5m<")
    assert parse_config(wrap(valid)).vhosts["/"].defaults.keys() == {
        "consumer",
        "isolation",
        "deadLetter",
    }


def test_a_schema_section_no_plugin_parses_is_kept_unparsed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="plugbroker.config"):
        cfg = parse_config(wrap(SECTIONS), "x.xml", registry=ConfigElementRegistry())
    defaults = cfg.vhosts["/"].defaults
    assert defaults["consumer"] == UnparsedSection("consumer", 3, PolicyRef("Delete"))
    # only the schema checked it: the range check (ackTimeout > 0) is the plugin's
    assert defaults["isolation"] == UnparsedSection("isolation", 4, None)
    assert isinstance(defaults["deadLetter"], UnparsedSection)
    assert "x.xml:4: <isolation> has no effect: no loaded plugin parses it" in caplog.text
    assert "not parsed: no loaded plugin handles <deadLetter>" in cfg.describe()


def test_an_unparsed_section_is_still_checked_by_the_schema_and_placed() -> None:
    empty = ConfigElementRegistry()
    err = fails(wrap("<isolation>\n<ackTimeut>1s</ackTimeut></isolation>"), registry=empty)
    assert_located(err, 4, "ackTimeut", "unexpected element <ackTimeut> under <isolation>")
    err = fails(wrap('<queue name="q"><deadLetter/>\n<deadLetter/></queue>'), registry=empty)
    assert_located(err, 4, "deadLetter", "appears more than once", "first on line 3")
    err = fails(
        "<broker>\n<isolation><ackTimeout>1s</ackTimeout></isolation></broker>", registry=empty
    )
    assert_located(err, 2, "isolation", "put it under <virtualhost>, <queue> or <topic>")


def _blocked(tmp_path: Path, plugin: str, body: str) -> tuple[Any, Any]:
    """Load ``body`` under ``/`` the way ``plugbroker run`` does, with ``plugin`` blocked."""
    path = tmp_path / "broker.xml"
    path.write_text(
        f'<broker><plugins><plugin enabled="false">{plugin}</plugin></plugins>\n'
        f'<virtualhost name="/">{body}</virtualhost></broker>'
    )
    host, registry = load_plugins(path)
    config = load_config(path, registry=registry)
    host.verify_policies(config)
    return host, config


@pytest.mark.parametrize(
    "plugin",
    [
        "plugbroker.plugins.slow_consumer",
        "plugbroker.plugins.isolation",
        "plugbroker.plugins.dead_letter",
    ],
)
def test_a_file_without_its_section_loads_with_a_built_in_plugin_blocked(
    tmp_path: Path, plugin: str
) -> None:
    host, config = _blocked(tmp_path, plugin, "")
    assert plugin not in host.names() and not config.vhosts["/"].defaults


def test_consumer_is_refused_with_the_slow_consumer_plugin_blocked(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as err:
        _blocked(tmp_path, "plugbroker.plugins.slow_consumer", SECTIONS.splitlines()[0])
    assert str(err.value) == (
        f"policy 'Delete' used in {tmp_path / 'broker.xml'} at <virtualhost name='/'> "
        "<consumer> is not registered by any plugin (registered policies: none)"
    )


@pytest.mark.parametrize(
    ("plugin", "section", "line"),
    [
        (
            "plugbroker.plugins.isolation",
            "isolation",
            "<isolation><ackTimeout>5m</ackTimeout></isolation>",
        ),
        ("plugbroker.plugins.dead_letter", "deadLetter", SECTIONS.splitlines()[2]),
    ],
)
def test_isolation_and_dead_letter_load_without_effect_with_their_plugin_blocked(
    tmp_path: Path, plugin: str, section: str, line: str
) -> None:
    host, config = _blocked(tmp_path, plugin, line)
    assert isinstance(config.vhosts["/"].defaults[section], UnparsedSection)
    assert plugin not in host.names() and section not in host.config_registry().section_names


def test_the_front_door_limits_are_read() -> None:
    cfg = parse_config(
        "<broker>\n<limits><maxConnections>100</maxConnections>"
        "<maxConnectionsPerUser>10</maxConnectionsPerUser>"
        "<maxQueuesPerVhost>1000</maxQueuesPerVhost>"
        "<loginFailureDelay>100ms</loginFailureDelay>"
        "<loginFailureDelayMax>2s</loginFailureDelayMax></limits>\n</broker>"
    )
    lim = cfg.limits
    assert (lim.max_connections, lim.max_connections_per_user, lim.max_queues_per_vhost) == (
        100,
        10,
        1000,
    )
    assert (lim.login_failure_delay, lim.login_failure_delay_max) == (0.1, 2.0)
    assert "maxConnections 100" in lim.describe() and "maxQueuesPerVhost 1000" in lim.describe()
    default = parse_config("<broker/>").limits
    assert (default.max_connections, default.max_queues_per_vhost) == (0, 20_000)
    assert (default.login_failure_delay, default.login_failure_delay_max) == (0.5, 10.0)
    assert "maxConnections unlimited" in default.describe()


def test_the_tenant_limits_are_read_and_0_lifts_them() -> None:
    cfg = parse_config(
        "<broker>\n<limits><maxChannelsPerUser>7</maxChannelsPerUser>"
        "<maxConsumersPerChannel>0</maxConsumersPerChannel>"
        "<maxConsumersPerVhost>9</maxConsumersPerVhost></limits>\n</broker>"
    )
    lim = cfg.limits
    assert (lim.max_channels_per_user, lim.max_consumers_per_channel) == (7, 0)
    assert lim.max_consumers_per_vhost == 9 and lim.max_connections_per_user == 1000
    assert "maxChannelsPerUser 7" in lim.describe()
    assert "maxConsumersPerChannel unlimited" in lim.describe()
    with pytest.raises(ConfigError):
        parse_config(
            "<broker><limits><maxChannelsPerUser>-1</maxChannelsPerUser></limits></broker>"
        )


def test_the_binding_limits_and_the_hook_budget_are_read() -> None:
    cfg = parse_config(
        "<broker>\n<limits><maxBindingsPerExchange>50</maxBindingsPerExchange>"
        "<maxBindingsPerVhost>500</maxBindingsPerVhost><hookBudget>250ms</hookBudget>"
        "</limits>\n</broker>"
    )
    lim = cfg.limits
    assert (lim.max_bindings_per_exchange, lim.max_bindings_per_vhost) == (50, 500)
    assert lim.hook_budget == 0.25
    assert "maxBindingsPerExchange 50, maxBindingsPerVhost 500" in lim.describe()
    default = parse_config("<broker/>").limits
    assert (default.max_bindings_per_exchange, default.max_bindings_per_vhost) == (50_000, 100_000)
    assert default.hook_budget == 0.1
    assert (
        parse_config(
            "<broker><limits><hookBudget>0</hookBudget></limits></broker>"
        ).limits.hook_budget
        == 0
    )
    with pytest.raises(ConfigError):
        parse_config(
            "<broker><limits><maxBindingsPerVhost>-1</maxBindingsPerVhost></limits></broker>"
        )


def test_a_login_delay_cap_below_the_delay_is_refused_where_it_is_written() -> None:
    err = fails(
        "<broker>\n<limits>\n<loginFailureDelay>5s</loginFailureDelay>\n"
        "<loginFailureDelayMax>1s</loginFailureDelayMax>\n</limits>\n</broker>"
    )
    assert_located(err, 4, "loginFailureDelayMax", "below loginFailureDelay 5s")


def test_a_negative_connection_limit_is_refused() -> None:
    err = fails("<broker>\n<limits>\n<maxConnections>-1</maxConnections>\n</limits>\n</broker>")
    assert err.line == 3 and "maxConnections" in str(err)


# ---------------------------------------------------------------------------------------------
# <admin allowedHosts>
# ---------------------------------------------------------------------------------------------


def test_admin_allowed_hosts_are_a_list_of_names_in_lower_case() -> None:
    cfg = parse_config(
        '<broker>\n<admin port="0" allowedHosts="Proxy.Example.com,  ops.internal  '
        'proxy.example.com plug_admin."/>\n</broker>',
        "hosts.xml",
    )
    assert cfg.admin_allowed_hosts == ("proxy.example.com", "ops.internal", "plug_admin")
    assert "admin allowed hosts proxy.example.com ops.internal plug_admin" in cfg.describe()
    assert parse_config('<broker><admin port="0"/></broker>', "x.xml").admin_allowed_hosts == ()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("https://proxy.example.com", "is a URL; give the host name alone"),
        ("proxy.example.com/admin", "is a URL"),
        ("proxy.example.com:443", "has a port"),
        ("10.0.0.5", "is an address; addresses (and localhost) are always allowed"),
        ("[::1]", "is an address"),
        ("-bad-.example", "is not a host name"),
        ("a..b", "is not a host name"),
        ("x" * 64 + ".example", "is not a host name"),
    ],
)
def test_a_bad_allowed_host_names_file_line_and_field(value: str, says: str) -> None:
    err = fails(f'<broker>\n\n<admin port="0" allowedHosts="ok.example {value}"/>\n</broker>')
    assert_located(err, 3, "admin", "attribute allowedHosts:", repr(value), says)

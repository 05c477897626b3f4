"""Passes 1 and 2: XML syntax and the schema, each error located at file, line and element."""

from __future__ import annotations

from configutil import assert_located, fails, wrap
from lxml import etree

from plugbroker.config import (
    DEFAULT_TOPIC_EXCHANGE,
    ConfigElementRegistry,
    parse_config,
    schema_path,
)
from plugbroker.config.schema import CORE_ELEMENTS, declared_elements
from plugbroker.domain.exchange import DELAYED_TYPE, EXCHANGE_TYPES
from plugbroker.subscription import SUBSCRIPTION_TYPES


def test_str_input_with_encoding_declaration() -> None:
    cfg = parse_config(
        '<?xml version="1.0" encoding="UTF-8"?>\n<broker><listen port="1"/></broker>'
    )
    assert cfg.listen_port == 1


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


def test_schema_reports_all_errors() -> None:
    err = fails(wrap('<queue name="q" subscription="x"/>\n<queue name="r" durable="maybe"/>'))
    assert [e.line for e in err.all()] == [3, 4]


def test_builtin_sections_stay_strict_with_plugins(registry: ConfigElementRegistry) -> None:
    err = fails(
        wrap(
            '<queue name="q"><consumer>\n<maessageAge>'
            '1</maessageAge><policy name="Log"/></consumer></queue>'
        ),
        registry=registry,
    )
    assert_located(err, 4, "maessageAge", "unexpected element")


def test_the_schema_declares_the_core_elements_and_the_built_in_sections() -> None:
    declared = declared_elements()
    assert CORE_ELEMENTS <= declared
    assert declared - CORE_ELEMENTS == {"consumer", "isolation", "deadLetter"}


def _enumeration(simple_type: str) -> list[str]:
    doc = etree.parse(str(schema_path()))
    xs = "{http://www.w3.org/2001/XMLSchema}"
    node = doc.getroot().find(f"{xs}simpleType[@name='{simple_type}']")
    assert node is not None
    return [e.get("value") for e in node.iter(f"{xs}enumeration")]


def test_the_schema_agrees_with_the_domain_it_configures() -> None:
    """The XSD cannot import Python: these keep its copies in step with the one definition."""
    assert _enumeration("subscriptionType") == list(SUBSCRIPTION_TYPES)
    assert _enumeration("delayedTypeType") == list(EXCHANGE_TYPES)
    assert _enumeration("exchangeTypeType") == [*EXCHANGE_TYPES, DELAYED_TYPE]
    doc = etree.parse(str(schema_path()))
    topic = doc.getroot().find(
        "{http://www.w3.org/2001/XMLSchema}element[@name='topic']//"
        "{http://www.w3.org/2001/XMLSchema}attribute[@name='exchange']"
    )
    assert topic is not None and topic.get("default") == DEFAULT_TOPIC_EXCHANGE

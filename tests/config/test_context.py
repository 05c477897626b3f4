"""ParseContext: what every element parser (the core's and each plugin's) is handed."""

from __future__ import annotations

from typing import Any

import pytest
from lxml import etree

from plugbroker.config import ConfigElementRegistry, ConfigError, ParseContext, PolicyRef


def element(xml: str, path: str = ".") -> Any:
    root = etree.fromstring(xml)
    found = root if path == "." else root.find(path)
    assert found is not None
    return found


def test_once_refuses_a_second_element_of_a_name_naming_the_first_line() -> None:
    el = element("<backoff>\n<min>1s</min>\n<max>2s</max>\n<min>3s</min></backoff>")
    ctx = ParseContext("f.xml")
    seen: dict[str, Any] = {}
    first, second, third = ctx.children(el)
    ctx.once(seen, first, "<backoff>")
    ctx.once(seen, second, "<backoff>")
    with pytest.raises(ConfigError) as err:
        ctx.once(seen, third, "<backoff>")
    assert str(err.value) == (
        "f.xml:4: <min>: <min> appears more than once under <backoff> (first on line 2)"
    )


def test_children_skip_comments_and_processing_instructions() -> None:
    el = element("<s><!-- note --><a/><?pi x?><b/></s>")
    assert [c.tag for c in ParseContext.children(el)] == ["a", "b"]


@pytest.mark.parametrize(
    ("xml", "kind", "queue", "attributes"),
    [
        (
            '<virtualhost name="/"><queue name="q" subscription="failover"><s/></queue>'
            "</virtualhost>",
            "queue",
            "q",
            {"name": "q", "subscription": "failover"},
        ),
        ('<virtualhost name="/"><topic key="a.#"><s/></topic></virtualhost>', "topic", None, None),
        ('<virtualhost name="/"><s/></virtualhost>', "virtualhost", None, {"name": "/"}),
    ],
)
def test_scope_names_the_container_of_a_section(
    xml: str, kind: str, queue: str | None, attributes: dict[str, str] | None
) -> None:
    scope = ParseContext("f.xml").scope(element(xml, ".//s"))
    assert (scope.kind, scope.queue) == (kind, queue)
    if attributes is not None:
        assert dict(scope.attributes) == attributes


def test_policy_reads_name_and_options_and_refuses_an_option_given_twice() -> None:
    ctx = ParseContext("f.xml")
    el = element(
        '<policy name="Mine"><options><option name="a" value="1"/>'
        '<option name="b" value="x"/></options></policy>'
    )
    assert ctx.policy(el) == PolicyRef("Mine", {"a": "1", "b": "x"})
    seen: list[tuple[str, str]] = []

    def check(opt: Any, name: str, value: str) -> str:
        seen.append((name, value))
        return value.upper()

    ref = ctx.policy(el, check, name="MINE")
    assert ref.name == "MINE" and dict(ref.options) == {"a": "1", "b": "X"}
    assert seen == [("a", "1"), ("b", "x")]  # document order
    twice = element(
        '<policy name="Mine"><options><option name="a" value="1"/>\n'
        '<option name="a" value="2"/></options></policy>'
    )
    with pytest.raises(ConfigError, match=r"f.xml:2: <option>: option 'a' is given twice"):
        ctx.policy(twice)


def test_knows_policy_and_backoff_ask_the_registry() -> None:
    assert not ParseContext("f.xml").knows_policy("Mine")
    reg = ConfigElementRegistry()
    reg.register_policy("Mine")
    reg.register_backoff("jittered")
    ctx = ParseContext("f.xml", reg)
    assert ctx.knows_policy("Mine") and not ctx.knows_policy("mine")
    assert ctx.knows_backoff("jittered") and not ctx.knows_backoff("linear")

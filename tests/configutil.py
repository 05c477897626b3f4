"""Helpers for the configuration tests (tests/config and the built-in plugins' section tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from plugbroker.config import ConfigError, ParseContext, parse_config

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

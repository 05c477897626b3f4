"""The ``registry`` fixture: the built-in plugins' elements plus a plugin's ``<throttle>``."""

from __future__ import annotations

import pytest
from configutil import throttle_parser

from plugbroker.config import ConfigElementRegistry, builtin_registry


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

"""The isolation plugin's configuration: the ``<isolation>`` section.

Registered by :func:`plugbroker.plugins.isolation.broker_add_config_elements` exactly as a third-party plugin
registers its elements; the core's loader only calls :func:`parse_isolation`. The schema
(``config/plugbroker.xsd``) keeps the section's shape; ranges and the "shared queues only" rule
are checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from math import floor
from typing import Any

from plugbroker.config import ConfigElementRegistry, ParseContext
from plugbroker.config.context import local_name
from plugbroker.config.units import format_duration
from plugbroker.subscription import SHARED

__all__ = [
    "DEFAULT_ETA_HEADERS",
    "SECTION",
    "IsolationConfig",
    "add_config_elements",
    "parse_isolation",
]

#: Celery's protocol-2 header for a task's ETA (countdown tasks have one too)
DEFAULT_ETA_HEADERS: tuple[str, ...] = ("eta",)

#: the element this plugin reads; its check finds it as ``QueueView.policy["isolation"]``
SECTION = "isolation"


@dataclass(frozen=True, slots=True)
class IsolationConfig:
    """``<isolation>``: ack-timeout isolation of consumers of a shared queue (TDMQ)."""

    #: seconds without any ack/nack/reject, while holding unacked messages, before isolation
    ack_timeout: float
    max_isolated_ratio: float = 0.6
    #: seconds between checks
    check_period: float = 30.0
    max_unacked_per_consumer: int = 50000
    #: distinct consumers that may hold a message without settling it before it is
    #: dead-lettered as poison (0: never)
    poison_deliveries: int = 3
    #: message headers that say when a delivery is due (ISO 8601 text, an AMQP timestamp or a
    #: number of seconds since the epoch); a delivery not due yet is off the ack clock until it
    #: is (Celery's protocol-2 ``eta`` by default; empty: ETA awareness off)
    eta_headers: tuple[str, ...] = DEFAULT_ETA_HEADERS

    def max_isolated(self, consumers: int) -> int:
        """``floor(maxIsolatedRatio x consumers)``, computed in decimal so 0.29 x 100 is 29."""
        return floor(Decimal(repr(self.max_isolated_ratio)) * consumers)

    def describe(self) -> str:
        return (
            f"ackTimeout {format_duration(self.ack_timeout)}, maxIsolatedRatio "
            f"{self.max_isolated_ratio:g}, checkPeriod {format_duration(self.check_period)}, "
            f"maxUnackedPerConsumer {self.max_unacked_per_consumer}, poisonDeliveries "
            f"{self.poison_deliveries or 'off'}, etaHeaders "
            f"{' '.join(self.eta_headers) or 'off'}"
        )


def parse_isolation(el: Any, ctx: ParseContext) -> IsolationConfig:
    """``<isolation>`` -> :class:`IsolationConfig`; in a ``<queue>``, that queue must be shared."""
    ack_timeout = ctx.duration(el, "ackTimeout")
    if ack_timeout is None:  # the schema requires it; a parser called on its own still says so
        raise ctx.error(el, "missing required child element <ackTimeout>")
    config = IsolationConfig(
        ack_timeout=ack_timeout,
        max_isolated_ratio=ctx.number(el, "maxIsolatedRatio", 0.6, minimum=0.0, maximum=1.0),
        check_period=ctx.duration(el, "checkPeriod", 30.0),
        max_unacked_per_consumer=ctx.integer(el, "maxUnackedPerConsumer", 50000, minimum=1),
        poison_deliveries=ctx.integer(el, "poisonDeliveries", 3, minimum=0),
        eta_headers=_eta_headers(el, ctx),
    )
    if config.poison_deliveries == 1:
        where = next(c for c in ctx.children(el) if local_name(c) == "poisonDeliveries")
        raise ctx.error(
            where,
            "<poisonDeliveries> must be 0 (off) or at least 2: a message is poison only when "
            "more than one consumer failed on it",
        )
    scope = ctx.scope(el)
    subscription = scope.attributes.get("subscription")
    if scope.kind == "queue" and subscription not in (None, SHARED):
        raise ctx.error(
            el,
            f"isolation applies to shared queues only, and queue {scope.queue!r} has "
            f"subscription {subscription}",
        )
    return config


def _eta_headers(el: Any, ctx: ParseContext) -> tuple[str, ...]:
    """``<etaHeaders>``: header names separated by spaces (empty: off); ``eta`` if absent."""
    text = ctx.text(el, "etaHeaders")
    if text is None:
        return DEFAULT_ETA_HEADERS
    names = tuple(dict.fromkeys(text.split()))
    for name in names:
        if len(name.encode()) > 255:
            where = next(c for c in ctx.children(el) if local_name(c) == "etaHeaders")
            raise ctx.error(where, f"<etaHeaders>: header name {name[:40]!r}... is over 255 bytes")
    return names


def add_config_elements(registry: ConfigElementRegistry) -> None:
    """Register ``<isolation>`` (what the plugin's ``broker_add_config_elements`` does)."""
    registry.register(SECTION, parse_isolation)

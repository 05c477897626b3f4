"""The slow-consumer plugin's configuration: the ``<consumer>`` section and its ``<policy>``.

Registered by :func:`plugbroker.plugins.slow_consumer.broker_add_config_elements` exactly as a third-party
plugin registers its elements; the core's loader only calls :func:`parse_consumer`. The schema
(``config/plugbroker.xsd``) keeps the section's shape, so a misspelled child is reported by the
schema with its line; ranges, the "at least one threshold" rule and the options of the built-in
policies are checked here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from plugbroker.config import (
    REACH_TOPIC_SUBSCRIPTIONS,
    ConfigElementRegistry,
    ParseContext,
    PolicyRef,
)
from plugbroker.config.model import XML_FALSE, XML_TRUE
from plugbroker.config.units import format_duration, format_size

__all__ = [
    "DELETE",
    "GRADUATED",
    "GRADUATED_STEPS",
    "LOG",
    "OPTIONS_BY_POLICY",
    "POLICIES",
    "POLICY_OPTIONS",
    "SECTION",
    "SlowConsumerConfig",
    "add_config_elements",
    "parse_consumer",
    "parse_policy",
]

#: the element this plugin reads; policies find it as ``QueueView.policy["consumer"]``
SECTION = "consumer"
#: the policies this plugin implements (Qpid design); the XML may write them in any case
DELETE = "Delete"
LOG = "Log"
GRADUATED = "Graduated"
POLICIES: tuple[str, ...] = (DELETE, LOG, GRADUATED)
#: the steps of ``Graduated``, in order (the values of its ``max-step`` option)
GRADUATED_STEPS: tuple[str, ...] = ("log", "prefetch", "cancel", "close", "delete")
#: the options each built-in policy understands
OPTIONS_BY_POLICY: dict[str, frozenset[str]] = {
    DELETE: frozenset({"delete-persistent"}),
    LOG: frozenset({"delete-persistent"}),
    GRADUATED: frozenset({"delete-persistent", "prefetch-divisor", "max-step", "close-wait"}),
}
#: every option a built-in policy understands
POLICY_OPTIONS: frozenset[str] = frozenset().union(*OPTIONS_BY_POLICY.values())


@dataclass(frozen=True, slots=True)
class SlowConsumerConfig:
    """``<consumer>``: slow-consumer thresholds; exceeding *any* configured one triggers."""

    depth: int | None = None
    #: seconds
    message_age: float | None = None
    message_count: int | None = None
    #: acks per second the consumer must stay above while the queue has a backlog
    consumption_rate: float | None = None
    policy: PolicyRef = field(default_factory=lambda: PolicyRef("Log"))

    def thresholds(self) -> tuple[tuple[str, float], ...]:
        """``(element name, configured value)`` for each threshold set, for logs and journal."""
        out: list[tuple[str, float]] = []
        for name, value in (
            ("depth", self.depth),
            ("messageAge", self.message_age),
            ("messageCount", self.message_count),
            ("consumptionRate", self.consumption_rate),
        ):
            if value is not None:
                out.append((name, value))
        return tuple(out)

    def describe(self) -> str:
        parts: list[str] = []
        if self.depth is not None:
            parts.append(f"depth {format_size(self.depth)}")
        if self.message_age is not None:
            parts.append(f"messageAge {format_duration(self.message_age)}")
        if self.message_count is not None:
            parts.append(f"messageCount {self.message_count}")
        if self.consumption_rate is not None:
            parts.append(f"consumptionRate {self.consumption_rate:g}/s")
        parts.append(f"policy {self.policy.describe()}")
        return ", ".join(parts)


def parse_consumer(el: Any, ctx: ParseContext) -> SlowConsumerConfig:
    """``<consumer>`` -> :class:`SlowConsumerConfig`; at least one threshold is required."""
    depth = ctx.size(el, "depth")
    age = ctx.duration(el, "messageAge")
    count = ctx.integer(el, "messageCount", minimum=0)
    rate = ctx.number(el, "consumptionRate", minimum=0.0, exclusive_min=True)
    if depth is None and age is None and count is None and rate is None:
        raise ctx.error(
            el,
            "sets no threshold: give at least one of depth, messageAge, messageCount, "
            "consumptionRate",
        )
    policy_el = el.find("policy")
    if policy_el is None:  # the schema requires it; a parser called on its own still says so
        raise ctx.error(el, "missing required child element <policy>")
    return SlowConsumerConfig(
        depth=depth,
        message_age=age,
        message_count=count,
        consumption_rate=rate,
        policy=parse_policy(policy_el, ctx),
    )


def parse_policy(el: Any, ctx: ParseContext) -> PolicyRef:
    """``<policy name>``: a built-in policy (its name canonical, its options checked) or one that
    a plugin registered (options passed through as strings)."""
    name = el.get("name")
    canonical = next((p for p in POLICIES if p.lower() == name.lower()), None)
    if canonical is None:
        ref = ctx.policy(el)
        if not ctx.knows_policy(name):
            registered = ctx.registered_policies()
            close = difflib.get_close_matches(name, (*POLICIES, *registered), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            extra = [p for p in registered if p not in POLICIES]
            others = f" (registered by plugins: {', '.join(extra)})" if extra else ""
            raise ctx.error(
                el,
                f"attribute name: policy {name!r} is not built in ({', '.join(POLICIES)}) "
                f"and no plugin registered it{others}{hint}",
            )
        return ref

    known = OPTIONS_BY_POLICY[canonical]

    def check_option(opt: Any, option: str, value: str) -> str:
        if option not in known:
            raise ctx.error(
                opt,
                f"attribute name: {option!r} is not an option of policy {canonical} "
                f"(known: {', '.join(sorted(known))})",
            )
        v = value.strip().lower()
        if option == "max-step":
            if v not in GRADUATED_STEPS:
                raise ctx.error(
                    opt,
                    f"attribute value: option max-step takes one of "
                    f"{', '.join(GRADUATED_STEPS)}, not {value!r}",
                )
            return v
        if option == "close-wait":
            if not v.isdigit() or int(v) < 1:
                raise ctx.error(
                    opt,
                    f"attribute value: option close-wait takes a whole number of checks, 1 or "
                    f"more, not {value!r}",
                )
            return str(int(v))
        if option == "prefetch-divisor":
            if not v.isdigit() or int(v) < 2:
                raise ctx.error(
                    opt,
                    f"attribute value: option prefetch-divisor takes a whole number of 2 or "
                    f"more, not {value!r}",
                )
            return str(int(v))
        if v not in XML_TRUE | XML_FALSE:
            raise ctx.error(
                opt,
                f"attribute value: option {option} takes true or false, not {value!r}",
            )
        return "true" if v in XML_TRUE else "false"

    return ctx.policy(el, check_option, name=canonical)


def add_config_elements(registry: ConfigElementRegistry) -> None:
    """Register ``<consumer>`` (what the plugin's ``broker_add_config_elements`` does).

    Under ``<virtualhost>`` or ``<topic>`` it reaches topic subscriptions only (the Qpid design):
    never a queue bound only to a direct, fanout or the default exchange, nor a dead-letter or
    retry target. Under ``<queue name>`` it reaches that queue.
    """
    registry.register(SECTION, parse_consumer, reach=REACH_TOPIC_SUBSCRIPTIONS)

"""The dead-letter plugin's configuration: ``<deadLetter>`` with its ``<retry>`` and ``<backoff>``.

Registered by :meth:`plugbroker.plugins.dead_letter.DeadLetterPlugin.broker_add_config_elements` exactly as a
third-party plugin registers its elements; the core's loader only calls
:func:`parse_dead_letter`. The schema (``config/plugbroker.xsd``) keeps the section's shape;
ranges, which children fit which backoff type, the queue template's placeholders and the names of
the dead-letter and retry queues are checked here. The retry levels and the delay range are the
retry contract's (:mod:`plugbroker.retry`), shared with the kombu helper.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from math import log
from types import MappingProxyType
from typing import Any

from plugbroker.config import ConfigElementRegistry, ParseContext
from plugbroker.config.model import frozen_map
from plugbroker.config.units import format_duration
from plugbroker.retry import DEFAULT_LEVELS, MAX_DELAY, MIN_DELAY

__all__ = [
    "BACKOFF_FIELDS",
    "BACKOFF_TYPES",
    "DLQ_TEMPLATE_FIELDS",
    "SECTION",
    "BackoffConfig",
    "DeadLetterConfig",
    "RetryConfig",
    "add_config_elements",
    "parse_backoff",
    "parse_dead_letter",
    "parse_retry",
    "target_role",
]

#: the element this plugin reads; its hooks find it as the queue's ``policy["deadLetter"]``
SECTION = "deadLetter"
#: the nack backoffs this plugin computes itself (PIP-106); other plugins may register more
BACKOFF_TYPES: tuple[str, ...] = ("fixed", "exponential", "levels")
#: the children each built-in backoff type takes
BACKOFF_FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "fixed": frozenset({"delay"}),
        "exponential": frozenset({"min", "max", "multiplier"}),
        "levels": frozenset({"levels"}),
    }
)
#: placeholders a <queueTemplate> may use
DLQ_TEMPLATE_FIELDS = ("queue", "exchange", "vhost")


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """``<retry>``: the retry queue used by ``reconsume_later`` and its delay levels."""

    #: explicit retry queue name; ``None`` means ``{queue}-RETRY``
    queue: str | None = None
    #: seconds; level n (1-based) is ``levels[n-1]``
    levels: tuple[float, ...] = DEFAULT_LEVELS

    def queue_name(self, queue: str) -> str:
        """The retry queue for ``queue`` (TDMQ names it ``<topic>-RETRY``)."""
        return self.queue or f"{queue}-RETRY"

    def level_delay(self, level: int) -> float:
        """Delay of 1-based ``level``; past the last level the last delay repeats (TDMQ)."""
        if level < 1:
            raise ValueError(f"delay levels start at 1, not {level}")
        return self.levels[min(level, len(self.levels)) - 1]

    def describe(self, queue: str | None = None) -> str:
        name = self.queue or ("{queue}-RETRY" if queue is None else self.queue_name(queue))
        return f"retry queue {name} levels {' '.join(format_duration(x) for x in self.levels)}"


@dataclass(frozen=True, slots=True)
class BackoffConfig:
    """``<backoff type=...>``: delay before a nacked (requeue=true) message comes back (PIP-106).

    Built-in types have every field they use filled in (defaults applied at load); a custom type
    (registered by a plugin) gets its ``<param>`` children as string ``params``.
    """

    type: str
    #: seconds (exponential)
    min: float | None = None
    #: seconds (exponential)
    max: float | None = None
    multiplier: float | None = None
    #: seconds (fixed)
    delay: float | None = None
    #: seconds (levels)
    levels: tuple[float, ...] | None = None
    params: Mapping[str, str] = field(default_factory=frozen_map)

    @property
    def builtin(self) -> bool:
        return self.type in BACKOFF_TYPES

    def next_delay(self, redelivery_count: int) -> float:
        """Seconds before redelivery, for a message already redelivered ``redelivery_count`` times.

        The first nack of a message passes 0 (Pulsar's ``next(redeliveryCount)``): fixed gives
        ``delay``; exponential ``min x multiplier**count`` capped at ``max``; levels the
        count-th level, the last one repeating.

        :raises ValueError: for a custom type; the plugin that registered it computes delays.
        """
        n = max(0, redelivery_count)
        if self.type == "fixed":
            assert self.delay is not None
            return self.delay
        if self.type == "exponential":
            assert self.min is not None and self.max is not None and self.multiplier is not None
            if self.multiplier <= 1.0 or self.min <= 0.0:
                return min(self.min, self.max)
            # compare in log space so a huge count cannot overflow multiplier ** count
            if n * log(self.multiplier) >= log(self.max / self.min):
                return self.max
            return min(self.min * self.multiplier**n, self.max)
        if self.type == "levels":
            assert self.levels
            return self.levels[min(n, len(self.levels) - 1)]
        raise ValueError(f"backoff type {self.type!r} is computed by the plugin that registered it")

    def describe(self) -> str:
        if self.type == "fixed":
            return f"backoff fixed {format_duration(self.delay or 0)}"
        if self.type == "exponential":
            return (
                f"backoff exponential min {format_duration(self.min or 0)} max "
                f"{format_duration(self.max or 0)} multiplier {self.multiplier:g}"
            )
        if self.type == "levels":
            return "backoff levels " + " ".join(format_duration(x) for x in self.levels or ())
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"backoff {self.type}({params})"


@dataclass(frozen=True, slots=True)
class DeadLetterConfig:
    """``<deadLetter>``: redelivery limit, dead-letter queue, retry queue, nack backoff."""

    max_redeliveries: int = 16
    #: explicit DLQ name; when ``None`` the template names it
    queue: str | None = None
    queue_template: str = "{queue}-DLQ"
    retry: RetryConfig | None = None
    backoff: BackoffConfig | None = None

    def dlq_name(self, queue: str, exchange: str = "", vhost: str = "/") -> str:
        """The dead-letter queue for ``queue`` (PIP-22: ``<name>-DLQ`` unless given).

        ``{exchange}`` in the template is the exchange the message was first published to
        (``amq.default`` for the default exchange), like Pulsar's ``<topic>-<subscription>-DLQ``.
        """
        return self.queue or self.queue_template.format(
            queue=queue, exchange=exchange or "amq.default", vhost=vhost
        )

    def describe(self, queue: str | None = None) -> str:
        dlq = self.queue or (self.queue_template if queue is None else self.dlq_name(queue))
        parts = [f"maxRedeliveries {self.max_redeliveries}", f"DLQ {dlq}"]
        if self.retry is not None:
            parts.append(self.retry.describe(queue))
        if self.backoff is not None:
            parts.append(self.backoff.describe())
        return ", ".join(parts)

    def describe_for(self, queue: str) -> str:
        """:meth:`describe` with the dead-letter and retry queues named for ``queue``."""
        return self.describe(queue)


# ---------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------


def parse_dead_letter(el: Any, ctx: ParseContext) -> DeadLetterConfig:
    """``<deadLetter>`` -> :class:`DeadLetterConfig`; in a ``<queue>``, the dead-letter and retry
    queues it names must differ from that queue (and from each other)."""
    queue = ctx.text(el, "queue")
    template_el = el.find("queueTemplate")
    template = "{queue}-DLQ"
    if template_el is not None:
        if queue is not None:
            raise ctx.error(
                template_el,
                "give either <queue> (one dead-letter queue) or <queueTemplate> (one per "
                "queue), not both",
            )
        template = (template_el.text or "").strip()
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ctx.error(
                template_el,
                f"{template!r} is not a valid template: {exc}",
            ) from None
        bad = [f for f in fields if f not in DLQ_TEMPLATE_FIELDS]
        if bad:
            raise ctx.error(
                template_el,
                f"{template!r} uses {{{bad[0]}}}; the placeholders are "
                + ", ".join(f"{{{f}}}" for f in DLQ_TEMPLATE_FIELDS),
            )
    retry_el = el.find("retry")
    backoff_el = el.find("backoff")
    config = DeadLetterConfig(
        max_redeliveries=ctx.integer(el, "maxRedeliveries", 16, minimum=0),
        queue=queue,
        queue_template=template,
        retry=parse_retry(retry_el, ctx) if retry_el is not None else None,
        backoff=parse_backoff(backoff_el, ctx) if backoff_el is not None else None,
    )
    name = ctx.scope(el).queue
    if name is not None:
        dlq = config.dlq_name(name)
        if dlq == name:
            raise ctx.error(el, f"the dead-letter queue of {name!r} would be the queue itself")
        if config.retry is not None:
            rq = config.retry.queue_name(name)
            if rq in (name, dlq):
                raise ctx.error(
                    el,
                    f"the retry queue of {name!r} ({rq!r}) must differ from the queue and its "
                    "dead-letter queue",
                )
    return config


def _check_levels(
    ctx: ParseContext, el: Any, levels: tuple[float, ...], lo: float, lo_open: bool, what: str
) -> None:
    for i, delay in enumerate(levels, start=1):
        if (delay <= lo if lo_open else delay < lo) or delay > MAX_DELAY:
            low = format_duration(lo)
            bound = f"greater than {low}" if lo_open else f"at least {low}"
            raise ctx.error(
                el,
                f"level {i} is {format_duration(delay)}; {what} must be {bound} and at most "
                f"{format_duration(MAX_DELAY)} ({MAX_DELAY:g}s)",
            )


def parse_retry(el: Any, ctx: ParseContext) -> RetryConfig:
    """``<retry>`` -> :class:`RetryConfig`; each level from 1 s to 10 days."""
    levels = ctx.durations(el, "levels", DEFAULT_LEVELS)
    levels_el = el.find("levels")
    if levels_el is not None:
        _check_levels(ctx, levels_el, levels, MIN_DELAY, False, "retry delays")
    return RetryConfig(queue=ctx.text(el, "queue"), levels=levels)


def parse_backoff(el: Any, ctx: ParseContext) -> BackoffConfig:
    """``<backoff type>`` -> :class:`BackoffConfig`: a built-in type with its defaults applied,
    or a type another plugin registered (its ``<param>`` s passed through as strings)."""
    btype = el.get("type")
    seen: dict[str, Any] = {}
    params: dict[str, str] = {}
    for child in ctx.children(el):
        tag = child.tag
        if tag == "param":
            pname = child.get("name")
            if pname in params:
                raise ctx.error(child, f"param {pname!r} is given twice")
            params[pname] = child.get("value")
            continue
        ctx.once(seen, child, "<backoff>")
    if btype in BACKOFF_TYPES:
        allowed = BACKOFF_FIELDS[btype]
        for tag, child in seen.items():
            if tag not in allowed:
                raise ctx.error(
                    child,
                    f"does not apply to backoff type {btype} (it takes: "
                    f"{', '.join(sorted(allowed))})",
                )
        if params:
            first = next(p for p in ctx.children(el) if p.tag == "param")
            raise ctx.error(
                first,
                f"<param> is for plugin backoff types; backoff type {btype} takes: "
                f"{', '.join(sorted(allowed))}",
            )
    elif not ctx.knows_backoff(btype):
        raise ctx.error(
            el,
            f"attribute type: backoff type {btype!r} is not built in "
            f"({', '.join(BACKOFF_TYPES)}) "
            "and no plugin registered it",
        )
    limit = MAX_DELAY
    if btype == "fixed":
        return BackoffConfig("fixed", delay=ctx.duration(el, "delay", 60.0, maximum=limit))
    if btype == "exponential":
        lo = ctx.duration(el, "min", 1.0, maximum=limit)
        hi = ctx.duration(el, "max", 60.0, maximum=limit)
        if lo > hi:
            target = seen.get("max") if "max" in seen else seen.get("min", el)
            raise ctx.error(
                target,
                f"max ({format_duration(hi)}) is smaller than min ({format_duration(lo)})",
            )
        return BackoffConfig(
            "exponential",
            min=lo,
            max=hi,
            multiplier=ctx.number(el, "multiplier", 2.0, minimum=1.0),
        )
    if btype == "levels":
        levels = ctx.durations(el, "levels", DEFAULT_LEVELS)
        if "levels" in seen:
            _check_levels(ctx, seen["levels"], levels, 0.0, True, "backoff delays")
        return BackoffConfig("levels", levels=levels)
    # a plugin's backoff: pass everything through, still checked for shape and range
    levels_opt = ctx.durations(el, "levels")
    if levels_opt is not None:
        _check_levels(ctx, seen["levels"], levels_opt, 0.0, True, "backoff delays")
    multiplier = ctx.number(el, "multiplier", minimum=0.0, exclusive_min=True)
    return BackoffConfig(
        btype,
        min=ctx.duration(el, "min", maximum=limit),
        max=ctx.duration(el, "max", maximum=limit),
        multiplier=multiplier,
        delay=ctx.duration(el, "delay", maximum=limit),
        levels=levels_opt,
        params=frozen_map(params),
    )


def add_config_elements(registry: ConfigElementRegistry) -> None:
    """Register ``<deadLetter>`` (what the plugin's ``broker_add_config_elements`` does)."""
    registry.register(SECTION, parse_dead_letter)


# ---------------------------------------------------------------------------------------------
# Which queues the configuration names as dead-letter or retry targets
# ---------------------------------------------------------------------------------------------


def _template_regex(template: str, vhost: str) -> re.Pattern[str]:
    """A regular expression matching the names ``template`` makes, capturing ``{queue}``."""
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(re.escape(literal))
        if name == "queue":
            out.append("(?P<queue>.+)" if "(?P<queue>" not in "".join(out) else "(?P=queue)")
        elif name == "exchange":
            out.append(".+")
        elif name == "vhost":
            out.append(re.escape(vhost))
    return re.compile("".join(out), re.DOTALL)


def _sections(vc: Any) -> Iterator[tuple[str | None, DeadLetterConfig]]:
    """Every ``<deadLetter>`` of a vhost's configuration, with the queue it is for (None: the
    vhost's default, or a ``<topic>``'s, which may apply to any queue)."""
    for qc in vc.queues.values():
        cfg = qc.sections.get(SECTION)
        if isinstance(cfg, DeadLetterConfig):
            yield qc.name, cfg
    for t in vc.topics:
        cfg = t.sections.get(SECTION)
        if isinstance(cfg, DeadLetterConfig):
            yield None, cfg
    cfg = vc.defaults.get(SECTION)
    if isinstance(cfg, DeadLetterConfig):
        yield None, cfg


def target_role(vc: Any, queue: str) -> str | None:
    """Why the configuration of one vhost (``vc``, a ``VhostConfig``) names ``queue`` as a
    dead-letter or retry target, or None if it does not: the ``<queue>`` of a
    ``<deadLetter>``, a name its ``<queueTemplate>`` (``{queue}-DLQ`` by default) makes, the
    ``<queue>`` of a ``<retry>`` or its ``{queue}-RETRY``. A section for one queue names only
    that queue's targets; a vhost's or a topic's default may apply to any queue, so any name
    its template makes counts. O(sections)."""
    for origin, cfg in _sections(vc):
        if cfg.queue is not None:
            if queue == cfg.queue and queue != origin:
                return f"the <deadLetter><queue> of {origin or 'the vhost default'}"
        else:
            m = _template_regex(cfg.queue_template, vc.name).fullmatch(queue)
            of = m.groupdict().get("queue") if m is not None else None
            if m is not None and (of is None or (of != queue and origin in (None, of))):
                return f"the dead-letter queue of '{of or origin or '*'}' ({cfg.queue_template})"
        r = cfg.retry
        if r is None:
            continue
        if r.queue is not None:
            if queue == r.queue and queue != origin:
                return f"the <retry><queue> of {origin or 'the vhost default'}"
        elif queue.endswith("-RETRY") and origin in (None, queue[: -len("-RETRY")]):
            return f"the retry queue of '{queue[: -len('-RETRY')]}'"
    return None

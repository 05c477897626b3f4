"""The XML configuration: loading, validation, the config model and policy resolution.

One file configures the broker (SPEC section 4). Loading happens in three passes, and each
pass reports a problem the same way, as a :class:`ConfigError` that names the file, the line
and the element (``config/bad.xml:12: <messageAge>: '10 minutes' is not a duration ...``):

1. XML syntax (lxml, with entity expansion and network access off);
2. the XML Schema ``config/plugbroker.xsd`` (shapes and types: a misspelled element inside a
   built-in section, a duration written ``10 minutes``);
3. this module's walk, which checks what a schema cannot say well: ranges, cross-field rules,
   placement and "at most once" in the open containers, and *plugin elements*.

Plugin elements: ``<broker>``, ``<virtualhost>``, ``<queue>`` and ``<topic>`` accept elements
the schema does not know, because third-party plugins configure themselves in the same file.
Such an element is accepted only when a plugin registered its name in a
:class:`ConfigElementRegistry` (the plugin host fills one from a hook); the registered parser
turns it into whatever object the plugin wants, and that object then resolves per queue exactly
like the built-in ``<consumer>``/``<isolation>``/``<deadLetter>`` sections do. Anything else is
an error, so a typo never silently disables a policy.

Policy resolution (:meth:`VhostConfig.resolve`) is per section: for each section element the
``<queue name>`` of that exact name wins, then the first ``<topic>`` in document order that
matches one of the queue's topic-exchange bindings, then the ``<virtualhost>`` defaults.

Everything here is immutable once loaded, so a reload builds a new :class:`BrokerConfig` and
swaps it in only when the whole file is valid; a failed reload leaves the running one alone.
"""

from __future__ import annotations

import difflib
import re
import string
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from math import floor, isfinite, log
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, overload

from lxml import etree

from broker.subscription import SUBSCRIPTION_TYPES
from broker.units import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    format_duration,
    format_size,
    parse_duration,
    parse_duration_list,
    parse_size,
)

__all__ = [
    "BUILTIN_BACKOFFS",
    "BUILTIN_POLICIES",
    "BUILTIN_SECTIONS",
    "DEFAULT_RETRY_LEVELS",
    "DEFAULT_TOPIC_EXCHANGE",
    "RETRY_DELAY_MAX",
    "RETRY_DELAY_MIN",
    "SUBSCRIPTION_TYPES",
    "BackoffConfig",
    "BrokerConfig",
    "ConfigElementRegistry",
    "ConfigError",
    "DeadLetterConfig",
    "ElementParser",
    "ExchangeDecl",
    "IsolationConfig",
    "Limits",
    "ParseContext",
    "PolicyRef",
    "QueueConfig",
    "ResolvedPolicy",
    "RetryConfig",
    "Sections",
    "SlowConsumerConfig",
    "TopicConfig",
    "TopicMatcher",
    "User",
    "VhostConfig",
    "default_config_path",
    "load_config",
    "load_default",
    "parse_config",
    "schema_path",
]

# ---------------------------------------------------------------------------------------------
# Constants that are part of the contract
# ---------------------------------------------------------------------------------------------

#: the section elements this module parses itself; each may sit under virtualhost/queue/topic
BUILTIN_SECTIONS: tuple[str, ...] = ("consumer", "isolation", "deadLetter")
#: built-in slow-consumer policies (Qpid design); plugins may register more
BUILTIN_POLICIES: tuple[str, ...] = ("Delete", "Log")
#: built-in nack backoffs (PIP-106); plugins may register more
BUILTIN_BACKOFFS: tuple[str, ...] = ("fixed", "exponential", "levels")
#: TDMQ's MESSAGE_DELAYLEVEL
DEFAULT_RETRY_LEVELS: tuple[float, ...] = parse_duration_list(
    "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
)
DEFAULT_TOPIC_EXCHANGE = "amq.topic"
#: retry (reconsumeLater) delays must lie in this range, seconds (SPEC section 7)
RETRY_DELAY_MIN = 1.0
RETRY_DELAY_MAX = 864000.0

_BROKER_SINGLETONS = (
    "listen",
    "store",
    "users",
    "housekeeping",
    "plugins",
    "journal",
    "limits",
    "admin",
)
_BROKER_CHILDREN = (*_BROKER_SINGLETONS, "virtualhost")
_VHOST_CHILDREN = ("exchange", "queue", "topic")
_RESERVED_NAMES = frozenset((*_BROKER_CHILDREN, *_VHOST_CHILDREN, *BUILTIN_SECTIONS, "broker"))
#: the standard exchanges every vhost has, with their types (AMQP 0-9-1 section 3.1.3)
_AMQ_EXCHANGE_TYPES = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}
_POLICY_OPTIONS = frozenset({"delete-persistent"})
#: the children each built-in backoff type takes
_BACKOFF_FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "fixed": frozenset({"delay"}),
        "exponential": frozenset({"min", "max", "multiplier"}),
        "levels": frozenset({"levels"}),
    }
)  # options the built-in Delete/Log policies understand
_TRUE = {"true", "1"}
_FALSE = {"false", "0"}

# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """A configuration problem, located: ``file:line: <element>: message``.

    ``more`` holds further problems found in the same pass (schema validation reports them all)
    so that ``check-config`` can list everything at once; ``str()`` shows the first only.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        element: str | None = None,
        more: tuple[ConfigError, ...] = (),
    ) -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.element = element
        self.message = message
        self.more = more

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line:
            where = f"{where}:{self.line}"
        if self.element:
            return f"{where}: <{self.element}>: {self.message}"
        return f"{where}: {self.message}"

    def all(self) -> tuple[ConfigError, ...]:
        """This error followed by the others found in the same pass."""
        return (self, *self.more)


# ---------------------------------------------------------------------------------------------
# Plugin element registry and the context handed to element parsers
# ---------------------------------------------------------------------------------------------

ElementParser = Callable[[Any, "ParseContext"], object]
"""``(lxml_element, ctx) -> parsed object``; raise ``ctx.error(el, msg)`` on bad input."""


class RegistryLike(Protocol):
    """What :func:`load_config` needs from a registry; :class:`ConfigElementRegistry` has it all.

    Only ``config_element`` is required; the others are looked up with ``getattr`` and count as
    "nothing registered" when missing.
    """

    def config_element(self, name: str) -> ElementParser | None: ...


class ConfigElementRegistry:
    """Names plugins added to the configuration language, and the parsers for their elements.

    The plugin host fills one from a hook before loading the config. Two levels exist:

    * ``"section"``: an element under ``<virtualhost>``, ``<queue>`` or ``<topic>``; its parsed
      value resolves per queue like ``<consumer>`` does and shows up in :class:`ResolvedPolicy`.
    * ``"broker"``: an element directly under ``<broker>`` (broker-wide settings such as an admin
      endpoint); its parsed value lands in :attr:`BrokerConfig.extensions`.

    Policy names (``<policy name=...>`` in ``<consumer>``) and backoff types
    (``<backoff type=...>``) that plugins implement are registered here too, so a typo in either
    is a load error rather than a policy that never fires.
    """

    def __init__(self) -> None:
        self._sections: dict[str, ElementParser] = {}
        self._broker: dict[str, ElementParser] = {}
        self._policies: set[str] = set()
        self._backoffs: set[str] = set()

    def register(self, name: str, parser: ElementParser, *, level: str = "section") -> None:
        """Register ``parser`` for element ``name``.

        :raises ValueError: for a built-in name, a name already registered, or a bad level.
        """
        if level not in ("section", "broker"):
            raise ValueError(f"level must be 'section' or 'broker', not {level!r}")
        if not name or name in _RESERVED_NAMES:
            raise ValueError(f"<{name}> is a built-in element and cannot be registered by a plugin")
        if name in self._sections or name in self._broker:
            raise ValueError(f"<{name}> is already registered by another plugin")
        if not callable(parser):
            raise TypeError(f"the parser for <{name}> must be callable")
        (self._sections if level == "section" else self._broker)[name] = parser

    def register_policy(self, name: str) -> None:
        """Declare that a plugin implements the slow-consumer policy ``name``."""
        if name.lower() in {p.lower() for p in BUILTIN_POLICIES}:
            raise ValueError(f"policy {name!r} is built in")
        self._policies.add(name)

    def register_backoff(self, name: str) -> None:
        """Declare that a plugin implements the nack backoff type ``name``."""
        if name in BUILTIN_BACKOFFS:
            raise ValueError(f"backoff type {name!r} is built in")
        self._backoffs.add(name)

    def get(self, name: str) -> ElementParser | None:
        """The parser registered for section element ``name``, or ``None``."""
        return self._sections.get(name)

    config_element = get

    def broker_element(self, name: str) -> ElementParser | None:
        """The parser registered for broker-level element ``name``, or ``None``."""
        return self._broker.get(name)

    def has_policy(self, name: str) -> bool:
        return name in self._policies

    def has_backoff(self, name: str) -> bool:
        return name in self._backoffs

    @property
    def section_names(self) -> frozenset[str]:
        return frozenset(self._sections)

    @property
    def broker_names(self) -> frozenset[str]:
        return frozenset(self._broker)


def _q(value: str) -> str:
    """An attribute value quoted as it would be written in the file."""
    return f'"{value}"' if '"' not in value else f"'{value}'"


def _local(el: Any) -> str:
    """The element name to show a user (namespace dropped)."""
    tag = el.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else str(tag)


def _elements(el: Any) -> Iterator[Any]:
    """Child elements, skipping comments and processing instructions."""
    return (c for c in el if isinstance(c.tag, str))


class ParseContext:
    """Helpers for element parsers (built-in and plugin) that turn text into values.

    Every helper reads either the text of child element ``child`` of ``el`` or, with
    ``child=None``, the text of ``el`` itself; a missing child yields ``default``. A bad value
    raises a :class:`ConfigError` located at the element that holds it.
    """

    def __init__(self, source: str, registry: RegistryLike | None = None) -> None:
        self.source = source
        self.registry = registry

    # -- errors -------------------------------------------------------------------------------

    def error(self, el: Any, message: str) -> ConfigError:
        """A :class:`ConfigError` located at ``el`` (raise it)."""
        return ConfigError(message, file=self.source, line=el.sourceline, element=_local(el))

    # -- raw access ---------------------------------------------------------------------------

    def _target(self, el: Any, child: str | None) -> Any | None:
        return el if child is None else el.find(child)

    def _present(self, el: Any, child: str | None) -> bool:
        return child is None or el.find(child) is not None

    @overload
    def attr(self, el: Any, name: str, default: str) -> str: ...

    @overload
    def attr(self, el: Any, name: str, default: None = None) -> str | None: ...

    def attr(self, el: Any, name: str, default: str | None = None) -> str | None:
        value = el.get(name)
        return default if value is None else value

    @overload
    def text(self, el: Any, child: str | None, default: str) -> str: ...

    @overload
    def text(self, el: Any, child: str | None = None, default: None = None) -> str | None: ...

    def text(self, el: Any, child: str | None = None, default: str | None = None) -> str | None:
        target = self._target(el, child)
        if target is None:
            return default
        return (target.text or "").strip()

    def _convert(self, el: Any, child: str | None, default: Any, conv: Callable[[str], Any]) -> Any:
        target = self._target(el, child)
        if target is None:
            return default
        try:
            return conv((target.text or "").strip())
        except ValueError as exc:
            raise self.error(target, str(exc)) from None

    def _check_range(
        self,
        el: Any,
        child: str | None,
        value: float | None,
        minimum: float | None,
        maximum: float | None,
        render: Callable[[Any], str],
        *,
        exclusive_min: bool = False,
    ) -> None:
        if value is None:
            return
        target = self._target(el, child)
        if minimum is not None and (value <= minimum if exclusive_min else value < minimum):
            op = "greater than" if exclusive_min else "at least"
            raise self.error(
                target, f"{render(value)} is too small: it must be {op} {render(minimum)}"
            )
        if maximum is not None and value > maximum:
            raise self.error(
                target, f"{render(value)} is too large: it must be at most {render(maximum)}"
            )

    # -- typed helpers ------------------------------------------------------------------------

    @overload
    def duration(
        self,
        el: Any,
        child: str | None,
        default: float,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        allow_zero: bool = ...,
    ) -> float: ...

    @overload
    def duration(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        allow_zero: bool = ...,
    ) -> float | None: ...

    def duration(
        self,
        el: Any,
        child: str | None,
        default: float | None = None,
        *,
        minimum: float | None = 0.0,
        maximum: float | None = None,
        allow_zero: bool = False,
    ) -> float | None:
        """Seconds from ``300000`` (ms) or ``5m``; by default a duration must be > 0."""
        value = self._convert(el, child, default, parse_duration)
        if self._present(el, child):  # defaults are the caller's, not the user's: not checked
            self._check_range(
                el,
                child,
                value,
                minimum,
                maximum,
                format_duration,
                exclusive_min=(not allow_zero and minimum == 0.0),
            )
        return value

    @overload
    def size(
        self,
        el: Any,
        child: str | None,
        default: int,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int: ...

    @overload
    def size(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int | None: ...

    def size(
        self,
        el: Any,
        child: str | None,
        default: int | None = None,
        *,
        minimum: int | None = 0,
        maximum: int | None = None,
    ) -> int | None:
        """Bytes from ``4235264`` or ``4MB``."""
        value = self._convert(el, child, default, parse_size)
        if self._present(el, child):
            self._check_range(el, child, value, minimum, maximum, format_size)
        return value

    @overload
    def integer(
        self,
        el: Any,
        child: str | None,
        default: int,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int: ...

    @overload
    def integer(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: int | None = ...,
        maximum: int | None = ...,
    ) -> int | None: ...

    def integer(
        self,
        el: Any,
        child: str | None,
        default: int | None = None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        def conv(s: str) -> int:
            try:
                return int(s)
            except ValueError:
                raise ValueError(f"{s!r} is not a whole number") from None

        value = self._convert(el, child, default, conv)
        if self._present(el, child):
            self._check_range(el, child, value, minimum, maximum, str)
        return value

    @overload
    def number(
        self,
        el: Any,
        child: str | None,
        default: float,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        exclusive_min: bool = ...,
    ) -> float: ...

    @overload
    def number(
        self,
        el: Any,
        child: str | None,
        default: None = None,
        *,
        minimum: float | None = ...,
        maximum: float | None = ...,
        exclusive_min: bool = ...,
    ) -> float | None: ...

    def number(
        self,
        el: Any,
        child: str | None,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_min: bool = False,
    ) -> float | None:
        def conv(s: str) -> float:
            try:
                value = float(Decimal(s))
            except (ArithmeticError, ValueError):
                raise ValueError(f"{s!r} is not a number") from None
            if not isfinite(value):
                raise ValueError(f"{s!r} is not a finite number")
            return value

        value = self._convert(el, child, default, conv)
        if self._present(el, child):
            self._check_range(
                el, child, value, minimum, maximum, lambda v: f"{v:g}", exclusive_min=exclusive_min
            )
        return value

    def boolean(self, el: Any, child: str | None, default: bool | None = None) -> bool | None:
        def conv(s: str) -> bool:
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ValueError(f"{s!r} is not true or false")

        return self._convert(el, child, default, conv)

    @overload
    def durations(
        self, el: Any, child: str | None, default: tuple[float, ...]
    ) -> tuple[float, ...]: ...

    @overload
    def durations(
        self, el: Any, child: str | None, default: None = None
    ) -> tuple[float, ...] | None: ...

    def durations(
        self, el: Any, child: str | None, default: tuple[float, ...] | None = None
    ) -> tuple[float, ...] | None:
        """A whitespace-separated level list (``"1s 5s 10s"``) as seconds."""
        return self._convert(el, child, default, parse_duration_list)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def _frozen_map(d: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True, slots=True)
class User:
    """A user allowed to connect (PLAIN/AMQPLAIN) to the listed vhosts."""

    name: str
    password: str
    vhosts: tuple[str, ...] = ("/",)

    def can_access(self, vhost: str) -> bool:
        return vhost in self.vhosts


@dataclass(frozen=True, slots=True)
class Limits:
    """Connection limits offered in connection.tune and enforced by the front end."""

    #: seconds; 0 disables heartbeats. AMQP negotiates whole seconds.
    heartbeat: float = 60.0
    frame_max: int = 131072
    #: 0 means "no specific limit" in AMQP
    channel_max: int = 2047
    #: seconds a client gets to finish connection.start..open before it is dropped
    handshake_timeout: float = 10.0
    max_message_size: int = 128 * 1024 * 1024

    def describe(self) -> str:
        return (
            f"heartbeat {format_duration(self.heartbeat)}, frameMax {self.frame_max}, "
            f"channelMax {self.channel_max}, handshakeTimeout "
            f"{format_duration(self.handshake_timeout)}, maxMessageSize "
            f"{format_size(self.max_message_size)}"
        )


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """``<policy name="Delete"><options><option name=".." value=".."/></options></policy>``."""

    name: str
    options: Mapping[str, str] = field(default_factory=_frozen_map)

    def option(self, name: str, default: str | None = None) -> str | None:
        return self.options.get(name, default)

    def flag(self, name: str, default: bool = False) -> bool:
        """A boolean option (``true``/``false``/``1``/``0``)."""
        value = self.options.get(name)
        if value is None:
            return default
        return value.strip().lower() in _TRUE

    @property
    def delete_persistent(self) -> bool:
        """Whether durable queues may be touched (Qpid's ``delete-persistent``; default no)."""
        return self.flag("delete-persistent")

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name}({opts})" if opts else self.name


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


@dataclass(frozen=True, slots=True)
class IsolationConfig:
    """``<isolation>``: ack-timeout isolation of consumers of a shared queue (TDMQ)."""

    #: seconds without any ack/nack/reject, while holding unacked messages, before isolation
    ack_timeout: float
    max_isolated_ratio: float = 0.6
    #: seconds between checks
    check_period: float = 30.0
    max_unacked_per_consumer: int = 50000

    def max_isolated(self, consumers: int) -> int:
        """``floor(maxIsolatedRatio x consumers)``, computed in decimal so 0.29 x 100 is 29."""
        return floor(Decimal(repr(self.max_isolated_ratio)) * consumers)

    def describe(self) -> str:
        return (
            f"ackTimeout {format_duration(self.ack_timeout)}, maxIsolatedRatio "
            f"{self.max_isolated_ratio:g}, checkPeriod {format_duration(self.check_period)}, "
            f"maxUnackedPerConsumer {self.max_unacked_per_consumer}"
        )


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """``<retry>``: the retry queue used by ``reconsume_later`` and its delay levels."""

    #: explicit retry queue name; ``None`` means ``{queue}-RETRY``
    queue: str | None = None
    #: seconds; level n (1-based) is ``levels[n-1]``
    levels: tuple[float, ...] = DEFAULT_RETRY_LEVELS

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
    params: Mapping[str, str] = field(default_factory=_frozen_map)

    @property
    def builtin(self) -> bool:
        return self.type in BUILTIN_BACKOFFS

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


#: placeholders a <queueTemplate> may use
DLQ_TEMPLATE_FIELDS = ("queue", "exchange", "vhost")


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


def _describe_section(value: object, queue: str | None = None) -> str:
    if isinstance(value, DeadLetterConfig):
        return value.describe(queue)
    describe = getattr(value, "describe", None)
    if callable(describe):
        try:
            return str(describe())
        except Exception as exc:
            return f"{value!r} (its describe() failed: {exc!r})"
    return repr(value)


class Sections(Mapping[str, object]):
    """Section element name -> parsed section, read-only.

    Built-in sections have typed accessors; plugin sections are reached by element name
    (``sections["throttle"]``).
    """

    __slots__ = ("_items",)
    _items: dict[str, object]

    def __init__(self, items: Mapping[str, object] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Sections is read-only")

    def __getitem__(self, key: str) -> object:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    # Mapping's own get/__contains__ go through __getitem__ and an exception; these are on the
    # housekeeping path once per queue per check, so answer from the dict directly.
    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        return self._items.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    __hash__ = None  # type: ignore[assignment]

    @property
    def consumer(self) -> SlowConsumerConfig | None:
        return self._items.get("consumer")  # type: ignore[return-value]

    @property
    def isolation(self) -> IsolationConfig | None:
        return self._items.get("isolation")  # type: ignore[return-value]

    @property
    def dead_letter(self) -> DeadLetterConfig | None:
        return self._items.get("deadLetter")  # type: ignore[return-value]


class ResolvedPolicy(Sections):
    """The sections that apply to one queue, with where each came from.

    ``source[name]`` is ``"queue work"``, ``"topic stocks.us.* on amq.topic"`` or
    ``"virtualhost /"``; ``subscription`` is the queue's ``<queue subscription=>`` or ``None``.
    """

    __slots__ = ("queue", "source", "subscription")
    queue: str
    source: Mapping[str, str]
    subscription: str | None

    def __init__(
        self,
        queue: str,
        items: Mapping[str, object],
        source: Mapping[str, str],
        subscription: str | None,
    ) -> None:
        super().__init__(items)
        object.__setattr__(self, "queue", queue)
        object.__setattr__(self, "source", MappingProxyType(dict(source)))
        object.__setattr__(self, "subscription", subscription)

    def __repr__(self) -> str:
        return (
            f"ResolvedPolicy(queue={self.queue!r}, sections={dict(self._items)!r}, "
            f"source={dict(self.source)!r}, subscription={self.subscription!r})"
        )

    def describe(self) -> str:
        """One line per section: ``name  settings  <- source``."""
        lines = [
            f"{name:<11} {_describe_section(value, self.queue)}  <- {self.source[name]}"
            for name, value in self._items.items()
        ]
        return "\n".join(lines) if lines else "(no policies)"


class TopicMatcher:
    """AMQP topic pattern matching on words: ``*`` is exactly one word, ``#`` zero or more.

    Compiled once per ``<topic>`` at load. The binding key being tested is matched literally
    (a binding key ``stocks.us.*`` is matched by the pattern ``stocks.#``). An empty key has
    zero words, so only ``#`` (or an empty pattern) matches it.
    """

    __slots__ = ("_wild", "_words", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._words: tuple[str, ...] = tuple(pattern.split(".")) if pattern else ()
        self._wild = any(w in ("*", "#") for w in self._words)

    def matches(self, key: str) -> bool:
        if not self._wild:
            return key == self.pattern
        words = tuple(key.split(".")) if key else ()
        pat = self._words
        # dynamic programming over (pattern position, key position); O(len(pat) x len(words))
        reachable = {0}
        for p in pat:
            nxt: set[int] = set()
            if p == "#":
                start = min(reachable) if reachable else None
                if start is not None:
                    nxt.update(range(start, len(words) + 1))
            else:
                for i in reachable:
                    if i < len(words) and (p == "*" or p == words[i]):
                        nxt.add(i + 1)
            reachable = nxt
            if not reachable:
                return False
        return len(words) in reachable

    def __repr__(self) -> str:
        return f"TopicMatcher({self.pattern!r})"


@dataclass(frozen=True, slots=True)
class ExchangeDecl:
    """``<exchange>``: an exchange the broker declares when the vhost starts."""

    name: str
    type: str
    durable: bool = False
    auto_delete: bool = False
    #: declare arguments, e.g. ``{"x-delayed-type": "topic"}`` for x-delayed-message
    arguments: Mapping[str, str] = field(default_factory=_frozen_map)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """``<queue name>``: policies for the queue of exactly this name.

    ``durable`` is ``None`` when the attribute is absent: the element then only carries policy
    and the broker does not declare the queue (a client will, with whatever durability it
    wants). With ``durable="true|false"`` the broker declares the queue at start (see
    :attr:`declare`).
    """

    name: str
    durable: bool | None = None
    subscription: str | None = None
    sections: Sections = field(default_factory=Sections)
    line: int | None = None

    @property
    def declare(self) -> bool:
        return self.durable is not None


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """``<topic key [exchange]>``: policies for queues bound to a topic exchange with that key."""

    key: str
    exchange: str = DEFAULT_TOPIC_EXCHANGE
    sections: Sections = field(default_factory=Sections)
    line: int | None = None
    matcher: TopicMatcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matcher", TopicMatcher(self.key))

    @property
    def label(self) -> str:
        return f"topic {self.key} on {self.exchange}"

    def matches(self, exchange: str, exchange_type: str, binding_key: str) -> bool:
        """True for a binding to this topic's exchange, of type topic, with a matching key."""
        return (
            exchange == self.exchange
            and exchange_type == "topic"
            and (binding_key == self.key or self.matcher.matches(binding_key))
        )

    def matches_any(self, bindings: Iterable[tuple[str, str, str]]) -> bool:
        return any(self.matches(e, t, k) for e, t, k in bindings)


@dataclass(frozen=True, slots=True)
class VhostConfig:
    """``<virtualhost name>``: declared exchanges, per-queue and per-topic policies, defaults."""

    name: str
    exchanges: tuple[ExchangeDecl, ...] = ()
    queues: Mapping[str, QueueConfig] = field(default_factory=_frozen_map)
    topics: tuple[TopicConfig, ...] = ()
    defaults: Sections = field(default_factory=Sections)

    def resolve(
        self, queue_name: str, bindings: Iterable[tuple[str, str, str]] = ()
    ) -> ResolvedPolicy:
        """The policy sections for ``queue_name`` with ``(exchange, exchange_type, key)`` bindings.

        Per section element: the ``<queue>`` of that exact name, else the first ``<topic>`` in
        document order that has the section and matches a binding whose exchange type is
        ``topic``, else the vhost default. The caller passes the *effective* type, so a binding
        to an x-delayed-message exchange with ``x-delayed-type: topic`` should be passed as
        ``"topic"``. Cost: O(topics x bindings), no message is touched.
        """
        blist = tuple(bindings)
        qc = self.queues.get(queue_name)
        matching = [t for t in self.topics if t.matches_any(blist)] if blist else []
        names: dict[str, None] = {}
        if qc is not None:
            names.update(dict.fromkeys(qc.sections))
        for t in matching:
            names.update(dict.fromkeys(t.sections))
        names.update(dict.fromkeys(self.defaults))
        items: dict[str, object] = {}
        source: dict[str, str] = {}
        for name in names:
            if qc is not None and name in qc.sections:
                items[name], source[name] = qc.sections[name], f"queue {qc.name}"
                continue
            for t in matching:
                if name in t.sections:
                    items[name], source[name] = t.sections[name], t.label
                    break
            else:
                items[name], source[name] = self.defaults[name], f"virtualhost {self.name}"
        return ResolvedPolicy(
            queue_name, items, source, qc.subscription if qc is not None else None
        )

    def exchange(self, name: str) -> ExchangeDecl | None:
        for ex in self.exchanges:
            if ex.name == name:
                return ex
        return None


def _default_users() -> Mapping[str, User]:
    return _frozen_map({"guest": User("guest", "guest", ("/",))})


def _default_vhosts() -> Mapping[str, VhostConfig]:
    return _frozen_map({"/": VhostConfig("/")})


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The whole configuration. Every field has the default the file would give it.

    Paths are kept as written (relative paths are relative to the broker's working directory,
    which is how the README's run command uses ``data/``).
    """

    source: Path | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 5672
    store_path: Path | None = None
    #: ``normal`` (survives kill -9) or ``full`` (also survives power loss); see durability.md
    store_sync: str = "normal"
    users: Mapping[str, User] = field(default_factory=_default_users)
    housekeeping_threads: int = 4
    #: seconds
    housekeeping_period: float = 30.0
    #: extra plugin modules / entry points to load, in document order
    plugins: tuple[str, ...] = ()
    #: plugins (built-in ones included) that must not be loaded: ``<plugin enabled="false">``
    blocked_plugins: frozenset[str] = frozenset()
    journal_path: Path | None = None
    #: ``(host, port)`` of the admin HTTP interface, or None when ``<admin>`` is absent
    admin: tuple[str, int] | None = None
    limits: Limits = field(default_factory=Limits)
    vhosts: Mapping[str, VhostConfig] = field(default_factory=_default_vhosts)
    #: broker-level plugin elements, by element name -> what the plugin's parser returned
    extensions: Mapping[str, object] = field(default_factory=_frozen_map)

    def vhost(self, name: str) -> VhostConfig | None:
        return self.vhosts.get(name)

    def describe(self) -> str:
        """What ``plugbroker check-config FILE`` prints: settings, and what applies where."""
        out: list[str] = []
        origin = self.source if self.source is not None else "(built-in defaults)"
        out.append(f"config {origin}: valid")
        out.append(f"listen {self.listen_host}:{self.listen_port}")
        out.append(f"store {self.store_path if self.store_path is not None else '(none)'}")
        out.append(f"journal {self.journal_path if self.journal_path is not None else 'off'}")
        out.append(
            f"admin {'http://{}:{}'.format(*self.admin) if self.admin is not None else 'off'}"
        )
        out.append(
            f"housekeeping {self.housekeeping_threads} threads, every "
            f"{format_duration(self.housekeeping_period)}"
        )
        out.append(f"limits {self.limits.describe()}")
        users = ", ".join(f"{u.name} ({' '.join(u.vhosts)})" for u in self.users.values())
        out.append(f"users {users or '(none)'}")
        out.append(f"plugins {' '.join(self.plugins) or '(built-in only)'}")
        if self.blocked_plugins:
            out.append(f"blocked plugins {' '.join(sorted(self.blocked_plugins))}")
        for name, value in self.extensions.items():
            out.append(f"<{name}> {_describe_section(value)}")
        for vh in self.vhosts.values():
            out.append("")
            out.append(f"virtualhost {vh.name}")
            for ex in vh.exchanges:
                flags = ["durable" if ex.durable else "transient"]
                if ex.auto_delete:
                    flags.append("auto-delete")
                flags.extend(f"{k}={v}" for k, v in ex.arguments.items())
                out.append(f"  exchange {ex.name}: {ex.type}, {', '.join(flags)}")
            out.append("  defaults (every queue of this vhost unless overridden):")
            for name, value in vh.defaults.items():
                out.append(f"    {name:<11} {_describe_section(value)}")
            if not vh.defaults:
                out.append("    (none)")
            topic_sections = sorted({n for t in vh.topics for n in t.sections})
            for qc in vh.queues.values():
                attrs: list[str] = []
                if qc.durable is not None:
                    attrs.append("declared, durable" if qc.durable else "declared, transient")
                attrs.append(f"subscription {qc.subscription or 'shared (default)'}")
                out.append(f"  queue {qc.name} ({', '.join(attrs)}):")
                out.extend(_indent(vh.resolve(qc.name, ()).describe(), 4))
                open_ = [n for n in topic_sections if n not in qc.sections]
                if open_:
                    out.append(
                        "    if bound to a matching <topic>, that topic supplies: "
                        + ", ".join(open_)
                    )
            for t in vh.topics:
                out.append(f"  {t.label} (queues bound to {t.exchange} with a key it matches):")
                for name, value in t.sections.items():
                    out.append(f"    {name:<11} {_describe_section(value)}")
                if not t.sections:
                    out.append("    (no policies)")
                rest = [n for n in vh.defaults if n not in t.sections]
                if rest:
                    out.append(
                        f"    not set here (a later matching <topic> or virtualhost {vh.name} "
                        f"applies): {', '.join(rest)}"
                    )
        return "\n".join(out)


def _indent(text: str, n: int) -> list[str]:
    pad = " " * n
    return [pad + line for line in text.splitlines()]


# ---------------------------------------------------------------------------------------------
# Schema and paths
# ---------------------------------------------------------------------------------------------


def _config_dir() -> Path:
    import broker

    return Path(broker.__file__).resolve().parent.parent / "config"


def schema_path() -> Path:
    """``config/plugbroker.xsd`` in the source tree (next to the ``broker`` package)."""
    return _config_dir() / "plugbroker.xsd"


def default_config_path() -> Path:
    """``config/default.xml``, the config the README's run command uses."""
    return _config_dir() / "default.xml"


_XS = "{http://www.w3.org/2001/XMLSchema}"


@dataclass(frozen=True)
class _Shape:
    """What the schema declares for one element: child elements, attributes, required children."""

    children: tuple[str, ...]
    attributes: tuple[str, ...]
    required: tuple[str, ...]


_schema_lock = threading.Lock()


@dataclass(frozen=True)
class _Schema:
    schema: etree.XMLSchema
    #: (parent element or None for global, element) -> (child element names, attribute names)
    shapes: Mapping[tuple[str | None, str], _Shape]

    def shape(self, parent: str | None, name: str) -> _Shape | None:
        return self.shapes.get((parent, name)) or self.shapes.get((None, name))


@lru_cache(maxsize=1)
def _load_schema() -> _Schema:
    path = schema_path()
    try:
        doc = etree.parse(str(path))
    except (OSError, etree.XMLSyntaxError) as exc:  # a broken install, not a user error
        raise ConfigError(f"cannot read the configuration schema: {exc}", file=str(path)) from None
    return _Schema(etree.XMLSchema(doc), MappingProxyType(_schema_shapes(doc.getroot())))


def _schema_shapes(root: Any) -> dict[tuple[str | None, str], _Shape]:
    """Which children and attributes each element declares, read from the XSD itself.

    Used only to word errors ("expected one of ..."), so they can never drift from the schema.
    """
    named = {ct.get("name"): ct for ct in root.findall(f"{_XS}complexType")}
    groups = {g.get("name"): g for g in root.findall(f"{_XS}group")}
    shapes: dict[tuple[str | None, str], _Shape] = {}
    containers = {
        f"{_XS}{n}"
        for n in (
            "sequence",
            "all",
            "choice",
            "complexContent",
            "simpleContent",
            "extension",
            "restriction",
        )
    }

    def visit(decl: Any, parent: str | None) -> None:
        name = decl.get("name")
        ct = decl.find(f"{_XS}complexType")
        if ct is None and decl.get("type"):
            ct = named.get(decl.get("type").split(":")[-1])
        if name is None or ct is None:
            return
        children: list[str] = []
        attrs: list[str] = []
        required: list[str] = []

        def walk(node: Any, optional: bool) -> None:
            for n in node:
                opt = optional or n.get("minOccurs") == "0"
                if n.tag == f"{_XS}element":
                    children.append(n.get("name") or n.get("ref"))
                    if not opt:
                        required.append(children[-1])
                    visit(n, name)
                elif n.tag == f"{_XS}attribute":
                    attrs.append(n.get("name"))
                elif n.tag == f"{_XS}group" and n.get("ref") in groups:
                    walk(groups[n.get("ref")], opt)
                elif n.tag in containers:
                    # no single alternative of a choice is required on its own
                    walk(n, opt or n.tag == f"{_XS}choice")

        walk(ct, False)
        shapes[(parent, name)] = _Shape(tuple(children), tuple(attrs), tuple(required))

    for decl in root.findall(f"{_XS}element"):
        visit(decl, None)
    return shapes


# ---------------------------------------------------------------------------------------------
# Turning lxml messages into located, readable errors
# ---------------------------------------------------------------------------------------------

# libxml2's schema messages, as lxml passes them on (libxml2 2.9 - 2.14 word them alike)
_PREFIX_RE = re.compile(
    r"^Element '(?P<el>[^']+)'(?:, attribute '(?P<attr>[^']+)')?: (?P<rest>.*)$", re.DOTALL
)
_PATTERN_RE = re.compile(
    r"^\[facet 'pattern'\] The value '(?P<v>.*)' is not accepted by the pattern '(?P<p>.*)'\.$",
    re.DOTALL,
)
_ENUM_RE = re.compile(
    r"^\[facet 'enumeration'\] The value '(?P<v>.*)' is not an element of the set "
    r"\{(?P<set>.*)\}\.$",
    re.DOTALL,
)
_ATOMIC_RE = re.compile(
    r"^'(?P<v>.*)' is not a valid value of the (?:local )?(?:atomic|list) type "
    r"'(?P<t>[^']+)'\.$",
    re.DOTALL,
)
_LENGTH_RE = re.compile(
    r"^\[facet '(?:minLength|length)'\] The value '(?P<v>.*)' has a length of '0'", re.DOTALL
)
_MAXLEN_RE = re.compile(
    r"^\[facet 'maxLength'\] The value .* has a length of '(?P<n>\d+)'; this exceeds the "
    r"allowed maximum length of '(?P<m>\d+)'",
    re.DOTALL,
)
_NOT_EXPECTED_RE = re.compile(
    r"^This element is not expected\.(?: Expected is (?:one of )?\( (?P<exp>.*) \)\.)?$", re.DOTALL
)
_MISSING_RE = re.compile(
    r"^Missing child element\(s\)\. Expected is (?:one of )?\( (?P<exp>.*) \)\.$", re.DOTALL
)
_ATTR_MISSING_RE = re.compile(r"^The attribute '(?P<a>[^']+)' is required but missing\.$")
_ATTR_UNKNOWN_RE = re.compile(r"^The attribute '(?P<a>[^']+)' is not allowed\.$")

_IDENT_HINT = "a name such as my_company.policies, Delete or exponential"
_TYPE_HINTS = {
    "xs:boolean": "is not true or false",
    "xs:positiveInteger": "is not a whole number of 1 or more",
    "xs:nonNegativeInteger": "is not a whole number of 0 or more",
    "xs:unsignedShort": "is not a whole number from 0 to 65535",
    "xs:decimal": "is not a decimal number (like 0.6 or 100)",
    "xs:integer": "is not a whole number",
}


def _value_message(value: str, type_or_pattern: str) -> str:
    """The message for a value the schema refused, in units.py's words where it applies."""
    try:
        if type_or_pattern in (DURATION_PATTERN, "durationType"):
            parse_duration(value)
        elif type_or_pattern in (SIZE_PATTERN, "sizeType"):
            parse_size(value)
        elif type_or_pattern in ("durationListType", "durationListItems"):
            parse_duration_list(value)
    except ValueError as exc:
        return str(exc)
    if type_or_pattern in _TYPE_HINTS:
        return f"{value!r} {_TYPE_HINTS[type_or_pattern]}"
    if type_or_pattern == "identifierType" or "A-Za-z_" in type_or_pattern:
        return f"{value!r} is not a valid name ({_IDENT_HINT})"
    return f"{value!r} is not a valid {type_or_pattern}"


def _find_path(root: Any, path: str | None) -> Any | None:
    """The element an lxml error path (``/broker/virtualhost[2]/queue``) points at."""
    if not path:
        return None
    try:
        found = root.getroottree().xpath(path)
    except etree.XPathError:
        return None
    return found[0] if found else None


def _suggest(name: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean <{close[0]}>?" if close else ""


def _schema_error(entry: Any, source: str, schema: _Schema, root: Any) -> ConfigError:
    steps = [re.sub(r"\[\d+\]$", "", s) for s in (entry.path or "").split("/") if s]
    m = _PREFIX_RE.match(entry.message.strip())
    element = m["el"] if m else (steps[-1] if steps else None)
    attr = m["attr"] if m else None
    rest = m["rest"].strip() if m else entry.message.strip()
    parent = steps[-2] if len(steps) >= 2 else None
    msg = rest
    if (mm := _PATTERN_RE.match(rest)) is not None:
        msg = _value_message(mm["v"], mm["p"])
    elif (mm := _ENUM_RE.match(rest)) is not None:
        allowed = re.findall(r"'([^']*)'", mm["set"])
        msg = f"{mm['v']!r} is not one of: {', '.join(allowed)}"
    elif (mm := _ATOMIC_RE.match(rest)) is not None:
        msg = _value_message(mm["v"], mm["t"])
    elif _LENGTH_RE.match(rest):
        msg = "must not be empty"
    elif (mm := _MAXLEN_RE.match(rest)) is not None:
        msg = f"is {mm['n']} characters long; at most {mm['m']} are allowed"
    elif (mm := _NOT_EXPECTED_RE.match(rest)) is not None:
        shape = schema.shape(steps[-3] if len(steps) >= 3 else None, parent) if parent else None
        expected = (
            list(shape.children)
            if shape and shape.children
            else ([e.strip() for e in mm["exp"].split(",")] if mm["exp"] else [])
        )
        where = f" under <{parent}>" if parent else ""
        if element in expected:
            msg = f"<{element}> appears more than once{where}"
        else:
            msg = f"unexpected element <{element}>{where}"
            if expected:
                msg += f"; expected one of: {', '.join(expected)}"
            msg += _suggest(element or "", expected)
    elif (mm := _MISSING_RE.match(rest)) is not None:
        shape = schema.shape(parent, element or "")
        target = _find_path(root, entry.path)
        missing: list[str] = []
        if shape is not None and target is not None:
            missing = [c for c in shape.required if target.find(c) is None]
        if missing:
            msg = f"missing required child element <{missing[0]}>"
        else:
            msg = f"missing child element; expected one of: {mm['exp']}"
    elif rest.startswith("Character content other than whitespace is not allowed"):
        msg = "text is not allowed here, only child elements"
    elif (mm := _ATTR_MISSING_RE.match(rest)) is not None:
        msg = f"attribute {mm['a']} is required"
    elif (mm := _ATTR_UNKNOWN_RE.match(rest)) is not None:
        shape = schema.shape(parent, element or "")
        allowed = list(shape.attributes) if shape else []
        msg = f"unknown attribute {mm['a']!r}"
        if allowed:
            msg += f"; allowed: {', '.join(allowed)}"
        else:
            msg += "; this element takes no attributes"
        close = difflib.get_close_matches(mm["a"], allowed, n=1, cutoff=0.6)
        if close:
            msg += f"; did you mean {close[0]!r}?"
        attr = None
    if attr:
        msg = f"attribute {attr}: {msg}"
    return ConfigError(msg, file=source, line=entry.line or None, element=element)


_SYNTAX_PATTERNS = (
    (
        re.compile(
            r"Opening and ending tag mismatch: (?P<a>\S+) line (?P<l>\d+) and (?P<b>[^,\s]+)"
        ),
        lambda m: (m["a"], f"<{m['a']}> (opened on line {m['l']}) is closed by </{m['b']}>"),
    ),
    (
        re.compile(r"Premature end of data in tag (?P<a>\S+) line (?P<l>\d+)"),
        lambda m: (m["a"], f"the file ends before <{m['a']}> (opened on line {m['l']}) is closed"),
    ),
    (
        re.compile(r"Couldn't find end of Start Tag (?P<a>\S+) line"),
        lambda m: (m["a"], f"the start tag <{m['a']}> is not finished (check quotes and '>')"),
    ),
)


def _syntax_error(exc: etree.XMLSyntaxError, source: str, log: Any) -> ConfigError:
    entries = list(log) if log else []
    raw = entries[0].message if entries else str(exc.msg)
    line = entries[0].line if entries else exc.lineno
    # libxml2's first message is usually the root cause; prefer one that names an element
    for entry in entries or []:
        for rx, render in _SYNTAX_PATTERNS:
            m = rx.search(entry.message)
            if m:
                element, text = render(m)
                return ConfigError(
                    f"malformed XML: {text}", file=source, line=entry.line, element=element
                )
    text = re.sub(r", line \d+, column \d+$", "", raw.strip())
    return ConfigError(f"malformed XML: {text}", file=source, line=line or None)


# ---------------------------------------------------------------------------------------------
# The loader (pass 3)
# ---------------------------------------------------------------------------------------------


class _Loader:
    """Walks a schema-valid document and builds the model, checking what the schema cannot."""

    def __init__(self, source: str, registry: RegistryLike | None) -> None:
        self.ctx = ParseContext(source, registry)
        self.registry = registry

    # -- helpers ------------------------------------------------------------------------------

    def err(self, el: Any, msg: str) -> ConfigError:
        return self.ctx.error(el, msg)

    def _lookup(self, method: str, name: str) -> Any:
        if self.registry is None:
            return None
        fn = getattr(self.registry, method, None)
        return fn(name) if callable(fn) else None

    def _once(self, seen: dict[str, Any], el: Any, where: str) -> None:
        name = _local(el)
        if name in seen:
            raise self.err(
                el,
                f"<{name}> appears more than once under {where} (first on line "
                f"{seen[name].sourceline})",
            )
        seen[name] = el

    def _unknown(self, el: Any, where: str, here: Iterable[str]) -> ConfigError:
        name = _local(el)
        container = where[1:].split()[0].rstrip(">")
        if name in _BROKER_CHILDREN:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; it belongs directly under <broker>",
            )
        if name in _VHOST_CHILDREN:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; it belongs directly under <virtualhost>",
            )
        if name in BUILTIN_SECTIONS or self._lookup("config_element", el.tag) is not None:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; put it under <virtualhost>, <queue> or "
                "<topic>",
            )
        if self._lookup("broker_element", el.tag) is not None:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; it belongs directly under <broker>",
            )
        known = list(here)
        for attr in ("section_names", "broker_names"):
            known.extend(getattr(self.registry, attr, ()) or ())
        return self.err(
            el,
            f"unknown element <{name}> under <{container}>: no plugin registered it"
            + _suggest(name, known),
        )

    # -- broker -------------------------------------------------------------------------------

    def broker(self, root: Any, source: Path | None) -> BrokerConfig:
        if root.tag != "broker":
            raise self.err(root, "the root element must be <broker>")
        seen: dict[str, Any] = {}
        values: dict[str, Any] = {}
        vhost_els: list[Any] = []
        extensions: dict[str, object] = {}
        for el in _elements(root):
            name = _local(el)
            if el.tag in _BROKER_SINGLETONS:
                self._once(seen, el, "<broker>")
                getattr(self, f"_{name}")(el, values)
            elif el.tag == "virtualhost":
                vhost_els.append(el)
            else:
                parser = self._lookup("broker_element", el.tag)
                if parser is None:
                    raise self._unknown(el, "<broker>", _BROKER_CHILDREN)
                self._once(seen, el, "<broker>")
                extensions[el.tag] = self._run_plugin_parser(parser, el)

        vhosts: dict[str, VhostConfig] = {}
        vhost_lines: dict[str, int] = {}
        for el in vhost_els:
            vh = self.vhost(el)
            if vh.name in vhosts:
                raise self.err(
                    el,
                    f"virtualhost {vh.name!r} is declared twice (first on line "
                    f"{vhost_lines[vh.name]})",
                )
            vhosts[vh.name] = vh
            vhost_lines[vh.name] = el.sourceline
        if not vhosts:
            vhosts["/"] = VhostConfig("/")

        # no <users> at all: RabbitMQ's guest/guest on "/" (listen defaults to loopback);
        # an empty <users/> means nobody may connect
        users: Mapping[str, User] = _default_users()
        if "users" in seen:
            users = values.pop("_users_parsed")
            user_els = values.pop("_user_els")
            for user in users.values():
                for vh_name in user.vhosts:
                    if vh_name not in vhosts:
                        raise self.err(
                            user_els[user.name],
                            f"user {user.name!r} names virtualhost {vh_name!r}, which is "
                            f"not declared (declared: {', '.join(vhosts)})",
                        )
        return BrokerConfig(
            source=source,
            users=_frozen_map(users),
            vhosts=_frozen_map(vhosts),
            extensions=_frozen_map(extensions),
            **values,
        )

    def _listen(self, el: Any, values: dict[str, Any]) -> None:
        host = (el.get("host") or "127.0.0.1").strip()
        if not host:
            raise self.err(el, "attribute host: must not be empty")
        values["listen_host"] = host
        values["listen_port"] = int(el.get("port", "5672"))

    def _store(self, el: Any, values: dict[str, Any]) -> None:
        values["store_path"] = Path(el.get("path"))
        values["store_sync"] = (el.get("sync") or "normal").strip().lower()

    def _journal(self, el: Any, values: dict[str, Any]) -> None:
        values["journal_path"] = Path(el.get("path"))

    def _admin(self, el: Any, values: dict[str, Any]) -> None:
        host = (el.get("host") or "127.0.0.1").strip()
        if not host:
            raise self.err(el, "attribute host: must not be empty")
        values["admin"] = (host, int(el.get("port", "15672")))

    def _users(self, el: Any, values: dict[str, Any]) -> None:
        users: dict[str, User] = {}
        els: dict[str, Any] = {}
        for u in _elements(el):
            name = u.get("name")
            if name in users:
                raise self.err(
                    u,
                    f"user {name!r} is declared twice (first on line {els[name].sourceline})",
                )
            raw = u.get("vhosts")
            vhosts = ("/",) if raw is None else tuple(raw.split())
            if not vhosts:
                raise self.err(
                    u,
                    f"attribute vhosts: user {name!r} must be allowed at least one virtualhost",
                )
            users[name] = User(name, u.get("password"), vhosts)
            els[name] = u
        values["_users_parsed"] = users
        values["_user_els"] = els

    def _housekeeping(self, el: Any, values: dict[str, Any]) -> None:
        values["housekeeping_threads"] = self.ctx.integer(el, "threads", 4, minimum=1, maximum=1024)
        values["housekeeping_period"] = self.ctx.duration(el, "period", 30.0)

    def _plugins(self, el: Any, values: dict[str, Any]) -> None:
        enabled: list[str] = []
        blocked: set[str] = set()
        lines: dict[str, int] = {}
        for p in _elements(el):
            name = (p.text or "").strip()
            if name in lines:
                raise self.err(p, f"plugin {name!r} is listed twice (first on line {lines[name]})")
            lines[name] = p.sourceline
            if (p.get("enabled") or "true").strip() in _TRUE:
                enabled.append(name)
            else:
                blocked.add(name)
        values["plugins"] = tuple(enabled)
        values["blocked_plugins"] = frozenset(blocked)

    def _limits(self, el: Any, values: dict[str, Any]) -> None:
        c = self.ctx
        heartbeat = c.duration(el, "heartbeat", 60.0, allow_zero=True, maximum=65535.0)
        if heartbeat is not None and heartbeat != int(heartbeat):
            raise self.err(
                el.find("heartbeat"),
                f"{format_duration(heartbeat)} is not whole seconds; AMQP negotiates heartbeats "
                "in seconds",
            )
        values["limits"] = Limits(
            heartbeat=float(heartbeat or 0.0),
            frame_max=c.size(el, "frameMax", 131072, minimum=4096, maximum=2**32 - 1),
            channel_max=c.integer(el, "channelMax", 2047, minimum=0, maximum=65535),
            handshake_timeout=c.duration(el, "handshakeTimeout", 10.0),
            max_message_size=c.size(el, "maxMessageSize", 128 * 1024 * 1024, minimum=1),
        )

    # -- virtual hosts ------------------------------------------------------------------------

    def vhost(self, el: Any) -> VhostConfig:
        name = el.get("name")
        where = f"<virtualhost name={_q(name)}>"
        exchanges: list[ExchangeDecl] = []
        exchange_els: dict[str, Any] = {}
        queues: dict[str, QueueConfig] = {}
        topics: list[TopicConfig] = []
        topic_els: list[Any] = []
        sections: dict[str, object] = {}
        seen: dict[str, Any] = {}
        for child in _elements(el):
            tag = child.tag
            if tag == "exchange":
                ex = self.exchange(child)
                if ex.name in exchange_els:
                    raise self.err(
                        child,
                        f"exchange {ex.name!r} is declared twice in {where} (first on line "
                        f"{exchange_els[ex.name].sourceline})",
                    )
                exchanges.append(ex)
                exchange_els[ex.name] = child
            elif tag == "queue":
                qc = self.queue(child)
                if qc.name in queues:
                    raise self.err(
                        child,
                        f"queue {qc.name!r} is configured twice in {where} (first on line "
                        f"{queues[qc.name].line})",
                    )
                queues[qc.name] = qc
            elif tag == "topic":
                tc = self.topic(child)
                for other in topics:
                    if (other.key, other.exchange) == (tc.key, tc.exchange):
                        raise self.err(
                            child,
                            f"<topic key={tc.key!r} exchange={tc.exchange!r}> is configured twice "
                            f"(first on line {other.line}); merge them",
                        )
                topics.append(tc)
                topic_els.append(child)
            else:
                self._section_into(child, sections, seen, where, _VHOST_CHILDREN)

        # a <topic> only ever matches topic exchanges: catch one aimed at a declared non-topic one
        types = dict(_AMQ_EXCHANGE_TYPES)
        types.update((ex.name, ex.arguments.get("x-delayed-type", ex.type)) for ex in exchanges)
        for tc, tel in zip(topics, topic_els):
            ex_type = types.get(tc.exchange)
            if ex_type is not None and ex_type != "topic":
                raise self.err(
                    tel,
                    f"attribute exchange: {tc.exchange!r} is a {ex_type} exchange; "
                    "<topic> policies only match bindings to topic exchanges",
                )
        return VhostConfig(
            name=name,
            exchanges=tuple(exchanges),
            queues=_frozen_map(queues),
            topics=tuple(topics),
            defaults=Sections(sections),
        )

    def exchange(self, el: Any) -> ExchangeDecl:
        name = el.get("name")
        if name.startswith("amq."):
            raise self.err(
                el,
                f"attribute name: {name!r}: exchange names starting with 'amq.' are reserved for "
                "the broker",
            )
        ex_type = el.get("type")
        delayed = el.get("delayedType")
        args: dict[str, str] = {}
        if ex_type == "x-delayed-message":
            if delayed is None:
                raise self.err(
                    el,
                    "attribute delayedType is required for an x-delayed-message exchange (direct, "
                    "fanout, topic or headers)",
                )
            args["x-delayed-type"] = delayed
        elif delayed is not None:
            raise self.err(
                el,
                f"attribute delayedType only applies to type x-delayed-message, not {ex_type}",
            )
        return ExchangeDecl(
            name=name,
            type=ex_type,
            durable=(el.get("durable") or "false") in _TRUE,
            auto_delete=(el.get("autoDelete") or "false") in _TRUE,
            arguments=_frozen_map(args),
        )

    def queue(self, el: Any) -> QueueConfig:
        name = el.get("name")
        durable_attr = el.get("durable")
        subscription = el.get("subscription")
        where = f"<queue name={_q(name)}>"
        sections: dict[str, object] = {}
        seen: dict[str, Any] = {}
        for child in _elements(el):
            self._section_into(child, sections, seen, where, ())
        if "isolation" in sections and subscription not in (None, "shared"):
            raise self.err(
                seen["isolation"],
                f"isolation applies to shared queues only, and queue {name!r} has "
                f"subscription {subscription}",
            )
        dl = sections.get("deadLetter")
        if isinstance(dl, DeadLetterConfig):
            dlq = dl.dlq_name(name)
            if dlq == name:
                raise self.err(
                    seen["deadLetter"],
                    f"the dead-letter queue of {name!r} would be the queue itself",
                )
            if dl.retry is not None:
                rq = dl.retry.queue_name(name)
                if rq in (name, dlq):
                    raise self.err(
                        seen["deadLetter"],
                        f"the retry queue of {name!r} ({rq!r}) must differ from the queue and its "
                        "dead-letter queue",
                    )
        return QueueConfig(
            name=name,
            durable=None if durable_attr is None else durable_attr in _TRUE,
            subscription=subscription,
            sections=Sections(sections),
            line=el.sourceline,
        )

    def topic(self, el: Any) -> TopicConfig:
        key = el.get("key")
        exchange = el.get("exchange") or DEFAULT_TOPIC_EXCHANGE
        for word in key.split(".") if key else ():
            if ("*" in word or "#" in word) and word not in ("*", "#"):
                raise self.err(
                    el,
                    f"attribute key: {key!r}: '*' and '#' must be whole words between dots "
                    f"(the word {word!r} would only match itself literally)",
                )
        sections: dict[str, object] = {}
        seen: dict[str, Any] = {}
        for child in _elements(el):
            self._section_into(child, sections, seen, f"<topic key={_q(key)}>", ())
        return TopicConfig(
            key=key, exchange=exchange, sections=Sections(sections), line=el.sourceline
        )

    # -- sections -----------------------------------------------------------------------------

    def _section_into(
        self,
        el: Any,
        into: dict[str, object],
        seen: dict[str, Any],
        where: str,
        also: Iterable[str],
    ) -> None:
        tag = el.tag
        if tag in BUILTIN_SECTIONS:
            self._once(seen, el, where)
            builtin: dict[str, Callable[[Any], object]] = {
                "consumer": self.consumer,
                "isolation": self.isolation,
                "deadLetter": self.dead_letter,
            }
            into[tag] = builtin[tag](el)
            return
        parser = self._lookup("config_element", tag)
        if parser is None:
            raise self._unknown(el, where, (*also, *BUILTIN_SECTIONS))
        self._once(seen, el, where)
        into[tag] = self._run_plugin_parser(parser, el)

    def _run_plugin_parser(self, parser: ElementParser, el: Any) -> object:
        try:
            return parser(el, self.ctx)
        except ConfigError:
            raise
        except ValueError as exc:
            raise self.err(el, str(exc)) from None
        except Exception as exc:  # a plugin bug must still come out located
            raise self.err(el, f"the plugin parser for <{_local(el)}> failed: {exc!r}") from exc

    def consumer(self, el: Any) -> SlowConsumerConfig:
        c = self.ctx
        depth = c.size(el, "depth")
        age = c.duration(el, "messageAge")
        count = c.integer(el, "messageCount", minimum=0)
        rate = c.number(el, "consumptionRate", minimum=0.0, exclusive_min=True)
        if depth is None and age is None and count is None and rate is None:
            raise self.err(
                el,
                "sets no threshold: give at least one of depth, messageAge, messageCount, "
                "consumptionRate",
            )
        return SlowConsumerConfig(
            depth=depth,
            message_age=age,
            message_count=count,
            consumption_rate=rate,
            policy=self.policy(el.find("policy")),
        )

    def policy(self, el: Any) -> PolicyRef:
        name = el.get("name")
        canonical = next((p for p in BUILTIN_POLICIES if p.lower() == name.lower()), None)
        options: dict[str, str] = {}
        lines: dict[str, int] = {}
        opts_el = el.find("options")
        for opt in _elements(opts_el) if opts_el is not None else ():
            oname = opt.get("name")
            if oname in lines:
                raise self.err(
                    opt,
                    f"option {oname!r} is given twice (first on line {lines[oname]})",
                )
            lines[oname] = opt.sourceline
            value = opt.get("value")
            if canonical is not None:
                if oname not in _POLICY_OPTIONS:
                    raise self.err(
                        opt,
                        f"attribute name: {oname!r} is not an option of policy {canonical} "
                        f"(known: {', '.join(sorted(_POLICY_OPTIONS))})",
                    )
                v = value.strip().lower()
                if v not in _TRUE | _FALSE:
                    raise self.err(
                        opt,
                        f"attribute value: option {oname} takes true or false, not {value!r}",
                    )
                value = "true" if v in _TRUE else "false"
            options[oname] = value
        if canonical is None:
            has = getattr(self.registry, "has_policy", None) if self.registry is not None else None
            if not (callable(has) and has(name)):
                raise self.err(
                    el,
                    f"attribute name: policy {name!r} is not built in "
                    f"({', '.join(BUILTIN_POLICIES)}) "
                    "and no plugin registered it",
                )
            canonical = name
        return PolicyRef(canonical, _frozen_map(options))

    def isolation(self, el: Any) -> IsolationConfig:
        c = self.ctx
        ack_timeout = c.duration(el, "ackTimeout")
        assert ack_timeout is not None  # required by the schema
        return IsolationConfig(
            ack_timeout=ack_timeout,
            max_isolated_ratio=c.number(el, "maxIsolatedRatio", 0.6, minimum=0.0, maximum=1.0),
            check_period=c.duration(el, "checkPeriod", 30.0),
            max_unacked_per_consumer=c.integer(el, "maxUnackedPerConsumer", 50000, minimum=1),
        )

    def dead_letter(self, el: Any) -> DeadLetterConfig:
        c = self.ctx
        queue = c.text(el, "queue")
        template_el = el.find("queueTemplate")
        template = "{queue}-DLQ"
        if template_el is not None:
            if queue is not None:
                raise self.err(
                    template_el,
                    "give either <queue> (one dead-letter queue) or <queueTemplate> (one per "
                    "queue), not both",
                )
            template = (template_el.text or "").strip()
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
            except ValueError as exc:
                raise self.err(
                    template_el,
                    f"{template!r} is not a valid template: {exc}",
                ) from None
            bad = [f for f in fields if f not in DLQ_TEMPLATE_FIELDS]
            if bad:
                raise self.err(
                    template_el,
                    f"{template!r} uses {{{bad[0]}}}; the placeholders are "
                    + ", ".join(f"{{{f}}}" for f in DLQ_TEMPLATE_FIELDS),
                )
        retry_el = el.find("retry")
        backoff_el = el.find("backoff")
        return DeadLetterConfig(
            max_redeliveries=c.integer(el, "maxRedeliveries", 16, minimum=0),
            queue=queue,
            queue_template=template,
            retry=self.retry(retry_el) if retry_el is not None else None,
            backoff=self.backoff(backoff_el) if backoff_el is not None else None,
        )

    def _check_levels(
        self, el: Any, levels: tuple[float, ...], lo: float, lo_open: bool, what: str
    ) -> None:
        for i, delay in enumerate(levels, start=1):
            if (delay <= lo if lo_open else delay < lo) or delay > RETRY_DELAY_MAX:
                low = format_duration(lo)
                bound = f"greater than {low}" if lo_open else f"at least {low}"
                raise self.err(
                    el,
                    f"level {i} is {format_duration(delay)}; {what} must be {bound} and at most "
                    f"{format_duration(RETRY_DELAY_MAX)} ({RETRY_DELAY_MAX:g}s)",
                )

    def retry(self, el: Any) -> RetryConfig:
        levels = self.ctx.durations(el, "levels", DEFAULT_RETRY_LEVELS)
        assert levels is not None
        levels_el = el.find("levels")
        if levels_el is not None:
            self._check_levels(levels_el, levels, RETRY_DELAY_MIN, False, "retry delays")
        return RetryConfig(queue=self.ctx.text(el, "queue"), levels=levels)

    def backoff(self, el: Any) -> BackoffConfig:
        c = self.ctx
        btype = el.get("type")
        seen: dict[str, Any] = {}
        params: dict[str, str] = {}
        for child in _elements(el):
            tag = child.tag
            if tag == "param":
                pname = child.get("name")
                if pname in params:
                    raise self.err(child, f"param {pname!r} is given twice")
                params[pname] = child.get("value")
                continue
            self._once(seen, child, "<backoff>")
        if btype in BUILTIN_BACKOFFS:
            allowed = _BACKOFF_FIELDS[btype]
            for tag, child in seen.items():
                if tag not in allowed:
                    raise self.err(
                        child,
                        f"does not apply to backoff type {btype} (it takes: "
                        f"{', '.join(sorted(allowed))})",
                    )
            if params:
                first = next(p for p in _elements(el) if p.tag == "param")
                raise self.err(
                    first,
                    f"<param> is for plugin backoff types; backoff type {btype} takes: "
                    f"{', '.join(sorted(allowed))}",
                )
        else:
            has = getattr(self.registry, "has_backoff", None) if self.registry is not None else None
            if not (callable(has) and has(btype)):
                raise self.err(
                    el,
                    f"attribute type: backoff type {btype!r} is not built in "
                    f"({', '.join(BUILTIN_BACKOFFS)}) "
                    "and no plugin registered it",
                )
        limit = RETRY_DELAY_MAX
        if btype == "fixed":
            return BackoffConfig("fixed", delay=c.duration(el, "delay", 60.0, maximum=limit))
        if btype == "exponential":
            lo = c.duration(el, "min", 1.0, maximum=limit)
            hi = c.duration(el, "max", 60.0, maximum=limit)
            assert lo is not None and hi is not None
            if lo > hi:
                target = seen.get("max") if "max" in seen else seen.get("min", el)
                raise self.err(
                    target,
                    f"max ({format_duration(hi)}) is smaller than min ({format_duration(lo)})",
                )
            return BackoffConfig(
                "exponential",
                min=lo,
                max=hi,
                multiplier=c.number(el, "multiplier", 2.0, minimum=1.0),
            )
        if btype == "levels":
            levels = c.durations(el, "levels", DEFAULT_RETRY_LEVELS)
            assert levels is not None
            if "levels" in seen:
                self._check_levels(seen["levels"], levels, 0.0, True, "backoff delays")
            return BackoffConfig("levels", levels=levels)
        # a plugin's backoff: pass everything through, still checked for shape and range
        levels_opt = c.durations(el, "levels")
        if levels_opt is not None:
            self._check_levels(seen["levels"], levels_opt, 0.0, True, "backoff delays")
        multiplier = c.number(el, "multiplier", minimum=0.0, exclusive_min=True)
        return BackoffConfig(
            btype,
            min=c.duration(el, "min", maximum=limit),
            max=c.duration(el, "max", maximum=limit),
            multiplier=multiplier,
            delay=c.duration(el, "delay", maximum=limit),
            levels=levels_opt,
            params=_frozen_map(params),
        )


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

_PARSER_OPTS: dict[str, bool] = {
    "resolve_entities": False,  # no entity expansion (billion laughs) and no external entities
    "no_network": True,
    "load_dtd": False,
    "huge_tree": False,
    "remove_comments": False,
}


def parse_config(
    text: bytes | str,
    source_name: str = "<string>",
    *,
    registry: RegistryLike | None = None,
    source: Path | None = None,
) -> BrokerConfig:
    """Parse and validate configuration XML held in memory.

    :param source_name: how errors name the file (``file:line: ...``).
    :param registry: plugin element/policy/backoff names; ``None`` means no plugin registered
        anything, so only built-in elements, policies and backoffs are accepted.
    :param source: stored as :attr:`BrokerConfig.source`.
    :raises ConfigError: for malformed XML, a schema violation or a semantic error.
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    if isinstance(text, str):
        # lxml refuses str input that carries an encoding declaration; we just encoded to UTF-8
        data = re.sub(rb"^(\s*<\?xml[^>]*?)\s+encoding=([\"'])[^\"']*\2", rb"\1", data, count=1)
    parser = etree.XMLParser(**_PARSER_OPTS)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        raise _syntax_error(exc, source_name, parser.error_log) from None
    if root is None:
        raise ConfigError("malformed XML: the document is empty", file=source_name, line=1)

    schema = _load_schema()
    with _schema_lock:  # an XMLSchema keeps its error log on the object
        valid = schema.schema.validate(root)
        entries = list(schema.schema.error_log)
    if not valid:
        errors: list[ConfigError] = []
        seen: set[tuple[int, str, str | None]] = set()
        for entry in entries:
            # lxml reports a bad pattern value twice (facet, then type): keep the first per spot
            m = _PREFIX_RE.match(entry.message.strip())
            key = (entry.line, entry.path or "", m["attr"] if m else None)
            if key in seen:
                continue
            seen.add(key)
            errors.append(_schema_error(entry, source_name, schema, root))
        if not errors:  # pragma: no cover - validate() said no but logged nothing
            raise ConfigError("does not match the configuration schema", file=source_name)
        first = errors[0]
        raise ConfigError(
            first.message,
            file=first.file,
            line=first.line,
            element=first.element,
            more=tuple(errors[1:]),
        )

    return _Loader(source_name, registry).broker(root, source)


def load_config(path: str | Path, *, registry: RegistryLike | None = None) -> BrokerConfig:
    """Load, validate and parse the configuration file at ``path``.

    :raises ConfigError: located at ``path`` (and a line and element where there is one).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the configuration: {exc.strerror or exc}", file=str(p)
        ) from None
    return parse_config(data, str(p), registry=registry, source=p)


def load_default(*, registry: RegistryLike | None = None) -> BrokerConfig:
    """Load ``config/default.xml``."""
    return load_config(default_config_path(), registry=registry)

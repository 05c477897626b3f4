"""The configuration model: immutable values the loader builds and the broker reads.

Everything here is the core's own: the broker-level settings (:class:`BrokerConfig`,
:class:`Limits`, :class:`User`), the virtual hosts with their declared exchanges, ``<queue>`` and
``<topic>`` elements (:class:`VhostConfig`, :class:`ExchangeDecl`, :class:`QueueConfig`,
:class:`TopicConfig`), and policy resolution (:meth:`VhostConfig.resolve` ->
:class:`ResolvedPolicy`).

A *section* (an element under ``<virtualhost>``, ``<queue>`` or ``<topic>`` such as
``<consumer>``) is whatever object the plugin that registered the element returned from its
parser; this module never looks inside one. It stores sections by element name
(:class:`Sections`) and resolves them per queue: for each section element the ``<queue name>`` of
that exact name wins, then the first ``<topic>`` in document order that matches one of the
queue's topic-exchange bindings, then the ``<virtualhost>`` defaults. :class:`PolicyRef` (a
section's ``<policy name>``) is core because the plugin host checks every policy name against the
registered policies.

Everything is immutable once loaded, so a reload builds a new :class:`BrokerConfig` and swaps it
in only when the whole file is valid; a failed reload leaves the running one alone.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plugbroker.config.units import format_duration, format_size
from plugbroker.config.users import DEFAULT_HASHING_ALGORITHM, Permission, check_password_hash
from plugbroker.routing import STANDARD_EXCHANGES, topic_words_match

__all__ = [
    "DEFAULT_TOPIC_EXCHANGE",
    "XML_FALSE",
    "XML_TRUE",
    "BrokerConfig",
    "ExchangeDecl",
    "Limits",
    "Permission",
    "PolicyRef",
    "QueueConfig",
    "ResolvedPolicy",
    "Sections",
    "TlsConfig",
    "TopicConfig",
    "TopicMatcher",
    "UnparsedSection",
    "User",
    "VhostConfig",
    "default_users",
    "describe_section",
    "frozen_map",
]

#: the exchange a ``<topic>`` without ``exchange=`` applies to: the standard topic exchange
DEFAULT_TOPIC_EXCHANGE: str = next(name for name, kind in STANDARD_EXCHANGES if kind == "topic")
#: how the XML writes a boolean (xs:boolean's lexical forms)
XML_TRUE: frozenset[str] = frozenset({"true", "1"})
XML_FALSE: frozenset[str] = frozenset({"false", "0"})


def frozen_map(d: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A read-only copy of ``d`` (the model's mappings are never shared with the caller)."""
    return MappingProxyType(dict(d or {}))


def _full_access() -> Mapping[str, Permission]:
    return frozen_map({"/": Permission()})


@dataclass(frozen=True, slots=True)
class User:
    """A user who may log in (PLAIN/AMQPLAIN) and what it may do once in.

    Exactly one of ``password`` (plain text, accepted with a warning) and ``password_hash``
    (RabbitMQ's salt + digest, see :mod:`plugbroker.config.users`) is set.
    """

    name: str
    password: str | None = None
    #: vhost -> configure/write/read patterns; a vhost not in here may not be opened
    permissions: Mapping[str, Permission] = field(default_factory=_full_access)
    #: salt + digest (decoded ``passwordHash``), or None with a plain ``password``
    password_hash: bytes | None = None
    hashing_algorithm: str = DEFAULT_HASHING_ALGORITHM
    tags: frozenset[str] = frozenset()
    #: may log in only from 127.0.0.0/8 or ::1
    loopback_only: bool = False

    @property
    def vhosts(self) -> tuple[str, ...]:
        """The vhosts the user has permissions on (what ``vhosts="..."`` lists)."""
        return tuple(self.permissions)

    def can_access(self, vhost: str) -> bool:
        return vhost in self.permissions

    def permission(self, vhost: str) -> Permission | None:
        return self.permissions.get(vhost)

    def check_password(self, password: str) -> bool:
        """Whether ``password`` is this user's (constant-time comparison)."""
        if self.password_hash is not None:
            return check_password_hash(password, self.password_hash, self.hashing_algorithm)
        if self.password is None:
            return False
        return hmac.compare_digest(self.password.encode("utf-8"), password.encode("utf-8"))

    def describe(self) -> str:
        parts = [self.name]
        if self.tags:
            parts.append(f"[{' '.join(sorted(self.tags))}]")
        if self.loopback_only:
            parts.append("loopback-only")
        perms = "; ".join(f"{vh}: {p.describe()}" for vh, p in self.permissions.items())
        parts.append(f"({perms or 'no vhost'})")
        return " ".join(parts)


#: the values of ``<tls verify>``: no client certificate asked for, or one asked for and checked
TLS_VERIFY: tuple[str, ...] = ("none", "peer")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """A ``<tls>`` element: a TLS listener (amqps under ``<broker>``, https under ``<admin>``).

    ``verify="peer"`` asks the client for a certificate and checks it against ``ca``; with
    ``fail_if_no_peer_cert`` a client without one is refused during the handshake, otherwise it
    may still log in with a password. Only a listener with ``verify="peer"`` offers the
    EXTERNAL login mechanism (the user is the certificate's CN).
    """

    port: int
    cert: Path
    key: Path
    ca: Path | None = None
    verify: str = "none"
    fail_if_no_peer_cert: bool = False
    #: the address to listen on; None: the plain listener's (``<listen host>``, ``<admin host>``)
    host: str | None = None

    @property
    def verify_peer(self) -> bool:
        return self.verify == "peer"

    def describe(self, scheme: str, default_host: str) -> str:
        peer = "none"
        if self.verify_peer:
            peer = "peer, required" if self.fail_if_no_peer_cert else "peer, optional"
        return (
            f"{scheme}://{self.host or default_host}:{self.port} (cert {self.cert}, key "
            f"{self.key}, ca {self.ca if self.ca is not None else '(none)'}, verify {peer})"
        )


#: the default limits on what one tenant may hold (0 lifts a limit): together, about 270 MB at
#: the costs measured per object (4.4 KB a queue, 1.1 KB a binding, 1.4 KB a channel, 5.2 KB
#: an idle connection, 1 KB a consumer), under the default memory watermark of any machine
#: with 1 GB or more; docs/operations.md (Limits) gives the arithmetic
DEFAULT_MAX_CONNECTIONS_PER_USER = 1000
DEFAULT_MAX_CHANNELS_PER_USER = 10_000
DEFAULT_MAX_QUEUES_PER_VHOST = 20_000
DEFAULT_MAX_BINDINGS_PER_EXCHANGE = 50_000
DEFAULT_MAX_BINDINGS_PER_VHOST = 100_000
DEFAULT_MAX_CONSUMERS_PER_CHANNEL = 1000
DEFAULT_MAX_CONSUMERS_PER_VHOST = 50_000
#: (Limits field, ``<limits>`` element, default) of the limits on what a tenant may hold
TENANT_LIMITS = (
    ("max_connections_per_user", "maxConnectionsPerUser", DEFAULT_MAX_CONNECTIONS_PER_USER),
    ("max_channels_per_user", "maxChannelsPerUser", DEFAULT_MAX_CHANNELS_PER_USER),
    ("max_queues_per_vhost", "maxQueuesPerVhost", DEFAULT_MAX_QUEUES_PER_VHOST),
    ("max_bindings_per_exchange", "maxBindingsPerExchange", DEFAULT_MAX_BINDINGS_PER_EXCHANGE),
    ("max_bindings_per_vhost", "maxBindingsPerVhost", DEFAULT_MAX_BINDINGS_PER_VHOST),
    ("max_consumers_per_channel", "maxConsumersPerChannel", DEFAULT_MAX_CONSUMERS_PER_CHANNEL),
    ("max_consumers_per_vhost", "maxConsumersPerVhost", DEFAULT_MAX_CONSUMERS_PER_VHOST),
)


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
    #: open client connections the broker accepts (0: no limit), RabbitMQ's connection_max
    max_connections: int = 0
    #: open connections one user may hold (0: no limit), RabbitMQ's user max-connections
    max_connections_per_user: int = DEFAULT_MAX_CONNECTIONS_PER_USER
    #: open channels one user may hold over its connections (0: no limit), RabbitMQ's user
    #: max-channels
    max_channels_per_user: int = DEFAULT_MAX_CHANNELS_PER_USER
    #: queues one virtual host may hold (0: no limit), RabbitMQ's vhost max-queues
    max_queues_per_vhost: int = DEFAULT_MAX_QUEUES_PER_VHOST
    #: bindings one exchange may have as their source (0: no limit)
    max_bindings_per_exchange: int = DEFAULT_MAX_BINDINGS_PER_EXCHANGE
    #: bindings one virtual host may hold (0: no limit)
    max_bindings_per_vhost: int = DEFAULT_MAX_BINDINGS_PER_VHOST
    #: consumers one channel may hold (0: no limit), RabbitMQ's consumer_max_per_channel
    max_consumers_per_channel: int = DEFAULT_MAX_CONSUMERS_PER_CHANNEL
    #: consumers one virtual host may hold (0: no limit)
    max_consumers_per_vhost: int = DEFAULT_MAX_CONSUMERS_PER_VHOST
    #: seconds the answer to the first failed login from a peer address is delayed; each
    #: further failure from that address doubles it, up to :attr:`login_failure_delay_max`
    #: (0 disables the throttle)
    login_failure_delay: float = 0.5
    login_failure_delay_max: float = 10.0
    #: the memory alarm's high mark as a fraction of physical memory (``0.4``), or None when
    #: :attr:`memory_high_watermark_bytes` gives it as a size
    memory_high_watermark: float | None = 0.4
    memory_high_watermark_bytes: int | None = None
    #: the disk alarm goes on while the store's filesystem has less free space than this
    disk_free_limit: int = 50 * 1024 * 1024
    #: the most a connection may hold in message bodies still arriving, over its channels
    partial_body_budget: int = 256 * 1024 * 1024
    #: seconds a connection may sit in the middle of a message body without sending more
    body_stall_timeout: float = 30.0
    #: seconds a plugin hook call may hold the event loop before it is logged and counted
    hook_budget: float = 0.1

    def describe(self) -> str:
        def limit(n: int) -> str:
            return str(n) if n else "unlimited"

        watermark = (
            format_size(self.memory_high_watermark_bytes)
            if self.memory_high_watermark_bytes is not None
            else f"{self.memory_high_watermark:g}"
        )
        return (
            f"heartbeat {format_duration(self.heartbeat)}, frameMax {self.frame_max}, "
            f"channelMax {self.channel_max}, handshakeTimeout "
            f"{format_duration(self.handshake_timeout)}, maxMessageSize "
            f"{format_size(self.max_message_size)}, maxConnections "
            f"{limit(self.max_connections)}, maxConnectionsPerUser "
            f"{limit(self.max_connections_per_user)}, maxChannelsPerUser "
            f"{limit(self.max_channels_per_user)}, maxQueuesPerVhost "
            f"{limit(self.max_queues_per_vhost)}, maxBindingsPerExchange "
            f"{limit(self.max_bindings_per_exchange)}, maxBindingsPerVhost "
            f"{limit(self.max_bindings_per_vhost)}, maxConsumersPerChannel "
            f"{limit(self.max_consumers_per_channel)}, maxConsumersPerVhost "
            f"{limit(self.max_consumers_per_vhost)}, loginFailureDelay "
            f"{format_duration(self.login_failure_delay)} (max "
            f"{format_duration(self.login_failure_delay_max)}), memoryHighWatermark {watermark}, "
            f"diskFreeLimit {format_size(self.disk_free_limit)}, partialBodyBudget "
            f"{format_size(self.partial_body_budget)}, bodyStallTimeout "
            f"{format_duration(self.body_stall_timeout)}, hookBudget "
            f"{format_duration(self.hook_budget)}"
        )


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """A section's ``<policy name=".."><options><option name=".." value=".."/></options></policy>``.

    The plugin that owns the section validates the options of its own policies; the plugin host
    checks at load that some plugin registered ``name``.
    """

    name: str
    options: Mapping[str, str] = field(default_factory=frozen_map)

    def option(self, name: str, default: str | None = None) -> str | None:
        return self.options.get(name, default)

    def flag(self, name: str, default: bool = False) -> bool:
        """A boolean option (``true``/``false``/``1``/``0``)."""
        value = self.options.get(name)
        if value is None:
            return default
        return value.strip().lower() in XML_TRUE

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name}({opts})" if opts else self.name


@dataclass(frozen=True, slots=True)
class UnparsedSection:
    """A section element the schema declares but no loaded plugin parses.

    That happens when the plugin that owns the element is blocked (``<plugin enabled="false">``)
    or not installed. The element has passed the schema; it has no effect. It is kept so that
    ``check-config`` shows it and so that its ``<policy name>`` (if any) is still checked against
    the registered policies, as for any other section.
    """

    element: str
    line: int | None = None
    policy: PolicyRef | None = None

    def describe(self) -> str:
        return f"not parsed: no loaded plugin handles <{self.element}>, so it has no effect"


def describe_section(value: object, queue: str | None = None) -> str:
    """One line about a section for ``check-config``.

    A section may define ``describe() -> str``, and ``describe_for(queue) -> str`` when what it
    says depends on the queue (a dead-letter queue named after it, say); otherwise its ``repr``.
    """
    if queue is not None:
        describe_for = getattr(value, "describe_for", None)
        if callable(describe_for):
            try:
                return str(describe_for(queue))
            except Exception as exc:
                return f"{value!r} (its describe_for() failed: {exc!r})"
    describe = getattr(value, "describe", None)
    if callable(describe):
        try:
            return str(describe())
        except Exception as exc:
            return f"{value!r} (its describe() failed: {exc!r})"
    return repr(value)


class Sections(Mapping[str, object]):
    """Section element name -> parsed section, read-only (``sections["consumer"]``).

    The values are what the registered parsers returned (or :class:`UnparsedSection`).
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
    def get(self, key: str, default: object = None) -> object:
        return self._items.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    __hash__ = None  # type: ignore[assignment]


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
            f"{name:<11} {describe_section(value, self.queue)}  <- {self.source[name]}"
            for name, value in self._items.items()
        ]
        return "\n".join(lines) if lines else "(no policies)"


class TopicMatcher:
    """AMQP topic pattern matching on words: ``*`` is exactly one word, ``#`` zero or more.

    Split once per ``<topic>`` at load; the matching itself is the topic exchange's
    (:func:`plugbroker.routing.topic_words_match`), so a ``<topic>`` policy reads a pattern
    the way the router does. The binding key being tested is matched literally (a binding key
    ``stocks.us.*`` is matched by the pattern ``stocks.#``). An empty binding key has zero words
    here, so only ``#`` (or an empty pattern) matches it; the router splits an empty routing key
    into one empty word instead.
    """

    __slots__ = ("_wild", "_words", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._words: tuple[str, ...] = tuple(pattern.split(".")) if pattern else ()
        self._wild = any(w in ("*", "#") for w in self._words)

    def matches(self, key: str) -> bool:
        if not self._wild:
            return key == self.pattern
        return topic_words_match(self._words, key.split(".") if key else ())

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
    arguments: Mapping[str, str] = field(default_factory=frozen_map)


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
class BlastRadiusConfig:
    """``<blastRadius>``: what all policies together may do to one vhost in a sliding minute
    (see :mod:`plugbroker.budget`); ``None`` for a limit that is not set."""

    max_actions_per_minute: int | None = None
    max_consumers_affected: int | None = None

    def describe(self) -> str:
        parts = []
        if self.max_actions_per_minute is not None:
            parts.append(f"at most {self.max_actions_per_minute} action(s) a minute")
        if self.max_consumers_affected is not None:
            parts.append(f"at most {self.max_consumers_affected} consumer(s) affected a minute")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class VhostConfig:
    """``<virtualhost name>``: declared exchanges, per-queue and per-topic policies, defaults."""

    name: str
    exchanges: tuple[ExchangeDecl, ...] = ()
    queues: Mapping[str, QueueConfig] = field(default_factory=frozen_map)
    topics: tuple[TopicConfig, ...] = ()
    defaults: Sections = field(default_factory=Sections)
    #: sections that reach topic subscriptions only from ``<virtualhost>`` and ``<topic>``
    #: (registered with ``reach=REACH_TOPIC_SUBSCRIPTIONS``: the slow-consumer ``<consumer>``)
    topic_only: frozenset[str] = frozenset()
    #: ``<blastRadius>``: the budget of every policy's actions in this vhost; None: unbounded
    blast_radius: BlastRadiusConfig | None = None

    def resolve(
        self,
        queue_name: str,
        bindings: Iterable[tuple[str, str, str]] = (),
        *,
        dead_letter_target: bool = False,
    ) -> ResolvedPolicy:
        """The policy sections for ``queue_name`` with ``(exchange, exchange_type, key)`` bindings.

        Per section element: the ``<queue>`` of that exact name, else the first ``<topic>`` in
        document order that has the section and matches a binding whose exchange type is
        ``topic``, else the vhost default. The caller passes the *effective* type, so a binding
        to an x-delayed-message exchange with ``x-delayed-type: topic`` should be passed as
        ``"topic"``. Cost: O(topics x bindings), no message is touched.

        A section in :attr:`topic_only` reaches the queue from ``<topic>`` or ``<virtualhost>``
        only when the queue is a *topic subscription*: it has a binding whose exchange type is
        ``topic`` and it is not a dead-letter or retry target (``dead_letter_target``, which the
        broker works out from the queue's arguments and the vhost's dead-letter routes). From
        ``<queue name>`` it always reaches that queue.
        """
        blist = tuple(bindings)
        matching = [t for t in self.topics if t.matches_any(blist)] if blist else []
        return self.resolve_matched(
            queue_name,
            matching,
            topic_bound=any(t == "topic" for _, t, _ in blist),
            dead_letter_target=dead_letter_target,
        )

    def resolve_matched(
        self,
        queue_name: str,
        matching: Sequence[TopicConfig],
        *,
        topic_bound: bool,
        dead_letter_target: bool = False,
    ) -> ResolvedPolicy:
        """:meth:`resolve` from what the bindings were found to contribute: the ``<topic>``
        elements they match (in document order) and whether one is to a topic exchange. The
        broker keeps both up to date as bindings come and go, so a bind costs O(topics), not
        O(topics x bindings of the queue)."""
        qc = self.queues.get(queue_name)
        names: dict[str, None] = {}
        if qc is not None:
            names.update(dict.fromkeys(qc.sections))
        for t in matching:
            names.update(dict.fromkeys(t.sections))
        names.update(dict.fromkeys(self.defaults))
        items: dict[str, object] = {}
        source: dict[str, str] = {}
        subscription = not dead_letter_target and topic_bound
        for name in names:
            if qc is not None and name in qc.sections:
                items[name], source[name] = qc.sections[name], f"queue {qc.name}"
                continue
            if name in self.topic_only and not subscription:
                continue  # not a topic subscription: only <queue name> reaches it
            for t in matching:
                if name in t.sections:
                    items[name], source[name] = t.sections[name], t.label
                    break
            else:
                if name in self.defaults:
                    items[name], source[name] = self.defaults[name], f"virtualhost {self.name}"
        return ResolvedPolicy(
            queue_name, items, source, qc.subscription if qc is not None else None
        )

    def exchange(self, name: str) -> ExchangeDecl | None:
        for ex in self.exchanges:
            if ex.name == name:
                return ex
        return None


def default_users() -> Mapping[str, User]:
    """RabbitMQ's guest/guest: full permissions on "/", administrator, loopback only."""
    return frozen_map(
        {"guest": User("guest", "guest", tags=frozenset({"administrator"}), loopback_only=True)}
    )


def _default_vhosts() -> Mapping[str, VhostConfig]:
    return frozen_map({"/": VhostConfig("/")})


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The whole configuration. Every field has the default the file would give it.

    Paths are kept as written (relative paths are relative to the broker's working directory,
    which is how the README's run command uses ``data/``).
    """

    source: Path | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 5672
    #: False when the file has a ``<tls>`` listener and no ``<listen>``: amqps only
    listen_plain: bool = True
    #: ``<tls>`` under ``<broker>``: the amqps listener, beside the plain one
    tls: TlsConfig | None = None
    store_path: Path | None = None
    #: ``normal`` (survives kill -9) or ``full`` (also survives power loss); see durability.md
    store_sync: str = "normal"
    #: ``<store acceptLoss="true">``: start even if the store lost data (logged); see
    #: docs/operations.md, "Store integrity at start"
    store_accept_loss: bool = False
    users: Mapping[str, User] = field(default_factory=default_users)
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
    #: ``<tls>`` under ``<admin>``: the admin interface speaks HTTPS (only) on its ``port``
    admin_tls: TlsConfig | None = None
    #: ``<admin allowedHosts>``: host names (lower case) a request from this host may name in
    #: its ``Host`` header besides ``localhost`` and addresses (a reverse proxy's name)
    admin_allowed_hosts: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    vhosts: Mapping[str, VhostConfig] = field(default_factory=_default_vhosts)
    #: broker-level plugin elements, by element name -> what the plugin's parser returned
    extensions: Mapping[str, object] = field(default_factory=frozen_map)

    def vhost(self, name: str) -> VhostConfig | None:
        return self.vhosts.get(name)

    def describe(self) -> str:
        """What ``plugbroker check-config FILE`` prints: settings, and what applies where."""
        out: list[str] = []
        origin = self.source if self.source is not None else "(built-in defaults)"
        out.append(f"config {origin}: valid")
        out.append(
            f"listen {self.listen_host}:{self.listen_port}" if self.listen_plain else "listen off"
        )
        if self.tls is not None:
            out.append(f"tls {self.tls.describe('amqps', self.listen_host)}")
        out.append(f"store {self.store_path if self.store_path is not None else '(none)'}")
        out.append(f"journal {self.journal_path if self.journal_path is not None else 'off'}")
        if self.admin is None:
            out.append("admin off")
        elif self.admin_tls is not None:
            out.append(f"admin {self.admin_tls.describe('https', self.admin[0])}")
        else:
            out.append("admin http://{}:{}".format(*self.admin))
        if self.admin is not None and self.admin_allowed_hosts:
            out.append(f"admin allowed hosts {' '.join(self.admin_allowed_hosts)}")
        out.append(
            f"housekeeping {self.housekeeping_threads} threads, every "
            f"{format_duration(self.housekeeping_period)}"
        )
        out.append(f"limits {self.limits.describe()}")
        users = ", ".join(u.describe() for u in self.users.values())
        out.append(f"users {users or '(none)'}")
        out.append(f"plugins {' '.join(self.plugins) or '(built-in only)'}")
        if self.blocked_plugins:
            out.append(f"blocked plugins {' '.join(sorted(self.blocked_plugins))}")
        for name, value in self.extensions.items():
            out.append(f"<{name}> {describe_section(value)}")
        for vh in self.vhosts.values():
            out.append("")
            out.append(f"virtualhost {vh.name}")
            if vh.blast_radius is not None:
                out.append(f"  blastRadius: {vh.blast_radius.describe()} (all policies together)")
            for ex in vh.exchanges:
                flags = ["durable" if ex.durable else "transient"]
                if ex.auto_delete:
                    flags.append("auto-delete")
                flags.extend(f"{k}={v}" for k, v in ex.arguments.items())
                out.append(f"  exchange {ex.name}: {ex.type}, {', '.join(flags)}")
            out.append("  defaults (every queue of this vhost unless overridden):")
            for name, value in vh.defaults.items():
                only = "  (topic subscriptions only)" if name in vh.topic_only else ""
                out.append(f"    {name:<11} {describe_section(value)}{only}")
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
                subscription_only = [
                    n for n in vh.defaults if n in vh.topic_only and n not in qc.sections
                ]
                if subscription_only:
                    out.append(
                        f"    if it is a topic subscription, virtualhost {vh.name} supplies: "
                        + ", ".join(subscription_only)
                    )
            for t in vh.topics:
                out.append(f"  {t.label} (queues bound to {t.exchange} with a key it matches):")
                for name, value in t.sections.items():
                    out.append(f"    {name:<11} {describe_section(value)}")
                if not t.sections:
                    out.append("    (no policies)")
                rest = [n for n in vh.defaults if n not in t.sections]
                if rest:
                    out.append(
                        f"    not set here (a later matching <topic> or virtualhost {vh.name} "
                        f"applies): {', '.join(rest)}"
                    )
            out.extend(_reach_table(vh))
        return "\n".join(out)


#: which queues a topic-subscription-only section reaches from each placement (check-config)
REACH_VHOST = (
    "queues bound to a topic exchange; never one bound only to direct, fanout or the default "
    "exchange"
)
REACH_TOPIC = "queues bound to {exchange} with a key it matches"
REACH_EXCEPT = "never a dead-letter or retry target"
REACH_QUEUE = "that queue only, however it is bound"


def _reach_table(vh: VhostConfig) -> list[str]:
    """``check-config``'s lines on which queues each ``<consumer>`` placement reaches."""
    out: list[str] = []
    for name in sorted(vh.topic_only):
        rows: list[tuple[str, str]] = []
        if name in vh.defaults:
            rows.append((f"virtualhost {vh.name}", f"{REACH_VHOST}; {REACH_EXCEPT}"))
        for t in vh.topics:
            if name in t.sections:
                reach = REACH_TOPIC.format(exchange=t.exchange)
                rows.append((t.label, f"{reach}; {REACH_EXCEPT}"))
        for qc in vh.queues.values():
            if name in qc.sections:
                rows.append((f"queue {qc.name}", REACH_QUEUE))
        if not rows:
            continue
        out.append(f"  reach of <{name}> (topic subscriptions only, except by <queue name>):")
        out.extend(f"    {where}: {what}" for where, what in rows)
    return out


def _indent(text: str, n: int) -> list[str]:
    pad = " " * n
    return [pad + line for line in text.splitlines()]

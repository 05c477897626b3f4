"""The core API: the one narrow door into a running broker.

Plugins (through ``broker_startup``, ``broker_shutdown``, ``broker_config_reloaded``), the policy
action handlers, the housekeeping pool, the admin interface and the event journal receive a
:class:`BrokerAPI`. None of them touches a ``Queue``, ``Channel``, ``Connection`` or ``Broker``
object: they read **views** (frozen, slotted dataclasses: a copy of the moment, safe to keep)
and give **commands** that name their target by vhost, queue name, consumer tag and connection
id, and say what they did.

Every method runs on the broker's event loop, where hooks already run. Code on another thread
(the admin server, a housekeeping job) goes through :meth:`BrokerAPI.call_on_loop`.

What happens to a message is decided in :mod:`plugbroker.domain.fate`; the commands here that move
messages (isolate, release, redrive) call it, so their hooks fire as on any other path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import plugbroker as _pkg
from plugbroker.alarms import rss_bytes
from plugbroker.codec import properties as props_codec
from plugbroker.codec.ids import QUEUE_DECLARE
from plugbroker.domain import fate
from plugbroker.errors import PRECONDITION_FAILED, ChannelError, name_problem
from plugbroker.heap import CollectorStats, collector_stats

log = logging.getLogger("broker")

if TYPE_CHECKING:
    from plugbroker.app import Broker
    from plugbroker.budget import Budget
    from plugbroker.clock import Clock
    from plugbroker.config import BrokerConfig
    from plugbroker.config.users import Permission
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Consumer, Queue
    from plugbroker.policy import Action, Snapshot
    from plugbroker.session import Connection
    from plugbroker.streaks import Streaks


class NotFound(LookupError):
    """A command named a vhost, queue, consumer or connection that does not exist.

    The message is RabbitMQ's wording: ``no queue 'x' in vhost '/'``.
    """


# ------------------------------------------------------------------------------------- views


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue and its running figures (every figure is O(1) to read)."""

    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    exclusive: bool
    subscription_type: str
    #: messages held: ready, delivered-unacked and delayed
    messages: int
    ready: int
    unacked: int
    delayed: int
    #: body bytes of the messages held
    bytes: int
    #: monotonic arrival of the oldest message held, None when empty
    oldest_arrival: float | None
    #: messages settled since the queue was declared
    acks_total: int
    consumers: int
    delivery_limit: int | None
    retry_target: str | None
    arguments: Mapping[str, Any]
    #: ``(exchange, exchange type, binding key)`` per binding
    bindings: tuple[tuple[str, str, str], ...]
    #: the resolved policy sections by element name (``consumer``, ``isolation`` ...)
    policy: Mapping[str, object]
    #: the XML each policy section came from, by element name (for operators)
    policy_source: Mapping[str, str]
    #: running counters since the queue was declared (``/metrics``)
    published_total: int = 0
    delivered_total: int = 0
    acked_total: int = 0
    redelivered_total: int = 0
    dead_lettered_total: int = 0
    #: it is a dead-letter or retry target: no policy action deletes it
    dead_letter_target: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer of one queue."""

    vhost: str
    queue: str
    tag: str
    connection_id: str
    channel_id: int
    unacked: int
    prefetch: int
    no_ack: bool
    exclusive: bool
    isolated: bool
    #: messages delivered to it so far
    delivered: int
    #: monotonic time of its last ack, nack or reject; None before the first
    last_ack: float | None
    #: monotonic time of its first delivery; None before it got one
    first_delivery: float | None
    #: the ack clock isolation uses: monotonic time it went from nothing unacked to
    #: something unacked, restarted at each ack, nack or reject; None while it holds nothing
    busy_since: float | None = None
    #: monotonic time the delivery it works on last counted a timed-out hand-out (None: not
    #: in this hand-out)
    timed_out_at: float | None = None

    @property
    def ack_clock(self) -> float | None:
        """Its last settle, else its first delivery (the admin API's "last ack age").

        Isolation does not use this figure: an idle spell makes it old. See :attr:`busy_since`.
        """
        return self.last_ack if self.last_ack is not None else self.first_delivery


@dataclass(frozen=True, slots=True)
class VhostPermission:
    """A user's RabbitMQ-style patterns on one vhost (regular expressions searched in the
    resource name; "" matches nothing)."""

    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class UserInfo:
    """A configured user, without its password."""

    name: str
    #: management tags: administrator, monitoring, policymaker, management, impersonator
    tags: frozenset[str]
    #: vhost -> its patterns; a vhost not in here may not be opened
    permissions: Mapping[str, VhostPermission]
    loopback_only: bool

    def may_access(self, vhost: str) -> bool:
        return vhost in self.permissions


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    id: str
    peer: str
    user: str
    vhost: str | None
    channels: int
    heartbeat: int
    #: publishers of a blocked connection are not read from (a resource alarm)
    blocked: bool
    #: the client does not read its socket: deliveries to it and reading from it pause
    output_paused: bool = False
    #: bytes of message bodies still arriving on it
    partial_bytes: int = 0
    #: bytes of output not yet on its socket
    unsent_bytes: int = 0


@dataclass(frozen=True, slots=True)
class AlarmInfo:
    """A raised resource alarm."""

    #: memory, disk or store
    name: str
    #: what was measured against which limit
    detail: str
    #: wall-clock seconds when it was raised
    since: float


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """Failures the broker contained and carried on after (counts since start)."""

    #: store operations that could not be written and were left out (the sqlite store's
    #: ``records_failed``; 0 for a store that keeps nothing)
    store_records_failed: int
    #: hook implementations that raised, by (plugin, hook)
    hook_failures: Mapping[tuple[str, str], int]
    #: hook calls that held the loop longer than ``<limits><hookBudget>``, by (plugin, hook)
    hook_slow_calls: Mapping[tuple[str, str], int]
    #: queue dispatches that raised, by (vhost, queue)
    dispatch_failures: Mapping[tuple[str, str], int]


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """What the resource alarms measure (bytes; None where not known)."""

    memory_used: int
    memory_high_watermark: int | None
    memory_low_watermark: int | None
    rss: int | None
    disk_free: int | None
    disk_free_limit: int


@dataclass(frozen=True, slots=True)
class LimitsInfo:
    """The front door's limits (``<limits>``; 0 means no limit), what is counted against them,
    the refusals they caused, the login throttle and the accept loops."""

    max_connections: int
    max_connections_per_user: int
    max_queues_per_vhost: int
    channel_max: int
    #: connections past connection.open (what maxConnections counts)
    open_connections: int
    #: per user, connections past connection.open (what maxConnectionsPerUser counts)
    user_connections: Mapping[str, int]
    #: queues per vhost (what maxQueuesPerVhost counts)
    vhost_queues: Mapping[str, int]
    #: refusals since start, by the limit that caused them
    refusals: Mapping[str, int]
    login_failures: int
    #: failed logins answered late (login throttling)
    login_throttled: int
    #: peer addresses whose failed logins are currently being delayed more
    login_throttled_peers: int
    #: connections closed at once: their address had too many refusals waiting
    login_turned_away: int
    #: accept() calls that failed for want of a resource (EMFILE ...), since start
    accept_failures: int
    #: a listener is backing off after such a failure
    accept_backing_off: bool


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    connection_id: str
    id: int
    consumers: tuple[str, ...]
    unacked: int
    prefetch_count: int
    global_prefetch: int
    confirm: bool
    transactional: bool
    flow: bool


@dataclass(frozen=True, slots=True)
class ExchangeInfo:
    vhost: str
    name: str
    type: str
    #: the type that routes: an ``x-delayed-message`` exchange's ``x-delayed-type``
    effective_type: str
    durable: bool
    auto_delete: bool
    internal: bool


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """A message as a queue holds it (its body is not copied)."""

    id: int
    exchange: str
    routing_key: str
    size: int
    delivery_count: int
    redelivered: bool
    persistent: bool
    #: monotonic time it entered its queue
    arrival: float
    #: the raw content-header property bytes, as published
    properties: bytes

    def decoded_properties(self) -> dict[str, Any]:
        """The properties decoded; a malformed table gives what could be read."""
        try:
            return props_codec.decode_lenient(self.properties)
        except Exception:
            return {}


@dataclass(frozen=True, slots=True)
class DeliveryInfo:
    """A delivery waiting for its ack on some channel."""

    vhost: str
    queue: str
    #: None for a basic.get delivery
    consumer_tag: str | None
    connection_id: str
    channel_id: int
    delivery_tag: int
    message: MessageInfo


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """A dead-letter queue as it is now: read from the messages it holds, so it survives a
    restart and shows dead letters from every source (delivery limit, rejects, expiry,
    overflow, ``reconsume_later``)."""

    vhost: str
    queue: str
    #: messages it holds
    messages: int
    #: dead letters it received since the broker started, by reason
    received_by_reason: Mapping[str, int]
    #: the messages it holds, by their last death reason (``x-death``)
    by_reason: Mapping[str, int] = field(default_factory=dict)
    #: the messages it holds, by the queue each died in (``REAL_TOPIC``, else ``x-death``)
    sources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RedriveResult:
    #: messages moved back, by the queue they went to
    moved: Mapping[str, int]
    #: messages left in the dead-letter queue (origin unknown or gone, or it refused them, or
    #: filtered out by reason)
    kept: int
    #: what the redrive moves in all, by target queue (a dry run moves none of it; a paced
    #: one moves the rest on the broker's timers)
    planned: Mapping[str, int] = field(default_factory=dict)
    #: messages still to move by a paced redrive
    pending: int = 0
    dry_run: bool = False
    #: messages kept (and counted in ``kept``) because the asker may not write the queue
    #: they came from, by that queue
    refused: Mapping[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------------- the API


class BrokerAPI:
    """Views and commands over one running broker. See the module docstring."""

    __slots__ = ("__weakref__", "_b", "_stepping")

    def __init__(self, broker: Broker) -> None:
        self._b = broker
        #: work running a step per loop turn (:meth:`purge_queue_in_steps` ...), kept here so
        #: it runs to its end when its caller goes away
        self._stepping: set[asyncio.Future[None]] = set()

    # -- identity, time, configuration ----------------------------------------------------------

    @property
    def name(self) -> str:
        return self._b.name

    @property
    def version(self) -> str:
        return _pkg.__version__

    @property
    def clock(self) -> Clock:
        return self._b.clock

    @property
    def config(self) -> BrokerConfig:
        """The configuration in effect (replaced as a whole by a reload)."""
        return self._b.config

    @property
    def alarm(self) -> str | None:
        """What connection.blocked says while a resource alarm blocks publishers (``low on
        memory``, ``low on disk``, ``low on memory & disk``), or None."""
        return self._b.alarm

    def alarms(self) -> list[AlarmInfo]:
        """The raised resource alarms, oldest first."""
        return [
            AlarmInfo(a.name, a.detail, a.since)
            for a in sorted(self._b.alarms.values(), key=lambda a: a.since)
        ]

    def failures(self) -> FailureInfo:
        """The contained failures: store records left out, hook and dispatch exceptions
        (O(plugins x hooks + queues that failed))."""
        hooks = getattr(self._b.hooks, "hook_failures", None)
        slow = getattr(getattr(self._b.hooks, "watch", None), "slow_calls", None)
        return FailureInfo(
            store_records_failed=int(getattr(self._b.store, "records_failed", 0)),
            hook_failures=MappingProxyType(dict(hooks) if isinstance(hooks, dict) else {}),
            hook_slow_calls=MappingProxyType(dict(slow) if isinstance(slow, dict) else {}),
            dispatch_failures=MappingProxyType(dict(self._b.dispatch_failures)),
        )

    def collector(self) -> CollectorStats:
        """What CPython's cycle collector cost this process: collections, pauses (total and
        longest) per generation, and the objects frozen out of its reach (plugbroker.heap)."""
        return collector_stats()

    def resources(self) -> ResourceInfo:
        """The figures of the last memory and disk checks, and the process' RSS now."""
        m = self._b.monitor
        return ResourceInfo(
            m.memory_used_last,
            m.high_watermark,
            m.low_watermark,
            rss_bytes(),
            m.disk_free_last,
            m.disk_free_limit,
        )

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result (from another thread;
        on the loop it runs at once). Raises once the loop has stopped."""
        return self._b.call_on_loop(fn, *args)

    def authenticate(self, user: str, password: str, peer_host: str | None = None) -> bool:
        """Whether ``user`` with ``password`` may log in (from ``peer_host``, an IP address as
        the socket gives it: a loopback-only user is refused from any other; None skips that
        rule). The password is compared in constant time."""
        return self._b.authenticate(user, password, peer_host)

    def login_refusal(self, user: str, password: str, peer_host: str | None = None) -> str | None:
        """Why ``user`` may not log in with ``password`` from ``peer_host`` (for the log only;
        a client is told no more than "refused"), or None when it may."""
        return self._b.login_refusal(user, password, peer_host)

    # -- login throttling (shared by every door: AMQP, the admin API) -------------------------

    def login_judge(self, user: str, peer_host: str, ok: bool) -> tuple[str, float]:
        """What to do with a login of ``user`` from ``peer_host`` whose credentials were right
        (``ok``) or not, by the broker's login throttle (the rule AMQP logins follow):
        ``("accept", 0)``, ``("refuse", delay)`` or ``("turn-away", 0)``; see
        :meth:`plugbroker.guard.LoginThrottle.judge`. Counts a failure."""
        return self._b.login_throttle.judge(user, peer_host, ok)

    def login_next_delay(self, peer_host: str, user: str = "") -> float:
        """The delay the next failed login of ``user`` from ``peer_host`` would get (for a
        ``Retry-After``)."""
        return self._b.login_throttle.next_delay(peer_host, user)

    async def login_refusal_delay(self, peer_host: str, delay: float) -> None:
        """Wait ``delay`` seconds on the broker's timers (its clock) while the refusal counts
        as pending for ``peer_host`` (see :meth:`login_judge`); the loop serves everything
        else meanwhile. Cancelling the waiting task (the client went away) ends it early."""
        throttle = self._b.login_throttle
        timers = self._b.timers
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = timers.call_later(delay, done)
        throttle.hold(peer_host)
        try:
            await fut
        finally:
            timers.cancel(handle)
            throttle.release(peer_host)

    def user(self, name: str) -> UserInfo | None:
        """The configured user ``name`` (tags, permissions, loopback rule), or None."""
        u = self._b.config.users.get(name)
        if u is None:
            return None
        return UserInfo(
            u.name,
            u.tags,
            MappingProxyType(
                {
                    vh: VhostPermission(p.configure, p.write, p.read)
                    for vh, p in u.permissions.items()
                }
            ),
            u.loopback_only,
        )

    # -- reads ----------------------------------------------------------------------------------

    def vhosts(self) -> tuple[str, ...]:
        return tuple(self._b.vhosts)

    def queues(self, vhost: str | None = None) -> list[QueueInfo]:
        return [_queue_info(q) for q in self._queues(vhost)]

    def queue_names(self, vhost: str) -> list[str]:
        """The names of a vhost's queues in declaration order: one list copy, no view built
        (a listing then reads :meth:`queue` a bounded chunk at a time)."""
        vh = self._b.vhosts.get(vhost)
        return list(vh.queues) if vh is not None else []

    def queue(self, vhost: str, name: str) -> QueueInfo | None:
        q = self._find_queue(vhost, name)
        return _queue_info(q) if q is not None else None

    def has_queue(self, vhost: str, name: str) -> bool:
        return self._find_queue(vhost, name) is not None

    def queue_policy(self, vhost: str, name: str) -> Mapping[str, object] | None:
        """The resolved policy sections of a queue (None if there is no such queue). O(1): the
        decision hooks call it per message."""
        vh = self._b.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        return q.policy if q is not None else None

    def exchange(self, vhost: str, name: str) -> ExchangeInfo | None:
        vh = self._b.vhosts.get(vhost)
        ex = vh.exchanges.get(name) if vh is not None else None
        if ex is None:
            return None
        inner = getattr(ex, "inner", None)
        return ExchangeInfo(
            vhost,
            ex.name,
            ex.type,
            inner.type if inner is not None else ex.type,
            ex.durable,
            ex.auto_delete,
            ex.internal,
        )

    def consumers(
        self, vhost: str | None = None, queue: str | None = None, *, isolated_only: bool = False
    ) -> list[ConsumerInfo]:
        if vhost is not None and queue is not None:
            qs = _opt(self._find_queue(vhost, queue))  # O(1): a listing asks queue by queue
        else:
            qs = [q for q in self._queues(vhost) if queue is None or q.name == queue]
        return [
            _consumer_info(q, c) for q in qs for c in q.consumers if c.isolated or not isolated_only
        ]

    def consumer(
        self, vhost: str, queue: str, tag: str, connection_id: str = ""
    ) -> ConsumerInfo | None:
        q = self._find_queue(vhost, queue)
        c = _find_consumer(q, tag, connection_id) if q is not None else None
        return _consumer_info(q, c) if q is not None and c is not None else None

    def connections(self) -> list[ConnectionInfo]:
        return [
            ConnectionInfo(
                c.id,
                c.peer,
                c.user,
                c.vhost.name if c.vhost is not None else None,
                len(c.channels),
                c.heartbeat,
                c.blocked,
                not c.writable,
                c.codec.partial_bytes,
                c.unsent_bytes(),
            )
            for c in self._b.connections.values()
        ]

    def limits(self) -> LimitsInfo:
        b = self._b
        lim = b.config.limits
        throttle = b.login_throttle
        return LimitsInfo(
            max_connections=lim.max_connections,
            max_connections_per_user=lim.max_connections_per_user,
            max_queues_per_vhost=lim.max_queues_per_vhost,
            channel_max=b.limits.channel_max,
            open_connections=b.open_connections,
            user_connections=dict(b.user_connections),
            vhost_queues={name: len(vh.queues) for name, vh in b.vhosts.items()},
            refusals=dict(b.refusals),
            login_failures=throttle.failures_total,
            login_throttled=throttle.throttled_total,
            login_throttled_peers=throttle.peers(),
            login_turned_away=throttle.turned_away_total,
            accept_failures=sum(a.failures_total for a in b.acceptors),
            accept_backing_off=any(a.backing_off for a in b.acceptors),
        )

    def channels(self, connection_id: str | None = None) -> list[ChannelInfo]:
        conns: Iterable[Connection] = (
            self._b.connections.values()
            if connection_id is None
            else _opt(self._b.connections.get(connection_id))
        )
        return [
            ChannelInfo(
                conn.id,
                ch.id,
                tuple(ch.consumers),
                len(ch.unacked),
                ch.prefetch_consumer,
                ch.prefetch_global,
                ch.confirm,
                ch.tx,
                ch.flow,
            )
            for conn in conns
            for ch in conn.channels.values()
        ]

    def deliveries(self) -> list[DeliveryInfo]:
        """Every delivery waiting for an ack, channel by channel (O(unacked messages))."""
        return [
            DeliveryInfo(
                q.vhost.name,
                q.name,
                c.tag if c is not None else None,
                conn.id,
                ch.id,
                tag,
                _message_info(m),
            )
            for conn in self._b.connections.values()
            for ch in conn.channels.values()
            for tag, (m, q, c) in ch.unacked.items()
        ]

    def messages(
        self, vhost: str, queue: str, *, limit: int | None = None, ready_only: bool = True
    ) -> list[MessageInfo]:
        """The messages of a queue, oldest first: the ready ones (a peek), or with
        ``ready_only=False`` every one it holds. O(limit), or O(messages) without a limit.

        :raises NotFound: no such queue.
        """
        q = self._queue(vhost, queue)
        source: Iterable[Message] = q.ready if ready_only else list(q.held.values())
        out: list[MessageInfo] = []
        for m in source:
            if limit is not None and len(out) >= limit:
                break
            out.append(_message_info(m))
        return out

    def dead_letters(self, vhost: str | None = None) -> list[DeadLetterInfo]:
        """Every dead-letter queue: each queue whose oldest message is a dead letter from
        another queue (its last ``x-death`` record names another queue: a message redriven
        back to where it died does not count), and each that received dead letters since the
        start (or was marked a dead-letter target). What it holds is counted from its messages:
        O(queues + messages of dead-letter queues)."""
        out = []
        vhs = self._b.vhosts.values() if vhost is None else _opt(self._b.vhosts.get(vhost))
        for vh in vhs:
            names = set(vh.dead_letter_queues)
            for q in vh.queues.values():
                if q.dead_letter_target and q.retry_target is None:
                    names.add(q.name)
                elif q.held and q.retry_target is None:
                    head = next(iter(q.held.values()))
                    if head._hoff >= 0 and _died_elsewhere(head.headers.get("x-death"), q.name):
                        names.add(q.name)
            for name in sorted(names):
                q = vh.queues.get(name)
                by_reason: dict[str, int] = {}
                sources: dict[str, int] = {}
                for m in q.held.values() if q is not None else ():
                    reason = fate.death_reason_of(m) or "unknown"
                    by_reason[reason] = by_reason.get(reason, 0) + 1
                    origin = fate.original_queue_of(m) or "unknown"
                    sources[origin] = sources.get(origin, 0) + 1
                out.append(
                    DeadLetterInfo(
                        vh.name,
                        name,
                        len(q.held) if q is not None else 0,
                        dict(vh.dead_letter_queues.get(name, {})),
                        by_reason,
                        sources,
                    )
                )
        return out

    def delayed_pending(self, vhost: str | None = None) -> int:
        """Messages held by delayed (``x-delayed-message``) exchanges."""
        vhs = self._b.vhosts.values() if vhost is None else _opt(self._b.vhosts.get(vhost))
        return sum(vh.delayed_pending for vh in vhs)

    def policy_action_counts(self) -> Mapping[tuple[str, str], int]:
        """Policy actions applied since start, by ``(policy, outcome)``."""
        return dict(self._b.action_counts)

    def plugin_names(self) -> tuple[str, ...]:
        names = getattr(self._b.hooks, "names", None)
        return tuple(names()) if callable(names) else ()

    def snapshot(self, vhost: str | None = None, section: str | None = None) -> Snapshot:
        """Every queue's running figures and consumers as a policy :class:`Snapshot`:
        O(queues + consumers). With ``section``, only queues whose resolved policy has it."""
        return self._b.snapshot(vhost, section)

    # -- commands -------------------------------------------------------------------------------

    def declare_queue(
        self,
        vhost: str,
        name: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        limited: bool = False,
    ) -> QueueInfo:
        """Declare a queue (or find the existing one) as a client's queue.declare would.

        :param limited: refuse it past ``<limits><maxQueuesPerVhost>`` as a client's declare
            is (the admin API's declares); without, the broker's own queues (a plugin's
            dead-letter queue) are made whatever the limit, and count against it.
        :raises NotFound: no such vhost.
        :raises plugbroker.errors.ChannelError: arguments that a client would be refused for,
            a different declaration of an existing queue, or (``limited``) the queue limit
            (406 ``PRECONDITION_FAILED``).
        """
        problem = name_problem(name)
        if problem:
            raise ChannelError(PRECONDITION_FAILED, f"queue name {name!r} {problem}", QUEUE_DECLARE)
        vh = self._vhost(vhost)
        if limited:
            self._b.check_queue_limit(vh, name, new=name not in vh.queues)
        q, _ = vh.declare_queue(
            name, durable=durable, auto_delete=auto_delete, arguments=dict(arguments or {})
        )
        return _queue_info(q)

    def delete_queue(self, vhost: str, name: str, *, reason: str, detail: str = "") -> int:
        """Delete a queue: its consumers are cancelled (``basic.cancel`` to clients that listen
        for it), its messages released. Returns how many were ready (queue.delete-ok's count).

        :raises NotFound: no such queue.
        """
        q = self._queue(vhost, name)
        return q.vhost.delete_queue(q, reason=reason, detail=detail)

    def purge_queue(self, vhost: str, name: str) -> int:
        """Drop the ready messages of a queue; returns how many.

        :raises NotFound: no such queue.
        """
        return fate.purge(self._queue(vhost, name))

    # -- the same for queues of millions: bounded work per loop turn -----------------------------

    async def purge_queue_in_steps(self, vhost: str, name: str) -> int:
        """:meth:`purge_queue` for a queue that may hold millions: the ready list is emptied
        at once (one purge, at one instant), and the messages are let go
        :data:`~plugbroker.domain.fate.STEP_MESSAGES` per loop turn, so other connections are
        served meanwhile; returns when all are. Cancelling the caller does not stop it.

        :raises NotFound: no such queue.
        """
        n, steps = fate.purge_in_steps(self._queue(vhost, name))
        await self._in_steps(steps)
        return n

    async def delete_queue_in_steps(
        self, vhost: str, name: str, *, reason: str, detail: str = ""
    ) -> int:
        """:meth:`delete_queue` for a queue that may hold millions: the queue is deleted at
        once, its messages freed a step per loop turn; returns when all are.

        :raises NotFound: no such queue.
        """
        q = self._queue(vhost, name)
        held: list[dict[int, Message]] = []
        n = q.vhost.delete_queue(q, reason=reason, detail=detail, keep=held)
        for msgs in held:
            await self._in_steps(fate.let_go_in_steps(msgs))
        return n

    async def redrive_in_steps(
        self,
        vhost: str,
        queue: str,
        *,
        limit: int | None = None,
        reasons: Iterable[str] | None = None,
        reset: bool = True,
        dry_run: bool = False,
        allowed: Callable[[str], bool] | None = None,
    ) -> RedriveResult:
        """:meth:`redrive` without a rate, for a dead-letter queue that may hold millions: the
        messages ready when it starts are looked at a step per loop turn
        (:class:`~plugbroker.domain.fate.StepwiseRedrive`); returns when all are.

        :raises NotFound: no such queue.
        """
        q = self._queue(vhost, queue)
        run = fate.StepwiseRedrive(
            q,
            limit=limit,
            reasons=frozenset(reasons) if reasons else None,
            reset=reset,
            dry_run=dry_run,
            allowed=allowed,
        )
        await self._in_steps(run.steps())
        moved = {} if dry_run else dict(run.moved)
        return RedriveResult(moved, run.kept, dict(run.planned), 0, dry_run, dict(run.refused))

    def user_permission(self, user: str, vhost: str) -> Permission | None:
        """``user``'s compiled configure/write/read patterns on ``vhost`` (None: no access),
        for a door that checks them as the session does (:mod:`plugbroker.authz`)."""
        return self._b.user_permission(user, vhost)

    async def _in_steps(self, steps: Iterator[None]) -> None:
        """Run ``steps`` one per loop turn in a task of its own, so that a cancelled caller
        (an admin client that went away) leaves no half-done work; wait for it."""

        async def run() -> None:
            for _ in steps:
                await asyncio.sleep(0)  # a turn for everyone else
            self._b.end_of_turn()

        task = asyncio.ensure_future(run())
        self._stepping.add(task)
        task.add_done_callback(self._stepping.discard)
        await asyncio.shield(task)

    def close_channel(self, connection_id: str, channel_id: int, code: int, text: str) -> bool:
        """Close one channel from the broker's side (its connection stays open). False if there
        is no such open channel."""
        conn = self._b.connections.get(connection_id)
        ch = conn.channels.get(channel_id) if conn is not None else None
        if conn is None or ch is None or ch.closing:
            return False
        conn.close_channel(ch, code, text)
        return True

    def close_connection(self, connection_id: str, text: str, code: int = 320) -> bool:
        """Close a connection: ``connection.close`` with ``code`` and ``text``; with the default
        code, 320 ``CONNECTION_FORCED - text`` (as RabbitMQ's operator close). False if there is
        no such connection."""
        conn = self._b.connections.get(connection_id)
        if conn is None:
            return False
        if code == 320:
            conn.force_close(text)
        else:
            conn.close(code, text)
        return True

    def reauthorize(self, connection_id: str) -> bool:
        """Give a connection its user's patterns on its vhost from the configuration in effect
        (after a reload); what it checked before is forgotten. False if there is no such open
        connection."""
        conn = self._b.connections.get(connection_id)
        if conn is None or conn.vhost is None:
            return False
        conn.set_permission(self._b.user_permission(conn.user, conn.vhost.name))
        conn.impersonator = self._b.user_tags(conn.user).impersonator
        return True

    def queue_channels(self, vhost: str, queue: str) -> list[tuple[str, int]]:
        """``(connection_id, channel_id)`` of every open channel that consumes from the queue or
        polled it with basic.get."""
        q = self._find_queue(vhost, queue)
        if q is None:
            return []
        out: dict[tuple[str, int], None] = {}
        for c in q.consumers:
            out[(c.channel.connection_id, c.channel.id)] = None
        for conn_id, ch_id in q.getters:
            conn = self._b.connections.get(conn_id)
            if conn is not None and ch_id in conn.channels:
                out[(conn_id, ch_id)] = None
        return list(out)

    def cancel_consumer(self, vhost: str, queue: str, tag: str, connection_id: str = "") -> bool:
        """Cancel a consumer with a broker-sent ``basic.cancel``; its channel stays open."""
        c = self._consumer(vhost, queue, tag, connection_id)
        if c is None:
            return False
        c.queue.remove_consumer(c)
        c.channel.consumer_cancelled_by_broker(c)
        return True

    def set_prefetch(
        self, vhost: str, queue: str, tag: str, connection_id: str, prefetch: int
    ) -> bool:
        """Set one consumer's prefetch window (0: unlimited, within the unacked cap)."""
        c = self._consumer(vhost, queue, tag, connection_id)
        if c is None:
            return False
        c.prefetch = prefetch
        c.queue.vhost.mark_dirty(c.queue)
        return True

    def isolate(
        self,
        vhost: str,
        queue: str,
        tag: str,
        connection_id: str = "",
        *,
        timeout: float | None = None,
    ) -> int | None:
        """Blocklist a consumer and requeue its unacked messages to the others; returns how
        many moved (0 if it was isolated already, or if the delivery it works on was
        dead-lettered as poison instead), None if there is no such consumer. With ``timeout``
        (the ack timeout it is over), the delivery it works on first counts a timed-out
        hand-out (see :meth:`count_timeout`)."""
        c = self._consumer(vhost, queue, tag, connection_id)
        if c is None:
            return None
        return fate.isolate(c, self._b.clock.monotonic(), timeout)

    def mark_dead_letter_target(self, vhost: str, queue: str, why: str) -> bool:
        """Know ``queue`` as a dead-letter or retry target from now on (``why`` says who names
        it so, for the log): no policy action deletes it, slow-consumer sections under
        ``<virtualhost>`` and ``<topic>`` stop reaching it, and a durable queue keeps the mark
        across restarts. False if there is no such queue."""
        q = self._find_queue(vhost, queue)
        if q is None:
            return False
        if not q.dead_letter_target:
            q.vhost.mark_dead_letter_target(q)
            log.info(
                "queue '%s' in vhost '%s' is a dead-letter target (%s): no policy deletes it",
                queue,
                vhost,
                why,
            )
        return True

    def count_timeout(
        self, vhost: str, queue: str, tag: str, connection_id: str = "", *, timeout: float
    ) -> tuple[int, int, bool] | None:
        """A consumer is over its ack timeout (``timeout`` seconds) and keeps its deliveries
        (the cap spared it): the delivery it works on counts one more timed-out hand-out, at
        most once per ``timeout``; at the queue's ``<poisonDeliveries>`` the message is
        dead-lettered as poison and the consumer keeps the rest. Returns ``(message id, its
        count, dead-lettered)``, None when nothing counted (no such consumer, nothing due, or
        counted less than ``timeout`` ago)."""
        c = self._consumer(vhost, queue, tag, connection_id)
        if c is None:
            return None
        now = self._b.clock.monotonic()
        m = fate.count_timeout(c, now, timeout)
        if m is None:
            return None
        poison = fate.is_poison(c.queue, m)
        if poison:
            fate.expel_poison(c.queue, m, c, now)
        return m.id, m.timeouts, poison

    def release(
        self, vhost: str, queue: str, tag: str, connection_id: str = "", *, reason: str
    ) -> bool:
        """Take a consumer off the blocklist. False if there is no such consumer."""
        c = self._consumer(vhost, queue, tag, connection_id)
        if c is None:
            return False
        fate.release(c, reason)
        return True

    def redrive(
        self,
        vhost: str,
        queue: str,
        *,
        limit: int | None = None,
        reasons: Iterable[str] | None = None,
        reset: bool = True,
        dry_run: bool = False,
        rate: float | None = None,
        allowed: Callable[[str], bool] | None = None,
    ) -> RedriveResult:
        """Move the ready messages of a dead-letter queue back to the queue each came from
        (``REAL_TOPIC``, else its last ``x-death`` queue), as new messages. Messages whose
        origin is unknown, gone or full stay.

        :param limit: move at most this many.
        :param reasons: only dead letters whose last death reason (``x-death``) is one of these.
        :param reset: start them again: delivery count 0 and no ``RECONSUMETIMES`` (else both
            are kept, and a message that used up its retries dies again at once).
        :param dry_run: only say what would move.
        :param rate: messages per second: the first batch moves now, the rest on the broker's
            timers (``pending`` says how many are left).
        :param allowed: whether the asker may write a queue (by name): a dead letter whose
            origin it may not write stays (``refused``); None: every origin may be written.
        :raises NotFound: no such queue.
        :raises ValueError: a rate that is not positive.
        """
        q = self._queue(vhost, queue)
        wanted = frozenset(reasons) if reasons else None
        plan = fate.plan_redrive(q, limit=limit, reasons=wanted, allowed=allowed)
        planned: dict[str, int] = {}
        for _m, target in plan.moves:
            planned[target.name] = planned.get(target.name, 0) + 1
        kept = plan.kept + plan.skipped
        refused = dict(plan.refused)
        if dry_run:
            return RedriveResult({}, kept, planned, 0, True, refused)
        if rate is not None:
            paced = fate.PacedRedrive(
                q, rate=rate, limit=len(plan.moves), reasons=wanted, reset=reset, allowed=allowed
            )
            if plan.moves:
                paced.start()
            done = sum(paced.moved.values()) + paced.kept
            return RedriveResult(
                dict(paced.moved), kept, planned, len(plan.moves) - done, refused=refused
            )
        moved, kept = fate.redrive(q, limit, reasons=wanted, reset=reset, allowed=allowed)
        return RedriveResult(moved, kept, planned, refused=refused)

    def apply_actions(self, actions: Sequence[Action], streaks: Streaks | None = None) -> list[str]:
        """Apply policy actions in order (see :mod:`plugbroker.core.actions`); one outcome each.
        ``streaks``: the job's repeated spared or deferred decisions, told once."""
        from plugbroker.core.actions import apply_actions

        return apply_actions(self, actions, streaks)

    def budget(self, vhost: str) -> Budget | None:
        """The blast-radius budget of ``vhost`` (``<blastRadius>``), or None when it has none."""
        vc = self._b.config.vhosts.get(vhost)
        br = vc.blast_radius if vc is not None else None
        if br is None:
            return self._b.budgets.get(vhost, None, None)
        return self._b.budgets.get(vhost, br.max_actions_per_minute, br.max_consumers_affected)

    def count_policy_action(self, action: Action, outcome: str) -> None:
        """Count an action's outcome (metrics) without telling the plugins (a repeat of a
        decision already reported: see :mod:`plugbroker.streaks`)."""
        counts = self._b.action_counts
        key = (action.policy, outcome)
        counts[key] = counts.get(key, 0) + 1

    def report_policy_action(self, action: Action, outcome: str) -> None:
        """Count an applied action (metrics) and tell the plugins (``broker_policy_action``)."""
        self.count_policy_action(action, outcome)
        h = self._b.hooks.policy_action
        if h is not None:
            h(action=action, outcome=outcome)

    def end_of_turn(self) -> None:
        """Dispatch what the commands made ready and write out pending output now."""
        self._b.end_of_turn()

    # -- plugins --------------------------------------------------------------------------------

    def register_plugin(self, plugin: object, name: str) -> None:
        """Register a hook implementation object with the running broker's plugin host (for a
        plugin that listens only while something is configured, like the journal)."""
        self._host("register")(plugin, name=name)

    def unregister_plugin(self, name: str) -> None:
        self._host("unregister")(name)

    def _host(self, method: str) -> Callable[..., Any]:
        fn: Callable[..., Any] | None = getattr(self._b.hooks, method, None)
        if fn is None:
            raise RuntimeError("this broker runs without a plugin host")
        return fn

    def backoff_factory(self, name: str) -> Callable[[dict[str, str]], Any]:
        """The factory a plugin registered for ``<backoff type="{name}">``.

        :raises plugbroker.registry.PluginError: nobody registered it.
        """
        registry = getattr(self._b.hooks, "registry", None)
        if registry is None:
            raise NotFound(f"backoff {name!r}: no plugin registry")
        factory: Callable[[dict[str, str]], Any] = registry.backoff(name)
        return factory

    # -- internals ------------------------------------------------------------------------------

    def _queues(self, vhost: str | None) -> list[Queue]:
        vhs = self._b.vhosts.values() if vhost is None else _opt(self._b.vhosts.get(vhost))
        return [q for vh in vhs for q in vh.queues.values()]

    def _find_queue(self, vhost: str, name: str) -> Queue | None:
        vh = self._b.vhosts.get(vhost)
        return vh.queues.get(name) if vh is not None else None

    def _vhost(self, vhost: str) -> Any:
        vh = self._b.vhosts.get(vhost)
        if vh is None:
            raise NotFound(f"no vhost '{vhost}'")
        return vh

    def _queue(self, vhost: str, name: str) -> Queue:
        q = self._find_queue(vhost, name)
        if q is None:
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'")
        return q

    def _consumer(self, vhost: str, queue: str, tag: str, connection_id: str) -> Consumer | None:
        q = self._find_queue(vhost, queue)
        return _find_consumer(q, tag, connection_id) if q is not None else None


# ------------------------------------------------------------------------------------- helpers


def _died_elsewhere(deaths: object, queue: str) -> bool:
    return (
        isinstance(deaths, list)
        and bool(deaths)
        and isinstance(deaths[0], dict)
        and deaths[0].get("queue") not in (None, queue)
    )


def _opt(x: Any) -> list[Any]:
    return [] if x is None else [x]


def _find_consumer(q: Queue, tag: str, connection_id: str) -> Consumer | None:
    for c in q.consumers:
        if c.tag == tag and (not connection_id or c.channel.connection_id == connection_id):
            return c
    return None


def _queue_info(q: Queue) -> QueueInfo:
    pol = q.policy
    source = getattr(pol, "source", None) or {}
    return QueueInfo(
        q.vhost.name,
        q.name,
        q.durable,
        q.auto_delete,
        q.exclusive_owner is not None,
        q.subscription_type,
        len(q.held),
        len(q.ready),
        q.unacked_count,
        q.delayed,
        q.bytes,
        q.oldest_counting(),
        q.acks_total,
        len(q.consumers),
        q.delivery_limit,
        q.retry_target,
        dict(q.arguments),
        tuple(q.bindings()),
        pol if pol else {},
        {name: str(source.get(name, "")) for name in pol} if pol else {},
        q.published_total,
        q.delivered_total,
        q.acked_total,
        q.redelivered_total,
        q.dead_lettered_total,
        q.dead_letter_target,
    )


def _consumer_info(q: Queue, c: Consumer) -> ConsumerInfo:
    return ConsumerInfo(
        q.vhost.name,
        q.name,
        c.tag,
        c.channel.connection_id,
        c.channel.id,
        c.unacked,
        c.prefetch,
        c.no_ack,
        c.exclusive,
        c.isolated,
        c.delivered_total,
        c.last_ack,
        c.first_delivery,
        c.busy_since,
        c.counted_at if c.counted else None,
    )


def _message_info(m: Message) -> MessageInfo:
    return MessageInfo(
        m.id,
        m.exchange,
        m.routing_key,
        m.body_size,
        m.delivery_count,
        m.redelivered,
        m.persistent,
        m.arrival,
        m.properties,
    )


__all__ = [
    "BrokerAPI",
    "ChannelInfo",
    "ConnectionInfo",
    "ConsumerInfo",
    "DeadLetterInfo",
    "DeliveryInfo",
    "ExchangeInfo",
    "LimitsInfo",
    "MessageInfo",
    "NotFound",
    "QueueInfo",
    "RedriveResult",
    "UserInfo",
    "VhostPermission",
]

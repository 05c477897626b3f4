"""The broker object: configuration, virtual hosts, plugins, timers, turn batching.

One :class:`Broker` owns everything that lives on the event loop. It is also the
``BrokerHandle`` the housekeeping pool talks to: :meth:`snapshot` and :meth:`apply_actions` run
on the loop (the pool's threads reach them through :meth:`call_on_loop`).

Work is batched per loop turn: queues that gained messages or capacity are marked dirty and
dispatched once at the end of the turn (:meth:`end_of_turn`), then every connection with
pending output is flushed with one write.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from plugbroker.alarms import MEMORY, STORE, Alarm, ResourceMonitor, blocked_reason
from plugbroker.authz import Tags
from plugbroker.budget import Budgets
from plugbroker.clock import Clock, SystemClock
from plugbroker.codec.ids import BASIC_CONSUME, CHANNEL_OPEN, QUEUE_DECLARE
from plugbroker.config.users import Permission, is_loopback
from plugbroker.core.access import revoke_lost_access
from plugbroker.core.api import BrokerAPI
from plugbroker.core.policyindex import BindingPolicyIndex
from plugbroker.domain.exchange import Binding, Exchange
from plugbroker.domain.message import MessageIds
from plugbroker.domain.queue import SHARED, Queue
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import NoHooks, VirtualHost
from plugbroker.errors import (
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
    ChannelError,
    ConnectionError_,
)
from plugbroker.guard import Acceptor, LoginThrottle
from plugbroker.policy import (
    Action,
    ConsumerView,
    QueueView,
    Snapshot,
)
from plugbroker.store import MemoryStore, Store

if TYPE_CHECKING:
    from plugbroker.config import BrokerConfig
    from plugbroker.config.model import VhostConfig
    from plugbroker.session import Connection
    from plugbroker.streaks import Streaks

log = logging.getLogger("broker")


#: how long the broker waits for connection.close-ok before dropping the socket
CLOSE_TIMEOUT = 1.0


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        hooks: Any = None,
        store: Store | None = None,
        name: str = "plugbroker",
    ) -> None:
        self.config = config
        self.name = name
        self.clock: Clock = clock or SystemClock()
        self.timers = Timers(self.clock)
        #: message ids of this broker (unique across its vhosts)
        self.ids = MessageIds()
        self.hooks = hooks if hooks is not None else NoHooks()
        self.store: Store = store if store is not None else MemoryStore()
        cl = config.limits
        # AMQP's channel_max 0 means "no specific limit": the protocol's own, 65535
        self.limits = cl if cl.channel_max else replace(cl, channel_max=65535)
        self.close_timeout = CLOSE_TIMEOUT
        self.connections: dict[str, Connection] = {}
        self._conn_seq = itertools.count(1)
        self._dirty: list[Queue] = []
        #: (vhost, queue) -> how many times its dispatch raised (logged the first time)
        self.dispatch_failures: dict[tuple[str, str], int] = {}
        self._flush: list[Connection] = []
        self._turn_scheduled = False
        #: set by the server to ``loop.call_soon``; None runs work at once (domain tests)
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the raised resource alarms by name (memory, disk, store)
        self.alarms: dict[str, Alarm] = {}
        #: what connection.blocked says while any alarm is raised (None: publishers run);
        #: a plain attribute, read on every publish
        self.alarm: str | None = None
        #: the virtual hosts the memory alarm blocks (None: every connection)
        self.memory_scope: frozenset[str] | None = None
        #: open channels per user, as last counted (:meth:`check_channel_limit`)
        self.user_channels: dict[str, int] = {}
        #: the listeners' accept loops (set by the server), for the admin view
        self.acceptors: list[Acceptor] = []
        #: delays the answer to failed logins, per peer address
        self.login_throttle = LoginThrottle(
            self.clock, cl.login_failure_delay, cl.login_failure_delay_max
        )
        #: connections past connection.open, in all and per user (the connection limits)
        self.open_connections = 0
        self.user_connections: dict[str, int] = {}
        #: refusals by the limit that caused them (maxConnections, channelMax, ...)
        self.refusals: dict[str, int] = {}
        #: policy actions applied, by (policy, outcome), for metrics
        self.action_counts: dict[tuple[str, str], int] = {}
        #: the blast-radius budget of each vhost (``<blastRadius>``), kept across reloads
        self.budgets = Budgets()
        self.vhosts: dict[str, VirtualHost] = {}
        for name_ in config.vhosts:
            self._add_vhost(name_)
        self._loop_thread: int | None = None
        #: the narrow door plugins, admin and journal use (views and commands)
        self.api = BrokerAPI(self)
        #: the memory and disk checks (started with the loop)
        self.monitor = ResourceMonitor(self)

    # ------------------------------------------------------------------ setup

    def _add_vhost(self, name: str) -> VirtualHost:
        vh = VirtualHost(
            name,
            clock=self.clock,
            timers=self.timers,
            hooks=self.hooks,
            store=self.store,
            mark_dirty=self.mark_dirty,
            ids=self.ids,
        )
        vh.on_topology_change = self.resolve_policy
        vh.on_binding_change = self.binding_changed
        vh.on_limit_refused = self.refused
        self._binding_limits(vh)
        self.vhosts[name] = vh
        vc = self.config.vhosts.get(name)
        if vc is not None:
            for ex in vc.exchanges:
                vh.declare_exchange(
                    ex.name,
                    ex.type,
                    durable=ex.durable,
                    auto_delete=ex.auto_delete,
                    arguments=dict(ex.arguments),
                )
            for qc in vc.queues.values():
                if getattr(qc, "declare", False):
                    vh.declare_queue(
                        qc.name, durable=bool(qc.durable), subscription_type=qc.subscription
                    )
        return vh

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run deferred work on ``loop``: turn batching and the single timer wake-up."""
        self.loop = loop
        self._loop_thread = threading.get_ident()
        self.store.bind_loop(loop)
        self._timer_handle: asyncio.TimerHandle | None = None
        self._timer_due: float | None = None
        self.timers.on_earliest_changed = self._arm_timer
        earliest = self.timers.earliest()
        if earliest is not None:
            self._arm_timer(earliest)
        self.monitor.start()

    def _arm_timer(self, due: float) -> None:
        loop = self.loop
        if loop is None:
            return
        if self._timer_due is not None and self._timer_due <= due:
            return
        if self._timer_handle is not None:
            self._timer_handle.cancel()
        self._timer_due = due
        delay = max(0.0, due - self.clock.monotonic())
        self._timer_handle = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer_handle = None
        self._timer_due = None
        self.open_turn()
        try:
            self.timers.run_due()
        finally:
            earliest = self.timers.earliest()
            if earliest is not None:
                self._arm_timer(earliest)
            self.end_of_turn()

    # ------------------------------------------------------------------ turn batching

    def call_soon(self, fn: Callable[[], None]) -> None:
        if self.loop is not None:
            self.loop.call_soon(fn)
        else:
            fn()

    def open_turn(self) -> None:
        """The caller is a loop callback that will call :meth:`end_of_turn` itself when done
        (``try: ... finally: broker.end_of_turn()``): the work it marks needs no loop callback
        of its own. Saves a callback and an extra poll of the selector per read."""
        self._turn_scheduled = True

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            if self.loop is not None:
                self.loop.call_soon(self.end_of_turn)

    def mark_dirty(self, q: Queue) -> None:
        self._dirty.append(q)
        self._schedule_turn()

    def want_flush(self, conn: Connection) -> None:
        self._flush.append(conn)
        self._schedule_turn()

    def end_of_turn(self) -> None:
        """Dispatch dirty queues, then write out every connection's pending output."""
        self._turn_scheduled = False
        dirty = self._dirty
        rounds = 0
        while dirty and rounds < 16:
            rounds += 1
            self._dirty = []
            for q in dirty:
                if q.dirty:
                    try:
                        q.dispatch()
                    except Exception:
                        self._dispatch_failed(q)
            dirty = self._dirty
        flush, self._flush = self._flush, []
        for conn in flush:
            try:
                conn.flush()
            except Exception:
                log.exception("connection %s: writing its output failed; dropping it", conn.id)
                conn.out.clear()
                conn.transport.close()  # connection_lost follows and cleans up
        if self._dirty or self._flush:
            self._schedule_turn()

    def _dispatch_failed(self, q: Queue) -> None:
        """A queue's dispatch raised: that queue waits for its next event (a publish, an ack, a
        new consumer), the other dirty queues of this turn are still dispatched. Logged with
        the traceback once per queue; later failures of the same queue are counted."""
        q.dirty = False
        key = (q.vhost.name, q.name)
        n = self.dispatch_failures.get(key, 0) + 1
        self.dispatch_failures[key] = n
        if n == 1:
            log.exception(
                "queue '%s' in vhost '%s': dispatch failed; other queues carry on (further "
                "failures of this queue are counted, not logged)",
                q.name,
                q.vhost.name,
            )

    # ------------------------------------------------------------------ connections

    def new_connection_id(self, peer: str) -> str:
        return f"{peer}#{next(self._conn_seq)}"

    def connection_opened(self, conn: Connection) -> None:
        self.connections[conn.id] = conn

    def connection_closed(self, conn: Connection) -> None:
        if self.connections.pop(conn.id, None) is not None:
            self.uncount_channels(conn)
            h = self.hooks.connection_closed
            if h is not None:
                h(connection_id=conn.id, code=0, text=conn.close_reason)

    def admit(self, user: str) -> str | None:
        """Count a connection of ``user`` that is being opened; or say why a limit refuses
        it (RabbitMQ's text, answered with 530 NOT_ALLOWED). :meth:`release` undoes it."""
        lim = self.config.limits
        if lim.max_connections and self.open_connections >= lim.max_connections:
            self.refused("maxConnections")
            return f"Connection refused: node connection limit ({lim.max_connections}) is reached"
        n = self.user_connections.get(user, 0)
        per_user = lim.max_connections_per_user
        if per_user and n >= per_user:
            self.refused("maxConnectionsPerUser")
            return (
                f"Connection refused for user '{user}': user connection limit ({per_user}) is "
                "reached"
            )
        self.open_connections += 1
        self.user_connections[user] = n + 1
        return None

    def release(self, user: str) -> None:
        """A connection :meth:`admit` counted is gone."""
        self.open_connections -= 1
        n = self.user_connections.get(user, 0) - 1
        if n > 0:
            self.user_connections[user] = n
        else:
            self.user_connections.pop(user, None)

    def refused(self, limit: str) -> None:
        """Count a refusal by ``limit`` (for the admin API and metrics)."""
        self.refusals[limit] = self.refusals.get(limit, 0) + 1

    def check_queue_limit(self, vh: VirtualHost, name: str, *, new: bool) -> None:
        """Refuse (406, counted) a declare that would make one more queue in ``vh`` past
        ``<limits><maxQueuesPerVhost>``. ``new``: the declare creates a queue (a server-named
        one, or a name the vhost does not hold). Every queue counts, those of the
        configuration file and the store's included; only declares by clients and by the
        admin API are refused."""
        max_queues = self.config.limits.max_queues_per_vhost
        if max_queues and new and len(vh.queues) >= max_queues:
            self.refused("maxQueuesPerVhost")
            raise ChannelError(
                PRECONDITION_FAILED,
                f"cannot declare queue '{name}': queue limit in vhost '{vh.name}' "
                f"({max_queues}) is reached",
                QUEUE_DECLARE,
            )

    def check_channel_limit(self, conn: Connection) -> None:
        """Refuse (530, counted) a channel.open past ``<limits><maxChannelsPerUser>``: the
        user's channels over all its connections, counted as each connection opens one
        (:attr:`Connection.channels_counted`) and recounted exactly before refusing."""
        limit = self.config.limits.max_channels_per_user
        if not limit:
            return
        user = conn.user
        counts = self.user_channels
        n = counts.get(user, 0) + len(conn.channels) - conn.channels_counted
        if n >= limit:  # what closed channels left behind is counted again
            n = sum(len(c.channels) for c in self.connections.values() if c.user == user)
            for c in self.connections.values():
                if c.user == user:
                    c.channels_counted = len(c.channels)
        conn.channels_counted = len(conn.channels)
        counts[user] = n
        if n >= limit:
            self.refused("maxChannelsPerUser")
            raise ConnectionError_(
                NOT_ALLOWED,
                f"number of channels opened for user '{user}' has reached the maximum allowed "
                f"user limit of ({limit})",
                CHANNEL_OPEN,
            )
        counts[user] = n + 1  # the channel being opened
        conn.channels_counted += 1

    def uncount_channels(self, conn: Connection) -> None:
        """``conn`` is gone: its channels no longer count for its user."""
        n = self.user_channels.get(conn.user, 0) - conn.channels_counted
        conn.channels_counted = 0
        if n > 0:
            self.user_channels[conn.user] = n
        else:
            self.user_channels.pop(conn.user, None)

    def check_consumer_limits(self, vh: VirtualHost, consumers: int) -> None:
        """Refuse (530, counted, as RabbitMQ's ``consumer_max_per_channel``) a basic.consume
        on a channel holding ``consumers`` past ``<limits><maxConsumersPerChannel>``, or in a
        vhost past ``<maxConsumersPerVhost>``."""
        lim = self.config.limits
        if lim.max_consumers_per_channel and consumers >= lim.max_consumers_per_channel:
            self.refused("maxConsumersPerChannel")
            text = f"reached maximum ({lim.max_consumers_per_channel}) of consumers per channel"
        elif lim.max_consumers_per_vhost and vh.consumer_count >= lim.max_consumers_per_vhost:
            self.refused("maxConsumersPerVhost")
            text = (
                f"reached maximum ({lim.max_consumers_per_vhost}) of consumers in vhost '{vh.name}'"
            )
        else:
            return
        raise ConnectionError_(NOT_ALLOWED, text, BASIC_CONSUME)

    def _binding_limits(self, vh: VirtualHost) -> None:
        """Give ``vh`` the ``<limits>`` on bindings (they follow a reload)."""
        lim = self.config.limits
        vh.max_bindings_per_exchange = lim.max_bindings_per_exchange
        vh.max_bindings_per_vhost = lim.max_bindings_per_vhost

    def authenticate(self, user: str, password: str, peer_host: str | None = None) -> bool:
        return self.login_refusal(user, password, peer_host) is None

    def login_refusal(self, user: str, password: str, peer_host: str | None = None) -> str | None:
        """Why ``user`` may not log in with ``password`` from ``peer_host`` (None: it may).

        The reason is for the log only; the client is told no more than "refused", as by
        RabbitMQ. ``peer_host`` None (an in-process caller) skips the loopback rule.
        """
        u = self.config.users.get(user)
        if u is None:
            return f"user '{user}' - invalid credentials"
        if u.loopback_only and peer_host is not None and not is_loopback(peer_host):
            return f"user '{user}' can only connect via localhost"
        if not u.check_password(password):
            return f"user '{user}' - invalid credentials"
        return None

    def external_login_refusal(self, user: str, peer_host: str | None = None) -> str | None:
        """Why ``user``, the CN of a verified client certificate (EXTERNAL), may not log in
        (None: it may). The certificate stands for the password; the rest is as for a login."""
        u = self.config.users.get(user)
        if u is None:
            return f"user '{user}' (the client certificate's CN) is not a configured user"
        if u.loopback_only and peer_host is not None and not is_loopback(peer_host):
            return f"user '{user}' can only connect via localhost"
        return None

    def may_access(self, user: str, vhost: str) -> bool:
        u = self.config.users.get(user)
        return u is not None and vhost in u.vhosts

    def user_permission(self, user: str, vhost: str) -> Permission | None:
        """``user``'s configure/write/read patterns on ``vhost`` (None: no access)."""
        u = self.config.users.get(user)
        return u.permission(vhost) if u is not None else None

    def user_tags(self, user: str) -> Tags:
        """``user``'s management tags (none for an unknown user)."""
        u = self.config.users.get(user)
        return Tags(u.tags if u is not None else frozenset())

    def set_alarm(self, reason: str | None) -> None:
        """The store's alarm (``Store.attach``): raised with ``reason`` or cleared (None)."""
        if reason is None:
            self.clear_alarm(STORE, "store writes succeed again")
        else:
            self.raise_alarm(STORE, reason)

    def raise_alarm(self, name: str, detail: str, vhosts: frozenset[str] | None = None) -> None:
        """Raise the ``name`` alarm (memory, disk, store): publishers are blocked meanwhile.
        ``vhosts``: the memory alarm blocks only the connections of these virtual hosts (None:
        every connection). Raising it again updates its detail and widens what it blocks."""
        old = self.alarms.get(name)
        if old is not None:
            if old.detail != detail:
                self.alarms[name] = Alarm(name, detail, old.since)
            if name == MEMORY and self.memory_scope is not None:
                wider = None if vhosts is None else self.memory_scope | vhosts
                if wider != self.memory_scope:
                    self.memory_scope = wider
                    log.warning(
                        "memory alarm now blocks %s",
                        "every connection" if wider is None else "vhosts " + ", ".join(wider),
                    )
                    self._alarms_changed()
            return
        if name == MEMORY:
            self.memory_scope = vhosts
        self.alarms[name] = Alarm(name, detail, self.clock.time())
        log.warning("resource alarm raised: %s: %s", name, detail)
        self._alarms_changed()
        hook = self.hooks.alarm_changed
        if hook is not None:
            hook(name=name, raised=True, detail=detail)

    def clear_alarm(self, name: str, detail: str = "") -> None:
        if self.alarms.pop(name, None) is None:
            return
        log.warning("resource alarm cleared: %s%s", name, f": {detail}" if detail else "")
        self._alarms_changed()
        hook = self.hooks.alarm_changed
        if hook is not None:
            hook(name=name, raised=False, detail=detail)

    def _alarms_changed(self) -> None:
        reason = self.alarm = blocked_reason(self.alarms)
        if reason is None:
            self.memory_scope = None
            log.warning("publishers unblocked: no resource alarm is raised")
        for conn in list(self.connections.values()):
            conn.set_blocked(self.blocking_reason(conn))

    def blocking_reason(self, conn: Connection) -> str | None:
        """What the raised alarms block ``conn`` for (None: nothing). The disk and store alarms
        block every connection; the memory alarm those of :attr:`memory_scope`."""
        reason = self.alarm
        scope = self.memory_scope
        if reason is None or scope is None or len(self.alarms) > 1 or MEMORY not in self.alarms:
            return reason
        vh = conn.vhost
        return reason if vh is not None and vh.name in scope else None

    def check_stalled_bodies(self) -> None:
        """Close the connections that have sat in the middle of a message body, sending
        nothing more, for ``<bodyStallTimeout>`` (O(connections); run by the monitor)."""
        timeout = self.limits.body_stall_timeout
        now = self.clock.monotonic()
        for conn in list(self.connections.values()):
            conn.check_body_stall(now, timeout)

    # ------------------------------------------------------------------ policy resolution

    def configured_subscription(self, vhost: str, queue: str) -> str | None:
        vc = self.config.vhosts.get(vhost)
        if vc is None:
            return None
        qc = vc.queues.get(queue)
        return qc.subscription if qc is not None else None

    def resolve_policy(self, q: Queue) -> None:
        """(Re)compute the policy sections that apply to ``q`` from its name and bindings.

        Called on every topology change that can alter the answer: the queue's declaration, a
        dead-letter route to it appearing or going, its first dead letter, a reload. What the
        bindings contribute is kept in a :class:`BindingPolicyIndex` (built in
        O(topics x bindings of the queue) under a new configuration, reused otherwise); a
        binding made or removed goes through :meth:`binding_changed` instead.
        """
        vh = q.vhost
        vc = self.config.vhosts.get(vh.name)
        if vc is None:
            vh.policy_indexes.pop(q.name, None)
            q.policy = {}
            return
        dead_letter_target = vh.is_dead_letter_target(q)
        if dead_letter_target and not q.dead_letter_target:
            # named as one by a queue argument (a dead-letter route reaches it) or a retry
            # queue: known as one from now on, across restarts
            q.dead_letter_target = True
            vh.save_mark(q)
        index = vh.policy_indexes.get(q.name)
        if index is None or not index.holds(q, vc):
            bindings = [
                (b.source.name, _effective_type(b.source), b.routing_key) for b in q.bound.values()
            ]
            index = BindingPolicyIndex(q, vc, bindings, dead_letter_target)
            vh.policy_indexes[q.name] = index
        index.dead_letter_target = dead_letter_target
        self._apply_policy(q, vc, index)

    def binding_changed(self, q: Queue, b: Binding, added: bool) -> None:
        """A binding to ``q`` was made (``added``) or removed: update what its bindings
        contribute to its policy in O(topics), and resolve the policy again only when that
        changed (a ``<topic>`` starts or stops matching, the queue becomes or stops being a
        topic subscription or a dead-letter target)."""
        vh = q.vhost
        vc = self.config.vhosts.get(vh.name)
        index = vh.policy_indexes.get(q.name)
        if vc is None or index is None or not index.holds(q, vc):
            self.resolve_policy(q)
            return
        src = b.source
        changed = index.count(src.name, _effective_type(src), b.routing_key, 1 if added else -1)
        dead_letter_target = index.dead_letter_target
        if added:
            dead_letter_target = dead_letter_target or vh.binding_reaches_dead_letters(b)
            if dead_letter_target and not q.dead_letter_target:
                q.dead_letter_target = True  # a dead-letter route reaches it: for good
                vh.save_mark(q)
        elif dead_letter_target and vh.binding_reaches_dead_letters(b):
            dead_letter_target = vh.is_dead_letter_target(q)
        if dead_letter_target != index.dead_letter_target:
            index.dead_letter_target = dead_letter_target
            changed = True
        if changed:
            self._apply_policy(q, vc, index)

    def _apply_policy(self, q: Queue, vc: VhostConfig, index: BindingPolicyIndex) -> None:
        """Put the policy ``index`` gives under ``vc`` in effect on ``q``."""
        q.policy = vc.resolve_matched(
            q.name,
            index.matching(),
            topic_bound=index.topic_bindings > 0,
            dead_letter_target=index.dead_letter_target,
        )
        q.view_static = None
        limit = None
        hl = self.hooks.delivery_limit
        if hl is not None:
            limit = hl(vhost=q.vhost.name, queue=q.name)
        q.delivery_limit = limit if limit is not None else q.delivery_limit_arg
        iso = q.policy.get("isolation") if hasattr(q.policy, "get") else None
        poison = getattr(iso, "poison_deliveries", None)
        q.poison_deliveries = poison if poison and q.subscription_type == SHARED else None
        shared_iso = iso is not None and q.subscription_type == SHARED
        timeout = getattr(iso, "ack_timeout", None) if shared_iso else None
        q.ack_timeout_ms = max(round(timeout * 1000), 1) if timeout else 0
        eta = getattr(iso, "eta_headers", ()) if shared_iso else ()
        q.eta_headers = tuple(eta) if eta else ()
        cap = getattr(iso, "max_unacked_per_consumer", None)
        if cap:
            q.max_unacked_per_consumer = cap
            for c in q.consumers:
                c.max_unacked = cap

    def resolve_all(self) -> None:
        """Resolve every queue's policy again (after plugins started: queues declared from the
        configuration or recovered from the store existed before any plugin saw the broker)."""
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                self.resolve_policy(q)

    def reload(self, config: BrokerConfig) -> None:
        """Apply a new (already validated) configuration to the running queues, and close
        what users lost (:mod:`plugbroker.core.access`)."""
        old, self.config = self.config, config
        for line in revoke_lost_access(self.api, old, config):
            log.warning("reload: closed %s", line)
        for vh in self.vhosts.values():
            self._binding_limits(vh)
        self.resolve_all()
        for name in config.vhosts:
            if name not in self.vhosts:
                self._add_vhost(name)
        h = self.hooks.config_reloaded
        if h is not None:
            h(broker=self.api, config=config)

    # ------------------------------------------------------------------ snapshot / actions

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the loop and return its result (called from pool threads)."""
        loop = self.loop
        if loop is None or threading.get_ident() == self._loop_thread:
            return fn(*args)
        if loop.is_closed() or not loop.is_running():
            raise RuntimeError("the broker's event loop is not running")

        async def run() -> Any:
            try:
                return fn(*args)
            finally:
                self.end_of_turn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=30)

    def snapshot(self, vhost: str | None = None, section: str | None = None) -> Snapshot:
        """Every queue's running figures and consumers: O(queues + consumers).

        :param section: only queues whose resolved policy has this section (e.g. ``"consumer"``).
        """
        views = []
        view = self.queue_view
        vhosts = [self.vhosts[vhost]] if vhost is not None else list(self.vhosts.values())
        for vh in vhosts:
            for q in vh.queues.values():
                if section is None or section in q.policy:
                    views.append(view(q))
        return Snapshot(self.clock.monotonic(), tuple(views))

    def queue_view(
        self, q: Queue, _cv: Any = ConsumerView, _qv: Any = QueueView, _new: Any = tuple.__new__
    ) -> QueueView:
        """A read-only view of one queue. Cost: a few attribute loads plus one per consumer.

        The fields that change only with topology or configuration are cached on the queue
        (``view_static``, dropped whenever its policy is resolved again); the view is that
        cache joined with the live figures, built with ``tuple.__new__`` (a named tuple's own
        ``__new__`` is a Python-level call).
        """
        static = q.view_static
        if static is None:
            static = q.view_static = (
                (
                    q.vhost.name,
                    q.name,
                    q.durable,
                    q.auto_delete,
                    q.exclusive_owner is not None,
                    q.subscription_type,
                ),
                (
                    tuple(
                        [(b.source.name, b.source.type, b.routing_key) for b in q.bound.values()]
                    ),
                    q.policy,
                ),
            )
        held = q.held
        n = len(held)
        n_ready = len(q.ready)
        cs = q.consumers
        consumers = (
            tuple(
                [
                    _cv(
                        c.tag,
                        c.channel.connection_id,
                        c.channel.id,
                        c.unacked,
                        c.last_ack,
                        c.first_delivery,
                        c.isolated,
                        c.prefetch,
                        c.no_ack,
                        # a consumer the broker is not hearing (a resource alarm blocks its
                        # connection) is not overdue: its ack clock stands still meanwhile
                        c.busy_since
                        if c.busy_since is None or not c.channel.unheard
                        else self.clock.monotonic(),
                        c.counted_at if c.counted else None,
                        c.pardon != 0,
                    )
                    for c in cs
                ]
            )
            if cs
            else ()
        )
        view: QueueView = _new(
            _qv,
            static[0]
            + (
                n,
                q.bytes,
                n_ready,
                n - n_ready - q.delayed,
                (held[next(iter(held))].arrival if not q.not_due else q.oldest_counting())
                if n
                else None,
                q.acks_total,
                consumers,
            )
            + static[1]
            + ((tuple(q.getters),) if q.getters else ((),)),
        )
        return view

    def apply_actions(self, actions: Sequence[Action], streaks: Streaks | None = None) -> list[str]:
        """Apply policy actions on the loop (see :mod:`plugbroker.core.actions`)."""
        return self.api.apply_actions(actions, streaks)

    # ------------------------------------------------------------------ shutdown

    def close_all(self, text: str = "broker shutdown") -> None:
        self.monitor.stop()
        for conn in list(self.connections.values()):
            conn.force_close(text)
        self.end_of_turn()


__all__ = ["CLOSE_TIMEOUT", "RESOURCE_ERROR", "SHARED", "Broker"]


def _effective_type(ex: Exchange) -> str:
    """The type ``ex`` routes as: an x-delayed-message exchange's ``x-delayed-type``."""
    inner = getattr(ex, "inner", None)
    return inner.type if isinstance(inner, Exchange) else ex.type

"""A virtual host: its exchanges and queues, routing, dead-lettering and delayed delivery."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plugbroker.codec.ids import (
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_UNBIND,
)
from plugbroker.domain import fate
from plugbroker.domain.exchange import (
    DELAYED_TYPE,
    EXCHANGE_TYPES,
    RETRY_EXCHANGE,
    TOUCH_EXCHANGE,
    Binding,
    DelayedExchange,
    DirectExchange,
    Exchange,
    RetryExchange,
    TouchExchange,
)
from plugbroker.domain.message import Message, MessageIds
from plugbroker.domain.queue import (
    EXCLUSIVE,
    FAILOVER,
    SHARED,
    Queue,
)
from plugbroker.domain.queueargs import queue_options
from plugbroker.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    ChannelError,
    ConnectionError_,
)
from plugbroker.routing import STANDARD_EXCHANGES, topic_words_match
from plugbroker.store import MemoryStore, Store

if TYPE_CHECKING:
    from plugbroker.domain.timers import Timers

log = logging.getLogger("broker.vhost")


class NoHooks:
    """Stands in for the plugin host when no plugin is loaded: every hook is absent."""

    def __getattr__(self, name: str) -> Any:  # None; Any for mypyc (a None return breaks it)
        return None


class VirtualHost:
    def __init__(
        self,
        name: str,
        *,
        clock: Any,
        timers: Timers,
        hooks: Any = None,
        store: Store | None = None,
        mark_dirty: Callable[[Queue], None] | None = None,
        ids: MessageIds | None = None,
    ) -> None:
        self.name = name
        #: message ids, shared by the broker's vhosts (each broker has its own)
        self.ids = ids if ids is not None else MessageIds()
        self.clock = clock
        self.timers = timers
        self.hooks = hooks if hooks is not None else NoHooks()
        self.store: Store = store if store is not None else MemoryStore()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        #: the broker's per-turn batching (None in domain tests, which dispatch by hand)
        self._mark_dirty = mark_dirty
        #: called with a queue whose bindings or declaration changed (policy re-resolution)
        self.on_topology_change: Callable[[Queue], None] | None = None
        #: called instead, when set, with a queue, the binding made or removed and whether it
        #: was made: the broker updates the queue's policy from that one binding
        self.on_binding_change: Callable[[Queue, Binding, bool], None] | None = None
        #: bindings held in this vhost, and the caps a client's bind is held to (0: none);
        #: ``on_limit_refused`` is told the limit's name when one refuses a bind
        self.binding_count = 0
        #: consumers on the vhost's queues (what maxConsumersPerVhost counts)
        self.consumer_count = 0
        self.max_bindings_per_exchange = 0
        self.max_bindings_per_vhost = 0
        self.on_limit_refused: Callable[[str], None] | None = None
        #: what each queue's bindings contribute to its policy, by queue name (the broker's)
        self.policy_indexes: dict[str, Any] = {}
        self.default_exchange = DirectExchange("", durable=True)
        self.exchanges[""] = self.default_exchange
        for ename, etype in STANDARD_EXCHANGES:
            self.exchanges[ename] = EXCHANGE_TYPES[etype](ename, durable=True)
        #: ``amq.retry``: a consumer's request to retry one of its deliveries (see
        #: :func:`plugbroker.domain.fate.reconsume`); the session recognises it by identity
        self.retry_exchange = RetryExchange(RETRY_EXCHANGE, durable=True)
        self.exchanges[RETRY_EXCHANGE] = self.retry_exchange
        #: ``amq.touch``: a consumer says it still works on a delivery (see
        #: :func:`plugbroker.domain.fate.touch`); the session recognises it by identity
        self.touch_exchange = TouchExchange(TOUCH_EXCHANGE, durable=True)
        self.exchanges[TOUCH_EXCHANGE] = self.touch_exchange
        self.delayed_pending = 0
        #: queues that received dead letters: name -> {reason: count} (for the admin API)
        self.dead_letter_queues: dict[str, dict[str, int]] = {}
        #: where queues' ``x-dead-letter-exchange`` sends dead letters: exchange name ->
        #: {``x-dead-letter-routing-key`` (None: the message's own key): how many queues}
        self.dead_letter_routes: dict[str, dict[str | None, int]] = {}
        #: retry queues by the queue they feed (``x-retry-target``)
        self._retry_queues: dict[str, Queue] = {}

    # ----------------------------------------------------------------- dispatch batching

    def mark_dirty(self, q: Queue) -> None:
        """Ask for ``q.dispatch()`` at the end of this loop turn (once, however often asked)."""
        if not q.dirty:
            q.dirty = True
            if self._mark_dirty is not None:
                self._mark_dirty(q)

    # ----------------------------------------------------------------- exchanges

    def declare_exchange(
        self,
        name: str,
        type_: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        arguments = arguments or {}
        sig = EXCHANGE_DECLARE
        ex = self.exchanges.get(name)
        if passive:
            if ex is None or name == "":
                raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'", sig)
            return ex
        if name == "" or name.startswith("amq."):
            if ex is not None and ex.type == type_:
                return ex
            if ex is not None and name:
                # an existing standard exchange: the type check fails, as in RabbitMQ
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg 'type' for exchange '{name}' in vhost "
                    f"'{self.name}': received '{type_}' but current is "
                    f"'{ex.type}'",
                    sig,
                )
            raise ChannelError(
                ACCESS_REFUSED,
                f"exchange name '{name}' contains reserved prefix 'amq.*'"
                if name
                else "the default exchange cannot be declared",
                sig,
            )
        if ex is not None:
            diff = ex.equivalent(type_, durable, auto_delete, internal, arguments)
            if diff is not None:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{diff}' for exchange '{name}' in vhost '{self.name}'",
                    sig,
                )
            return ex
        if type_ == DELAYED_TYPE:
            inner = arguments.get("x-delayed-type")
            if not isinstance(inner, str) or inner not in EXCHANGE_TYPES:  # may be a table
                raise ChannelError(
                    PRECONDITION_FAILED,
                    "x-delayed-message exchange needs argument x-delayed-type: "
                    "direct, fanout, topic or headers",
                    sig,
                )
            cls: type[Exchange] = DelayedExchange
        else:
            try:
                cls = EXCHANGE_TYPES[type_]
            except KeyError:
                raise ConnectionError_(
                    COMMAND_INVALID, f"unknown exchange type '{type_}'", sig
                ) from None
        ex = cls(
            name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
        )
        self.exchanges[name] = ex
        if durable and self.store.durable:
            self.store.save_exchange(self.name, ex)
        return ex

    def get_exchange(self, name: str, sig: tuple[int, int]) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'", sig)
        return ex

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        sig = EXCHANGE_DELETE
        if name == "":
            raise ChannelError(
                ACCESS_REFUSED, "operation not permitted on the default exchange", sig
            )
        if name.startswith("amq."):
            raise ChannelError(
                ACCESS_REFUSED,
                f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed",
                sig,
            )
        ex = self.get_exchange(name, sig)
        if if_unused and ex.bindings:
            raise ChannelError(
                PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use", sig
            )
        del self.exchanges[name]
        for b in list(ex.bindings.values()):
            ex.unbind(b.destination, b.routing_key, b.arguments)
            self._binding_gone(b)
        # bindings where it is the destination
        for other in list(self.exchanges.values()):
            for b in other.unbind_destination(ex):
                self._binding_gone(b)
        if ex.durable and self.store.durable:
            self.store.delete_exchange(self.name, name)

    # ----------------------------------------------------------------- queues

    def declare_queue(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        owner: str = "",
        subscription_type: str | None = None,
        server_name: str = "",
    ) -> tuple[Queue, bool]:
        """Declare (or find) a queue; returns ``(queue, created)``.

        :param server_name: the ``amq.gen-`` name to give when ``name`` is empty (the session
            makes it first, to check permissions on it); made here when not given.
        """
        sig = QUEUE_DECLARE
        arguments = arguments or {}
        q = self.queues.get(name) if name else None
        if passive:
            if q is None:
                raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'", sig)
            self._check_owner(q, owner, sig)
            return q, False
        if q is not None:
            self._check_owner(q, owner, sig)
            if (q.exclusive_owner is not None) != exclusive:
                # RabbitMQ checks exclusivity strictly on redeclare: 405, not 406
                raise ChannelError(
                    RESOURCE_LOCKED,
                    f"cannot obtain exclusive access to locked queue '{name}' in "
                    f"vhost '{self.name}'. It could be originally declared on "
                    "another connection or the exclusive property value does "
                    "not match that of the original declaration.",
                    sig,
                )
            for field_, mine, theirs in (
                ("durable", q.durable, durable),
                ("auto_delete", q.auto_delete, auto_delete),
            ):
                if mine != theirs:
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{field_}' for queue '{name}' in vhost "
                        f"'{self.name}': received '{theirs}' but current is "
                        f"'{mine}'",
                        sig,
                    )
            for k, v in arguments.items():
                # a redeclare may leave arguments out, but may not change one
                if k.startswith("x-") and q.arguments.get(k) != v:
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{k}' for queue '{name}' in vhost "
                        f"'{self.name}': received {v!r} but current is "
                        f"{q.arguments.get(k)!r}",
                        sig,
                    )
            q.touch()
            q.arm_idle_expiry()
            return q, False
        if name.startswith("amq."):
            raise ChannelError(
                ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", sig
            )
        if not name:
            name = server_name or "amq.gen-" + secrets.token_urlsafe(16)
        opts = queue_options(arguments)
        if subscription_type is not None and "subscription_type" not in opts:
            opts["subscription_type"] = subscription_type
        q = Queue(
            self,
            name,
            durable=durable,
            exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
            **opts,
        )
        self.queues[name] = q
        if q.dlx is not None:
            self._dead_letter_route(q, 1)
        if q.retry_target is not None:
            self._retry_queues.setdefault(q.retry_target, q)
        if durable and self.store.durable:
            self.store.save_queue(q)
            if q.pageable:
                paged = self.store.paged_ready(q)
                if paged is not None:
                    q.set_ready_list(paged)
        # every queue is bound to the default exchange by its name (implicitly)
        if self.on_topology_change is not None:
            self.on_topology_change(q)
        q.arm_idle_expiry()
        h = self.hooks.queue_declared
        if h is not None:
            h(vhost=self.name, queue=name, durable=durable, arguments=dict(arguments))
        return q, True

    def _check_owner(self, q: Queue, owner: str, sig: tuple[int, int]) -> None:
        if q.exclusive_owner is not None and q.exclusive_owner != owner:
            raise ChannelError(
                RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue '{q.name}' in "
                f"vhost '{self.name}'. It could be originally declared on another "
                "connection or the exclusive property value does not match that "
                "of the original declaration.",
                sig,
            )

    def get_queue(self, name: str, sig: tuple[int, int], owner: str = "") -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'", sig)
        self._check_owner(q, owner, sig)
        return q

    def delete_queue(
        self,
        q: Queue,
        *,
        reason: str = "client",
        detail: str = "",
        if_unused: bool = False,
        if_empty: bool = False,
        keep: list[dict[int, Message]] | None = None,
    ) -> int:
        """Delete ``q``: cancel its consumers, drop its bindings, release its messages.

        ``reason`` is the code plugins see (``client``, ``auto-delete``, ``expired``,
        ``exclusive-owner-closed``, ``policy:<name>``); ``detail`` goes to the log line.
        ``keep``: the messages it held (by id) are appended there instead of being let go at
        once, so the caller can free them a step at a time
        (:func:`plugbroker.domain.fate.let_go_in_steps`).
        """
        sig = QUEUE_DELETE
        if if_unused and q.consumers:
            raise ChannelError(
                PRECONDITION_FAILED, f"queue '{q.name}' in vhost '{self.name}' in use", sig
            )
        if if_empty and q.message_count:
            raise ChannelError(
                PRECONDITION_FAILED, f"queue '{q.name}' in vhost '{self.name}' not empty", sig
            )
        if q.deleted:
            return 0
        q.deleted = True
        count = q.ready_count
        self.queues.pop(q.name, None)
        self.policy_indexes.pop(q.name, None)
        if q.dlx is not None:
            self._dead_letter_route(q, -1)
        if q.retry_target is not None and self._retry_queues.get(q.retry_target) is q:
            del self._retry_queues[q.retry_target]
        for b in list(q.bound.values()):
            if b.source.unbind(q, b.routing_key, b.arguments) is not None:
                self._binding_gone(b, notify_queue=False)
        for c in q.iter_consumers():
            q.consumers.remove(c)
            self.consumer_count -= 1
            c.channel.consumer_cancelled_by_broker(c)
        msgs = q.drain_all()
        if q.durable and self.store.durable:
            self.store.delete_queue(self.name, q.name)
        # a policy's deletion has its own line (plugbroker.policy): this one only at DEBUG then
        log.log(
            logging.DEBUG if reason.startswith("policy:") else logging.INFO,
            "queue '%s' in vhost '%s' deleted (%s%s), %d messages released",
            q.name,
            self.name,
            reason,
            f": {detail}" if detail else "",
            len(msgs),
        )
        h = self.hooks.queue_deleted
        if h is not None:
            h(vhost=self.name, queue=q.name, reason=reason, messages=len(msgs))
        if keep is not None:
            keep.append(msgs)
        return count

    # ----------------------------------------------------------------- dead-letter targets

    def is_dead_letter_target(self, q: Queue) -> bool:
        """Whether ``q`` is a dead-letter or retry target (SPEC 4: slow-consumer sections under
        ``<virtualhost>`` or ``<topic>`` never reach one). O(bindings of ``q``).

        It is one when it is a retry queue (``x-retry-target``); when a dead letter was ever
        routed to it (a dead-letter plugin's queue, or an ``x-dead-letter-exchange`` route); or
        when one of its bindings can receive what a queue of this vhost dead-letters through its
        ``x-dead-letter-exchange``: a binding to that exchange whose key matches the
        ``x-dead-letter-routing-key`` (any binding when the messages keep their own key), or,
        for the default exchange, a queue of that name.
        """
        if q.retry_target is not None or q.dead_letter_target:
            return True
        routes = self.dead_letter_routes
        if not routes:
            return False
        direct = routes.get("")
        if direct and q.name in direct:
            return True
        return any(self.binding_reaches_dead_letters(b) for b in q.bound.values())

    def binding_reaches_dead_letters(self, b: Binding) -> bool:
        """Whether binding ``b`` can receive what a queue of this vhost dead-letters through its
        ``x-dead-letter-exchange`` (one binding's part of :meth:`is_dead_letter_target`)."""
        keys = self.dead_letter_routes.get(b.source.name)
        if not keys:
            return False
        return _route_reaches(b, keys)

    def mark_dead_letter_target(self, q: Queue) -> None:
        """``q`` is a dead-letter or retry target from now on (a dead letter was routed to it,
        or something names it as one); the mark is stored with a durable queue, so it holds
        across restarts, and its policy is resolved again (slow-consumer sections stop
        reaching it)."""
        if q.dead_letter_target:
            return
        q.dead_letter_target = True
        self.save_mark(q)
        if self.on_topology_change is not None:
            self.on_topology_change(q)

    def save_mark(self, q: Queue) -> None:
        """Store ``q``'s dead-letter-target mark (a durable queue in a durable store)."""
        if q.durable and self.store.durable and not q.deleted:
            self.store.save_queue(q)

    def _dead_letter_route(self, q: Queue, delta: int) -> None:
        """Count ``q``'s dead-letter route in or out, and re-resolve the queues it may reach."""
        assert q.dlx is not None
        keys = self.dead_letter_routes.setdefault(q.dlx, {})
        rk = q.dlx_routing_key
        n = keys.get(rk, 0) + delta
        if n > 0:
            keys[rk] = n
        else:
            keys.pop(rk, None)
            if not keys:
                del self.dead_letter_routes[q.dlx]
        if self.on_topology_change is None:
            return
        if q.dlx == "":
            target = self.queues.get(rk) if rk else None
            if target is not None and target is not q:
                self.on_topology_change(target)
            return
        ex = self.exchanges.get(q.dlx)
        if ex is not None:
            # each queue once, however many bindings it has to that exchange
            dests = dict.fromkeys(b.destination for b in ex.bindings.values())
            for dest in dests:
                if isinstance(dest, Queue) and dest is not q and not dest.deleted:
                    self.on_topology_change(dest)

    # ----------------------------------------------------------------- bindings

    def bind(
        self,
        source: Exchange,
        dest: Queue | Exchange,
        routing_key: str,
        arguments: dict[str, Any],
        *,
        limited: bool = True,
    ) -> None:
        """Bind ``dest`` to ``source`` (idempotent). ``limited``: a new binding past
        ``max_bindings_per_exchange`` or ``max_bindings_per_vhost`` is refused with 406 (a
        client's or the admin API's bind; recovery from the store is not limited)."""
        if source is self.default_exchange:
            raise ChannelError(
                ACCESS_REFUSED, "operation not permitted on the default exchange", QUEUE_BIND
            )
        b = Binding(source, dest, routing_key, arguments)
        if b.key in source.bindings:
            return
        if limited:
            self._check_binding_limits(source, dest)
        source.bind(b)
        self.binding_count += 1
        if self.store.durable and source.durable and dest.durable:
            kind = "queue" if isinstance(dest, Queue) else "exchange"
            self.store.save_binding(self.name, source.name, kind, dest.name, routing_key, arguments)
        if isinstance(dest, Queue):
            dest.bound[id(b)] = b
            dest.view_static = None
            if self.on_binding_change is not None:
                self.on_binding_change(dest, b, True)
            elif self.on_topology_change is not None:
                self.on_topology_change(dest)
            h = self.hooks.queue_bound
            if h is not None:
                h(vhost=self.name, queue=dest.name, exchange=source.name, routing_key=routing_key)

    def _check_binding_limits(self, source: Exchange, dest: Queue | Exchange) -> None:
        per_exchange = self.max_bindings_per_exchange
        per_vhost = self.max_bindings_per_vhost
        if per_exchange and len(source.bindings) >= per_exchange:
            limit = "maxBindingsPerExchange"
            why = (
                f"binding limit of exchange '{source.name}' in vhost '{self.name}' ({per_exchange})"
            )
        elif per_vhost and self.binding_count >= per_vhost:
            limit = "maxBindingsPerVhost"
            why = f"binding limit in vhost '{self.name}' ({per_vhost})"
        else:
            return
        if self.on_limit_refused is not None:
            self.on_limit_refused(limit)
        kind = "queue" if isinstance(dest, Queue) else "exchange"
        raise ChannelError(
            PRECONDITION_FAILED,
            f"cannot bind {kind} '{dest.name}' to exchange '{source.name}': {why} is reached",
            QUEUE_BIND if isinstance(dest, Queue) else EXCHANGE_BIND,
        )

    def unbind(
        self, source: Exchange, dest: Queue | Exchange, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        if source is self.default_exchange:
            raise ChannelError(
                ACCESS_REFUSED, "operation not permitted on the default exchange", QUEUE_UNBIND
            )
        b = source.unbind(dest, routing_key, arguments)
        if b is not None:
            self._binding_gone(b)

    def _binding_gone(self, b: Binding, notify_queue: bool = True) -> None:
        dest = b.destination
        self.binding_count -= 1
        if self.store.durable and b.source.durable and dest.durable:
            kind = "queue" if isinstance(dest, Queue) else "exchange"
            self.store.delete_binding(
                self.name, b.source.name, kind, dest.name, b.routing_key, b.arguments
            )
        if isinstance(dest, Queue):
            dest.bound.pop(id(b), None)
            dest.view_static = None
        if isinstance(dest, Queue) and notify_queue:
            if self.on_binding_change is not None:
                self.on_binding_change(dest, b, False)
            elif self.on_topology_change is not None:
                self.on_topology_change(dest)
            h = self.hooks.queue_unbound
            if h is not None:
                h(
                    vhost=self.name,
                    queue=dest.name,
                    exchange=b.source.name,
                    routing_key=b.routing_key,
                )
        src = b.source
        if src.auto_delete and not src.bindings and src.name in self.exchanges:
            self.delete_exchange(src.name)

    def retry_queue_of(self, name: str) -> Queue | None:
        """The retry queue that feeds queue ``name`` (its ``x-retry-target``), or None."""
        rq = self._retry_queues.get(name)
        if rq is not None and not rq.deleted:
            return rq
        for other in self.queues.values():  # the first one was deleted: another may feed it
            if other.retry_target == name:
                self._retry_queues[name] = other
                return other
        self._retry_queues.pop(name, None)
        return None

    def bindings_of(self, q: Queue) -> list[tuple[str, str, str]]:
        return q.bindings()

    # ----------------------------------------------------------------- routing

    def route(self, ex: Exchange, msg: Message) -> list[Queue]:
        """The queues a message goes to, following exchange-to-exchange bindings."""
        if ex is self.default_exchange:
            q = self.queues.get(msg.routing_key)
            return [q] if q is not None else []
        dests = ex.route(msg)
        if not dests:
            return self._alternate(ex, msg)
        out: list[Queue] = []
        nested = False
        for d in dests:
            if isinstance(d, Queue):
                # one copy per queue, however many of its bindings match
                if d not in out:
                    out.append(d)
            else:
                nested = True
        if nested:
            seen = {id(ex)}
            stack = [d for d in dests if isinstance(d, Exchange)]
            while stack:
                e = stack.pop()
                if id(e) in seen:
                    continue
                seen.add(id(e))
                for d in e.route(msg):
                    if isinstance(d, Queue):
                        if d not in out:
                            out.append(d)
                    else:
                        stack.append(d)
        if not out:
            return self._alternate(ex, msg)
        return out

    def _alternate(self, ex: Exchange, msg: Message) -> list[Queue]:
        if ex.alternate is None:
            return []
        alt = self.exchanges.get(ex.alternate)
        if alt is None or alt is ex:
            return []
        return self.route(alt, msg)

    def deliver_to_queues(self, queues: list[Queue], msg: Message) -> tuple[list[Queue], bool]:
        """Enqueue into every queue (a copy each after the first).

        Returns the queues that took it and whether any refused it (reject-publish overflow).
        """
        taken: list[Queue] = []
        refused = False
        store = self.store
        # copies are made before any queue touches the message: per-queue state (expiry,
        # stored) must not leak from one queue's copy into the next
        copies = [msg] if len(queues) == 1 else [msg] + [msg.copy() for _ in queues[1:]]
        for q, m in zip(queues, copies):
            outcome = q.enqueue(m)
            if outcome:
                taken.append(q)
                if m.persistent and q.durable and store.durable:
                    m.stored = True
                    store.add_message(q, m)
                    if q.retry_target is not None:  # keep its due time across a restart
                        store.hold_message(q, m, q.retry_delay(m))
            elif outcome is False:
                refused = True  # reject-publish: the publisher gets a nack
        return taken, refused

    def hold_delayed(self, ex: DelayedExchange, msg: Message, delay: float) -> None:
        """Keep a message for an x-delayed-message exchange until its x-delay passes."""
        self.delayed_pending += 1
        if msg.persistent and ex.durable and self.store.durable:
            msg.stored = True
            self.store.add_delayed(self.name, ex, msg, delay)
        self.timers.call_later(delay, self._release_delayed, ex, msg)

    def _release_delayed(self, ex: DelayedExchange, msg: Message) -> None:
        self.delayed_pending -= 1
        held_on_disk = msg.stored
        msg.stored = False
        if self.exchanges.get(ex.name) is not ex:
            if held_on_disk:
                self.store.remove_delayed(self.name, msg)
            return
        msg.arrival = self.clock.monotonic()
        fate.enqueue(self, self.route(ex, msg), msg, "delayed")
        if held_on_disk:  # after the enqueue: a crash in between duplicates, never loses
            self.store.remove_delayed(self.name, msg)

    def store_remove(self, q: Queue, msg: Message) -> None:
        msg.stored = False
        self.store.remove_message(q, msg)


__all__ = ["EXCLUSIVE", "FAILOVER", "SHARED", "NoHooks", "VirtualHost", "queue_options"]


def _route_reaches(b: Binding, keys: dict[str | None, int]) -> bool:
    """Whether binding ``b`` can receive dead letters sent with one of ``keys`` (None: any key)."""
    if None in keys:
        return True
    ex = b.source
    etype = ex.type
    if isinstance(ex, DelayedExchange):
        etype = ex.inner.type
    if etype == "direct":
        return b.routing_key in keys
    if etype == "topic":
        pattern = b.routing_key.split(".")
        return any(topic_words_match(pattern, (k or "").split(".")) for k in keys)
    return True  # fanout, headers, others: whatever the key

"""Queues and their consumers.

A queue keeps its figures as running totals so that a policy check is O(1) per queue: the count
and body bytes of every message it holds (ready, delivered-unacked and delayed), the arrival of
the oldest (``held`` is an insertion-ordered map, so the oldest is its first key), and the
number of acks since it was declared.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from plugbroker.domain import fate
from plugbroker.domain.channelapi import ConsumerChannel as ConsumerChannel
from plugbroker.domain.message import Message
from plugbroker.domain.ready import FifoReady, PriorityReady, ReadyList
from plugbroker.retry import MAX_DELAY

# defined in plugbroker.subscription (policies read them too); re-exported for the core's modules
from plugbroker.subscription import EXCLUSIVE as EXCLUSIVE
from plugbroker.subscription import FAILOVER as FAILOVER
from plugbroker.subscription import KEY_SHARED as KEY_SHARED
from plugbroker.subscription import SHARED as SHARED
from plugbroker.subscription import SUBSCRIPTION_TYPES as SUBSCRIPTION_TYPES

if TYPE_CHECKING:
    from plugbroker.domain.exchange import Binding
    from plugbroker.domain.timers import TimerHandle
    from plugbroker.domain.vhost import VirtualHost

#: stop dispatching to a consumer that holds this many unacked messages, whatever its prefetch
DEFAULT_MAX_UNACKED_PER_CONSUMER = 50_000


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Consumer:
    __slots__ = (
        "arguments",
        "busy_since",
        "capped",
        "channel",
        "counted",
        "counted_at",
        "deferred",
        "delivered_total",
        "due_heap",
        "exclusive",
        "first_delivery",
        "isolated",
        "isolated_for",
        "last_ack",
        "max_unacked",
        "no_ack",
        "order",
        "pardon",
        "prefetch",
        "queue",
        "tag",
        "tag_bytes",
        "unacked",
    )

    def __init__(
        self,
        tag: str,
        channel: ConsumerChannel,
        queue: Queue,
        *,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: dict[str, Any],
        order: int,
        max_unacked: int = DEFAULT_MAX_UNACKED_PER_CONSUMER,
    ) -> None:
        self.tag = tag
        self.tag_bytes = tag.encode()
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        #: per-consumer prefetch count (0: unlimited)
        self.prefetch = prefetch
        self.unacked = 0
        #: monotonic time of the last ack/nack/reject from this consumer
        self.last_ack: float | None = None
        #: monotonic time of the first delivery to it
        self.first_delivery: float | None = None
        #: the ack clock (SPEC 6): monotonic time it went from nothing unacked to something
        #: unacked, restarted at each ack, nack or reject; ``None`` while it holds nothing
        self.busy_since: float | None = None
        self.isolated = False
        #: unacked deliveries it holds that were not due when delivered (ETA awareness):
        #: message id -> monotonic due time; ``due_heap`` gives the earliest (stale entries are
        #: dropped lazily). Empty for a queue without ETA awareness.
        self.deferred: dict[int, float] = {}
        self.due_heap: list[tuple[float, int]] = []
        self.arguments = arguments
        self.order = order
        #: the unacked cap was hit; dispatch resumes at half of it
        self.capped = False
        self.max_unacked = max_unacked
        self.delivered_total = 0
        #: the id of the delivery whose hand-out to it last counted a timeout (0: none), and
        #: when (monotonic): a hand-out counts once per ``ackTimeout`` that runs out
        #: (:func:`plugbroker.domain.fate.count_timeout`)
        self.counted = 0
        self.counted_at: float | None = None
        #: the id of the delivery it was working on when it was isolated (0: none): when that
        #: message is dead-lettered as poison, this consumer is released
        self.isolated_for = 0
        #: the id of a message dead-lettered as poison while this consumer was still working
        #: on it (0: none): until it settles anything (its late ack of that message, say) it
        #: gets no new delivery, is not isolated and its timeouts count against no message
        self.pardon = 0

    def can_take(self) -> bool:
        if self.isolated or self.pardon:
            return False
        n = self.unacked
        if self.prefetch and n >= self.prefetch:
            return False
        if self.capped:
            if n > self.max_unacked // 2:
                return False
            self.capped = False
        elif n >= self.max_unacked:
            self.capped = True
            return False
        return self.channel.can_deliver()

    def __repr__(self) -> str:
        return f"<Consumer {self.tag!r} on {self.queue.name!r} unacked={self.unacked}>"


class Queue:
    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        *,
        durable: bool = False,
        exclusive_owner: str | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        subscription_type: str = SHARED,
        max_priority: int | None = None,
        message_ttl: int | None = None,
        expires: int | None = None,
        max_length: int | None = None,
        max_length_bytes: int | None = None,
        overflow: str = "drop-head",
        dlx: str | None = None,
        dlx_routing_key: str | None = None,
        delivery_limit: int | None = None,
        retry_target: str | None = None,
        retry_levels: tuple[float, ...] = (),
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.subscription_type = subscription_type
        self.max_priority = max_priority
        self.ready: ReadyList = PriorityReady(max_priority) if max_priority else FifoReady()
        #: every message the queue holds, oldest first (ready, unacked and delayed)
        self.held: OrderedDict[int, Message] = OrderedDict()
        self.bytes = 0
        #: the held messages' property bytes (headers), for the memory accounting
        self.header_bytes = 0
        self.ready_bytes = 0
        self.acks_total = 0
        #: running counters for /metrics (kept incrementally: one int add where each happens)
        #: messages that entered the queue
        self.published_total = 0
        #: deliveries to consumers and basic.get
        self.delivered_total = 0
        #: basic.ack'ed deliveries
        self.acked_total = 0
        #: messages put back for redelivery (reject/nack requeue, close, recover, isolation)
        self.redelivered_total = 0
        #: messages dead-lettered from this queue
        self.dead_lettered_total = 0
        self.delayed = 0
        self.consumers: list[Consumer] = []
        self._rr = 0
        self._consumer_order = 0
        self.had_consumers = False
        self.deleted = False
        self.message_ttl = message_ttl
        self.expires = expires
        self.max_length = max_length
        self.max_length_bytes = max_length_bytes
        self.overflow = overflow
        self.dlx = dlx
        self.dlx_routing_key = dlx_routing_key
        #: the ``x-delivery-limit`` argument; :attr:`delivery_limit` is what applies (a plugin's
        #: ``broker_delivery_limit`` answer wins, see Broker.resolve_policy)
        self.delivery_limit_arg = delivery_limit
        self.delivery_limit = delivery_limit
        #: a retry queue: each message waits its delay here, then moves to this queue
        self.retry_target = retry_target
        #: a dead letter was routed here (see VirtualHost.is_dead_letter_target)
        self.dead_letter_target = False
        #: delay levels (seconds) of a retry queue, for messages that name no ``x-delay``
        self.retry_levels = retry_levels
        self._expiry_timer: TimerHandle | None = None
        self._idle_timer: TimerHandle | None = None
        self.last_used = vhost.clock.monotonic()
        #: ``(connection_id, channel_id)`` of channels that polled with basic.get
        self.getters: dict[tuple[str, int], None] = {}
        #: resolved policy sections (filled by the broker from the configuration)
        self.policy: Any = {}
        self._key_owner: dict[str, Consumer] = {}
        self.dirty = False
        self.max_unacked_per_consumer = DEFAULT_MAX_UNACKED_PER_CONSUMER
        #: the bindings to this queue (kept by the vhost), so that a snapshot and a delete cost
        #: O(bindings of this queue), not O(all bindings)
        self.bound: dict[int, Binding] = {}
        #: the parts of a snapshot view that change only with topology or configuration,
        #: cached by the broker when it resolves the queue's policy (None: not cached)
        self.view_static: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None
        #: ids of messages taken back from an isolated consumer and not delivered again yet:
        #: a late ack for one of them can then find it without scanning the ready list
        self.moved_waiting: set[int] = set()
        #: ``<isolation><poisonDeliveries>`` of a shared queue with isolation, else None: the
        #: timed-out hand-outs after which a message is dead-lettered as poison
        self.poison_deliveries: int | None = None
        #: ETA awareness (``<isolation><etaHeaders>`` of a shared queue with isolation): the
        #: headers that say when a delivery is due; empty: every delivery is due at once
        self.eta_headers: tuple[str, ...] = ()
        #: held messages whose delivery found them not due yet (ETA awareness): message id ->
        #: monotonic due time; the message age counts them from then (:meth:`oldest_counting`)
        self.not_due: dict[int, float] = {}
        #: ``<isolation><ackTimeout>`` in whole milliseconds, sent to its consumers as the
        #: header ``x-ack-timeout`` on every delivery (0: no isolation, no header)
        self.ack_timeout_ms = 0

    # ----------------------------------------------------------------- figures

    @property
    def message_count(self) -> int:
        return len(self.held)

    @property
    def ready_count(self) -> int:
        return len(self.ready)

    @property
    def unacked_count(self) -> int:
        return len(self.held) - len(self.ready) - self.delayed

    @property
    def oldest_arrival(self) -> float | None:
        held = self.held
        if not held:
            return None
        return held[next(iter(held))].arrival

    def oldest_counting(self) -> float | None:
        """The arrival the message age counts from: the oldest held message's, except that a
        message found not due yet at its delivery (ETA awareness) counts from its due time. Looks
        at the head only, up to :attr:`NOT_DUE_SCAN` such messages (beyond, the next message's
        arrival counts): O(1) per queue for a check."""
        held = self.held
        if not held:
            return None
        nd = self.not_due
        if not nd:
            return held[next(iter(held))].arrival
        best: float | None = None
        for i, m in enumerate(held.values()):
            due = nd.get(m.id)
            a = m.arrival if due is None or due < m.arrival else due
            if best is None or a < best:
                best = a
            if due is None or i >= self.NOT_DUE_SCAN:
                break
        return best

    #: how many messages not due yet :meth:`oldest_counting` skips at the head of a queue
    NOT_DUE_SCAN = 64

    def bindings(self) -> list[tuple[str, str, str]]:
        """``(exchange, exchange_type, key)`` for each binding of this queue."""
        return [(b.source.name, b.source.type, b.routing_key) for b in self.bound.values()]

    # ----------------------------------------------------------------- messages

    def enqueue(self, msg: Message) -> bool | None:
        """Add a routed message: True when the queue holds it, False when
        ``x-overflow: reject-publish`` refused it (the publisher gets a nack), None when
        drop-head overflow dropped it at once (the publisher still gets an ack, as in RabbitMQ)."""
        if self.max_length is not None or self.max_length_bytes is not None:
            room = self._make_room(msg)
            if not room:
                return room
        msg.queue_name = self.name
        if self.retry_target is not None:
            return self._hold_for_retry(msg)
        now = msg.arrival
        ttl = self.message_ttl
        if msg.expiration is not None:
            ttl = msg.expiration if ttl is None else min(ttl, msg.expiration)
        if ttl is not None:
            msg.expires_at = now + ttl / 1000.0
        self.held[msg.id] = msg
        self.bytes += msg.body_size
        self.header_bytes += len(msg.properties)
        self.published_total += 1
        self.ready.append(msg)
        self.ready_bytes += msg.body_size
        if msg.expires_at is not None:
            self._arm_expiry()
        self.vhost.mark_dirty(self)
        return True

    #: the longest a retry queue holds a message (TDMQ's 864,000 s, ten days)
    MAX_RETRY_DELAY = MAX_DELAY

    def retry_delay(self, msg: Message) -> float:
        """How long a retry queue holds ``msg``: its ``x-delay`` header (ms); else the delay
        of its ``x-retry-level`` header (1-based); else of the level after its
        ``RECONSUMETIMES`` (TDMQ's "next level"); past the last level the last repeats."""
        if msg._hoff < 0:
            return 0.0
        h = msg.headers
        d = h.get("x-delay")
        if _is_number(d) and d > 0:
            return min(d / 1000.0, self.MAX_RETRY_DELAY)
        levels = self.retry_levels
        if not levels:
            return 0.0
        for name in ("x-retry-level", "RECONSUMETIMES"):
            raw = h.get(name)
            if isinstance(raw, str) and raw.isdigit():
                raw = int(raw)
            if _is_number(raw) and raw >= 1:
                return levels[min(int(raw), len(levels)) - 1]
        return 0.0

    def _hold_for_retry(self, msg: Message, delay: float | None = None) -> bool:
        """Retry queue: hold the message for its delay, then forward it to the target."""
        if delay is None:
            delay = self.retry_delay(msg)
        self.held[msg.id] = msg
        self.bytes += msg.body_size
        self.header_bytes += len(msg.properties)
        self.delayed += 1
        self.vhost.timers.call_later(delay, self._forward, msg)
        return True

    def restore_retry_hold(self, msg: Message, delay: float) -> None:
        """Recovery: a stored retry-queue message waits only what was left of its delay."""
        msg.queue_name = self.name
        self._hold_for_retry(msg, max(0.0, delay))

    def _forward(self, msg: Message) -> None:
        fate.retry_due(self, msg)

    def release_hold(self, msg: Message) -> bool:
        """A retry hold ran out: let go of ``msg`` (False if the queue no longer holds it)."""
        if self.deleted or self.held.pop(msg.id, None) is None:
            return False
        if self.not_due:
            self.not_due.pop(msg.id, None)
        self.bytes -= msg.body_size
        self.header_bytes -= len(msg.properties)
        self.delayed -= 1
        self.acks_total += 1
        if msg.stored:
            self.vhost.store_remove(self, msg)
        return True

    def _full_for(self, msg: Message) -> bool:
        """Whether adding ``msg`` would pass ``x-max-length`` or ``x-max-length-bytes``."""
        max_len, max_bytes = self.max_length, self.max_length_bytes
        return (max_len is not None and len(self.ready) >= max_len) or (
            max_bytes is not None and self.ready_bytes + msg.body_size > max_bytes
        )

    def _rejects_publish(self) -> bool:
        return self.overflow in ("reject-publish", "reject-publish-dlx")

    def refuses(self, msg: Message) -> bool:
        """Whether the length limits would keep ``msg`` out (refused, or dropped as it comes
        in), without doing anything: a message moved here (redrive, retry) then stays where it
        is instead of being dead-lettered by this queue."""
        if self.max_length is None and self.max_length_bytes is None:
            return False
        if self._rejects_publish():
            return self._full_for(msg)
        max_bytes = self.max_length_bytes
        return self.max_length == 0 or (max_bytes is not None and msg.body_size > max_bytes)

    def _make_room(self, msg: Message) -> bool | None:
        if self._rejects_publish():
            if self._full_for(msg):
                if self.overflow == "reject-publish-dlx":
                    fate.overflow(self, msg, refused=True)
                return False
            return True
        # drop-head: make room by dropping (dead-lettering) the oldest ready messages
        while self.ready and self._full_for(msg):
            head = self.ready.popleft()
            self.ready_bytes -= head.body_size
            self._forget(head)
            fate.overflow(self, head, refused=False)
        if self.refuses(msg):
            fate.overflow(self, msg, refused=False)
            return None
        return True

    def _forget(self, msg: Message) -> None:
        if self.held.pop(msg.id, None) is not None:
            if self.not_due:
                self.not_due.pop(msg.id, None)
            self.bytes -= msg.body_size
            self.header_bytes -= len(msg.properties)
            if msg.stored:
                self.vhost.store_remove(self, msg)

    def settle(self, msg: Message) -> None:
        """A delivered message is done with (acked, or rejected without requeue)."""
        self.acks_total += 1
        self._forget(msg)

    def requeue(self, msgs: Sequence[Message], *, count: bool = True) -> None:
        """Delivered messages come back to the front, redelivered (and counted).

        A primitive: the delivery limit is :func:`plugbroker.domain.fate.requeue`'s to apply, which
        is what every requeue path calls.
        """
        live = []
        for m in msgs:
            if m.id not in self.held or self.deleted:
                continue
            m.redelivered = True
            if count:
                m.delivery_count += 1
            live.append(m)
            self.ready_bytes += m.body_size
        if live:
            self.redelivered_total += len(live)
            self.ready.requeue(live)
            self.vhost.mark_dirty(self)
            self._arm_expiry()  # a requeued message may be past its TTL already

    def make_visible(self, msg: Message) -> None:
        """A message held back (nack backoff) becomes ready again."""
        if self.deleted or msg.id not in self.held:
            return
        self.delayed -= 1
        self.redelivered_total += 1
        self.ready.requeue([msg])
        self.ready_bytes += msg.body_size
        self.vhost.mark_dirty(self)
        self._arm_expiry()

    def hold_back(self, msg: Message, delay: float) -> None:
        """Keep a rejected message invisible for ``delay`` seconds, then requeue it."""
        msg.redelivered = True
        self.delayed += 1
        if msg.stored:
            self.vhost.store.hold_message(self, msg, delay)
        self.vhost.timers.call_later(delay, self.make_visible, msg)

    def take_ready(self, msg: Message) -> bool:
        """Take ``msg`` out of the ready list (a late ack, a redrive); False if it is not there."""
        try:
            self.ready.remove(msg)
        except ValueError:
            return False
        self.ready_bytes -= msg.body_size
        return True

    def get(self) -> Message | None:
        """Take the next ready message for basic.get (expired heads are dropped first)."""
        self.touch()
        self._expire_heads()
        if not self.ready:
            return None
        m = self.ready.popleft()
        self.ready_bytes -= m.body_size
        self.delivered_total += 1
        return m

    def purge(self) -> list[Message]:
        """Let go of every ready message (unacked ones stay); :func:`fate.purge` calls this."""
        msgs = self.take_all_ready()
        for m in msgs:
            self._forget(m)
        return msgs

    def take_all_ready(self) -> list[Message]:
        """Empty the ready list at once (one pass in C for the usual lists) and return what it
        held; the messages stay held until :meth:`forget_taken` lets go of them (a purge in
        steps: :func:`plugbroker.domain.fate.purge_in_steps`)."""
        self.moved_waiting.clear()
        msgs = self.ready.drain()
        self.ready_bytes = 0
        return msgs

    def forget_taken(self, msgs: Iterable[Message]) -> None:
        """Let go of messages :meth:`take_all_ready` took (those still held)."""
        for m in msgs:
            self._forget(m)

    def untake(self, msg: Message) -> None:
        """Put back a message :meth:`take_ready` took, where it was (by id), unchanged."""
        self.ready.requeue([msg])
        self.ready_bytes += msg.body_size
        self.vhost.mark_dirty(self)

    # ----------------------------------------------------------------- expiry

    def _arm_expiry(self) -> None:
        head = self.ready.peek()
        if head is None or head.expires_at is None:
            return
        t = self._expiry_timer
        if t is not None and not t.cancelled and t.due <= head.expires_at:
            return
        if t is not None:
            self.vhost.timers.cancel(t)
        self._expiry_timer = self.vhost.timers.call_at(head.expires_at, self._on_expiry)

    def _on_expiry(self) -> None:
        self._expiry_timer = None
        if self.deleted:
            return
        self._expire_heads()
        self._arm_expiry()

    def _expire_heads(self) -> None:
        ready = self.ready
        head = ready.peek()
        if head is None or head.expires_at is None:
            return
        now = self.vhost.clock.monotonic()
        while head is not None and head.expires_at is not None and head.expires_at <= now:
            ready.popleft()
            self.ready_bytes -= head.body_size
            self._forget(head)
            fate.expire(self, head)
            head = ready.peek()

    def touch(self) -> None:
        """The queue was used (consume, get, declare): restart its x-expires clock."""
        self.last_used = self.vhost.clock.monotonic()

    def arm_idle_expiry(self) -> None:
        if self.expires is None or self.deleted:
            return
        if self._idle_timer is not None:
            self.vhost.timers.cancel(self._idle_timer)
        self._idle_timer = self.vhost.timers.call_at(
            self.last_used + self.expires / 1000.0, self._on_idle
        )

    def _on_idle(self) -> None:
        self._idle_timer = None
        if self.deleted or self.expires is None:
            return
        if self.consumers:
            return  # re-armed when the last consumer leaves
        due = self.last_used + self.expires / 1000.0
        if due <= self.vhost.clock.monotonic():
            self.vhost.delete_queue(self, reason="expired", detail="unused for x-expires")
        else:
            self.arm_idle_expiry()

    # ----------------------------------------------------------------- consumers

    def add_consumer(
        self,
        tag: str,
        channel: ConsumerChannel,
        *,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: dict[str, Any],
    ) -> Consumer:
        self._consumer_order += 1
        c = Consumer(
            tag,
            channel,
            self,
            no_ack=no_ack,
            exclusive=exclusive,
            prefetch=prefetch,
            arguments=arguments,
            order=self._consumer_order,
            max_unacked=self.max_unacked_per_consumer,
        )
        self.consumers.append(c)
        self.vhost.consumer_count += 1
        self.had_consumers = True
        self._key_owner.clear()
        self.touch()
        self.vhost.mark_dirty(self)
        return c

    def remove_consumer(self, c: Consumer) -> None:
        try:
            self.consumers.remove(c)
        except ValueError:
            return
        self.vhost.consumer_count -= 1
        self._key_owner.clear()
        self.touch()
        if not self.consumers:
            if self.auto_delete and self.had_consumers:
                self.vhost.delete_queue(self, reason="auto-delete", detail="last consumer left")
                return
            self.arm_idle_expiry()
        self.vhost.mark_dirty(self)

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    # ----------------------------------------------------------------- dispatch

    def dispatch(self) -> None:
        """Deliver ready messages to consumers that can take them."""
        self.dirty = False
        ready = self.ready
        consumers = self.consumers
        if not ready or not consumers or self.deleted:
            return
        if ready.peek().expires_at is not None:  # type: ignore[union-attr]
            self._expire_heads()
        stype = self.subscription_type
        select = self.vhost.hooks.select_consumer
        if stype == FAILOVER:
            self._dispatch_single(consumers[0])
        elif stype == KEY_SHARED:
            self._dispatch_key_shared()
        elif select is not None:
            self._dispatch_hooked(select)
        else:
            self._dispatch_round_robin()
        if ready and ready.peek().expires_at is not None:  # type: ignore[union-attr]
            self._arm_expiry()

    def _take(self) -> Message:
        m = self.ready.popleft()
        self.ready_bytes -= m.body_size
        return m

    def _dispatch_round_robin(self) -> None:
        ready = self.ready
        consumers = self.consumers
        n = len(consumers)
        rr = self._rr
        idle = 0
        while ready and idle < n:
            c = consumers[rr % n]
            rr += 1
            if c.can_take():
                m = self._take()
                if m.expires_at is not None and m.expires_at <= self.vhost.clock.monotonic():
                    self._forget(m)
                    fate.expire(self, m)
                    continue
                c.channel.deliver(c, m, self)
                idle = 0
            else:
                idle += 1
        self._rr = rr % n if n else 0

    def _dispatch_single(self, c: Consumer) -> None:
        ready = self.ready
        while ready and c.can_take():
            c.channel.deliver(c, self._take(), self)

    def _dispatch_hooked(self, select: Any) -> None:
        ready = self.ready
        vh = self.vhost.name
        for _ in range(len(ready)):
            candidates = [c for c in self.consumers if c.can_take()]
            if not candidates:
                return
            m = ready.peek()
            chosen = select(vhost=vh, queue=self.name, message=m, consumers=candidates)
            if chosen is None:
                self._dispatch_round_robin()
                return
            if chosen not in candidates:
                return
            chosen.channel.deliver(chosen, self._take(), self)

    def key_of(self, m: Message) -> str:
        if m._hoff >= 0:
            try:
                k = m.headers.get("x-key")
            except ValueError:  # PropertiesError: a headers table nobody read on publish
                k = None
            if k is not None:
                return k if isinstance(k, str) else str(k)
        return m.routing_key

    def owner_of(self, key: str) -> Consumer:
        """Rendezvous hashing: each key goes to the consumer with the highest weight for it,
        so keys spread evenly and a leaving consumer's keys move without touching the rest."""
        c = self._key_owner.get(key)
        if c is None:
            best = -1
            for cand in self.consumers:
                w = int.from_bytes(
                    hashlib.blake2b(
                        # surrogatepass: header strings may hold lone surrogates
                        # (py-amqp decodes so)
                        f"{key}\x00{cand.channel.connection_id}\x00{cand.tag}".encode(
                            "utf-8", "surrogatepass"
                        ),
                        digest_size=8,
                    ).digest(),
                    "big",
                )
                if w > best:
                    best, c = w, cand
            assert c is not None
            if len(self._key_owner) > 65536:
                self._key_owner.clear()
            self._key_owner[key] = c
        return c

    def _dispatch_key_shared(self) -> None:
        # A message whose owner is busy waits, and so do later messages of its key (their
        # order holds); messages of other keys behind it may go on. The scan stops once every
        # consumer is busy, or after KEY_SCAN_LIMIT skipped messages, so it stays bounded.
        ready = self.ready
        waiting: list[Message] = []
        blocked: set[str] = set()
        while ready and len(waiting) < self.KEY_SCAN_LIMIT:
            m = ready.popleft()
            key = self.key_of(m)
            owner = self.owner_of(key)
            if key in blocked or not owner.can_take():
                blocked.add(key)
                waiting.append(m)
                if not any(c.can_take() for c in self.consumers):
                    break
                continue
            self.ready_bytes -= m.body_size
            owner.channel.deliver(owner, m, self)
        if waiting:
            ready.put_front(waiting)

    KEY_SCAN_LIMIT = 1024

    # ----------------------------------------------------------------- teardown

    def drain_all(self) -> OrderedDict[int, Message]:
        """Remove every message (the queue is being deleted); returns what was held: the
        queue's own map of them, handed over whole (emptying the ready list is the only pass
        over them, in C for the usual lists)."""
        msgs = self.held
        self.held = OrderedDict()
        self.ready.drain()
        self.not_due.clear()
        self.bytes = self.header_bytes = self.ready_bytes = self.delayed = 0
        self.moved_waiting.clear()
        for t in (self._expiry_timer, self._idle_timer):
            if t is not None:
                self.vhost.timers.cancel(t)
        return msgs

    def iter_consumers(self) -> Iterable[Consumer]:
        return tuple(self.consumers)

    # ----------------------------------------------------------------- paging
    #
    # A store may keep the bodies of messages deep in a long queue on disk only (the body is
    # None in memory). The queue says whether that is allowed, and takes the store's list.

    @property
    def pageable(self) -> bool:
        """Whether ready messages may wait without their body in memory: no feature of this
        queue needs a body before dispatch (priorities and length limits look at the ready
        list, expiry dead-letters from it, a plugin's consumer choice sees each message)."""
        if self.max_priority or self.max_length is not None or self.max_length_bytes is not None:
            return False
        if self.message_ttl is not None:
            return False  # expiry from the ready list dead-letters (x-dead-letter-exchange or
            # a plugin's target), which needs the body; a TTL also keeps such queues short
        return self.vhost.hooks.select_consumer is None

    def set_ready_list(self, ready: ReadyList) -> None:
        """Keep ready messages in ``ready`` from now on (a store's paging list). Only while
        the queue has no ready message, so nothing is lost or reordered."""
        if len(self.ready):
            raise ValueError(f"queue '{self.name}' has ready messages; its list stays")
        self.ready = ready

    def drop_unreadable(self, msg: Message) -> bool:
        """The store cannot read back the body of ``msg``, a ready message of this queue: it
        is dropped. False when the queue no longer holds it (nothing to do)."""
        if self.deleted or msg.id not in self.held:
            return False
        try:
            self.ready.remove(msg)
        except ValueError:
            pass
        else:
            self.ready_bytes -= msg.body_size
        self._forget(msg)
        return True

    def wake(self) -> None:
        """Bodies the ready list waited for are in memory: dispatch at the end of the turn."""
        if not self.deleted:
            self.vhost.mark_dirty(self)

    def __repr__(self) -> str:
        return f"<Queue {self.vhost.name}/{self.name} held={len(self.held)}>"

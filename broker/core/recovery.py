"""Rebuilding the broker from what the store kept, before the broker listens.

The store reads its rows into records (:mod:`plugbroker.store.base`); this module turns them back
into the domain, in the order docs/durability.md gives:

1. durable exchanges (one the configuration declared already stays as configured);
2. durable queues, with their arguments and subscription type;
3. bindings (one with a missing or non-durable end is dropped, with a warning);
4. messages, per queue in the order they entered it, each with its delivery count,
   ``redelivered`` if it had been delivered or requeued, its TTL running from its wall-clock
   arrival; nack-backoff holds and retry-queue holds re-armed for what is left of them; one
   whose body fails its checksum is then dead-lettered as ``corrupt`` (never delivered);
5. messages held by delayed exchanges, re-armed for their remaining time;
6. message ids continue above the highest recovered one.

What the configuration now declares otherwise is left on disk (a queue now non-durable, a
virtual host no longer configured), with a warning; what cannot be restored at all (an
unreadable message, a binding or delayed message whose exchange is gone) is discarded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from plugbroker.clock import Clock
from plugbroker.domain.damage import expel_corrupt
from plugbroker.domain.exchange import DelayedExchange
from plugbroker.domain.message import Message, MessageIds
from plugbroker.domain.queue import Queue
from plugbroker.domain.vhost import VirtualHost
from plugbroker.errors import AMQPError
from plugbroker.store.base import QueueKey, Store, StoredTopology

log = logging.getLogger("plugbroker.core.recovery")


@dataclass(slots=True)
class RecoveryStats:
    """What a recovery restored (and dropped), for the log and for tests."""

    exchanges: int = 0
    queues: int = 0
    bindings: int = 0
    messages: int = 0
    delayed: int = 0
    #: messages that could not be restored (unreadable, or refused by the queue)
    dropped: int = 0
    #: messages whose body failed its checksum, dead-lettered as ``corrupt``
    corrupt: int = 0


def recover(
    store: Store, vhosts: Mapping[str, VirtualHost], *, clock: Clock, ids: MessageIds
) -> RecoveryStats:
    """Restore into ``vhosts`` (already holding what the configuration declares) everything
    ``store`` kept; ``ids`` (the broker's message ids) continue above the highest id on disk.
    A store that keeps nothing restores nothing."""
    stats = RecoveryStats()
    if not store.durable:
        return stats
    t0 = time.monotonic()
    rec = _Recovery(store, vhosts, clock, ids, stats)
    with store.recovering():
        rec.run()
    # once the store writes again: a damaged message may create its queue's DLQ
    for q, m in rec.corrupt:
        if expel_corrupt(q, m, m.body or b""):
            stats.corrupt += 1
    log.info(
        "store %s recovered in %.2f s: %d exchanges, %d queues, %d bindings, "
        "%d messages, %d delayed",
        store,
        time.monotonic() - t0,
        stats.exchanges,
        stats.queues,
        stats.bindings,
        stats.messages,
        stats.delayed,
    )
    return stats


class _Recovery:
    def __init__(
        self,
        store: Store,
        vhosts: Mapping[str, VirtualHost],
        clock: Clock,
        ids: MessageIds,
        stats: RecoveryStats,
    ) -> None:
        self.store = store
        self.vhosts = vhosts
        self.ids = ids
        self.stats = stats
        #: one reading of both clocks: every wall-clock time on disk is mapped through it
        self.now_w = clock.time()
        self.now_m = clock.monotonic()
        #: the highest message id seen on disk
        self.max_id = 0
        #: restored messages whose body fails its checksum (dead-lettered after recovery)
        self.corrupt: list[tuple[Queue, Message]] = []

    def run(self) -> None:
        topology = self.store.read_topology()
        self.exchanges(topology)
        queues = self.queues(topology)
        self.bindings(topology)
        self.messages(queues)
        self.delayed()
        if self.max_id:
            self.ids.advance(self.max_id)

    # ------------------------------------------------------------------ topology

    def exchanges(self, topology: StoredTopology) -> None:
        for rec in topology.exchanges:
            vh = self.vhosts.get(rec.vhost)
            if vh is None:
                log.warning(
                    "store: exchange '%s' of unknown vhost '%s' kept on disk, not loaded",
                    rec.name,
                    rec.vhost,
                )
                continue
            if rec.name in vh.exchanges:
                continue
            try:
                vh.declare_exchange(
                    rec.name,
                    rec.type,
                    durable=True,
                    auto_delete=rec.auto_delete,
                    internal=rec.internal,
                    arguments=rec.arguments,
                )
                self.stats.exchanges += 1
            except AMQPError as exc:
                log.warning(
                    "store: exchange '%s' in vhost '%s' not restored: %s", rec.name, rec.vhost, exc
                )

    def queues(self, topology: StoredTopology) -> dict[QueueKey, Queue]:
        """Declare the stored queues; returns those whose messages are to be restored."""
        restored: dict[QueueKey, Queue] = {}
        for rec in topology.queues:
            vh = self.vhosts.get(rec.vhost)
            if vh is None:
                log.warning(
                    "store: queue '%s' of unknown vhost '%s' kept on disk, not loaded",
                    rec.name,
                    rec.vhost,
                )
                continue
            q = vh.queues.get(rec.name)
            if q is None:
                try:
                    q, _ = vh.declare_queue(
                        rec.name,
                        durable=True,
                        auto_delete=rec.auto_delete,
                        arguments=rec.arguments,
                        subscription_type=rec.subscription_type,
                    )
                except AMQPError as exc:
                    log.warning(
                        "store: queue '%s' in vhost '%s' not restored: %s",
                        rec.name,
                        rec.vhost,
                        exc,
                    )
                    continue
                self.stats.queues += 1
            elif not q.durable:
                log.warning(
                    "store: queue '%s' in vhost '%s' is declared non-durable by the "
                    "configuration; its stored messages are kept on disk, not loaded",
                    rec.name,
                    rec.vhost,
                )
                continue
            if rec.dead_letter_target:
                q.dead_letter_target = True  # known as one since before the restart
            restored[rec.key] = q
        return restored

    def bindings(self, topology: StoredTopology) -> None:
        for rec in topology.bindings:
            vh = self.vhosts.get(rec.vhost)
            if vh is None:
                continue
            src = vh.exchanges.get(rec.source)
            dst = (
                vh.queues.get(rec.dest) if rec.dest_kind == "queue" else vh.exchanges.get(rec.dest)
            )
            if src is None or dst is None or not src.durable or not dst.durable:
                log.warning(
                    "store: binding %s -> %s '%s' (key %r) in vhost '%s' has a missing end; "
                    "dropped",
                    rec.source,
                    rec.dest_kind,
                    rec.dest,
                    rec.routing_key,
                    rec.vhost,
                )
                self.store.discard(rec)
                continue
            try:
                vh.bind(src, dst, rec.routing_key, rec.arguments, limited=False)
                self.stats.bindings += 1
            except AMQPError as exc:
                log.warning(
                    "store: binding %s -> %s in vhost '%s' not restored: %s",
                    rec.source,
                    rec.dest,
                    rec.vhost,
                    exc,
                )

    # ------------------------------------------------------------------ messages

    def messages(self, queues: dict[QueueKey, Queue]) -> None:
        """Messages in their queues' order; held ones re-armed for the rest of their hold.

        This loop runs once per stored message (a million for a long queue), so it keeps to
        locals: records are unpacked at once (a :class:`MessageRecord` is a named tuple), and
        the queue is looked up again only when the key changes (a store returns a queue's
        messages in runs, with one key object per queue).
        """
        store = self.store
        stats = self.stats
        now_w = self.now_w
        now_m = self.now_m
        from_publish = Message.from_publish
        max_id = self.max_id
        #: per queue: messages to make ready, and (message, remaining delay) to hold back
        per_queue: dict[Queue, tuple[list[Message], list[tuple[Message, float]]]] = {}
        last_key: QueueKey | None = None
        q: Queue | None = None
        for rec in store.read_messages():
            (
                key,
                mid,
                ex,
                rk,
                props,
                body,
                size,
                ts,
                arrival,
                count,
                delivered,
                due,
                timeouts,
                bad,
            ) = rec
            if mid > max_id:
                max_id = mid
            if key is not last_key:
                last_key = key
                q = queues.get(key)
            if q is None:
                continue  # kept on disk (see queues())
            try:
                # body None: paged, read back before dispatch; the arrival is moved onto the
                # monotonic clock, so the TTL runs on from the wall-clock arrival
                arrived = now_m - max(0.0, now_w - arrival)
                m = from_publish(mid, ex, rk, props, body, size, arrived, ts)
            except Exception as exc:
                log.error(
                    "store: message %d of queue '%s' is unreadable (%s); dropped", mid, q.name, exc
                )
                store.discard(rec)
                stats.dropped += 1
                continue
            if body is None and m.expiration is not None and q.dlx is not None:
                # it may expire into a dead-letter exchange from the ready list: keep its body
                # in memory (what Queue.pageable ensures for messages added live)
                m.body = store.read_body(q, m)  # None: still paged
            m.delivery_count = count
            m.timeouts = timeouts
            m.redelivered = delivered or count > 0
            m.stored = True
            if bad:
                self.corrupt.append((q, m))
            if due is not None and q.retry_target is not None:
                # a retry queue's hold: the rest of its delay, or at once if it passed; it is
                # forwarded whole, so its body comes back into memory now
                if m.body is None:
                    m.body = store.read_body(q, m)
                q.restore_retry_hold(m, due - now_w)
                stats.messages += 1
                continue
            lists = per_queue.get(q)
            if lists is None:
                lists = per_queue[q] = ([], [])
            if due is not None and due > now_w:
                lists[1].append((m, due - now_w))
            else:
                lists[0].append(m)
        self.max_id = max_id

        for q, (ready, held) in per_queue.items():
            for m, delay in held:  # first, so each removal from the ready list is O(1)
                if self.enqueue(q, m):
                    q.ready.remove(m)
                    q.ready_bytes -= m.body_size
                    q.hold_back(m, delay)
                    stats.messages += 1
            for m in ready:
                if self.enqueue(q, m):
                    stats.messages += 1
                else:
                    stats.dropped += 1

    def enqueue(self, q: Queue, m: Message) -> bool:
        if q.enqueue(m):
            return True
        # refused (reject-publish overflow under a changed configuration)
        m.stored = False
        self.store.remove_message(q, m)
        return False

    # ------------------------------------------------------------------ delayed exchanges

    def delayed(self) -> None:
        now_w = self.now_w
        for rec in self.store.read_delayed():
            if rec.id > self.max_id:
                self.max_id = rec.id
            vh = self.vhosts.get(rec.vhost)
            ex = vh.exchanges.get(rec.exchange) if vh is not None else None
            if vh is None or not isinstance(ex, DelayedExchange):
                if vh is not None:
                    log.warning(
                        "store: delayed message %d for missing exchange '%s' in vhost '%s' dropped",
                        rec.id,
                        rec.exchange,
                        rec.vhost,
                    )
                    self.store.discard(rec)
                continue
            m = Message.from_publish(
                rec.id,
                rec.exchange,
                rec.routing_key,
                rec.properties,
                rec.body,
                len(rec.body),
                self.now_m,
                rec.timestamp,
            )
            vh.hold_delayed(ex, m, max(0.0, rec.due - now_w))
            m.stored = True
            self.stats.delayed += 1


__all__ = ["RecoveryStats", "recover"]

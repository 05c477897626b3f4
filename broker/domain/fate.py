"""Message fate: the one place that decides what becomes of a message once it left the ready list.

Every path by which a delivered or held message is settled, rejected, requeued (with the
delivery limit), dead-lettered, forwarded from a retry queue, redriven from a dead-letter queue,
or taken back from an isolated consumer is one function of this module:

==========================  ======================================================================
:func:`ack`                 basic.ack (and the ack part of tx.commit)
:func:`reject`              basic.nack / basic.reject: the plugins' decision, else AMQP's rules
:func:`settle_unacked`      a no-ack delivery or a no-ack basic.get: settled as it is sent
:func:`requeue`             back to the queue (at once or after a delay), delivery limit applied
:func:`late_settle`         an ack/nack for a message taken back from an isolated consumer
:func:`expire`              a TTL ran out at the head of a queue
:func:`overflow`            ``x-max-length`` / ``x-max-length-bytes`` pushed a message out
:func:`dead_letter_or_drop` to the dead-letter target if the queue has one, else dropped
:func:`dead_letter`         republish to the dead-letter target with RabbitMQ's ``x-death``
:func:`forward`             a copy into another queue: retry-queue forwarding and redrive
:func:`reconsume`           a consumer asked to retry a delivery: a copy to the retry queue or DLQ
:func:`retry_due`           a retry queue's hold ran out: the message goes back to its target
:func:`redrive`             a dead-letter queue's messages go back to where they died
:func:`enqueue`             the broker puts a message on queues: a dead letter, a delayed release
:func:`purge`               queue.purge: the ready messages leave
:func:`purge_in_steps`      the same, its per-message part a bounded step at a time (admin)
:func:`let_go_in_steps`     a deleted queue's messages freed a bounded step at a time (admin)
:func:`plan_redrive`        which of them would go where (a dry run, and each paced step)
:class:`StepwiseRedrive`    a redrive without a rate, a bounded step at a time (admin)
:func:`isolate`             blocklist a consumer and requeue its unacked messages to the others
:func:`release`             take a consumer off the blocklist
:func:`requeue_unsettled`   messages a consumer held without settling come back (disconnect,
                            isolation): poison ones dead-lettered, the others :func:`requeue`
:func:`count_timeout`       a consumer's ack clock ran out: the delivery it works on counts one
                            timed-out hand-out; at ``poisonDeliveries`` it is dead-lettered
                            (reason ``poison``, parked in ``{queue}-DLQ`` without a target)
:func:`timed_out_on_close`  the same for a consumer whose channel closes past its ack timeout
:func:`hold_deferred`       a delivery that is not due yet (its ETA header): off the ack clock
:func:`touch`               a consumer says it still works on a delivery: its ack clock restarts
==========================  ======================================================================

The session (the basic.* methods, channel close, basic.recover), the core API (isolation,
release, redrive), the queue (expiry, overflow, retry holds) call these; the message-event hooks
(``broker_message_acked``, ``..._rejected``, ``..._redelivered``, ``..._dead_lettered``,
``..._enqueued``, ``..._removed``, ``..._expired``, ``..._dropped``,
``..._timed_out``, ``broker_consumer_isolated``, ``..._released``) and the decision hooks
(``broker_reject_decision``, ``broker_redelivery_delay``, ``broker_dead_letter_target``) are
called from here and from nowhere else, so no path can miss one. The queue keeps only the
primitives (take from the ready list, put back, forget).
"""

from __future__ import annotations

import datetime as _dt
import heapq
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from plugbroker.retry import DEFAULT_MAX_RECONSUME, MAX_DELAY, MIN_DELAY
from plugbroker.subscription import EXCLUSIVE, FAILOVER

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterator, Sequence

    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Consumer, Queue
    from plugbroker.domain.vhost import VirtualHost

log = logging.getLogger("broker.vhost")
policy_log = logging.getLogger("plugbroker.policy")


class Settler(Protocol):
    """Who settles: the channel a delivery went out on (for the hooks' arguments)."""

    id: int
    connection_id: str


# --------------------------------------------------------------------------- settle


def ack(q: Queue, msg: Message, consumer: Consumer | None, channel: Settler, now: float) -> None:
    """A consumer acked ``msg`` (``consumer`` is None for a basic.get delivery)."""
    ack_all(((msg, q, consumer),), channel, now)


def ack_all(
    entries: Sequence[tuple[Message, Queue, Consumer | None]], channel: Settler, now: float
) -> None:
    """Acks from one channel (a ``multiple`` ack covers several): each message is settled,
    its consumer's ack clock restarts (an isolated consumer is released), and
    ``broker_message_acked`` is called for it. The hot path: the hook is looked up once."""
    if not entries:
        return
    h = entries[0][1].vhost.hooks.message_acked  # one channel, one vhost, one plugin host
    for msg, q, consumer in entries:
        q.settle(msg)
        q.acked_total += 1
        tag = _settled_by(consumer, now, "acked", msg.id)
        if h is not None:
            h(
                vhost=q.vhost.name,
                queue=q.name,
                consumer_tag=tag,
                connection_id=channel.connection_id,
                channel_id=channel.id,
                message=msg,
            )
        if not q.dirty and q.ready:
            q.vhost.mark_dirty(q)


def _settled_by(consumer: Consumer | None, now: float, how: str, msg_id: int) -> str | None:
    """``consumer`` settled one of its deliveries (None: a basic.get): one fewer unacked, its
    ack clock restarts, and it leaves the blocklist. Returns its tag for the hooks."""
    if consumer is None:
        return None
    n = consumer.unacked - 1
    consumer.unacked = n
    consumer.last_ack = now
    if consumer.pardon:
        _end_pardon(consumer)
    if consumer.counted == msg_id:
        consumer.counted = 0  # the hand-out that timed out is over
        consumer.counted_at = None
    if consumer.deferred:
        unheld(consumer, msg_id)
        restart_clock(consumer, now)
    else:
        consumer.busy_since = now if n > 0 else None
    if consumer.isolated:
        release(consumer, how)
    return consumer.tag


def settle_unacked(q: Queue, msg: Message) -> None:
    """A message delivered with no-ack is done with as it is sent (no ack will come)."""
    q.settle(msg)


def reject(
    q: Queue,
    msg: Message,
    consumer: Consumer | None,
    channel: Settler,
    requeue_: bool,
    now: float,
) -> None:
    """A consumer nacked or rejected ``msg``: ask the plugins, else follow AMQP.

    A ``broker_reject_decision`` answer wins (requeue after a delay, dead-letter, drop). Without
    one, ``requeue`` puts the message back (after ``broker_redelivery_delay``, if a plugin gives
    one), within the queue's delivery limit; ``requeue=false`` dead-letters or drops it.
    """
    tag = _settled_by(consumer, now, "rejected", msg.id)
    vh = q.vhost
    hooks = vh.hooks
    h = hooks.message_rejected
    if h is not None:
        h(
            vhost=vh.name,
            queue=q.name,
            consumer_tag=tag,
            connection_id=channel.connection_id,
            channel_id=channel.id,
            message=msg,
            requeue=requeue_,
        )
    if q.deleted or msg.id not in q.held:
        return  # the queue let go of it meanwhile (deleted): nothing left to decide
    _reject(q, msg, requeue_)
    if not q.dirty and q.ready:
        vh.mark_dirty(q)  # the consumer's prefetch slot is free again


def _reject(q: Queue, msg: Message, requeue_: bool) -> None:
    vh = q.vhost
    hooks = vh.hooks
    decide = hooks.reject_decision
    decision = None
    if decide is not None:
        decision = decide(
            vhost=vh.name,
            queue=q.name,
            message=msg,
            requeue=requeue_,
            delivery_count=msg.delivery_count,
        )
    if decision is not None:
        kind = decision.kind
        if kind == "requeue":
            requeue(q, [msg], "rejected", delay=decision.delay)
        elif kind == "dead-letter":
            q.settle(msg)
            dead_letter(q, msg, decision.reason)
        else:
            q.settle(msg)
            drop(q, msg, decision.reason)
        return
    if requeue_:
        delay = None
        hd = hooks.redelivery_delay
        if hd is not None:
            delay = hd(
                vhost=vh.name,
                queue=q.name,
                message=msg,
                delivery_count=msg.delivery_count + 1,
            )
        requeue(q, [msg], "rejected", delay=delay or 0.0)
    else:
        q.settle(msg)
        dead_letter_or_drop(q, msg, "rejected")


def requeue(
    q: Queue,
    msgs: Sequence[Message],
    reason: str,
    *,
    delay: float = 0.0,
    count: bool = True,
) -> list[Message]:
    """Delivered messages go back to ``q``: to the front at once, or after ``delay`` seconds.

    Each one's delivery count goes up (unless ``count`` is false). A message whose count would
    pass the queue's delivery limit is dead-lettered with reason ``delivery_limit`` instead
    (PIP-22's redelivery tracker, on every requeue path). Messages the queue no longer holds
    (it was deleted, or a late ack took them) are skipped. Raised counts of stored messages are
    written to the store; ``broker_message_redelivered`` is called for each one requeued.
    Returns the messages requeued.
    """
    if q.deleted:
        return []
    limit = q.delivery_limit if count else None
    held = q.held
    live: list[Message] = []
    for m in msgs:
        if m.id not in held:
            continue
        if limit is not None and m.delivery_count + 1 > limit:
            m.redelivered = True
            m.delivery_count += 1
            q.settle(m)
            dead_letter_or_drop(q, m, "delivery_limit")
            continue
        live.append(m)
    if not live:
        return live
    if delay > 0:
        for m in live:
            if count:
                m.delivery_count += 1
            q.hold_back(m, delay)
    else:
        q.requeue(live, count=count)
    vh = q.vhost
    store = vh.store
    if store.durable:
        for m in live:
            if m.stored:
                store.update_message(q, m)
    h = vh.hooks.message_redelivered
    if h is not None:
        for m in live:
            h(
                vhost=vh.name,
                queue=q.name,
                message=m,
                delivery_count=m.delivery_count,
                reason=reason,
            )
    return live


def late_settle(
    q: Queue, msg: Message, consumer: Consumer, channel: Settler, ack_: bool, now: float
) -> None:
    """An ack, nack or reject for a message taken back from ``consumer`` when it was isolated.

    It is a sign of life: the consumer's ack clock restarts and it leaves the blocklist. For an
    ack, a message nobody has received since counts as acked (and ``broker_message_acked`` is
    called); one already redelivered stays with its new consumer. A nack or reject changes
    nothing more: the message was requeued already.
    """
    consumer.last_ack = now
    if consumer.pardon:
        _end_pardon(consumer)
    if consumer.counted == msg.id:
        consumer.counted = 0
        consumer.counted_at = None
    restart_clock(consumer, now)
    if consumer.isolated:
        release(consumer, "acked" if ack_ else "rejected")
    if not ack_ or q.deleted or msg.id not in q.moved_waiting or msg.id not in q.held:
        return
    q.moved_waiting.discard(msg.id)
    if not q.take_ready(msg):
        return  # already delivered elsewhere
    q.settle(msg)
    vh = q.vhost
    h = vh.hooks.message_acked
    if h is not None:
        h(
            vhost=vh.name,
            queue=q.name,
            consumer_tag=consumer.tag,
            connection_id=channel.connection_id,
            channel_id=channel.id,
            message=msg,
        )


# --------------------------------------------------------------------------- the ack clock
#
# SPEC 6's ack clock is per consumer (``busy_since``). ETA awareness: a delivery whose message
# says it is not due yet (``<isolation><etaHeaders>``, Celery's ``eta`` by default) is parsed
# once, when it is delivered; it is kept in the consumer's ``deferred`` (message id -> due) and
# ``due_heap``, and the clock of a consumer that holds only such deliveries starts at the
# earliest due time, not at the delivery. ``busy_since`` may so lie in the future: the
# isolation check (``now - busy_since > ackTimeout``) and every reader of the clock need no
# change, and a check stays O(queues + consumers).


def due_time(headers: dict[str, Any], names: Sequence[str]) -> float | None:
    """When a message is due, in seconds since the epoch, from the first of the ``names``
    headers it has: ISO 8601 text (with or without a timezone; without one it is UTC, as
    Celery sends it), an AMQP timestamp, or a number of seconds since the epoch. ``None``
    when it has none of them, or the value cannot be read (the delivery is then due at once:
    a bad header never holds a consumer's clock back)."""
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            try:
                value = _dt.datetime.fromisoformat(value.strip())
            except ValueError:
                return None
        if isinstance(value, _dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=_dt.UTC)
            try:
                return value.timestamp()
            except (OverflowError, OSError, ValueError):
                return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            f = float(value)
            return f if f == f and abs(f) < 1e12 else None  # NaN and absurd values: none
        return None
    return None


def hold_deferred(consumer: Consumer, msg_id: int, due: float) -> None:
    """``consumer`` was just handed a delivery that is not due before ``due`` (monotonic): it
    does not count on its ack clock until then. Call after the delivery was counted in
    ``consumer.unacked``. O(log n) in the deferred deliveries it holds."""
    consumer.deferred[msg_id] = due
    heapq.heappush(consumer.due_heap, (due, msg_id))
    if consumer.unacked <= len(consumer.deferred):
        # it held nothing that was due: its clock starts at the earliest due time
        since = consumer.busy_since
        if since is None or since > due:
            consumer.busy_since = due


def held_due(consumer: Consumer, now: float) -> None:
    """``consumer`` was just handed a delivery that is due (the usual case, for a queue with
    ETA awareness): if it held only deliveries not due yet, its clock starts now."""
    since = consumer.busy_since
    if since is None or since > now:
        consumer.busy_since = now


def earliest_due(consumer: Consumer) -> float | None:
    """The earliest due time of the deferred deliveries ``consumer`` holds (None: none)."""
    d = consumer.deferred
    h = consumer.due_heap
    while h and d.get(h[0][1]) != h[0][0]:
        heapq.heappop(h)
    return h[0][0] if h else None


def unheld(consumer: Consumer, msg_id: int) -> None:
    """``consumer`` no longer holds the delivery of ``msg_id`` (settled, taken back)."""
    d = consumer.deferred
    if d.pop(msg_id, None) is None:
        return
    h = consumer.due_heap
    if not d:
        h.clear()
    elif len(h) > 2 * len(d) + 32:  # keep the heap O(held): drop the stale entries
        h[:] = [(due, mid) for due, mid in h if d.get(mid) == due]
        heapq.heapify(h)


def restart_clock(consumer: Consumer, now: float) -> None:
    """Restart ``consumer``'s ack clock (an ack, nack, reject or touch): it runs from now if it
    holds a delivery that is due, from the earliest due time if it holds only deliveries not
    due yet, and not at all if it holds nothing."""
    n = consumer.unacked
    if n <= 0:
        consumer.busy_since = None
        return
    d = consumer.deferred
    if d and n <= len(d):
        due = earliest_due(consumer)
        consumer.busy_since = due if due is not None and due > now else now
    else:
        consumer.busy_since = now


def touch(consumer: Consumer, now: float) -> None:
    """``consumer`` says it still works on one of its deliveries (a publish to ``amq.touch``):
    its ack clock restarts as on an ack, nothing is settled, and an isolated consumer stays
    isolated (it holds nothing: what it held was moved, and only an ack says it is back)."""
    restart_clock(consumer, now)


# --------------------------------------------------------------------------- removal


def expire(q: Queue, msg: Message) -> None:
    """``msg``'s TTL passed at the head of ``q`` (the queue has let go of it already)."""
    vh = q.vhost
    h = vh.hooks.message_expired
    if h is not None:
        h(vhost=vh.name, queue=q.name, message=msg)
    dead_letter_or_drop(q, msg, "expired")


def overflow(q: Queue, msg: Message, *, refused: bool) -> None:
    """A length limit pushed ``msg`` out of ``q`` (``maxlen``).

    :param refused: the publish itself was refused (``reject-publish-dlx``): the message is
        dead-lettered if the queue can, and the publisher gets a nack either way.
    """
    msg.queue_name = q.name
    if refused:
        dead_letter(q, msg, "maxlen")
    else:
        dead_letter_or_drop(q, msg, "maxlen")


def drop(q: Queue, msg: Message, reason: str) -> None:
    """``msg`` leaves ``q`` for good; the plugins are told why."""
    vh = q.vhost
    h = vh.hooks.message_dropped
    if h is not None:
        h(vhost=vh.name, queue=q.name, message=msg, reason=reason)


def dead_letter_or_drop(q: Queue, msg: Message, reason: str) -> None:
    """Dead-letter ``msg`` if the queue has a target, else drop it and say so."""
    if not dead_letter(q, msg, reason):
        drop(q, msg, reason)


def dead_letter(q: Queue, msg: Message, reason: str) -> bool:
    """Republish ``msg`` to the queue's dead-letter target with an ``x-death`` record.

    The target is a plugin's ``broker_dead_letter_target`` answer, else the queue's
    ``x-dead-letter-exchange``. Returns False when there is none (the caller drops the message).
    Queues the message already died in, with no rejection along the way, are skipped: that is a
    dead-letter cycle, which would otherwise go round for ever.
    """
    return _dead_letter(q, msg, reason) is not None


def dead_letter_or_park(q: Queue, msg: Message, reason: str) -> list[str]:
    """Dead-letter ``msg`` as :func:`dead_letter` does; a queue with no target parks it in
    ``{queue}-DLQ`` instead (declared durable on first use), so it is never dropped. Returns
    the names of the queues that took it."""
    taken = _dead_letter(q, msg, reason, park=True)
    return [t.name for t in taken or ()]


def park_queue_name(queue: str) -> str:
    """Where a queue with no dead-letter target parks what must not be lost."""
    name = f"{queue}-DLQ"
    while len(name.encode()) > 255:  # names are at most 255 bytes
        queue = queue[:-1]
        name = f"{queue}-DLQ"
    return name


def _dead_letter(q: Queue, msg: Message, reason: str, *, park: bool = False) -> list[Queue] | None:
    """:func:`dead_letter`; returns the queues that took the dead letter, None when the queue
    has no target (and ``park`` is false)."""
    vh = q.vhost
    choose = vh.hooks.dead_letter_target
    chosen = None
    if choose is not None:
        chosen = choose(vhost=vh.name, queue=q.name, message=msg, reason=reason)
    extra: dict[str, Any] | None
    declare = None
    if chosen is not None:
        target = chosen.exchange
        routing_key = chosen.routing_key
        extra = dict(chosen.headers) if chosen.headers else None
        declare = chosen.declare_queue
    elif q.dlx is not None:
        target = q.dlx
        routing_key = q.dlx_routing_key or msg.routing_key
        extra = None
    elif park:
        target = ""
        routing_key = declare = park_queue_name(q.name)
        extra = None
    else:
        return None
    if declare and declare not in vh.queues:
        dlq, _ = vh.declare_queue(declare, durable=True)
        log.info(
            "dead-letter queue '%s' in vhost '%s' created for queue '%s'",
            dlq.name,
            vh.name,
            q.name,
        )
    ex = vh.exchanges.get(target)
    if ex is None:
        log.warning(
            "dead-letter exchange '%s' of queue '%s' in vhost '%s' does not exist; message dropped",
            target,
            q.name,
            vh.name,
        )
        drop(q, msg, reason)
        return []
    if not _ensure_body(q, msg):
        log.error(
            "dead-lettering message %d of queue '%s' in vhost '%s': its body is gone; dropped",
            msg.id,
            q.name,
            vh.name,
        )
        return []
    dead = make_dead_letter(
        q, msg, reason, routing_key=routing_key, exchange=target, extra_headers=extra
    )
    queues = vh.route(ex, dead)
    deaths = dead.headers.get("x-death") or []
    rejected_in_chain = any(d.get("reason") == "rejected" for d in deaths)
    if not rejected_in_chain:
        died_in = {d.get("queue") for d in deaths}
        cyc = [t for t in queues if t.name in died_in]
        if cyc:
            log.warning(
                "dead-letter cycle through %s in vhost '%s' broken: message %d dropped there",
                ", ".join(repr(t.name) for t in cyc),
                vh.name,
                msg.id,
            )
            queues = [t for t in queues if t not in cyc]
    for t in queues:
        if not t.dead_letter_target:
            vh.mark_dead_letter_target(t)  # slow-consumer sections stop reaching it
    h = vh.hooks.message_dead_lettered
    if h is not None:
        h(
            vhost=vh.name,
            queue=q.name,
            message=msg,
            reason=reason,
            exchange=target,
            routing_key=dead.routing_key,
        )
    q.dead_lettered_total += 1
    taken: list[Queue] = []
    if queues:
        taken = enqueue(vh, queues, dead, "dead-letter")
        for t in taken:
            counts = vh.dead_letter_queues.setdefault(t.name, {})
            counts[reason] = counts.get(reason, 0) + 1
    return taken


def enqueue(vh: VirtualHost, queues: Sequence[Queue], msg: Message, reason: str) -> list[Queue]:
    """The broker itself puts ``msg`` on ``queues`` (a dead letter on its dead-letter queues,
    ``reason`` ``dead-letter``; a delayed message released, ``delayed``): enqueued, then
    ``broker_message_enqueued`` for each queue that took it. Returns those queues."""
    taken, _ = vh.deliver_to_queues(list(queues), msg)
    h = vh.hooks.message_enqueued
    if h is not None:
        for t in taken:
            h(vhost=vh.name, queue=t.name, message=msg, reason=reason)
    return taken


def removed(q: Queue, msg: Message, reason: str) -> None:
    """``msg`` left ``q`` otherwise than by a settle, an expiry, a dead letter or a drop."""
    vh = q.vhost
    h = vh.hooks.message_removed
    if h is not None:
        h(vhost=vh.name, queue=q.name, message=msg, reason=reason)


def purge(q: Queue) -> int:
    """queue.purge: the ready messages of ``q`` leave (``broker_message_removed``, reason
    ``purged``, for each); unacked ones stay with their consumers. Returns how many left."""
    msgs = q.purge()
    h = q.vhost.hooks.message_removed
    if h is not None:
        vname = q.vhost.name
        for m in msgs:
            h(vhost=vname, queue=q.name, message=m, reason="purged")
    return len(msgs)


#: messages one step of a stepwise purge, delete or redrive handles before the loop serves
#: others (about a millisecond of work for a purge; see docs/benchmarks.md, "Fairness")
STEP_MESSAGES = 2048


def purge_in_steps(q: Queue, step: int | None = None) -> tuple[int, Iterator[None]]:
    """queue.purge of a queue that may hold millions: the ready list is emptied now, as one
    purge at one instant (what a consumer, a declare-ok or a late publish sees), and returns
    ``(count, steps)``; each ``next(steps)`` then lets go of at most ``step`` of the purged
    messages (``broker_message_removed``, reason ``purged``, for each; their store records;
    their memory), so the loop serves others between steps. Until the last step the queue's
    ``messages`` and ``bytes`` figures still count the purged messages not yet let go."""
    msgs = q.take_all_ready()
    return len(msgs), _forget_in_steps(q, msgs, max(1, step or STEP_MESSAGES))


def _forget_in_steps(q: Queue, msgs: list[Message], step: int) -> Iterator[None]:
    msgs.reverse()  # taken from the end, in delivery order: each step frees what it took
    vname = q.vhost.name
    while msgs:
        part = msgs[-step:]
        del msgs[-step:]
        part.reverse()
        if not q.deleted:  # deleted meanwhile: they went with the queue (its delete counted them)
            q.forget_taken(part)
            h = q.vhost.hooks.message_removed
            if h is not None:
                for m in part:
                    h(vhost=vname, queue=q.name, message=m, reason="purged")
        del part
        if msgs:
            yield


def let_go_in_steps(msgs: dict[int, Message], step: int | None = None) -> Iterator[None]:
    """Drop the references to a deleted queue's messages (``VirtualHost.delete_queue``'s
    ``keep``) ``step`` at a time: freeing a million messages at once holds the loop for a
    sizeable fraction of a second."""
    step = max(1, step or STEP_MESSAGES)
    pop = msgs.popitem
    while msgs:
        for _ in range(min(step, len(msgs))):
            pop()
        if msgs:
            yield


#: header of a dead letter: the delivery count the message had when it died
LAST_DELIVERY_COUNT = "x-last-delivery-count"


def make_dead_letter(
    q: Queue,
    msg: Message,
    reason: str,
    *,
    routing_key: str,
    exchange: str | None = None,
    extra_headers: dict[str, Any] | None = None,
) -> Message:
    """A copy of ``msg`` carrying RabbitMQ's ``x-death`` record for this death."""
    vh = q.vhost
    props = msg.decoded
    headers = dict(props.get("application_headers") or {})
    deaths = [dict(d) for d in (headers.get("x-death") or []) if isinstance(d, dict)]
    now = _dt.datetime.fromtimestamp(int(vh.clock.time()), tz=_dt.UTC)
    entry = None
    for d in deaths:
        if d.get("queue") == q.name and d.get("reason") == reason:
            entry = d
            break
    if entry is not None:
        deaths.remove(entry)
        entry["count"] = int(entry.get("count", 1)) + 1
        entry["time"] = now
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": q.name,
            "time": now,
            "exchange": msg.exchange,
            "routing-keys": [msg.routing_key],
        }
        if props.get("expiration") is not None:
            entry["original-expiration"] = props["expiration"]
    deaths.insert(0, entry)
    headers["x-death"] = deaths
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", q.name)
    headers.setdefault("x-first-death-exchange", msg.exchange)
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = q.name
    headers["x-last-death-exchange"] = msg.exchange
    # the count it died with: a redrive that keeps counts gives it back
    headers[LAST_DELIVERY_COUNT] = msg.delivery_count
    if extra_headers:
        headers.update(extra_headers)
    props["application_headers"] = headers
    props.pop("expiration", None)  # a dead-lettered message does not expire again
    dead = msg.with_properties(props, vh.ids.next())
    dead.exchange = exchange if exchange is not None else (q.dlx or "")
    dead.routing_key = routing_key
    dead.arrival = vh.clock.monotonic()
    dead.timestamp = vh.clock.time()
    return dead


def _ensure_body(q: Queue, msg: Message) -> bool:
    """Bring back a body the store paged out (it is about to be copied elsewhere)."""
    if msg.body is None:
        body = q.vhost.store.read_body(q, msg)
        if body is None:
            return False
        msg.body = body
    return True


# --------------------------------------------------------------------------- moving on


def forward(
    source: Queue, msg: Message, target: Queue, reason: str, *, reset_count: bool
) -> Message | None:
    """Put a copy of ``msg`` (from ``source``) into ``target`` as a new message.

    The copy gets a new id, arrives now, is not redelivered and carries no expiry of its own;
    with ``reset_count`` its delivery count starts again at 0 (a redrive), else it keeps it (a
    retry). Returns the copy when ``target`` took it, None when it would not (see
    :func:`cannot_move`); ``broker_message_redelivered`` (with ``reason``) is called on
    ``target`` for a copy it took. The caller settles the original.
    """
    vh = source.vhost
    if cannot_move(source, msg, target) is not None:
        return None
    m = msg.copy()
    m.id = vh.ids.next()
    m.arrival = vh.clock.monotonic()
    m.expires_at = None
    m.stored = False
    m.redelivered = False
    m.timeouts = 0  # a new hand-out history in the target
    if reset_count:
        m.delivery_count = 0
    taken, _ = vh.deliver_to_queues([target], m)
    if not taken:
        return None
    h = vh.hooks.message_redelivered
    if h is not None:
        h(
            vhost=vh.name,
            queue=target.name,
            message=m,
            delivery_count=m.delivery_count,
            reason=reason,
        )
    return m


def cannot_move(source: Queue, msg: Message, target: Queue) -> str | None:
    """Why ``msg`` cannot move from ``source`` to ``target`` now, or None if it can:
    ``no-body`` (the store could not read its paged-out body back), ``maxlen`` (the target's
    length limits would keep it out: it is not offered, so the target does not dead-letter a
    copy of it)."""
    if not _ensure_body(source, msg):
        log.error(
            "queue '%s' in vhost '%s': message %d has no body; not moved to '%s'",
            source.name,
            source.vhost.name,
            msg.id,
            target.name,
        )
        return "no-body"
    if target.refuses(msg):
        return "maxlen"
    return None


def retry_due(retry_q: Queue, msg: Message) -> None:
    """A retry queue's hold of ``msg`` ran out: it goes back to the queue it was retried from."""
    if not retry_q.release_hold(msg):
        return  # the retry queue was deleted, or purged, meanwhile
    vh = retry_q.vhost
    target = vh.queues.get(retry_q.retry_target or "")
    if target is None:
        log.warning(
            "retry queue '%s' in vhost '%s': target queue '%s' does not exist; message dropped",
            retry_q.name,
            vh.name,
            retry_q.retry_target,
        )
        drop(retry_q, msg, "no-target")
        return
    why = cannot_move(retry_q, msg, target)
    if why is None and forward(retry_q, msg, target, "retry", reset_count=False) is not None:
        removed(retry_q, msg, "retry")
    else:
        log.warning(
            "retry queue '%s' in vhost '%s': message %d could not go back to queue '%s' (%s); "
            "dropped",
            retry_q.name,
            vh.name,
            msg.id,
            target.name,
            why or "refused",
        )
        drop(retry_q, msg, why or "maxlen")


def original_queue_of(msg: Message) -> str | None:
    """The queue a dead letter came from: ``REAL_TOPIC``, else its last ``x-death`` queue."""
    if msg._hoff < 0:
        return None
    h = msg.headers
    real = h.get("REAL_TOPIC")
    if isinstance(real, (str, bytes)) and real:
        return real.decode() if isinstance(real, bytes) else real
    deaths = h.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        origin = deaths[0].get("queue")
        return origin if isinstance(origin, str) else None
    return None


def death_reason_of(msg: Message) -> str | None:
    """Why a dead letter died last: its newest ``x-death`` record's reason (None if it has
    none: then it was not dead-lettered by a broker)."""
    if msg._hoff < 0:
        return None
    h = msg.headers
    deaths = h.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        reason = deaths[0].get("reason")
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        return reason if isinstance(reason, str) else None
    last = h.get("x-last-death-reason")
    return last if isinstance(last, str) else None


def origin_message_id(msg: Message) -> str:
    """``ORIGIN_MESSAGE_ID`` for a retry or a dead letter of ``msg``: the one it carries already
    (set by an earlier retry), else its ``message_id`` property, else a new unique id (kept in
    the header from then on, so it stays the same across retries)."""
    if msg._hoff >= 0:
        origin = msg.headers.get("ORIGIN_MESSAGE_ID")
        if isinstance(origin, bytes):
            origin = origin.decode(errors="replace")
        if isinstance(origin, str) and origin:
            return origin
    mid = msg.message_id
    if isinstance(mid, bytes):
        mid = mid.decode(errors="replace")
    if isinstance(mid, str) and mid:
        return mid
    return uuid.uuid4().hex


# --------------------------------------------------------------------------- reconsume

RETRIED = "retry"
DEAD_LETTERED = "dead-letter"


class RetryRefused(Exception):
    """A retry the broker will not do; the text says why (it goes back to the client)."""


def reconsume(
    q: Queue, msg: Message, *, delay: float | None = None, level: int | None = None
) -> tuple[str, Message]:
    """A consumer asked to retry ``msg``, an unacked delivery from ``q`` (TDMQ's
    reconsumeLater, done by the broker: :func:`plugbroker.retry.reconsume_later` asks for it
    through ``amq.retry``).

    A copy gets TDMQ's headers (``REAL_TOPIC`` the queue, ``ORIGIN_MESSAGE_ID``,
    ``RETRY_TOPIC`` the retry queue, ``RECONSUMETIMES`` one more than before) and goes to the
    queue's retry queue, which holds it for ``delay`` seconds, the delay of ``level``, or the
    level after ``RECONSUMETIMES``, then puts it back on ``q``; in an ``exclusive`` or
    ``failover`` subscription it goes back on ``q`` at once, without the delay. Past the queue's limit
    (``<maxRedeliveries>``) the copy is dead-lettered instead, reason ``delivery_limit``.
    The original is not touched: the client acks it once the broker confirmed the copy.

    :returns: ``(RETRIED or DEAD_LETTERED, the copy)``.
    :raises RetryRefused: ``q`` has no retry queue, a delay or level out of range, or no
        queue would take the copy (the client then leaves the original unacked).
    """
    vh = q.vhost
    retry_q = vh.retry_queue_of(q.name) if q.retry_target is None else None
    if retry_q is None:
        raise RetryRefused(
            f"queue '{q.name}' in vhost '{vh.name}' has no retry queue "
            "(configure <deadLetter><retry> for it)"
        )
    if delay is not None and not (MIN_DELAY <= delay <= MAX_DELAY):
        raise RetryRefused(f"delay {delay:g} s is out of range: {MIN_DELAY:g} to {MAX_DELAY:g} s")
    levels = retry_q.retry_levels
    if level is not None and not (1 <= level <= len(levels)):
        raise RetryRefused(
            f"level {level} is out of range for queue '{q.name}': 1 to {len(levels)}"
        )
    if not _ensure_body(q, msg):
        raise RetryRefused(f"message {msg.id} of queue '{q.name}' has no body")
    props = msg.decoded
    headers = dict(props.get("application_headers") or {})
    times = _count(headers.get("RECONSUMETIMES")) + 1
    headers["REAL_TOPIC"] = q.name
    headers["ORIGIN_MESSAGE_ID"] = origin_message_id(msg)
    headers["RETRY_TOPIC"] = retry_q.name
    headers["RECONSUMETIMES"] = times
    for name in ("x-delay", "x-retry-level", "x-delivery-count"):
        headers.pop(name, None)
    limit = q.delivery_limit if q.delivery_limit is not None else DEFAULT_MAX_RECONSUME
    dead = times > limit
    if not dead and q.subscription_type not in (EXCLUSIVE, FAILOVER):
        if delay is not None:
            headers["x-delay"] = round(delay * 1000)
        elif level is not None:
            headers["x-retry-level"] = level
    props["application_headers"] = headers
    copy = msg.with_properties(props, vh.ids.next())
    copy.arrival = vh.clock.monotonic()
    copy.timestamp = vh.clock.time()
    if dead:
        if not dead_letter(q, copy, "delivery_limit"):
            raise RetryRefused(
                f"queue '{q.name}' in vhost '{vh.name}' has used up its retries and has no "
                "dead-letter queue"
            )
        return DEAD_LETTERED, copy
    if q.subscription_type in (EXCLUSIVE, FAILOVER):
        # one consumer at a time: a retry is delivered at once, without the delay (as in
        # Pulsar, whose delays need a shared subscription), straight back to the queue
        if q.refuses(copy):
            raise RetryRefused(f"queue '{q.name}' in vhost '{vh.name}' is full")
        taken, _ = vh.deliver_to_queues([q], copy)
        if not taken:
            raise RetryRefused(f"queue '{q.name}' in vhost '{vh.name}' is full")
        return RETRIED, copy
    if retry_q.refuses(copy):
        raise RetryRefused(f"retry queue '{retry_q.name}' in vhost '{vh.name}' is full")
    taken, _ = vh.deliver_to_queues([retry_q], copy)
    if not taken:
        raise RetryRefused(f"retry queue '{retry_q.name}' in vhost '{vh.name}' is full")
    return RETRIED, copy


def _count(raw: object) -> int:
    if isinstance(raw, (bytes, str)):
        raw = raw.decode() if isinstance(raw, bytes) else raw
        return int(raw) if raw.isdigit() else 0
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    return 0


# --------------------------------------------------------------------------- redrive


@dataclass(frozen=True, slots=True)
class RedrivePlan:
    """What a redrive moves (or would move): ``[(message, target queue)]``, and how many
    dead letters stay (origin unknown, gone or full; or filtered out by reason)."""

    moves: list[tuple[Message, Queue]]
    kept: int
    skipped: int
    #: dead letters that stay because the asker may not write their origin, by origin
    refused: dict[str, int] = field(default_factory=dict)


def plan_redrive(
    q: Queue,
    *,
    limit: int | None = None,
    reasons: frozenset[str] | None = None,
    exclude: set[int] | None = None,
    allowed: Callable[[str], bool] | None = None,
) -> RedrivePlan:
    """Which ready messages of dead-letter queue ``q`` a redrive would move, oldest first.

    :param reasons: only dead letters whose last ``x-death`` reason is one of these.
    :param exclude: message ids to pass over (kept by an earlier step of a paced redrive).
    :param allowed: whether the asker may write a target queue (by name); a dead letter
        whose origin it may not write stays (a header never grants a destination).
    """
    vh = q.vhost
    moves: list[tuple[Message, Queue]] = []
    kept = 0
    skipped = 0
    refused: dict[str, int] = {}
    for m in q.ready:
        if limit is not None and len(moves) >= limit:
            break
        if exclude is not None and m.id in exclude:
            continue
        if reasons is not None and death_reason_of(m) not in reasons:
            skipped += 1
            continue
        origin = original_queue_of(m)
        target = vh.queues.get(origin) if origin else None
        if target is None or target is q or target.refuses(m):
            kept += 1
            continue
        if allowed is not None and not allowed(target.name):
            refused[target.name] = refused.get(target.name, 0) + 1
            kept += 1
            continue
        moves.append((m, target))
    return RedrivePlan(moves, kept, skipped, refused)


def redrive_one(q: Queue, m: Message, target: Queue, *, reset: bool) -> bool:
    """Move one dead letter back to ``target``; False if it could not go (it stays).

    With ``reset`` the copy starts again: delivery count 0 and no ``RECONSUMETIMES``, so a
    message that used up its retries gets them all again. Without, it keeps its
    ``RECONSUMETIMES`` and the delivery count it died with (``x-last-delivery-count``).
    """
    if target.deleted or m.id not in q.held:
        return False
    if _redrive_copy(q, m, target, reset=reset) is None:
        return False
    q.take_ready(m)
    q.settle(m)
    removed(q, m, "redrive")
    return True


def _redrive_copy(q: Queue, m: Message, target: Queue, *, reset: bool) -> Message | None:
    """The copy of dead letter ``m`` that a redrive puts on ``target`` (None: not taken)."""
    moving = m
    if reset and m._hoff >= 0 and "RECONSUMETIMES" in m.headers:
        if not _ensure_body(q, m):
            return None
        props = m.decoded
        headers = dict(props.get("application_headers") or {})
        headers.pop("RECONSUMETIMES", None)
        props["application_headers"] = headers
        moving = m.with_properties(props, m.id)
    elif not reset and m._hoff >= 0:
        moving = m.copy()
        moving.delivery_count = max(m.delivery_count, _count(m.headers.get(LAST_DELIVERY_COUNT)))
    return forward(q, moving, target, "redrive", reset_count=reset)


def redrive(
    q: Queue,
    limit: int | None = None,
    *,
    reasons: frozenset[str] | None = None,
    reset: bool = True,
    allowed: Callable[[str], bool] | None = None,
) -> tuple[dict[str, int], int]:
    """Move the ready messages of dead-letter queue ``q`` back to the queue each came from,
    now (for a paced redrive, see :class:`plugbroker.core.api.BrokerAPI.redrive`).

    A message whose origin is unknown or gone, or whose origin refuses it, stays; so does one
    whose last death reason is not in ``reasons`` (when given). Returns
    ``({target queue: moved}, kept)``.
    """
    plan = plan_redrive(q, limit=limit, reasons=reasons, allowed=allowed)
    moved: dict[str, int] = {}
    kept = plan.kept + plan.skipped
    for m, target in plan.moves:
        if redrive_one(q, m, target, reset=reset):
            moved[target.name] = moved.get(target.name, 0) + 1
        else:
            kept += 1
    return moved, kept


class StepwiseRedrive:
    """A redrive without a rate (or its dry run) over a dead-letter queue that may hold
    millions, a bounded step at a time: the candidates are the ready messages when it starts
    (one copy of the ready list, in C), and each step of :meth:`steps` looks at
    ``step`` of them, in order, then yields so the loop serves others.

    A candidate moves as :func:`redrive_one` moves it, and stays (counted in ``kept``) for the
    same reasons; one filtered out by ``reasons`` stays too. A candidate that is no longer
    ready when its turn comes (consumed from the dead-letter queue meanwhile, or gone) is
    passed over and not counted. ``planned`` counts, per target, the candidates that qualified
    (at most ``limit``); with ``dry_run`` nothing moves. It ends early if the dead-letter queue
    is deleted."""

    def __init__(
        self,
        q: Queue,
        *,
        limit: int | None = None,
        reasons: frozenset[str] | None = None,
        reset: bool = True,
        dry_run: bool = False,
        step: int | None = None,
        allowed: Callable[[str], bool] | None = None,
    ) -> None:
        self.q = q
        self.allowed = allowed
        #: dead letters kept because the asker may not write their origin, by origin
        self.refused: dict[str, int] = {}
        self.limit = limit
        self.reasons = reasons
        self.reset = reset
        self.dry_run = dry_run
        #: a move costs some 20 times a purge's forget (a copy, a delivery, hooks, a settle)
        self.step = max(1, step or STEP_MESSAGES // 32)
        self.moved: dict[str, int] = {}
        self.planned: dict[str, int] = {}
        self.kept = 0
        self._qualified = 0
        self._todo = list(q.ready)
        self._todo.reverse()

    def steps(self) -> Iterator[None]:
        todo = self._todo
        while todo:
            part = todo[-self.step :]
            del todo[-self.step :]
            part.reverse()
            self._handle(part)
            if self.q.deleted or (self.limit is not None and self._qualified >= self.limit):
                todo.clear()
            if todo:
                yield

    def _handle(self, part: list[Message]) -> None:
        q = self.q
        vh = q.vhost
        limit = self.limit
        for m in part:
            if q.deleted or (limit is not None and self._qualified >= limit):
                return
            if m.id not in q.held:
                continue  # consumed and settled meanwhile, or expired
            if self.reasons is not None and death_reason_of(m) not in self.reasons:
                self.kept += 1
                continue
            origin = original_queue_of(m)
            target = vh.queues.get(origin) if origin else None
            if target is None or target is q or target.deleted or target.refuses(m):
                self.kept += 1
                continue
            if self.allowed is not None and not self.allowed(target.name):
                self.refused[target.name] = self.refused.get(target.name, 0) + 1
                self.kept += 1
                continue
            if self.dry_run:
                self._qualified += 1
                self.planned[target.name] = self.planned.get(target.name, 0) + 1
                continue
            if not q.take_ready(m):
                continue  # delivered from the dead-letter queue meanwhile: not ours to move
            self._qualified += 1
            self.planned[target.name] = self.planned.get(target.name, 0) + 1
            if _redrive_copy(q, m, target, reset=self.reset) is None:
                q.untake(m)
                self.kept += 1
                continue
            q.settle(m)
            removed(q, m, "redrive")
            self.moved[target.name] = self.moved.get(target.name, 0) + 1


class PacedRedrive:
    """A redrive at ``rate`` messages per second, paced on the vhost's timers (the broker's
    clock): each step moves a small batch, then the next step is due ``batch / rate`` seconds
    later. It ends when nothing more matches, ``limit`` messages were handled, or the
    dead-letter queue is deleted; messages that could not move are passed over."""

    #: seconds a step covers at most (a batch is ``rate`` times this, at least one message)
    STEP = 0.05

    def __init__(
        self,
        q: Queue,
        *,
        rate: float,
        limit: int | None = None,
        reasons: frozenset[str] | None = None,
        reset: bool = True,
        allowed: Callable[[str], bool] | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, not {rate!r}")
        self.q = q
        self.rate = rate
        self.batch = max(1, int(rate * self.STEP))
        self.left = limit
        self.reasons = reasons
        self.reset = reset
        self.allowed = allowed
        self.moved: dict[str, int] = {}
        self.kept = 0
        self.done = False
        self._passed: set[int] = set()

    def start(self) -> None:
        """Take the first step now; the others follow on the vhost's timers."""
        self._step()

    def _step(self) -> None:
        q = self.q
        if q.deleted:
            self._finish()
            return
        n = self.batch if self.left is None else min(self.batch, self.left)
        plan = plan_redrive(
            q, limit=n, reasons=self.reasons, exclude=self._passed, allowed=self.allowed
        )
        if not plan.moves:
            self._finish()
            return
        for m, target in plan.moves:
            if redrive_one(q, m, target, reset=self.reset):
                self.moved[target.name] = self.moved.get(target.name, 0) + 1
            else:
                self._passed.add(m.id)
                self.kept += 1
        if self.left is not None:
            self.left -= len(plan.moves)
            if self.left <= 0:
                self._finish()
                return
        q.vhost.timers.call_later(len(plan.moves) / self.rate, self._step)

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        log.info(
            "paced redrive of '%s' in vhost '%s' finished: %s moved back, %d could not move",
            self.q.name,
            self.q.vhost.name,
            dict(self.moved) or "nothing",
            self.kept,
        )


# --------------------------------------------------------------------------- isolation


def isolate(consumer: Consumer, now: float, timeout: float | None = None) -> int:
    """Blocklist ``consumer`` and requeue its unacked messages to the others.

    With ``timeout`` (the ack timeout it is over), the delivery it works on first counts a
    timed-out hand-out (:func:`count_timeout`); if that makes the message poison, the message
    is dead-lettered and the consumer is not isolated for it: it is pardoned instead (its clock
    restarts and its next timeouts count against nothing until it settles something).
    A later ack for a moved message is accepted (see :func:`late_settle`). Calls
    ``broker_consumer_isolated``. Returns how many messages moved.
    """
    if consumer.isolated or consumer.pardon:
        return 0  # a pardoned consumer is busy with a message that left as poison
    q = consumer.queue
    working = working_delivery(consumer, now)
    if timeout is not None and working is not None:
        counted = count_timeout(consumer, now, timeout, working)
        if counted is not None and is_poison(q, counted):
            expel_poison(q, counted, consumer, now)
            return 0
    since = consumer.busy_since
    consumer.isolated = True
    consumer.isolated_for = working.id if working is not None else 0
    moved = consumer.channel.take_unacked(consumer)
    consumer.unacked = 0
    consumer.counted = 0
    consumer.counted_at = None
    consumer.busy_since = None
    consumer.deferred.clear()
    consumer.due_heap.clear()
    if moved:
        back = requeue_unsettled(q, moved, "consumer-isolated")
        q.moved_waiting.update(m.id for m in back)
    vh = q.vhost
    h = vh.hooks.consumer_isolated
    if h is not None:
        h(
            vhost=vh.name,
            queue=q.name,
            consumer_tag=consumer.tag,
            connection_id=consumer.channel.connection_id,
            last_ack_age=now - (since if since is not None else now),
            moved=len(moved),
        )
    return len(moved)


def release(consumer: Consumer, reason: str) -> None:
    """Take ``consumer`` off the blocklist (it settled something, or it is going away)."""
    if not consumer.isolated:
        return
    consumer.isolated = False
    q = consumer.queue
    vh = q.vhost
    vh.mark_dirty(q)
    policy_log.info(
        "consumer %s on queue '%s' (vhost '%s', connection %s) released from the blocklist: %s",
        consumer.tag,
        q.name,
        vh.name,
        consumer.channel.connection_id,
        reason,
    )
    h = vh.hooks.consumer_released
    if h is not None:
        h(
            vhost=vh.name,
            queue=q.name,
            consumer_tag=consumer.tag,
            connection_id=consumer.channel.connection_id,
            reason=reason,
        )


# --------------------------------------------------------------------------- bounded tries
#
# A message counts the hand-outs whose ack clock ran out (``Message.timeouts``): whether its
# consumer was then isolated or spared by the cap, whether the next hand-out went to the same
# consumer or another, and when the consumer's channel closed past its timeout. At the queue's
# ``poisonDeliveries`` the message is dead-lettered with reason ``poison`` (parked in
# ``{queue}-DLQ`` when the queue has no target): a task longer than ``ackTimeout`` runs at most
# that many times, whatever the number of consumers and the cap. Each step is O(1) or
# O(deliveries the consumer holds), and happens once per timeout, never per message.

#: the reason of a message dead-lettered as poison (x-death, hooks, journal)
POISON = "poison"


def working_delivery(consumer: Consumer, now: float) -> Message | None:
    """The delivery ``consumer`` works on: the oldest it holds unacked that is due (one held
    before its ETA has not started). None when it holds none."""
    deferred = consumer.deferred
    for m in consumer.channel.held_by(consumer):
        if deferred:
            due = deferred.get(m.id)
            if due is not None and due > now:
                continue
        return m
    return None


def _end_pardon(consumer: Consumer) -> None:
    """``consumer`` settled something: it is past the poison message, deliveries resume."""
    consumer.pardon = 0
    consumer.counted = 0
    consumer.counted_at = None
    q = consumer.queue
    if not q.deleted:
        q.vhost.mark_dirty(q)


def count_timeout(
    consumer: Consumer, now: float, timeout: float, working: Message | None = None
) -> Message | None:
    """``consumer``'s ack clock ran out (``timeout`` seconds without settling anything): the
    delivery it works on counts one more timed-out hand-out. A hand-out counts once per
    ``timeout`` that runs out (a consumer the cap spares holds it on, and counts again a
    timeout later). Stored messages keep the count across restarts; ``broker_message_timed_out``
    is called. Returns the message counted, None when nothing was: it holds nothing due, its
    hand-out counted less than ``timeout`` ago, or it is still busy with a message already
    dead-lettered as poison (:attr:`~plugbroker.domain.queue.Consumer.pardon`)."""
    if consumer.pardon:
        return None  # busy with a message that left as poison: nothing it holds is to blame
    q = consumer.queue
    m = working if working is not None else working_delivery(consumer, now)
    if m is None or q.deleted:
        return None
    at = consumer.counted_at
    if consumer.counted == m.id and at is not None and now - at < timeout:
        return None
    consumer.counted = m.id
    consumer.counted_at = now
    m.timeouts += 1
    vh = q.vhost
    if m.stored and vh.store.durable:
        vh.store.update_message(q, m)
    h = vh.hooks.message_timed_out
    if h is not None:
        h(
            vhost=vh.name,
            queue=q.name,
            consumer_tag=consumer.tag,
            connection_id=consumer.channel.connection_id,
            message=m,
            timeouts=m.timeouts,
        )
    return m


def is_poison(q: Queue, msg: Message) -> bool:
    """Whether ``msg`` timed out as many times as ``q`` allows."""
    limit = q.poison_deliveries
    return limit is not None and msg.timeouts >= limit


def timed_out_on_close(consumer: Consumer, now: float, poisoned: set[int]) -> None:
    """``consumer``'s channel is closing while it holds deliveries: if its ack clock had run
    out (its queue's ``ackTimeout``), the delivery it works on counts a timed-out hand-out, as
    at a check; a message that becomes poison so is added to ``poisoned`` (the caller
    dead-letters it instead of requeueing it: :func:`requeue_unsettled`). Call before the
    channel lets go of the deliveries."""
    q = consumer.queue
    timeout = q.ack_timeout_ms / 1000
    since = consumer.busy_since
    if not timeout or since is None or now - since <= timeout:
        return
    m = count_timeout(consumer, now, timeout)
    if m is not None and is_poison(q, m):
        poisoned.add(m.id)


def expel_poison(q: Queue, msg: Message, holder: Consumer | None, now: float) -> None:
    """``msg`` timed out ``poisonDeliveries`` times: it leaves ``q`` for its dead-letter target
    (or is parked in ``{queue}-DLQ``), with reason ``poison``, and one line says so.

    ``holder`` (if it still holds it) loses it as on isolation, so its late ack is accepted,
    its ack clock restarts and it is pardoned. The consumers isolated while working on it are
    released, pardoned too. A pardoned consumer may still be running the message: until it
    settles something (its late ack of it, say) it gets no new delivery, is not isolated again
    and its timeouts count against nothing, so no other message is handed to a worker that
    cannot start it, nor run twice because it was moved from one.
    """
    if holder is not None and holder.channel.take_unacked(holder, (msg.id,)):
        holder.unacked = max(holder.unacked - 1, 0)
        if holder.deferred:
            unheld(holder, msg.id)
        restart_clock(holder, now)
        holder.pardon = msg.id
        holder.counted = 0
        holder.counted_at = None
    q.moved_waiting.discard(msg.id)
    if msg.id not in q.held:
        return  # gone meanwhile
    q.settle(msg)  # held by a consumer or just taken from one: never in the ready list
    went = dead_letter_or_park(q, msg, POISON)
    vh = q.vhost
    policy_log.warning(
        "queue '%s' in vhost '%s': message %d%s timed out %d times (ackTimeout %g s) and was "
        "dead-lettered as poison to %s; work longer than ackTimeout is handed out again at "
        "every timeout: raise <isolation><ackTimeout> above the longest task, or have the "
        "worker touch its deliveries (plugbroker.contrib.touch for Celery)",
        q.name,
        vh.name,
        msg.id,
        _task_label(msg),
        msg.timeouts,
        q.ack_timeout_ms / 1000,
        ", ".join(repr(n) for n in went) or "nowhere (no queue took it)",
    )
    for c in list(q.consumers):
        if c.isolated and c.isolated_for == msg.id:
            c.isolated_for = 0
            c.pardon = msg.id
            release(c, POISON)


def _task_label(msg: Message) -> str:
    """`` (task 'name' id X)`` for a Celery task message, `` (message_id X)`` for one with a
    message id, else nothing."""
    h = msg.headers if msg._hoff >= 0 else {}
    task, tid = h.get("task"), h.get("id")
    if isinstance(task, str) and isinstance(tid, str):
        return f" (task {task!r} id {tid})"
    mid = msg.message_id
    return f" (message_id {mid})" if isinstance(mid, str) and mid else ""


def requeue_unsettled(
    q: Queue, msgs: Sequence[Message], reason: str, poisoned: Container[int] = ()
) -> list[Message]:
    """Messages that consumers held without settling come back to ``q``: their channel closed
    (or the connection went), or the consumer was isolated. Those in ``poisoned`` (they just
    timed out ``poisonDeliveries`` times: :func:`timed_out_on_close`) are dead-lettered as
    poison instead; the others go through :func:`requeue`. Returns the messages requeued."""
    if poisoned and not q.deleted:
        now = q.vhost.clock.monotonic()
        back = []
        for m in msgs:
            if m.id in poisoned:
                expel_poison(q, m, None, now)
            else:
                back.append(m)
        msgs = back
    return requeue(q, msgs, reason)


__all__ = [
    "DEAD_LETTERED",
    "LAST_DELIVERY_COUNT",
    "POISON",
    "RETRIED",
    "PacedRedrive",
    "RedrivePlan",
    "RetryRefused",
    "ack",
    "ack_all",
    "cannot_move",
    "count_timeout",
    "dead_letter",
    "dead_letter_or_drop",
    "dead_letter_or_park",
    "death_reason_of",
    "drop",
    "expel_poison",
    "expire",
    "forward",
    "is_poison",
    "isolate",
    "late_settle",
    "make_dead_letter",
    "origin_message_id",
    "original_queue_of",
    "overflow",
    "park_queue_name",
    "plan_redrive",
    "reconsume",
    "redrive",
    "redrive_one",
    "reject",
    "release",
    "requeue",
    "requeue_unsettled",
    "retry_due",
    "settle_unacked",
    "timed_out_on_close",
    "working_delivery",
]

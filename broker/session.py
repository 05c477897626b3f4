"""AMQP connections and channels: the protocol state machine between the codec and the domain.

Like the codec and the domain, this layer does no I/O of its own: it writes through a
:class:`Transport` (the asyncio adapter in :mod:`plugbroker.server`, or a fake in tests) and gets
time from the broker's clock and timer heap. Output is gathered per connection and written once
per loop turn (:meth:`Connection.flush`), so a burst of deliveries and confirms costs one
``transport.write``.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable, Container, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import plugbroker
from plugbroker import authz
from plugbroker.codec import NEED_DATA, ServerCodec
from plugbroker.codec.events import (
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicGet,
    BasicNack,
    BasicQos,
    BasicRecover,
    BasicRecoverAsync,
    BasicReject,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ConfirmSelect,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
    ConnectionUpdateSecret,
    Event,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    Heartbeat,
    MethodEvent,
    ProtocolHeader,
    Publish,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    TxCommit,
    TxRollback,
    TxSelect,
    UnexpectedMethod,
)
from plugbroker.codec.frames import PROTOCOL_HEADER
from plugbroker.codec.ids import (
    BASIC_ACK,
    BASIC_CONSUME,
    BASIC_GET,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    CHANNEL_CLOSE_OK,
    CHANNEL_OPEN,
    CONFIRM_SELECT,
    CONNECTION_OPEN,
    CONNECTION_START_OK,
    CONNECTION_TUNE_OK,
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    NO_METHOD,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
    TX_COMMIT,
    TX_ROLLBACK,
    TX_SELECT,
    MethodId,
)
from plugbroker.codec.properties import USER_ID_FLAG, PropertiesError
from plugbroker.config.users import FULL_PATTERN, Permission
from plugbroker.domain import fate
from plugbroker.domain.exchange import ACK_TIMEOUT_HEADER, TOUCH_TAG_HEADER, DelayedExchange
from plugbroker.domain.message import Message
from plugbroker.domain.queue import EXCLUSIVE, Consumer, Queue
from plugbroker.errors import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    REPLY_SUCCESS,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AMQPError,
    ChannelError,
    ConnectionError_,
)
from plugbroker.guard import ACCEPT, throttled_text, under_attack_text
from plugbroker.session_flow import FlowControl
from plugbroker.session_state import (
    DISCARDING,
    HANDSHAKE,
    REFUSED_CODE,
    TRANSITIONS,
    ConnectionState,
    Trigger,
    channel_zero_trigger,
)

if TYPE_CHECKING:
    from plugbroker.app import Broker
    from plugbroker.domain.timers import TimerHandle
    from plugbroker.domain.vhost import VirtualHost

log = logging.getLogger("plugbroker.session")

#: the work one connection may do per loop turn before it yields the loop to others, in units:
#: a publish, an ack / nack / reject or a heartbeat costs 1, any other method
#: :data:`METHOD_COST` (a queue.declare, bind or purge costs tens of times a publish), so a
#: client pipelining 100,000 declares or a publish flood holds the loop for about a millisecond
#: per turn (512 units measured a bystander p99 of 17 to 21 ms during a flood, 128 units 6 ms).
#: What a connection used is carried from one read to the next until it yields: uvloop (libuv)
#: reads a readable socket up to 32 times in one loop iteration, so a budget per read would let
#: a flood hold the loop for 32 budgets (about 150 ms here) before any other socket is polled.
MAX_EVENTS_PER_TURN = 128
#: what a method other than publish / ack / nack / reject costs against the turn's budget
METHOD_COST = 16


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}

# the connection states the code below tests most (module globals: cheap on the hot path)
AWAIT_HEADER = ConnectionState.AWAIT_HEADER
OPEN = ConnectionState.OPEN
CLOSING = ConnectionState.CLOSING
CLOSED = ConnectionState.CLOSED


#: checks remembered per connection before the memo starts over (bounds a client that names
#: ever new queues)
MAX_PERMISSION_MEMO = 1024


#: events that cost one unit of a turn's budget, like a publish (:data:`MAX_EVENTS_PER_TURN`)
CHEAP_EVENTS: frozenset[type] = frozenset({BasicAck, BasicNack, BasicReject, Heartbeat})


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


class Channel:
    """One AMQP channel: consumers, unacked deliveries, prefetch, confirms and transactions."""

    __slots__ = (
        "_hooks",
        "closing",
        "confirm",
        "confirm_due",
        "confirm_waiting",
        "conn",
        "connection_id",
        "consumers",
        "deferred_cancels",
        "flow",
        "id",
        "moved",
        "next_tag",
        "polled",
        "prefetch_consumer",
        "prefetch_global",
        "publish_seq",
        "tx",
        "tx_ops",
        "unacked",
        "vhost",
    )

    def __init__(self, conn: Connection, channel_id: int) -> None:
        self.id = channel_id
        self.conn = conn
        self.vhost: VirtualHost = conn.vhost  # type: ignore[assignment]
        self.connection_id = conn.id
        self.consumers: dict[str, Consumer] = {}
        #: delivery tag -> (message, queue, consumer or None for basic.get)
        self.unacked: dict[int, tuple[Message, Queue, Consumer | None]] = {}
        self.next_tag = 1
        self.prefetch_consumer = 0
        self.prefetch_global = 0
        self.flow = True
        self.confirm = False
        self.publish_seq = 0
        #: publisher confirms due this turn, written at flush: seq for an ack, -seq for a nack
        self.confirm_due: list[int] = []
        #: seqs of publishes whose confirm waits for the store's batch to reach the disk
        self.confirm_waiting: deque[int] = deque()
        self.tx = False
        self.tx_ops: list[tuple[str, Any]] = []
        self.closing = False
        #: delivery tags whose messages were taken back from an isolated consumer
        self.moved: dict[int, tuple[Message, Queue, Consumer]] = {}
        #: queues this channel polled with basic.get (forgotten when it closes)
        self.polled: dict[int, Queue] = {}
        #: while this channel runs queue.delete: the tags of its own consumers the delete
        #: cancels, told to the client after queue.delete-ok (as RabbitMQ orders them)
        self.deferred_cancels: list[str] | None = None
        self._hooks = conn.broker.hooks

    # ------------------------------------------------------------ ConsumerChannel

    @property
    def unheard(self) -> bool:
        """The broker is not reading this channel's connection because a resource alarm
        blocks it (a publisher): acks sent meanwhile wait unread, so its consumers' ack clocks
        stand still (see :meth:`Connection.set_blocked`)."""
        return self.conn.blocked

    def can_deliver(self) -> bool:
        if not self.flow or self.closing or not self.conn.writable:
            return False
        pg = self.prefetch_global
        return not pg or len(self.unacked) < pg

    def deliver(self, consumer: Consumer, msg: Message, queue: Queue) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        now = self.conn.clock.monotonic()
        if consumer.first_delivery is None:
            consumer.first_delivery = now
        consumer.delivered_total += 1
        queue.delivered_total += 1
        if queue.moved_waiting:
            queue.moved_waiting.discard(msg.id)
        if consumer.no_ack:
            fate.settle_unacked(queue, msg)
        else:
            self.unacked[tag] = (msg, queue, consumer)
            if not consumer.unacked:
                consumer.busy_since = now  # nothing unacked -> something: the clock starts
            consumer.unacked += 1
            if msg.stored and not msg.redelivered:
                queue.vhost.store.delivered(queue, msg)
        iso = queue.ack_timeout_ms  # 0 unless the queue is under isolation: one load here
        if iso:
            props, due_wall = self._isolated_delivery(consumer, msg, queue, now, iso)
        else:
            props, due_wall = msg.delivery_properties(), None
        conn = self.conn
        body = msg.body
        assert body is not None, "a paged-out body is read back before delivery (PagedReady)"
        conn.out.append(
            conn.codec.encode_deliver(
                self.id,
                consumer.tag_bytes,
                tag,
                msg.redelivered,
                msg.exchange.encode(),
                msg.routing_key.encode(),
                msg.body_size,
                props,
                body,
            )
        )
        conn.want_flush()
        h = self._hooks.message_delivered
        if h is not None:
            h(
                vhost=self.vhost.name,
                queue=queue.name,
                consumer_tag=consumer.tag,
                connection_id=self.connection_id,
                channel_id=self.id,
                delivery_tag=tag,
                message=msg,
                redelivered=msg.redelivered,
                no_ack=consumer.no_ack,
                due=due_wall,
            )

    def _isolated_delivery(
        self, consumer: Consumer, msg: Message, queue: Queue, now: float, ack_timeout_ms: int
    ) -> tuple[bytes, float | None]:
        """A delivery from a queue under isolation: its properties carry ``x-ack-timeout``, and
        with ETA awareness (SPEC 6) a message not due yet is parsed once, here, and kept off the
        consumer's ack clock until it is due. Returns the properties and the due time (wall
        clock) of a delivery not due yet, else None."""
        props = msg.delivery_properties_with(ACK_TIMEOUT_HEADER, ack_timeout_ms)
        names = queue.eta_headers
        if not names or consumer.no_ack:
            return props, None
        due = self._due(msg, names)
        if due is None or due[0] <= now:
            fate.held_due(consumer, now)
            return props, None
        if consumer.unacked == 1:
            consumer.busy_since = None  # it held nothing: the clock waits for the due time
        fate.hold_deferred(consumer, msg.id, due[0])
        queue.not_due[msg.id] = due[0]  # the message age counts from then too
        return props, due[1]

    def _due(self, msg: Message, names: tuple[str, ...]) -> tuple[float, float] | None:
        """When ``msg`` is due by its ETA headers: (monotonic, wall clock), or None (no such
        header, or one that cannot be read: the delivery then counts at once)."""
        if msg._hoff < 0:
            return None
        try:
            wall = fate.due_time(msg.headers, names)
        except PropertiesError:
            return None
        if wall is None:
            return None
        clock = self.conn.clock
        return clock.monotonic() + (wall - clock.time()), wall

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away (deleted): forget the consumer and tell the client if it can
        hear it (``consumer_cancel_notify``)."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.conn.client_caps.get("consumer_cancel_notify") and not self.closing:
            if self.deferred_cancels is not None:
                self.deferred_cancels.append(consumer.tag)
            else:
                self.conn.send(self.id, "basic.cancel", consumer.tag, True)
        self._consumer_gone(consumer, "queue-deleted")

    # ------------------------------------------------------------ helpers

    def _consumer_gone(self, c: Consumer, reason: str) -> None:
        h = self._hooks.consumer_removed
        if h is not None:
            h(
                vhost=self.vhost.name,
                queue=c.queue.name,
                consumer_tag=c.tag,
                connection_id=self.connection_id,
                channel_id=self.id,
                reason=reason,
            )

    def settle_tags(
        self, tag: int, multiple: bool, sig: tuple[int, int], ack: bool = True
    ) -> list[tuple[Message, Queue, Consumer | None]]:
        """Take the unacked entries an ack/nack/reject names (406 for an unknown tag).

        Tags of messages taken back from an isolated consumer (``moved``) are accepted
        without error; see :meth:`_late_settle`.
        """
        unacked = self.unacked
        if multiple:
            tags = list(unacked) if tag == 0 else [t for t in unacked if t <= tag]
            moved = [t for t in self.moved if tag == 0 or t <= tag]
            if not tags and not moved and tag != 0:
                raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", sig)
            out = [unacked.pop(t) for t in tags]
            for t in moved:
                self._late_settle(t, ack)
            return out
        entry = unacked.pop(tag, None)
        if entry is None:
            if tag in self.moved:
                self._late_settle(tag, ack)
                return []
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", sig)
        return [entry]

    def _late_settle(self, tag: int, ack: bool) -> None:
        """An ack/nack/reject for a message taken back from this (isolated) consumer."""
        msg, queue, consumer = self.moved.pop(tag)
        fate.late_settle(queue, msg, consumer, self, ack, self.conn.clock.monotonic())

    def take_unacked(self, consumer: Consumer, only: Container[int] | None = None) -> list[Message]:
        """Take back what ``consumer`` holds unacked (it is being isolated), or only the
        messages whose ids are in ``only`` (dead-lettered as poison); the tags are kept in
        :attr:`moved`, so a late ack for one of them is accepted (:meth:`_late_settle`)."""
        unacked = self.unacked
        moved = self.moved
        out: list[Message] = []
        for tag, entry in list(unacked.items()):
            if entry[2] is consumer and (only is None or entry[0].id in only):
                del unacked[tag]
                moved[tag] = entry  # type: ignore[assignment]
                out.append(entry[0])
        return out

    def held_by(self, consumer: Consumer) -> Iterator[Message]:
        """What ``consumer`` holds unacked here, oldest delivery first (tags only grow)."""
        for msg, _, c in self.unacked.values():
            if c is consumer:
                yield msg

    def requeue_all(self, reason: str = "channel-closed") -> None:
        """Return every unacked message to its queue (channel close, recover).

        On a channel close, a consumer whose ack clock had run out lost the delivery it was
        working on to a timeout: that counts on the message
        (:func:`plugbroker.domain.fate.timed_out_on_close`), which may make it poison; a
        basic.recover is the client's own request and does not count.
        """
        if not self.unacked:
            return
        poisoned: set[int] = set()
        if reason != "recover":
            now = self.conn.clock.monotonic()
            seen: set[int] = set()
            for _, q, c in self.unacked.values():
                if c is not None and q.poison_deliveries is not None and id(c) not in seen:
                    seen.add(id(c))
                    fate.timed_out_on_close(c, now, poisoned)
        by_queue: dict[int, tuple[Queue, list[Message]]] = {}
        for msg, q, c in self.unacked.values():
            if c is not None:
                c.unacked -= 1
                if c.deferred:
                    fate.unheld(c, msg.id)
                if not c.unacked:
                    c.busy_since = None
            by_queue.setdefault(id(q), (q, []))[1].append(msg)
        self.unacked.clear()
        for q, msgs in by_queue.values():
            fate.requeue_unsettled(q, msgs, reason, poisoned)

    def teardown(self, reason: str) -> None:
        """Cancel consumers and requeue unacked messages (the channel is going away)."""
        self.closing = True
        gone = list(self.consumers.values())
        for c in gone:
            c.queue.remove_consumer(c)
        self.consumers.clear()
        self.requeue_all()
        for c in gone:
            fate.release(c, "disconnected")
            self._consumer_gone(c, reason)
        self.moved.clear()
        self.tx_ops.clear()
        key = (self.connection_id, self.id)
        for q in self.polled.values():
            q.getters.pop(key, None)
        self.polled.clear()


class Connection(FlowControl):
    """One client connection."""

    def __init__(
        self,
        broker_: Broker,
        transport: Transport,
        peer: str,
        *,
        external: bool = False,
        cert_user: str | None = None,
    ) -> None:
        self.broker = broker_
        self.transport = transport
        self.peer = peer
        #: offer the EXTERNAL mechanism (a TLS listener that verifies client certificates)
        self.external = external
        #: the CN of the client's verified certificate: who EXTERNAL logs in
        self.cert_user = cert_user
        self.id = broker_.new_connection_id(peer)
        #: the peer's address without the port (``host:port`` or ``[v6]:port`` as given)
        self.peer_host = peer.rsplit(":", 1)[0].strip("[]") if ":" in peer else peer
        self.clock = broker_.clock
        limits = broker_.limits
        self.codec = ServerCodec(
            frame_max=limits.frame_max,
            max_message_size=limits.max_message_size,
            partial_budget=limits.partial_body_budget,
        )
        #: moved only through the transition table (:meth:`_advance`)
        self.state = AWAIT_HEADER
        self.channels: dict[int, Channel] = {}
        self.closing_channels: set[int] = set()
        self.out: list[bytes] = []
        #: channels with publisher confirms due (:meth:`_write_confirms` puts them in ``out``)
        self.confirming: list[Channel] = []
        self.flush_pending = False
        self.writable = True
        #: budget units used since this connection last yielded the loop (MAX_EVENTS_PER_TURN)
        self.turn_used = 0
        #: reading paused for the rest of this loop turn (MAX_EVENTS_PER_TURN)
        self.reading_paused = False
        #: whether the transport is told not to read (:meth:`_sync_reading`)
        self._reading_off = False
        #: the client was told connection.blocked and not yet connection.unblocked
        self.notified_blocked = False
        #: the not-reading-its-socket warning was logged (once per connection)
        self._logged_unread = False
        #: (partial body bytes, since when) for the stalled-body check
        self._stall_mark: tuple[int, float] | None = None
        self.user = ""
        self.vhost: VirtualHost | None = None
        #: the user's patterns on the vhost (set at connection.open and by a reload)
        self.permission: Permission | None = None
        #: (configure|write|read, resource name) -> allowed; cleared with a new permission
        self._allowed: dict[tuple[str, str], bool] = {}
        #: the write pattern is ".*": basic.publish checks nothing more
        self._write_all = False
        #: exchanges (as the client names them) this connection may publish to: the publish
        #: path's memo, one set lookup
        self._may_publish: set[str] = set()
        #: the user has the ``impersonator`` tag: a publish may carry another ``user_id``
        self.impersonator = False
        self.client_props: dict[str, Any] = {}
        self.client_caps: dict[str, Any] = {}
        self.channel_max = limits.channel_max
        self.frame_max = limits.frame_max
        self.heartbeat = 0
        now = self.clock.monotonic()
        self.last_recv = now
        self.last_sent = now
        self.blocked = False
        self.published = False
        #: this connection's channels as its user's count has them (Broker.check_channel_limit)
        self.channels_counted = 0
        #: counted by the broker's connection limits (:meth:`Broker.admit`)
        self.admitted = False
        self._hb_timer: TimerHandle | None = None
        self._timeout_timer: TimerHandle | None = broker_.timers.call_later(
            limits.handshake_timeout, self._handshake_timeout
        )
        self.close_reason = ""
        broker_.connection_opened(self)
        #: a delayed login refusal counted by the login throttle (:meth:`_refuse_later`)
        self._refusal_held = False

    # ================================================================ the state machine

    def _advance(self, trigger: Trigger) -> None:
        """Move to the state the transition table gives for ``trigger``."""
        target = TRANSITIONS.get((self.state, trigger))
        if target is None:  # a bug: callers check first (:meth:`_allows`, :meth:`_admits`)
            raise AssertionError(f"no transition from {self.state} on {trigger}")
        self.state = target

    def _allows(self, trigger: Trigger) -> bool:
        """Whether the table has a transition for ``trigger`` in the current state."""
        return (self.state, trigger) in TRANSITIONS

    def _admits(self, trigger: Trigger, name: str, method: MethodId) -> bool:
        """Whether a client's ``trigger`` may be handled now: True if the table allows it,
        False if it is to be discarded (after our connection.close), else a 503."""
        state = self.state
        if (state, trigger) in TRANSITIONS:
            return True
        if state in DISCARDING or state is CLOSED:
            return False
        if trigger is Trigger.CHANNEL_METHOD:
            text = f"{name} before the connection was opened"
        else:
            text = f"unexpected {name} on channel 0"
        raise ConnectionError_(REFUSED_CODE, text, method)

    # ================================================================ I/O edges

    def send(self, channel: int, name: str, *args: Any) -> None:
        if self.confirming:  # confirms due before this method go out before it
            self._write_confirms()
        self.out.append(self.codec.encode_method(channel, name, *args))
        self.want_flush()

    def want_flush(self) -> None:
        if not self.flush_pending:
            self.flush_pending = True
            self.broker.want_flush(self)

    def flush(self) -> None:
        self.flush_pending = False
        if self.confirming:
            self._write_confirms()
        out = self.out
        if out and self.state is not CLOSED:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.last_sent = self.clock.monotonic()
            self.transport.write(data)
        else:
            out.clear()

    def _sync_reading(self) -> None:
        """Tell the transport to read or not: not while this turn's event budget is spent,
        while a resource alarm blocks this publisher, or while its output is not drained."""
        off = self.reading_paused or self.blocked or not self.writable
        if off is not self._reading_off:
            self._reading_off = off
            if off:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def pause_writing(self) -> None:
        """The peer is not reading: stop delivering to it, and stop reading from it (what it
        sends would only add confirms and returns to the unsent output) until it drains."""
        self.writable = False
        if not self._logged_unread:
            self._logged_unread = True
            log.warning(
                "connection %s (%s): the client is not reading its socket (%d bytes unsent); "
                "deliveries to it and reading from it are paused until it drains",
                self.id,
                self.peer,
                self.unsent_bytes(),
            )
        self._sync_reading()

    def resume_writing(self) -> None:
        self.writable = True
        self._sync_reading()
        for ch in self.channels.values():
            for c in ch.consumers.values():
                c.queue.vhost.mark_dirty(c.queue)

    def data_received(self, data: bytes) -> None:
        if self.state is CLOSED:
            return
        self.last_recv = self.clock.monotonic()
        self.codec.receive_data(data)
        self.broker.monitor.ingest(len(data))
        self.process()

    def process(self) -> None:
        """Handle buffered events; yield after MAX_EVENTS_PER_TURN units, counted across
        reads until this connection yields (read back-pressure)."""
        codec = self.codec
        handled = self.turn_used
        while self.state is not CLOSED:
            try:
                ev = codec.next_event()
            except ConnectionError_ as conn_err:
                self.connection_error(conn_err)
                return
            except ChannelError as ch_err:
                self.channel_error(ch_err.channel, ch_err)
                continue
            except Exception:
                log.exception("connection %s: internal error reading its frames", self.id)
                self.codec.broken = True
                self.connection_error(ConnectionError_(INTERNAL_ERROR, "internal error"))
                return
            if ev is NEED_DATA:
                self.turn_used = handled
                break
            try:
                self.handle(ev)  # type: ignore[arg-type]
            except ChannelError as ch_err:
                self.channel_error(getattr(ev, "channel", 0), ch_err)
            except ConnectionError_ as conn_err:
                self.connection_error(conn_err)
                return
            except Exception:
                log.exception("connection %s: internal error handling %r", self.id, ev)
                self.connection_error(ConnectionError_(INTERNAL_ERROR, "internal error"))
                return
            if type(ev) is Publish or type(ev) in CHEAP_EVENTS:
                handled += 1
            else:
                handled += METHOD_COST
            if handled >= MAX_EVENTS_PER_TURN:
                self.turn_used = 0  # the next turn starts with the call below
                if not self.reading_paused:
                    self.reading_paused = True
                    self._sync_reading()
                self.broker.call_soon(self.process)
                return
        if self.reading_paused:
            self.reading_paused = False
            self._sync_reading()

    def connection_lost(self) -> None:
        if not self._allows(Trigger.LOST):
            return
        prev = self.state
        self._advance(Trigger.LOST)
        self._cleanup()
        if prev is not CLOSING:
            log.info(
                "connection %s (%s) closed by peer%s",
                self.id,
                self.peer,
                f": {self.close_reason}" if self.close_reason else "",
            )

    def _cleanup(self) -> None:
        self.codec.release()
        for t in (self._hb_timer, self._timeout_timer):
            if t is not None:
                self.broker.timers.cancel(t)
        self._hb_timer = self._timeout_timer = None
        if self.admitted:
            self.admitted = False
            self.broker.release(self.user)
        if self._refusal_held:
            self._refusal_held = False
            self.broker.login_throttle.release(self.peer_host)
        for ch in list(self.channels.values()):
            ch.teardown("connection-closed")
        self.channels.clear()
        if self.vhost is not None:
            for q in list(self.vhost.queues.values()):
                if q.exclusive_owner == self.id:
                    self.vhost.delete_queue(
                        q, reason="exclusive-owner-closed", detail=f"connection {self.id} closed"
                    )
        self.broker.connection_closed(self)

    # ================================================================ errors

    def channel_error(self, channel_id: int, e: AMQPError) -> None:
        if channel_id == 0 or e.connection_level:
            self.connection_error(e)
            return
        ch = self.channels.get(channel_id)
        if ch is None:
            self.connection_error(ConnectionError_(CHANNEL_ERROR, e.text, e.method))
            return
        log.info("connection %s channel %d closed: %d %s", self.id, channel_id, e.code, e.text)
        self.close_channel(ch, e.code, e.reply_text, e.method)

    def close_channel(
        self, ch: Channel, code: int, text: str, method: tuple[int, int] = NO_METHOD
    ) -> None:
        """Close a channel from the broker side (an error, or a policy such as 506)."""
        if ch.closing:
            return
        ch.teardown("channel-closed")
        self.codec.discard_channel(ch.id)
        self.closing_channels.add(ch.id)
        self.send(ch.id, "channel.close", code, text[:255], method[0], method[1])

    def connection_error(self, e: AMQPError) -> None:
        if not self._allows(Trigger.SEND_CLOSE):
            return
        log.warning("connection %s (%s) closed: %d %s", self.id, self.peer, e.code, e.text)
        self.close(e.code, e.reply_text, e.method)

    def close(self, code: int, text: str, method: tuple[int, int] = NO_METHOD) -> None:
        """Send connection.close and wait (a bounded time) for close-ok."""
        if not self._allows(Trigger.SEND_CLOSE):
            return
        self.close_reason = text
        was_open = self.state
        self._advance(Trigger.SEND_CLOSE)
        if self.confirming:
            self._write_confirms()
        self.out.append(
            self.codec.encode_method(0, "connection.close", code, text[:255], method[0], method[1])
        )
        self.flush()
        self.codec.drop_partials()
        for ch in list(self.channels.values()):
            ch.teardown("connection-closed")
        if was_open is AWAIT_HEADER:
            self._drop()
            return
        self._arm_timeout(self.broker.close_timeout, self._drop)

    def _arm_timeout(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """(Re)arm the connection's one deadline (handshake, close-ok, a held login refusal);
        :meth:`_cleanup` cancels it, so a closed connection is not kept alive until it is due."""
        if self._timeout_timer is not None:
            self.broker.timers.cancel(self._timeout_timer)
        self._timeout_timer = self.broker.timers.call_later(delay, fn, *args)

    def _drop(self, trigger: Trigger = Trigger.DROP) -> None:
        """Write what is pending and close the socket (``trigger`` says why: DROP, or the
        client's close / close-ok while we were closing)."""
        if not self._allows(trigger):
            return
        self.flush()
        self._advance(trigger)
        self._cleanup()
        self.transport.close()

    def _handshake_timeout(self) -> None:
        self._timeout_timer = None
        if self.state in HANDSHAKE:
            log.warning(
                "connection %s (%s) dropped: handshake not finished within %.1f s",
                self.id,
                self.peer,
                self.broker.limits.handshake_timeout,
            )
            self._advance(Trigger.DROP)
            self._cleanup()
            self.transport.close()

    # ================================================================ dispatch

    def handle(self, ev: Event) -> None:
        if isinstance(ev, Publish):  # the hot path first
            ch = self._open_channel(ev.channel, BASIC_PUBLISH, "basic.publish")
            if ch is not None:
                self._publish(ch, ev)
            return
        if isinstance(ev, MethodEvent):
            if ev.channel and self.state is OPEN:
                # the common case (basic.ack): a channel method with a handler, connection open
                handler = _HANDLERS.get(type(ev))
                if handler is not None:
                    ch = self._open_channel(ev.channel, ev.ID, ev.NAME)
                    if ch is not None:
                        handler(self, ch, ev)
                    return
            self._method(ev, ev.NAME, ev.ID)
        elif isinstance(ev, UnexpectedMethod):
            self._method(ev, ev.name, ev.method_id)
        elif isinstance(ev, Heartbeat):
            self._admits(Trigger.HEARTBEAT, "heartbeat", NO_METHOD)
        elif isinstance(ev, ProtocolHeader):
            trigger = Trigger.HEADER if ev.ok else Trigger.BAD_HEADER
            if not self._admits(trigger, "protocol header", NO_METHOD):
                return
            if ev.ok:
                self._start()
                return
            log.warning(
                "connection %s (%s): wrong protocol header %r; answered with ours",
                self.id,
                self.peer,
                ev.data,
            )
            self.transport.write(PROTOCOL_HEADER)
            self._advance(Trigger.BAD_HEADER)
            self._cleanup()
            self.transport.close()

    def _method(self, ev: MethodEvent | UnexpectedMethod, name: str, sig: MethodId) -> None:
        """Route a method: channel 0 to the state machine, the rest to a channel's handler."""
        if ev.channel == 0:
            trigger = channel_zero_trigger(type(ev))
            if self._admits(trigger, name, sig):
                _CONNECTION_HANDLERS[trigger](self, ev)
            return
        if self.state is not OPEN and not self._admits(Trigger.CHANNEL_METHOD, name, sig):
            return
        if type(ev) is ChannelOpen:
            self._channel_open(ev.channel)
            return
        ch = self._open_channel(ev.channel, sig, name)
        if ch is None:
            return
        handler = _HANDLERS.get(type(ev))  # type: ignore[arg-type]
        if handler is None:
            raise ConnectionError_(
                COMMAND_INVALID, f"{name} is not valid on a channel from a client", sig
            )
        handler(self, ch, ev)

    def _open_channel(self, channel_id: int, sig: MethodId, name: str) -> Channel | None:
        if self.state is not OPEN and not self._admits(Trigger.CHANNEL_METHOD, name, sig):
            return None
        if channel_id in self.closing_channels:
            # after our channel.close, only close/close-ok count; the rest is dropped
            if name == "channel.close_ok":
                self.closing_channels.discard(channel_id)
                self.channels.pop(channel_id, None)
            elif name == "channel.close":
                self.closing_channels.discard(channel_id)
                self.channels.pop(channel_id, None)
                self.send(channel_id, "channel.close_ok")
            return None
        ch = self.channels.get(channel_id)
        if ch is None:
            raise ConnectionError_(CHANNEL_ERROR, "expected 'channel.open'", sig)
        return ch

    # ================================================================ connection class

    def _start(self) -> None:
        self._advance(Trigger.HEADER)
        props = {
            "product": "plugbroker",
            "version": plugbroker.__version__,
            "platform": "Python",
            "information": "AMQP 0-9-1 broker with pluggable consumer policies",
            "capabilities": SERVER_CAPABILITIES,
            "cluster_name": self.broker.name,
        }
        mechanisms = "PLAIN AMQPLAIN EXTERNAL" if self.external else "PLAIN AMQPLAIN"
        self.send(0, "connection.start", 0, 9, props, mechanisms, "en_US")

    def _client_close(self, m: ConnectionClose) -> None:
        if self.state is CLOSING:  # the client's close crossed ours
            self.send(0, "connection.close_ok")
            self._drop(Trigger.CLOSE)
            return
        log.info(
            "connection %s (%s) closed by client: %s %s",
            self.id,
            self.peer,
            m.reply_code,
            m.reply_text,
        )
        self.close_reason = f"{m.reply_code} {m.reply_text}"
        for ch in list(self.channels.values()):
            ch.teardown("connection-closed")
        self.channels.clear()
        self.send(0, "connection.close_ok")
        self.flush()
        self._advance(Trigger.CLOSE)
        self._cleanup()
        self.transport.close()

    def _client_close_ok(self, m: ConnectionCloseOk) -> None:
        if self.state is CLOSING:
            self._drop(Trigger.CLOSE_OK)
        else:  # nobody asked for it: ignored (the table keeps the state)
            self._advance(Trigger.CLOSE_OK)

    def _update_secret(self, m: ConnectionUpdateSecret) -> None:
        raise ConnectionError_(NOT_IMPLEMENTED, "connection.update_secret is not supported", m.ID)

    def _start_ok(self, m: ConnectionStartOk) -> None:
        client_props, mechanism = m.client_properties, m.mechanism
        self.client_props = client_props if isinstance(client_props, dict) else {}
        caps = self.client_props.get("capabilities")
        self.client_caps = caps if isinstance(caps, dict) else {}
        user, password = self._credentials(mechanism, m.response)
        if password is None:  # EXTERNAL: the verified certificate vouches for the user
            refusal = self.broker.external_login_refusal(user, self.peer_host)
        else:
            refusal = self.broker.login_refusal(user, password, self.peer_host)
        throttle = self.broker.login_throttle
        verdict, delay = throttle.judge(user, self.peer_host, refusal is None)
        if verdict != ACCEPT:
            # the client learns no more than RabbitMQ tells it; the log says why
            text = (
                f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}."
                " For details see the broker logfile."
            )
            log.warning(
                "connection %s (%s): %s login refused: %s%s",
                self.id,
                self.peer,
                mechanism,
                refusal or under_attack_text(user, self.peer_host),
                throttled_text(verdict, delay, self.peer_host, throttle.max_pending),
                extra={"user": user, "peer": self.peer},
            )
            if delay:
                self._refuse_later(delay, text)
            elif self.client_caps.get("authentication_failure_close"):
                self.close(ACCESS_REFUSED, text, CONNECTION_START_OK)
            else:
                self._advance(Trigger.DROP)
                self._cleanup()
                self.transport.close()
            return
        self.user = user
        self._advance(Trigger.START_OK)
        lim = self.broker.limits
        self.send(0, "connection.tune", lim.channel_max, lim.frame_max, int(lim.heartbeat))

    def _refuse_later(self, delay: float, text: str) -> None:
        """Answer a failed login after ``delay`` seconds (login throttling). Meanwhile the
        connection is closing: it reads nothing more and what it already sent is discarded, so
        a client cannot learn the outcome sooner by sending more."""
        self.close_reason = text
        self._advance(Trigger.SEND_CLOSE)
        self.transport.pause_reading()  # resumed by _refuse_now (not by process())
        self.broker.login_throttle.hold(self.peer_host)
        self._refusal_held = True
        self._arm_timeout(delay, self._refuse_now, text)

    def _refuse_now(self, text: str) -> None:
        self._timeout_timer = None
        if self.state is not CLOSING:  # the socket went away meanwhile
            return
        if self.client_caps.get("authentication_failure_close"):
            self.out.append(
                self.codec.encode_method(
                    0, "connection.close", ACCESS_REFUSED, text[:255], *CONNECTION_START_OK
                )
            )
            self.flush()
            self.transport.resume_reading()  # for the client's close-ok
            self._arm_timeout(self.broker.close_timeout, self._drop)
        else:
            self._drop()

    def _credentials(self, mechanism: str, response: bytes) -> tuple[str, str | None]:
        """``(user, password)`` from start-ok's response; the password is None for EXTERNAL,
        where the user is the CN of the client's verified certificate."""
        if mechanism == "EXTERNAL" and self.external:
            if self.cert_user is None:
                raise ConnectionError_(
                    ACCESS_REFUSED,
                    "EXTERNAL login needs a client certificate with a CN",
                    CONNECTION_START_OK,
                )
            return self.cert_user, None
        if mechanism == "PLAIN":
            parts = bytes(response).split(b"\x00")
            if len(parts) != 3:
                raise ConnectionError_(SYNTAX_ERROR, "PLAIN response invalid", CONNECTION_START_OK)
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        if mechanism == "AMQPLAIN":
            from amqp.serialization import loads

            raw = bytes(response)
            try:
                table, _ = loads("F", len(raw).to_bytes(4, "big") + raw, 0)
            except Exception:
                raise ConnectionError_(
                    SYNTAX_ERROR, "AMQPLAIN response invalid", CONNECTION_START_OK
                ) from None
            t = table[0]
            return str(t.get("LOGIN", "")), str(t.get("PASSWORD", ""))
        raise ConnectionError_(
            COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'", CONNECTION_START_OK
        )

    def _tune_ok(self, m: ConnectionTuneOk) -> None:
        channel_max, frame_max, heartbeat = m.channel_max, m.frame_max, m.heartbeat
        lim = self.broker.limits
        if frame_max and frame_max < 4096:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is lower than the minimum allowed value "
                "(4096)",
                CONNECTION_TUNE_OK,
            )
        if frame_max > lim.frame_max:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is higher than the maximum allowed value "
                f"({lim.frame_max})",
                CONNECTION_TUNE_OK,
            )
        self.frame_max = frame_max or lim.frame_max
        self.codec.tune(self.frame_max)
        self.channel_max = min(channel_max or lim.channel_max, lim.channel_max)
        self.heartbeat = heartbeat
        self._advance(Trigger.TUNE_OK)

    def _open(self, m: ConnectionOpen) -> None:
        vhost_name = m.virtual_host
        vh = self.broker.vhosts.get(vhost_name)
        if vh is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost {vhost_name} not found", CONNECTION_OPEN)
        if not self.broker.may_access(self.user, vhost_name):
            raise ConnectionError_(
                NOT_ALLOWED,
                f"access to vhost '{vhost_name}' refused for user '{self.user}'",
                CONNECTION_OPEN,
            )
        refusal = self.broker.admit(self.user)
        if refusal is not None:
            raise ConnectionError_(NOT_ALLOWED, refusal, CONNECTION_OPEN)
        self.admitted = True
        self.vhost = vh
        self.set_permission(self.broker.user_permission(self.user, vhost_name))
        self.impersonator = self.broker.user_tags(self.user).impersonator
        self._advance(Trigger.OPEN)
        if self._timeout_timer is not None:
            self.broker.timers.cancel(self._timeout_timer)
            self._timeout_timer = None
        self.send(0, "connection.open_ok", "")
        if self.heartbeat:
            self._hb_timer = self.broker.timers.call_later(self.heartbeat / 2, self._hb_tick)
        if self.broker.alarm:
            self.set_blocked(self.broker.blocking_reason(self))
        log.info(
            "connection %s (%s) opened: user %r vhost %r heartbeat %ds",
            self.id,
            self.peer,
            self.user,
            vhost_name,
            self.heartbeat,
            extra={"user": self.user, "peer": self.peer, "vhost": vhost_name},
        )
        h = self.broker.hooks.connection_opened
        if h is not None:
            h(connection_id=self.id, peer=self.peer, user=self.user, vhost=vhost_name)

    def _hb_tick(self) -> None:
        self._hb_timer = None
        if self.state is not OPEN or not self.heartbeat:
            return
        now = self.clock.monotonic()
        hb = self.heartbeat
        if self.blocked or not self.writable:
            # we stopped reading from it (a resource alarm, or its output is not drained):
            # its heartbeats sit unread, so the missed-heartbeat check pauses meanwhile (as
            # RabbitMQ's does while a connection is blocked)
            self.last_recv = now
        if now - self.last_recv > 2 * hb:
            log.warning(
                "connection %s (%s) dropped: no frame from the client for %.1f s (heartbeat %d s)",
                self.id,
                self.peer,
                now - self.last_recv,
                hb,
            )
            self.close_reason = "missed heartbeats"
            self._advance(Trigger.DROP)
            self._cleanup()
            self.transport.close()
            return
        if now - self.last_sent >= hb / 2 and not self.out:
            self.out.append(self.codec.encode_heartbeat())
            self.flush()
        self._hb_timer = self.broker.timers.call_later(hb / 2, self._hb_tick)

    # ================================================================ channel class

    def _channel_open(self, channel_id: int) -> None:
        if channel_id in self.channels or channel_id in self.closing_channels:
            raise ConnectionError_(CHANNEL_ERROR, "second 'channel.open' seen", CHANNEL_OPEN)
        channel_max = self.channel_max
        if channel_id > channel_max:
            self.broker.refused("channelMax")
            raise ConnectionError_(
                NOT_ALLOWED,
                f"channel {channel_id} is above the negotiated channel_max ({channel_max})",
                CHANNEL_OPEN,
            )
        self.broker.check_channel_limit(self)
        self.channels[channel_id] = Channel(self, channel_id)
        self.send(channel_id, "channel.open_ok", b"")

    def _channel_flow(self, ch: Channel, m: ChannelFlow) -> None:
        ch.flow = bool(m.active)
        self.send(ch.id, "channel.flow_ok", ch.flow)
        if ch.flow:
            for c in ch.consumers.values():
                c.queue.vhost.mark_dirty(c.queue)

    def _channel_close(self, ch: Channel, m: ChannelClose) -> None:
        ch.teardown("channel-closed")
        self.channels.pop(ch.id, None)
        self.codec.discard_channel(ch.id)
        self.send(ch.id, "channel.close_ok")

    def _channel_close_ok(self, ch: Channel, m: ChannelCloseOk) -> None:
        raise ConnectionError_(
            CHANNEL_ERROR,
            f"channel.close_ok on channel {ch.id}, which the broker did not close",
            CHANNEL_CLOSE_OK,
        )

    # ================================================================ exchange class

    def _exchange_declare(self, ch: Channel, m: ExchangeDeclare) -> None:
        if not m.passive and m.exchange:  # "" is refused below as the default exchange
            self.require(authz.exchange_declare(m.exchange, m.arguments), EXCHANGE_DECLARE)
        ch.vhost.declare_exchange(
            m.exchange,
            m.type,
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments,
        )
        if not m.nowait:
            self.send(ch.id, "exchange.declare_ok")
        self.grew(not m.passive)

    def _exchange_delete(self, ch: Channel, m: ExchangeDelete) -> None:
        if m.exchange:
            self.require(authz.exchange_delete(m.exchange), EXCHANGE_DELETE)
        if m.exchange in ch.vhost.exchanges:
            ch.vhost.delete_exchange(m.exchange, if_unused=m.if_unused)
        if not m.nowait:
            self.send(ch.id, "exchange.delete_ok")

    def _exchange_bind(self, ch: Channel, m: ExchangeBind) -> None:
        self.require(authz.exchange_bind(m.source, m.destination), EXCHANGE_BIND)
        vh = ch.vhost
        d = vh.get_exchange(m.destination, EXCHANGE_BIND)
        s = vh.get_exchange(m.source, EXCHANGE_BIND)
        vh.bind(s, d, m.routing_key, m.arguments)
        if not m.nowait:
            self.send(ch.id, "exchange.bind_ok")
        self.grew()

    def _exchange_unbind(self, ch: Channel, m: ExchangeUnbind) -> None:
        self.require(authz.exchange_bind(m.source, m.destination), EXCHANGE_UNBIND)
        vh = ch.vhost
        d = vh.get_exchange(m.destination, EXCHANGE_UNBIND)
        s = vh.get_exchange(m.source, EXCHANGE_UNBIND)
        vh.unbind(s, d, m.routing_key, m.arguments)
        if not m.nowait:
            self.send(ch.id, "exchange.unbind_ok")

    # ================================================================ queue class

    def _queue_declare(self, ch: Channel, m: QueueDeclare) -> None:
        vh = ch.vhost
        name = m.queue
        server_name = ""
        if not m.passive:
            # RabbitMQ checks a server-named queue under the name it will get (amq.gen-...)
            if not name:
                server_name = "amq.gen-" + secrets.token_urlsafe(16)
            self.require(authz.queue_declare(name or server_name, m.arguments), QUEUE_DECLARE)
            self.broker.check_queue_limit(
                vh, name or server_name, new=bool(server_name) or name not in vh.queues
            )
        q, created = vh.declare_queue(
            name,
            server_name=server_name,
            passive=m.passive,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=m.arguments,
            owner=self.id,
            subscription_type=self.broker.configured_subscription(vh.name, m.queue),
        )
        if not m.nowait:
            self.send(ch.id, "queue.declare_ok", q.name, q.ready_count, len(q.consumers))
        self.grew(created)

    def _queue_bind(self, ch: Channel, m: QueueBind) -> None:
        self.require(authz.queue_bind(m.queue, m.exchange), QUEUE_BIND)
        vh = ch.vhost
        q = vh.get_queue(m.queue, QUEUE_BIND, self.id)
        ex = vh.get_exchange(m.exchange, QUEUE_BIND)
        vh.bind(ex, q, m.routing_key, m.arguments)
        if not m.nowait:
            self.send(ch.id, "queue.bind_ok")
        self.grew()

    def _queue_unbind(self, ch: Channel, m: QueueUnbind) -> None:
        self.require(authz.queue_bind(m.queue, m.exchange), QUEUE_UNBIND)
        vh = ch.vhost
        q = vh.get_queue(m.queue, QUEUE_UNBIND, self.id)
        ex = vh.get_exchange(m.exchange, QUEUE_UNBIND)
        vh.unbind(ex, q, m.routing_key, m.arguments)
        self.send(ch.id, "queue.unbind_ok")

    def _queue_purge(self, ch: Channel, m: QueuePurge) -> None:
        self.require(authz.queue_purge(m.queue), QUEUE_PURGE)
        q = ch.vhost.get_queue(m.queue, QUEUE_PURGE, self.id)
        n = fate.purge(q)
        if not m.nowait:
            self.send(ch.id, "queue.purge_ok", n)

    def _queue_delete(self, ch: Channel, m: QueueDelete) -> None:
        self.require(authz.queue_delete(m.queue), QUEUE_DELETE)
        vh = ch.vhost
        q = vh.queues.get(m.queue)
        n = 0
        cancels: list[str] = []
        if q is not None:
            vh._check_owner(q, self.id, QUEUE_DELETE)
            ch.deferred_cancels = cancels
            try:
                n = vh.delete_queue(
                    q,
                    reason="client",
                    detail=f"queue.delete on connection {self.id}",
                    if_unused=m.if_unused,
                    if_empty=m.if_empty,
                )
            finally:
                ch.deferred_cancels = None
        if not m.nowait:
            self.send(ch.id, "queue.delete_ok", n)
        # the queue's other consumers on this channel hear of it after the reply, as from
        # RabbitMQ (py-amqp would otherwise raise ConsumerCancelled inside queue_delete)
        for tag in cancels:
            self.send(ch.id, "basic.cancel", tag, True)

    # ================================================================ basic class

    def _basic_qos(self, ch: Channel, m: BasicQos) -> None:
        if m.global_:
            ch.prefetch_global = m.prefetch_count
        else:
            ch.prefetch_consumer = m.prefetch_count
        self.send(ch.id, "basic.qos_ok")
        for c in ch.consumers.values():
            c.queue.vhost.mark_dirty(c.queue)

    def _basic_consume(self, ch: Channel, m: BasicConsume) -> None:
        qname, tag, exclusive = m.queue, m.consumer_tag, m.exclusive
        sig = BASIC_CONSUME
        self.require(authz.consume(qname), sig)
        q = ch.vhost.get_queue(qname, sig, self.id)
        if not tag:
            tag = "amq.ctag-" + secrets.token_urlsafe(16)
        elif tag in ch.consumers:
            raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", sig)
        self.broker.check_consumer_limits(ch.vhost, len(ch.consumers))
        if q.has_exclusive_consumer() or (exclusive and q.consumers):
            raise ChannelError(
                ACCESS_REFUSED, f"queue '{qname}' in vhost '{ch.vhost.name}' in exclusive use", sig
            )
        if q.subscription_type == EXCLUSIVE and q.consumers:
            raise ChannelError(
                ACCESS_REFUSED,
                f"queue '{qname}' has an exclusive subscription and already has a consumer",
                sig,
            )
        c = q.add_consumer(
            tag,
            ch,
            no_ack=m.no_ack,
            exclusive=exclusive,
            prefetch=ch.prefetch_consumer,
            arguments=m.arguments,
        )
        ch.consumers[tag] = c
        if not m.nowait:
            self.send(ch.id, "basic.consume_ok", tag)
        h = self.broker.hooks.consumer_added
        if h is not None:
            h(
                vhost=ch.vhost.name,
                queue=q.name,
                consumer_tag=tag,
                connection_id=self.id,
                channel_id=ch.id,
            )

    def _basic_cancel(self, ch: Channel, m: BasicCancel) -> None:
        tag = m.consumer_tag
        c = ch.consumers.pop(tag, None)
        if c is not None:
            c.queue.remove_consumer(c)
            ch._consumer_gone(c, "cancel")
        if not m.nowait:
            self.send(ch.id, "basic.cancel_ok", tag)

    def _basic_get(self, ch: Channel, get: BasicGet) -> None:
        qname, no_ack = get.queue, get.no_ack
        self.require(authz.consume(qname), BASIC_GET)
        q = ch.vhost.get_queue(qname, BASIC_GET, self.id)
        q.getters[(self.id, ch.id)] = None
        ch.polled[id(q)] = q
        if ch.prefetch_global and len(ch.unacked) >= ch.prefetch_global and not no_ack:
            self.send(ch.id, "basic.get_empty", "")
            return
        m = q.get()
        if m is None:
            self.send(ch.id, "basic.get_empty", "")
            return
        if q.moved_waiting:
            q.moved_waiting.discard(m.id)
        tag = ch.next_tag
        ch.next_tag = tag + 1
        if no_ack:
            fate.settle_unacked(q, m)
        else:
            ch.unacked[tag] = (m, q, None)
            if m.stored and not m.redelivered:
                q.vhost.store.delivered(q, m)
        self.out.append(
            self.codec.encode_method(
                ch.id, "basic.get_ok", tag, m.redelivered, m.exchange, m.routing_key, q.ready_count
            )
        )
        body = m.body
        assert body is not None, "a paged-out body is read back before delivery (PagedReady)"
        self.out.append(
            self.codec.encode_content(ch.id, m.body_size, m.delivery_properties(), body)
        )
        self.want_flush()
        h = self.broker.hooks.message_delivered
        if h is not None:
            h(
                vhost=ch.vhost.name,
                queue=q.name,
                consumer_tag=None,
                connection_id=self.id,
                channel_id=ch.id,
                delivery_tag=tag,
                message=m,
                redelivered=m.redelivered,
                no_ack=no_ack,
                due=None,
            )

    def _basic_ack(self, ch: Channel, m: BasicAck) -> None:
        tag, multiple = m.delivery_tag, m.multiple
        if ch.tx:  # validate now, apply at commit
            self._tx_check_tag(ch, tag, multiple, BASIC_ACK)
            ch.tx_ops.append(("ack", (tag, multiple)))
            return
        self._ack(ch, tag, multiple)

    def _ack(self, ch: Channel, tag: int, multiple: bool) -> None:
        entries = ch.settle_tags(tag, multiple, BASIC_ACK)
        if not entries:
            return
        fate.ack_all(entries, ch, self.clock.monotonic())
        if ch.prefetch_global:
            self._channel_has_room(ch)

    @staticmethod
    def _channel_has_room(ch: Channel) -> None:
        """A settle freed room under the channel's global prefetch: its consumers' queues may
        dispatch again."""
        for c in ch.consumers.values():
            c.queue.vhost.mark_dirty(c.queue)

    def _basic_reject(self, ch: Channel, m: BasicReject) -> None:
        tag, requeue = m.delivery_tag, m.requeue
        if ch.tx:
            self._tx_check_tag(ch, tag, False, BASIC_REJECT)
            ch.tx_ops.append(("reject", (tag, False, requeue)))
            return
        self._reject(ch, tag, False, requeue, BASIC_REJECT)

    def _basic_nack(self, ch: Channel, m: BasicNack) -> None:
        tag, multiple, requeue = m.delivery_tag, m.multiple, m.requeue
        if ch.tx:
            self._tx_check_tag(ch, tag, multiple, BASIC_NACK)
            ch.tx_ops.append(("reject", (tag, multiple, requeue)))
            return
        self._reject(ch, tag, multiple, requeue, BASIC_NACK)

    def _reject(
        self, ch: Channel, tag: int, multiple: bool, requeue: bool, sig: tuple[int, int]
    ) -> None:
        entries = ch.settle_tags(tag, multiple, sig, ack=False)
        if requeue and len(entries) > 1:
            # each requeue goes to the front: newest first leaves the oldest at the head
            entries.reverse()
        now = self.clock.monotonic()
        for msg, q, c in entries:
            fate.reject(q, msg, c, ch, requeue, now)
        if entries and ch.prefetch_global:
            self._channel_has_room(ch)

    def _basic_recover(self, ch: Channel, m: BasicRecover) -> None:
        ch.requeue_all("recover")
        self.send(ch.id, "basic.recover_ok")

    def _basic_recover_async(self, ch: Channel, m: BasicRecoverAsync) -> None:
        ch.requeue_all("recover")

    def _publish(self, ch: Channel, ev: Publish) -> None:
        if not self._write_all and ev.exchange not in self._may_publish:
            self.require(authz.publish(ev.exchange), BASIC_PUBLISH)
            self._may_publish.add(ev.exchange)
        props = ev.properties  # user_id must be the user's (one byte test when it is absent)
        if len(props) > 1 and props[1] & USER_ID_FLAG and not self.impersonator:
            refusal = authz.user_id_refusal(props, self.user)
            if refusal is not None:
                raise ChannelError(PRECONDITION_FAILED, refusal, BASIC_PUBLISH)
        if ev.immediate:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true", BASIC_PUBLISH)
        if self.broker.alarm is not None and not self.blocked:
            self.block_if_alarmed()  # first publish during a resource alarm
        if ch.tx:
            # refuse a bad target now (as RabbitMQ does), not half-way through tx.commit
            vh = ch.vhost
            ex = vh.exchanges.get(ev.exchange)
            if ex is None:
                raise ChannelError(
                    NOT_FOUND, f"no exchange '{ev.exchange}' in vhost '{vh.name}'", BASIC_PUBLISH
                )
            if ex.internal:
                raise ChannelError(
                    ACCESS_REFUSED,
                    f"cannot publish to internal exchange '{ev.exchange}' in vhost '{vh.name}'",
                    BASIC_PUBLISH,
                )
            ch.tx_ops.append(("publish", ev))
            return
        self.published = True
        self._route(ch, ev)

    def _route(self, ch: Channel, ev: Publish) -> None:
        vh = ch.vhost
        ex = vh.exchanges.get(ev.exchange)
        if ex is None:
            raise ChannelError(
                NOT_FOUND, f"no exchange '{ev.exchange}' in vhost '{vh.name}'", BASIC_PUBLISH
            )
        if ex.internal:
            raise ChannelError(
                ACCESS_REFUSED,
                f"cannot publish to internal exchange '{ev.exchange}' in vhost '{vh.name}'",
                BASIC_PUBLISH,
            )
        clock = self.clock
        try:
            msg = Message.from_publish(
                vh.ids.next(),
                ev.exchange,
                ev.routing_key,
                ev.properties,
                ev.body,
                ev.body_size,
                clock.monotonic(),
                clock.time(),
            )
        except PropertiesError as exc:
            raise ChannelError(PRECONDITION_FAILED, str(exc), BASIC_PUBLISH) from None
        seq = 0
        if ch.confirm:
            ch.publish_seq += 1
            seq = ch.publish_seq
        if ex is vh.retry_exchange:
            self._reconsume(ch, ev, msg, seq)
            return
        if ex is vh.touch_exchange:
            self._touch(ch, ev, msg, seq)
            return
        try:  # headers are decoded only here, when an exchange needs them
            delay = DelayedExchange.delay_of(msg) if ex.type == "x-delayed-message" else 0.0
            queues = vh.route(ex, msg) if delay <= 0 else []
        except PropertiesError as exc:
            raise ChannelError(PRECONDITION_FAILED, str(exc), BASIC_PUBLISH) from None
        if delay > 0:
            vh.hold_delayed(ex, msg, delay)  # type: ignore[arg-type]
            if seq:
                if msg.stored:  # held on disk by a durable exchange: confirm once written
                    self._confirm_when_durable(ch, seq)
                else:
                    self._confirm(ch, seq)
            return
        h = self.broker.hooks.message_published
        if h is not None:
            h(
                vhost=vh.name,
                exchange=ev.exchange,
                routing_key=ev.routing_key,
                message=msg,
                queues=tuple(q.name for q in queues),
            )
        if not queues:
            if ev.mandatory:
                self.out.append(
                    self.codec.encode_method(
                        ch.id, "basic.return", NO_ROUTE, "NO_ROUTE", ev.exchange, ev.routing_key
                    )
                )
                self.out.append(
                    self.codec.encode_content(ch.id, ev.body_size, ev.properties, ev.body)
                )
                self.want_flush()
            if seq:
                self._confirm(ch, seq)
            return
        taken, refused = vh.deliver_to_queues(queues, msg)
        if seq:
            if refused:
                self._confirm(ch, -seq)
            elif msg.persistent and vh.store.durable and any(q.durable for q in taken):
                self._confirm_when_durable(ch, seq)
            else:
                self._confirm(ch, seq)

    def _touch(self, ch: Channel, ev: Publish, request: Message, seq: int) -> None:
        """A publish to ``amq.touch``: the consumer still works on the delivery of this
        channel that header ``x-touch-tag`` names, and its ack clock restarts
        (:func:`plugbroker.domain.fate.touch`).

        A tag that names no unacked delivery of a consumer on this channel (acked meanwhile,
        taken back by isolation, a basic.get, another channel's) changes nothing and closes
        nothing: the touch raced with the end of the task. In confirm mode it is nacked (and
        returned with 404 when mandatory); a touched delivery is acked. A publish without an
        integer ``x-touch-tag`` is a client bug: channel error 406, or a nack in confirm mode.
        """
        try:
            h = request.headers if request._hoff >= 0 else {}
        except PropertiesError as exc:
            h = {}
            bad = f"PRECONDITION_FAILED - touch refused: {exc}"
        else:
            bad = (
                "PRECONDITION_FAILED - a publish to amq.touch names a delivery of its channel "
                "with the integer header x-touch-tag"
            )
        tag = h.get(TOUCH_TAG_HEADER)
        if not _is_int(tag):
            if not seq:
                raise ChannelError(PRECONDITION_FAILED, bad, BASIC_PUBLISH)
            self._refuse_touch(ch, ev, seq, PRECONDITION_FAILED, bad)
            return
        entry = ch.unacked.get(tag)
        consumer = entry[2] if entry is not None else None
        if entry is None or consumer is None:
            text = (
                f"NOT_FOUND - no unacked delivery with tag {tag} from a consumer on channel {ch.id}"
            )
            log.debug("connection %s channel %d: touch ignored: %s", self.id, ch.id, text)
            if seq:
                self._refuse_touch(ch, ev, seq, NOT_FOUND, text)
            return
        msg, q, _ = entry
        fate.touch(consumer, self.clock.monotonic())
        ht = self.broker.hooks.delivery_touched
        if ht is not None:
            ht(
                vhost=q.vhost.name,
                queue=q.name,
                consumer_tag=consumer.tag,
                connection_id=self.id,
                channel_id=ch.id,
                delivery_tag=tag,
                message=msg,
            )
        if seq:
            self._confirm(ch, seq)

    def _refuse_touch(self, ch: Channel, ev: Publish, seq: int, code: int, text: str) -> None:
        if ev.mandatory:
            self.out.append(
                self.codec.encode_method(
                    ch.id, "basic.return", code, text[:255], ev.exchange, ev.routing_key
                )
            )
            self.out.append(self.codec.encode_content(ch.id, ev.body_size, ev.properties, ev.body))
        self._confirm(ch, -seq)

    def _reconsume(self, ch: Channel, ev: Publish, request: Message, seq: int) -> None:
        """A publish to ``amq.retry``: retry the unacked delivery it names (headers
        ``x-reconsume-channel``, ``x-reconsume-tag``, optional ``x-delay`` in ms or
        ``x-retry-level``) on the broker's side (:func:`plugbroker.domain.fate.reconsume`).

        Confirmed once the copy is safe (written, for a persistent one); refused with a
        ``basic.return`` carrying the reason (when mandatory) and a ``basic.nack`` in confirm
        mode, else with channel error 406; the delivery itself stays unacked either way."""
        vh = ch.vhost
        try:
            try:
                h = request.headers if request._hoff >= 0 else {}
            except PropertiesError as bad:
                # (a name of its own: mypyc types one name once per function, and the handler
                # below binds a RetryRefused)
                raise fate.RetryRefused(str(bad)) from None
            chan_id = h.get("x-reconsume-channel")
            tag = h.get("x-reconsume-tag")
            if not _is_int(chan_id) or not _is_int(tag):
                raise fate.RetryRefused(
                    "a publish to amq.retry names a delivery with integer headers "
                    "x-reconsume-channel and x-reconsume-tag"
                )
            dch = self.channels.get(chan_id)
            entry = dch.unacked.get(tag) if dch is not None and not dch.closing else None
            if entry is None:
                raise fate.RetryRefused(
                    f"no unacked delivery with tag {tag} on channel {chan_id} of this connection"
                )
            msg, q, _consumer = entry
            if q.vhost is not vh:
                raise fate.RetryRefused("the delivery is from another vhost")
            retry_q = vh.retry_queue_of(q.name) if q.retry_target is None else None
            if retry_q is not None:  # the copy is written there: the connection's write
                self.require(authz.retry_target(retry_q.name), BASIC_PUBLISH)
            delay_ms = h.get("x-delay")
            level = h.get("x-retry-level")
            if delay_ms is not None and not isinstance(delay_ms, (int, float)):
                raise fate.RetryRefused("x-delay must be a number of milliseconds")
            if level is not None and not _is_int(level):
                raise fate.RetryRefused("x-retry-level must be an integer")
            outcome, copy = fate.reconsume(
                q,
                msg,
                delay=delay_ms / 1000.0 if delay_ms is not None else None,
                level=level,
            )
        except fate.RetryRefused as exc:
            text = f"PRECONDITION_FAILED - retry refused: {exc}"
            log.warning(
                "connection %s channel %d: %s",
                self.id,
                ch.id,
                text.removeprefix("PRECONDITION_FAILED - "),
            )
            if not seq:
                raise ChannelError(PRECONDITION_FAILED, text, BASIC_PUBLISH) from None
            if ev.mandatory:
                self.out.append(
                    self.codec.encode_method(
                        ch.id,
                        "basic.return",
                        PRECONDITION_FAILED,
                        text[:255],
                        ev.exchange,
                        ev.routing_key,
                    )
                )
                self.out.append(
                    self.codec.encode_content(ch.id, ev.body_size, ev.properties, ev.body)
                )
            self._confirm(ch, -seq)
            return
        hp = self.broker.hooks.message_published
        if hp is not None and outcome == fate.RETRIED:
            hp(
                vhost=vh.name,
                exchange=ev.exchange,
                routing_key=ev.routing_key,
                message=copy,
                queues=(copy.queue_name,),
            )
        if seq:
            if copy.persistent and vh.store.durable:
                self._confirm_when_durable(ch, seq)
            else:
                self._confirm(ch, seq)

    # ================================================================ publisher confirms
    #
    # A confirm is not written when it becomes due but at the end of the turn (or before the
    # next other method to this client), so the confirms of one channel that fall due in the
    # same turn (a pipelining publisher, or one store batch reaching the disk) go out as one
    # basic.ack with multiple=true for the highest of a run of consecutive sequence numbers,
    # as RabbitMQ does. multiple=true acknowledges everything up to its tag, so a run stops
    # at a nack and never passes a publish still waiting for the disk.

    def _confirm(self, ch: Channel, seq: int) -> None:
        """Publish ``seq`` of ``ch`` is settled: an ack (``seq``) or a nack (``-seq``) is due."""
        due = ch.confirm_due
        if not due:
            self.confirming.append(ch)
            self.want_flush()
        due.append(seq)

    def _confirm_when_durable(self, ch: Channel, seq: int) -> None:
        """Confirm ``seq`` once everything the store has been given so far is on disk."""
        ch.confirm_waiting.append(seq)
        ch.vhost.store.after_durable(
            lambda: self._durable_confirm(ch, seq), lambda: self._durable_confirm(ch, -seq)
        )

    def _durable_confirm(self, ch: Channel, seq: int) -> None:
        """``seq`` is on disk (or, negative, could not be written: a nack)."""
        self._forget_waiting(ch.confirm_waiting, abs(seq))
        if self.state is OPEN and not ch.closing:
            self._confirm(ch, seq)

    @staticmethod
    def _forget_waiting(waiting: deque[int], seq: int) -> None:
        if waiting and waiting[0] == seq:
            waiting.popleft()  # the store runs its callbacks in the order they were given
        else:
            try:
                waiting.remove(seq)
            except ValueError:
                pass

    def _write_confirms(self) -> None:
        """Put the due confirms of every channel in ``out``, runs of acks coalesced."""
        channels, self.confirming = self.confirming, []
        out = self.out
        encode_ack = self.codec.encode_ack
        for ch in channels:
            due, ch.confirm_due = ch.confirm_due, []
            if len(due) > 1:
                due.sort(key=abs)
            waiting = ch.confirm_waiting
            # a multiple=true ack must not reach the first seq still waiting for the disk
            limit = waiting[0] if waiting else 1 << 64
            cid = ch.id
            first = last = 0  # the run of acks being gathered
            for seq in due:
                if last and seq == last + 1 and seq < limit:
                    last = seq
                    continue
                if last:
                    out.append(encode_ack(cid, last, last != first))
                    first = last = 0
                if seq < 0:
                    out.append(self.codec.encode_method(cid, "basic.nack", -seq, False, False))
                elif seq < limit:
                    first = last = seq
                else:
                    out.append(encode_ack(cid, seq, False))
            if last:
                out.append(encode_ack(cid, last, last != first))

    # ================================================================ confirm / tx

    def _confirm_select(self, ch: Channel, m: ConfirmSelect) -> None:
        if ch.tx:
            raise ChannelError(
                PRECONDITION_FAILED, "cannot switch from tx to confirm mode", CONFIRM_SELECT
            )
        ch.confirm = True
        if not m.nowait:
            self.send(ch.id, "confirm.select_ok")

    def _tx_select(self, ch: Channel, m: TxSelect) -> None:
        if ch.confirm:
            raise ChannelError(
                PRECONDITION_FAILED, "cannot switch from confirm to tx mode", TX_SELECT
            )
        ch.tx = True
        self.send(ch.id, "tx.select_ok")

    def _tx_check_tag(self, ch: Channel, tag: int, multiple: bool, sig: tuple[int, int]) -> None:
        if tag == 0 and multiple:
            return
        if (
            tag not in ch.unacked
            and tag not in ch.moved
            and not (multiple and any(t <= tag for t in ch.unacked))
        ):
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", sig)

    def _tx_commit(self, ch: Channel, m: TxCommit) -> None:
        if not ch.tx:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional", TX_COMMIT)
        ops, ch.tx_ops = ch.tx_ops, []
        for kind, arg in ops:
            if kind == "publish":
                self.published = True
                self._route(ch, arg)
            elif kind == "ack":
                self._ack(ch, *arg)
            else:
                tag, multiple, requeue = arg
                self._reject(ch, tag, multiple, requeue, BASIC_NACK)
        if ch.vhost.store.durable:  # commit-ok once the transaction's writes are on disk
            ch.vhost.store.after_durable(
                lambda: (
                    self.send(ch.id, "tx.commit_ok")
                    if self.state is OPEN and not ch.closing
                    else None
                )
            )
        else:
            self.send(ch.id, "tx.commit_ok")

    def _tx_rollback(self, ch: Channel, m: TxRollback) -> None:
        if not ch.tx:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional", TX_ROLLBACK)
        ch.tx_ops.clear()
        self.send(ch.id, "tx.rollback_ok")

    # ================================================================ broker-initiated

    # ================================================================ authorization

    def set_permission(self, permission: Permission | None) -> None:
        """Take the user's patterns on this connection's vhost (None: no access at all) and
        forget what was checked under the old ones."""
        self.permission = permission
        self._allowed = {}
        self._may_publish = set()
        self._write_all = permission is not None and permission.write == FULL_PATTERN

    def may(self, kind: str, name: str) -> bool:
        """Whether the user may ``kind`` (configure, write, read) the resource ``name``.
        Memoized per connection: a repeated check is one dict lookup."""
        key = (kind, name)
        allowed = self._allowed.get(key)
        if allowed is None:
            perm = self.permission
            allowed = perm is not None and perm.allows(kind, name)
            if len(self._allowed) >= MAX_PERMISSION_MEMO:
                self._allowed.clear()
                self._may_publish.clear()
            self._allowed[key] = allowed
        return allowed

    def require(self, needs: tuple[authz.Need, ...], method: MethodId) -> None:
        """Raise 403 ACCESS_REFUSED (closing the channel) unless the user has each of
        ``needs`` (:mod:`plugbroker.authz` says which an operation needs)."""
        for need in needs:
            if not self.may(need.kind, need.name):
                vhost = self.vhost.name if self.vhost is not None else ""
                raise ChannelError(ACCESS_REFUSED, authz.refusal(need, vhost, self.user), method)

    def force_close(self, text: str = "broker shutdown") -> None:
        """Close with 320 CONNECTION_FORCED (shutdown, admin)."""
        if self.state is OPEN:
            self.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {text}")
        elif self._allows(Trigger.DROP):
            self._advance(Trigger.DROP)
            self._cleanup()
            self.transport.close()


# ================================================================ dispatch tables

# The connection's methods taken from the class, called with the connection: a per-connection
# table of bound methods would make every connection a reference cycle, freed only by the cycle
# collector (whose full passes pause the loop for as long as the heap is big), not when it
# closes. Each handler takes the event class it is filed under; a mapping cannot say that per
# key, hence Any for the event argument. Module-level, after the class: a class compiled by
# mypyc (docs/operations.md#the-compiled-build) has no method names to read in its own body.
_HANDLERS: dict[type[MethodEvent], Callable[[Connection, Channel, Any], None]] = {
    ChannelFlow: Connection._channel_flow,
    ChannelClose: Connection._channel_close,
    ChannelCloseOk: Connection._channel_close_ok,
    ExchangeDeclare: Connection._exchange_declare,
    ExchangeDelete: Connection._exchange_delete,
    ExchangeBind: Connection._exchange_bind,
    ExchangeUnbind: Connection._exchange_unbind,
    QueueDeclare: Connection._queue_declare,
    QueueBind: Connection._queue_bind,
    QueueUnbind: Connection._queue_unbind,
    QueuePurge: Connection._queue_purge,
    QueueDelete: Connection._queue_delete,
    BasicQos: Connection._basic_qos,
    BasicConsume: Connection._basic_consume,
    BasicCancel: Connection._basic_cancel,
    BasicGet: Connection._basic_get,
    BasicAck: Connection._basic_ack,
    BasicReject: Connection._basic_reject,
    BasicNack: Connection._basic_nack,
    BasicRecover: Connection._basic_recover,
    BasicRecoverAsync: Connection._basic_recover_async,
    ConfirmSelect: Connection._confirm_select,
    TxSelect: Connection._tx_select,
    TxCommit: Connection._tx_commit,
    TxRollback: Connection._tx_rollback,
}
_CONNECTION_HANDLERS: dict[Trigger, Callable[[Connection, Any], None]] = {
    Trigger.START_OK: Connection._start_ok,
    Trigger.TUNE_OK: Connection._tune_ok,
    Trigger.OPEN: Connection._open,
    Trigger.CLOSE: Connection._client_close,
    Trigger.CLOSE_OK: Connection._client_close_ok,
    Trigger.UPDATE_SECRET: Connection._update_secret,
}


__all__ = [
    "MAX_EVENTS_PER_TURN",
    "METHOD_COST",
    "REPLY_SUCCESS",
    "UNEXPECTED_FRAME",
    "Channel",
    "Connection",
    "Transport",
]

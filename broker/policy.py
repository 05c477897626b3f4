"""The policy contract: what a policy sees, what it may ask for, and the one signature it has.

A **policy job** is a pure function with one signature, :class:`Policy`::

    def evaluate(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]

registered with ``registry.register_policy_job(name, evaluate, section=...)``. Wherever it runs,
it is run the same way: a :class:`SnapshotSource` takes a :class:`Snapshot` of the queues whose
resolved policy has the job's section, the job turns it into actions, and an
:class:`ActionSink` applies them, re-checking that each still holds (the queue still exists, the
consumer is still there). ``state`` is the job's own mapping, kept from one run to the next;
``policies`` looks up the *named policies* (``Delete``, ``Log``, a plugin's) that a
``<policy name>`` element chooses, each a :data:`NamedPolicy` over a :class:`Trigger`.

* In the broker, the housekeeping pool (:mod:`plugbroker.housekeeping`) takes the snapshot on the
  broker's loop (O(queues + consumers): every figure is a running figure the core keeps, nothing
  walks messages), calls the job on a pool thread and applies the actions on the loop with
  :meth:`plugbroker.app.Broker.apply_actions`.
* In the backtest (:mod:`plugbroker.analyze.replay`), the same jobs run over snapshots rebuilt from
  the event journal, and their actions are recorded instead of applied.

Snapshots and actions are plain values: this module imports nothing from the broker's domain,
session or application, so another source (a RabbitMQ cluster's management API, say) can stand
in for the broker as a :class:`SnapshotSource` and an :class:`ActionSink`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, TypeAlias

_NO_POLICY: Mapping[str, Any] = MappingProxyType({})


class ConsumerView(NamedTuple):
    """One consumer of one queue, as seen at snapshot time.

    Views are named tuples: immutable like frozen dataclasses, and several times cheaper to
    build, which matters when a check snapshots ten thousand queues.
    """

    tag: str
    connection_id: str
    channel_id: int
    unacked: int
    #: monotonic time of the consumer's last ack/nack/reject; ``None`` before the first one
    last_ack: float | None
    #: monotonic time of the first delivery to it; ``None`` if it never got a message
    first_delivery: float | None
    isolated: bool
    prefetch: int
    no_ack: bool
    #: the ack clock: monotonic time it went from nothing unacked to something unacked,
    #: restarted at each ack, nack or reject; ``None`` while it holds nothing unacked
    busy_since: float | None = None
    #: monotonic time the delivery it works on last counted a timed-out hand-out
    #: (:class:`CountTimeout`, or its isolation); ``None`` when it has not in this hand-out
    timed_out_at: float | None = None
    #: it is still busy with a message dead-lettered as poison (it has settled nothing since):
    #: it gets no new delivery and is neither isolated nor counted against meanwhile
    pardoned: bool = False


class QueueView(NamedTuple):
    """One queue, as seen at snapshot time. Every figure is a running figure."""

    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    exclusive: bool
    subscription_type: str
    #: messages held: ready plus delivered-but-unacked
    message_count: int
    #: bytes of the bodies of those messages
    message_bytes: int
    ready_count: int
    unacked_count: int
    #: monotonic arrival time of the oldest message held, ``None`` when empty
    oldest_arrival: float | None
    #: acks (and rejects/nacks that removed a message) since the queue was declared
    acks_total: int
    consumers: tuple[ConsumerView, ...]
    #: ``(exchange, exchange_type, binding_key)`` for every binding of the queue
    bindings: tuple[tuple[str, str, str], ...]
    #: the resolved policy sections for this queue (see :mod:`plugbroker.config`), by element name
    policy: Mapping[str, Any] = _NO_POLICY
    #: channels that used basic.get on this queue: ``(connection_id, channel_id)``
    getters: tuple[tuple[str, int], ...] = ()

    def age(self, now: float) -> float:
        """Age in seconds of the oldest message; 0 for an empty queue."""
        oldest = self.oldest_arrival
        return 0.0 if oldest is None or oldest >= now else now - oldest


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent, read-only picture of the queues a job asked for."""

    taken_at: float
    queues: tuple[QueueView, ...]


# ---------------------------------------------------------------------------------------------
# Actions. A policy returns these; the core applies them on the loop.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Action:
    """Base of every action. ``policy`` names who asked, ``reason`` says why (for logs/journal)."""

    vhost: str
    queue: str
    policy: str
    reason: str
    #: the threshold element that fired (e.g. ``messageCount``), the configured and measured values
    threshold: str = ""
    configured: float | None = None
    measured: float | None = None


@dataclass(frozen=True, slots=True)
class CloseConsumerChannels(Action):
    """Close every channel consuming from (or polling) the queue with ``code``/``text``."""

    code: int = 506
    text: str = "Consuming too slow."


@dataclass(frozen=True, slots=True)
class DeleteQueue(Action):
    """Delete the queue and release its messages (after any channel closes in the same batch)."""


@dataclass(frozen=True, slots=True)
class CancelConsumer(Action):
    """Cancel one consumer with a broker-sent basic.cancel; its channel stays open."""

    consumer_tag: str = ""
    connection_id: str = ""


@dataclass(frozen=True, slots=True)
class SetPrefetch(Action):
    """Lower (or raise) one consumer's prefetch window."""

    consumer_tag: str = ""
    connection_id: str = ""
    prefetch: int = 0


@dataclass(frozen=True, slots=True)
class IsolateConsumer(Action):
    """Put a consumer on the queue's blocklist and requeue its unacked messages.

    ``configured`` is the ack timeout it is over: the delivery it works on then counts one
    timed-out hand-out first (as :class:`CountTimeout`), and if that makes the message poison
    (``<poisonDeliveries>``) the message is dead-lettered and the consumer is not isolated."""

    consumer_tag: str = ""
    connection_id: str = ""


@dataclass(frozen=True, slots=True)
class CountTimeout(Action):
    """A consumer is over its ack timeout but keeps its deliveries (the cap spared it): the
    delivery it works on counts one more timed-out hand-out, at most once per ``configured``
    seconds (the ack timeout). At the queue's ``<poisonDeliveries>`` the message is
    dead-lettered with reason ``poison`` (parked in ``{queue}-DLQ`` without a dead-letter
    target) and the consumers isolated while working on it are released."""

    consumer_tag: str = ""
    connection_id: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseConsumer(Action):
    """Take a consumer off the blocklist."""

    consumer_tag: str = ""
    connection_id: str = ""


@dataclass(frozen=True, slots=True)
class LogOnly(Action):
    """Record that a policy would have acted (a dry run); the core only logs and notifies."""


@dataclass(frozen=True, slots=True)
class Spared(Action):
    """A policy chose not to act on a queue it matched (e.g. a durable subscription without
    ``delete-persistent``); the core logs why and reports the outcome ``spared``."""


# ---------------------------------------------------------------------------------------------
# Named policies. A <consumer><policy name="X"> element names a policy; when the slow-consumer
# check finds a queue over one of its thresholds it calls that policy with a Trigger.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Breach:
    """One threshold a queue crossed: its element name, the configured and measured values."""

    threshold: str
    configured: float
    measured: float

    def describe(self) -> str:
        return f"{self.threshold} {self.measured:g} (limit {self.configured:g})"


@dataclass(frozen=True, slots=True)
class Trigger:
    """What a named policy is told when a queue crosses thresholds.

    A named policy (:data:`NamedPolicy`) is any callable ``policy(trigger) -> list[Action]``; it
    is registered with ``registry.register_policy(name, policy)`` and chosen by
    ``<policy name>`` in the XML.
    """

    queue: QueueView
    breaches: tuple[Breach, ...]
    #: the ``<option name value>`` pairs of the ``<policy>`` element
    options: Mapping[str, str]
    now: float
    policy: str
    #: the named policy's own state, kept by the job that calls it from one check to the next
    #: (one mapping per policy name, shared by all its queues). A stateful policy keeps its
    #: per-queue entries in ``state["queues"]`` keyed by ``(vhost, queue)``: the slow-consumer
    #: job drops the entry of a queue that left its snapshot and, for a queue that is healthy
    #: again, calls the policy's optional ``healthy(queue, state)`` (see :data:`NamedPolicy`).
    #: Stateless policies ignore it.
    state: PolicyState = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return "; ".join(b.describe() for b in self.breaches)

    def action_fields(self) -> dict[str, Any]:
        """The common fields of an Action for this trigger (first breach as the threshold)."""
        first = self.breaches[0]
        return dict(
            vhost=self.queue.vhost,
            queue=self.queue.name,
            policy=self.policy,
            reason=self.reason,
            threshold=first.threshold,
            configured=first.configured,
            measured=first.measured,
        )


# ---------------------------------------------------------------------------------------------
# The contract: one signature for every policy job, and the two ends it runs between.
# ---------------------------------------------------------------------------------------------

#: A named policy: what ``<policy name="X">`` chooses. It gets the :class:`Trigger` of a queue
#: that crossed thresholds and returns the actions to take (``Delete``, ``Log`` and
#: ``Graduated`` are built in). A stateful one (``Graduated``) may also have an attribute
#: ``healthy(queue: QueueView, state: PolicyState) -> list[Action]``, called for a queue it has
#: an entry for in ``state["queues"]`` when a check finds that queue under every threshold.
NamedPolicy: TypeAlias = Callable[[Trigger], list[Action]]

#: Gives the named policy registered under a name; raises ``plugbroker.registry.PluginError`` for a
#: name nobody registered (the configuration is checked against the registry before it is used).
PolicyLookup: TypeAlias = Callable[[str], NamedPolicy]

#: A policy job's own state, kept across its runs (e.g. the last ``acks_total`` of each queue,
#: for a rate). It starts empty; the job decides what to keep and must keep it O(queues).
#: One key is written by whoever applies the job's actions: :data:`DEFERRED`.
PolicyState: TypeAlias = MutableMapping[str, Any]

#: ``state[DEFERRED]``: the actions of the job's previous run that the vhost's blast-radius
#: budget deferred (not applied), a list, set only when there were some (by the housekeeping
#: pool in the broker, by the replay in the backtest). A job that keeps an escalation in its
#: state pops it to take back the steps that did not happen.
DEFERRED = "deferred"


class Policy(Protocol):
    """The one signature of a policy job (any function or callable object of this shape).

    :param snapshot: the queues whose resolved policy has the job's section (every queue for a
        job registered with ``section=None``), taken at ``snapshot.taken_at``; read-only.
    :param state: the job's own mapping, the same object at every run.
    :param policies: looks up a named policy (``policies("Delete")``), for a job whose XML
        section names one with ``<policy name>``.
    :returns: the actions to take, in order; an empty list when all is well.

    A policy job must be pure apart from ``state``: it runs on a housekeeping thread in the broker
    and in Spark tasks in the backtest, and it may neither touch live broker objects nor block.
    """

    def __call__(
        self, snapshot: Snapshot, state: PolicyState, policies: PolicyLookup, /
    ) -> list[Action]: ...


class SnapshotSource(Protocol):
    """Where snapshots come from: the broker (on its loop), or another broker's management API."""

    def snapshot(self, vhost: str | None = None, section: str | None = None) -> Snapshot:
        """The queues of ``vhost`` (every vhost when ``None``); with ``section``, only those whose
        resolved policy has that section element (e.g. ``"consumer"``)."""
        ...


class ActionSink(Protocol):
    """Where actions go: the broker's core, or another broker's management API."""

    def apply_actions(self, actions: Sequence[Action], streaks: Any = None) -> list[str]:
        """Apply ``actions`` in order, re-checking that each still holds; one outcome per action,
        such as ``"applied"``, ``"logged"``, ``"spared"``, ``"stale"`` (nothing left to act on)
        or ``"failed"``. ``streaks`` (a :class:`plugbroker.streaks.Streaks`, one per job) lets
        the sink tell a repeated spared or deferred decision once; a sink may ignore it."""
        ...


__all__ = [
    "DEFERRED",
    "Action",
    "ActionSink",
    "Breach",
    "CancelConsumer",
    "CloseConsumerChannels",
    "ConsumerView",
    "CountTimeout",
    "DeleteQueue",
    "IsolateConsumer",
    "LogOnly",
    "NamedPolicy",
    "Policy",
    "PolicyLookup",
    "PolicyState",
    "QueueView",
    "ReleaseConsumer",
    "SetPrefetch",
    "Snapshot",
    "SnapshotSource",
    "Spared",
    "Trigger",
]

"""The snapshot pattern: what a policy sees and what it may ask for.

A housekeeping job takes a :class:`Snapshot` on the broker's loop (a cost of O(queues +
consumers): every figure in it is a running figure the core keeps, nothing walks messages),
hands it to a pure policy function ``evaluate(snapshot, state, now) -> list[Action]``, and the
core applies the actions back on the loop with :meth:`broker.app.Broker.apply_actions`,
re-checking that each still holds (the queue still exists, the consumer is still there).

The same functions run in the Spark backtest over snapshots rebuilt from the event journal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

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
    #: the resolved policy sections for this queue (see :mod:`broker.config`), by element name
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
    """Put a consumer on the queue's blocklist and requeue its unacked messages."""

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

    A named policy is any callable ``policy(trigger) -> list[Action]``; it is registered with
    ``registry.register_policy(name, policy)`` and chosen by ``<policy name>`` in the XML.
    """

    queue: QueueView
    breaches: tuple[Breach, ...]
    #: the ``<option name value>`` pairs of the ``<policy>`` element
    options: Mapping[str, str]
    now: float
    policy: str

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

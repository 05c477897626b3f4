"""Values that decision hooks return to the core.

This module imports nothing from pluggy so the core's hot path can build and inspect decisions
without touching the plugin machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RejectKind = Literal["requeue", "dead-letter", "drop"]
_KINDS: frozenset[str] = frozenset(("requeue", "dead-letter", "drop"))


@dataclass(frozen=True, slots=True)
class RejectDecision:
    """What becomes of a message a consumer nacked or rejected (``broker_reject_decision``).

    :param kind: ``"requeue"`` puts it back on its queue (after ``delay``), ``"dead-letter"`` sends
        it to the queue's dead-letter target and acks the original, ``"drop"`` discards it.
    :param delay: seconds before a requeued message is visible again; ignored for other kinds.
    :param reason: the ``x-death`` reason recorded when the message is dead-lettered
        (``rejected``, ``expired``, ``maxlen``, ``delivery_limit``) and shown in logs.
    """

    kind: RejectKind
    delay: float = 0.0
    reason: str = "rejected"

    def __post_init__(self) -> None:
        # A plugin's typo must fail where it is made, not as a confusing state in the queue.
        if self.kind not in _KINDS:
            raise ValueError(
                f"RejectDecision.kind must be one of {sorted(_KINDS)}, not {self.kind!r}"
            )
        if self.delay < 0:
            raise ValueError(f"RejectDecision.delay must be >= 0, not {self.delay!r}")


@dataclass(frozen=True, slots=True)
class DeadLetterTarget:
    """Where a dead-lettered message goes (``broker_dead_letter_target``).

    :param exchange: the exchange to publish the dead letter to (``""``, the default exchange,
        with ``routing_key`` set to a queue name, sends it straight to that queue).
    :param routing_key: its routing key.
    :param headers: extra headers for the dead letter (e.g. ``REAL_TOPIC``); the core adds
        RabbitMQ's ``x-death`` record itself.
    :param declare_queue: a queue to declare (durable) first if it does not exist, for a
        dead-letter queue that is created on first use.
    """

    exchange: str
    routing_key: str
    headers: Mapping[str, Any] = field(default_factory=dict)
    declare_queue: str | None = None


__all__ = ["DeadLetterTarget", "RejectDecision", "RejectKind"]

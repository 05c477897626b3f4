"""Narrow the prefetch window of consumers of backlogged queues: docs/write-a-policy-plugin.md."""

from __future__ import annotations

from plugbroker.hookimpl import hookimpl
from plugbroker.policy import (
    Action,
    Breach,
    PolicyLookup,
    PolicyState,
    SetPrefetch,
    Snapshot,
    Trigger,
)
from plugbroker.registry import Registrar

THRESHOLD = 100  # messages a queue may hold before its consumers' windows shrink
PREFETCH = 10  # the window they shrink to


def reduce_prefetch(trigger: Trigger) -> list[Action]:
    """Named policy: a SetPrefetch for each consumer of the queue whose window is wider."""
    return [
        SetPrefetch(
            **trigger.action_fields(),
            consumer_tag=c.tag,
            connection_id=c.connection_id,
            prefetch=PREFETCH,
        )
        for c in trigger.queue.consumers
        if not c.no_ack and (c.prefetch == 0 or c.prefetch > PREFETCH)
    ]  # prefetch 0 means "unlimited" in AMQP, so it is wider than any window


def evaluate(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]:
    """Policy job: the same policy for every queue over THRESHOLD, no XML needed."""
    actions: list[Action] = []
    for q in snapshot.queues:
        if q.message_count > THRESHOLD:
            breach = Breach("messageCount", THRESHOLD, q.message_count)
            trigger = Trigger(q, (breach,), {}, snapshot.taken_at, "ReducePrefetch")
            actions += reduce_prefetch(trigger)
    return actions  # the core applies them on its loop, re-checking each


@hookimpl
def broker_register(registry: Registrar) -> None:
    registry.register_policy("ReducePrefetch", reduce_prefetch)
    # section=None: every queue; no period: every <housekeeping><period>
    registry.register_policy_job("reduce-prefetch", evaluate, section=None)

"""Narrow the prefetch window of consumers of backlogged queues: docs/write-a-policy-plugin.md."""

from __future__ import annotations

from broker.hookimpl import hookimpl
from broker.housekeeping import JobContext
from broker.policy import Action, Breach, SetPrefetch, Trigger
from broker.registry import Registrar

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


def check(ctx: JobContext) -> None:
    """Housekeeping job: the same policy for every queue over THRESHOLD, no XML needed."""
    snap = ctx.snapshot()  # taken on the broker's loop, read-only
    actions: list[Action] = []
    for q in snap.queues:
        if q.message_count > THRESHOLD:
            breach = Breach("messageCount", THRESHOLD, q.message_count)
            actions += reduce_prefetch(Trigger(q, (breach,), {}, snap.taken_at, "ReducePrefetch"))
    ctx.apply(actions)  # applied on the loop, each action re-checked there


@hookimpl
def broker_register(registry: Registrar) -> None:
    registry.register_policy("ReducePrefetch", reduce_prefetch)
    registry.register_job("reduce-prefetch", check)  # every <housekeeping><period>

"""Lower the prefetch of consumers of backlogged queues: the example of docs/write-a-policy-plugin.md."""

from __future__ import annotations

from typing import Any

from broker.hookimpl import hookimpl
from broker.housekeeping import JobContext
from broker.policy import Action, SetPrefetch, Snapshot
from broker.registry import Registrar

THRESHOLD = 100  # messages a queue may hold before its consumers' windows shrink
PREFETCH = 10  # the window they shrink to


def reduce_prefetch(snapshot: Snapshot, state: dict[str, Any], now: float) -> list[Action]:
    """Pure policy: a SetPrefetch for each consumer of an over-full queue whose window is wider."""
    return [
        SetPrefetch(
            vhost=q.vhost, queue=q.name, policy="ReducePrefetch",
            reason=f"{q.message_count} messages held", threshold="messageCount",
            configured=THRESHOLD, measured=q.message_count,
            consumer_tag=c.tag, connection_id=c.connection_id, prefetch=PREFETCH,
        )
        for q in snapshot.queues if q.message_count > THRESHOLD
        for c in q.consumers if not c.no_ack and (c.prefetch == 0 or c.prefetch > PREFETCH)
    ]  # prefetch 0 means "unlimited" in AMQP, so it is wider than any window


def check(ctx: JobContext) -> None:
    """Housekeeping job: snapshot on the loop, decide here, apply on the loop."""
    ctx.apply(reduce_prefetch(ctx.snapshot(), ctx.state, ctx.clock.monotonic()))


@hookimpl
def broker_register(registry: Registrar) -> None:
    registry.register_policy("ReducePrefetch", reduce_prefetch)
    registry.register_job("reduce-prefetch", check)  # every <housekeeping><period>

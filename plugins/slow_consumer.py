"""Slow-consumer policy (the Qpid Java broker design): a queue whose backlog passes a threshold
has its consumers' channels closed with 506 ``Consuming too slow.`` and is deleted.

Detection is a housekeeping job over a snapshot, so each check costs O(queues + consumers):

* depth: bytes of every message body the queue holds (ready and delivered-unacked);
* messageCount: how many messages it holds;
* messageAge: age of its oldest message (an empty queue has age 0);
* consumptionRate: acks per second since the previous check, judged only while the queue has a
  backlog: messages ready *or delivered and not yet acked* (a consumer whose prefetch holds the
  whole backlog and acks slowly is slow; a queue with nothing held is never "slow").

Any configured threshold that is exceeded triggers the ``<policy name>`` of the ``<consumer>``
element: ``Delete`` (close channels with 506, then delete the queue; a durable queue only with
option ``delete-persistent=true``), ``Log`` (a dry run), or any policy another plugin registered.
A named policy is a callable ``policy(trigger) -> list[Action]`` (see
:class:`broker.policy.Trigger`).

The check is a policy job (:class:`broker.policy.Policy`) over the queues with a ``<consumer>``
section: the housekeeping pool runs :func:`evaluate` in the broker, and the backtest replays the
same function over the event journal.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from broker.config import ConfigElementRegistry
from broker.errors import RESOURCE_ERROR, SLOW_CONSUMER_TEXT
from broker.hookimpl import hookimpl
from broker.policy import (
    Action,
    Breach,
    CloseConsumerChannels,
    DeleteQueue,
    LogOnly,
    PolicyLookup,
    PolicyState,
    QueueView,
    Snapshot,
    Spared,
    Trigger,
)
from broker.registry import Registrar
from plugins import slow_consumer_config

log = logging.getLogger("plugins.slow_consumer")

JOB_NAME = "slow-consumer"
#: the section element whose queues the check looks at
SECTION = slow_consumer_config.SECTION


def backlog(queue: QueueView) -> int:
    """What the consumption-rate floor is judged against: messages ready plus unacked."""
    return queue.ready_count + queue.unacked_count


def measure(
    cfg: Any, queue: QueueView, now: float, previous: tuple[int, float] | None
) -> tuple[Breach, ...]:
    """The thresholds of ``cfg`` (a ``<consumer>`` section) that ``queue`` exceeds.

    :param previous: ``(acks_total, taken_at)`` from the previous check of this queue, for the
        consumption rate; None on the first check (rate not judged yet).
    """
    out: list[Breach] = []
    if cfg.depth is not None and queue.message_bytes > cfg.depth:
        out.append(Breach("depth", cfg.depth, queue.message_bytes))
    if cfg.message_count is not None and queue.message_count > cfg.message_count:
        out.append(Breach("messageCount", cfg.message_count, queue.message_count))
    if cfg.message_age is not None:
        age = queue.age(now)
        if age > cfg.message_age:
            out.append(Breach("messageAge", cfg.message_age, round(age, 3)))
    if cfg.consumption_rate is not None and previous is not None and backlog(queue) > 0:
        acks, then = previous
        elapsed = now - then
        if elapsed > 0 and queue.acks_total >= acks:
            rate = (queue.acks_total - acks) / elapsed
            if rate < cfg.consumption_rate:
                out.append(Breach("consumptionRate", cfg.consumption_rate, round(rate, 3)))
    return tuple(out)


def evaluate(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]:
    """Check every queue a ``<consumer>`` element applies to; return the policies' actions.

    The policy job: for each queue over a threshold, the named policy of its ``<policy name>``
    (looked up with ``policies``) is called with a :class:`Trigger`.

    ``state["rates"]`` keeps each queue's ``(acks_total, taken_at)`` from the previous check
    (for the consumption rate); it is rebuilt each time, so queues that are gone drop out and
    it stays O(queues). A healthy queue costs a handful of comparisons: :func:`measure`, which
    builds the :class:`Breach` records, runs only for a queue that is over a threshold.
    """
    now = snapshot.taken_at
    actions: list[Action] = []
    previous: dict[tuple[str, str], tuple[int, float]] = state.get("rates", {})
    rates: dict[tuple[str, str], tuple[int, float]] = {}
    for q in snapshot.queues:
        pol = q.policy
        cfg = pol.get(SECTION) if pol else None
        if cfg is None:
            continue
        key = (q.vhost, q.name)
        acks = q.acks_total
        rates[key] = (acks, now)
        prev = previous.get(key)
        depth = cfg.depth
        count = cfg.message_count
        max_age = cfg.message_age
        floor = cfg.consumption_rate
        oldest = q.oldest_arrival
        over = (
            (depth is not None and q.message_bytes > depth)
            or (count is not None and q.message_count > count)
            or (max_age is not None and oldest is not None and now - oldest > max_age)
        )
        if (
            not over
            and floor is not None
            and prev is not None
            and (q.ready_count or q.unacked_count)
        ):
            elapsed = now - prev[1]
            over = elapsed > 0 and acks >= prev[0] and (acks - prev[0]) / elapsed < floor
        if not over:
            continue
        breaches = measure(cfg, q, now, prev)
        ref = cfg.policy
        trigger = Trigger(
            queue=q, breaches=breaches, options=dict(ref.options), now=now, policy=ref.name
        )
        actions.extend(policies(ref.name)(trigger))
    state["rates"] = rates
    return actions


# --------------------------------------------------------------------------- built-in policies


def delete_policy(trigger: Trigger) -> list[Action]:
    """Close every consuming (or polling) channel with 506, then delete the queue.

    A durable queue (a durable subscription) is spared unless ``delete-persistent`` is true:
    disconnecting its consumer would leave it bound and filling, which is worse.
    """
    q = trigger.queue
    fields = trigger.action_fields()
    if q.durable and not _flag(trigger.options, "delete-persistent"):
        fields["reason"] = (
            f"{trigger.reason}; durable queue kept, option delete-persistent is not true"
        )
        return [Spared(**fields)]
    return [
        CloseConsumerChannels(**fields, code=RESOURCE_ERROR, text=SLOW_CONSUMER_TEXT),
        DeleteQueue(**fields),
    ]


def log_policy(trigger: Trigger) -> list[Action]:
    """Detect and record only: a dry run before enabling Delete."""
    return [LogOnly(**trigger.action_fields())]


def _flag(options: Mapping[str, str], name: str) -> bool:
    return (options.get(name) or "").strip().lower() in ("true", "1", "yes", "on")


@hookimpl(trylast=True)
def broker_register(registry: Registrar) -> None:
    registry.register_policy(slow_consumer_config.DELETE, delete_policy)
    registry.register_policy(slow_consumer_config.LOG, log_policy)
    registry.register_policy_job(JOB_NAME, evaluate, section=SECTION)


@hookimpl(trylast=True)
def broker_add_config_elements(registry: ConfigElementRegistry) -> None:
    """``<consumer>`` is this plugin's section (parsed in :mod:`plugins.slow_consumer_config`)."""
    slow_consumer_config.add_config_elements(registry)

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
option ``delete-persistent=true``), ``Log`` (a dry run), ``Graduated`` (one step further per
check: log, lower the prefetch, cancel, 506, delete; one step back per healthy check), or any
policy another plugin registered.
A named policy is a callable ``policy(trigger) -> list[Action]`` (see
:class:`plugbroker.policy.Trigger`).

The check is a policy job (:class:`plugbroker.policy.Policy`) over the queues with a ``<consumer>``
section: the housekeeping pool runs :func:`evaluate` in the broker, and the backtest replays the
same function over the event journal.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from plugbroker.config import ConfigElementRegistry
from plugbroker.errors import RESOURCE_ERROR, SLOW_CONSUMER_TEXT
from plugbroker.hookimpl import hookimpl
from plugbroker.plugins import slow_consumer_config
from plugbroker.policy import (
    DEFERRED,
    Action,
    Breach,
    CancelConsumer,
    CloseConsumerChannels,
    DeleteQueue,
    LogOnly,
    PolicyLookup,
    PolicyState,
    QueueView,
    SetPrefetch,
    Snapshot,
    Spared,
    Trigger,
)
from plugbroker.registry import Registrar

log = logging.getLogger("plugbroker.plugins.slow_consumer")

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

    ``state["named"]`` keeps each named policy's own state (:attr:`Trigger.state`, what
    ``Graduated`` escalates in); entries of queues that left the snapshot drop out. When the
    blast-radius budget deferred an action a named policy asked for (``state[DEFERRED]``, see
    :data:`plugbroker.policy.DEFERRED`), that policy's entry for the queue is put back as it was
    before that check (``state["undo"]``), so a step that did not happen is asked for again
    rather than passed over.
    """
    now = snapshot.taken_at
    actions: list[Action] = []
    previous: dict[tuple[str, str], tuple[int, float]] = state.get("rates", {})
    rates: dict[tuple[str, str], tuple[int, float]] = {}
    #: each named policy's own state (Trigger.state), by policy name
    named: dict[str, PolicyState] = state.setdefault("named", {})
    #: (policy, vhost, queue) -> the policy's entry for the queue before the last check called it
    undo: dict[tuple[str, str, str], Any] = state.pop("undo", {})
    for a in state.pop(DEFERRED, ()):
        # the budget held back what the policy asked for: its step did not happen, take it back
        k = (a.policy, a.vhost, a.queue)
        if k in undo:
            entries = named.get(a.policy, {}).setdefault("queues", {})
            if undo[k] is None:
                entries.pop((a.vhost, a.queue), None)
            else:
                entries[(a.vhost, a.queue)] = undo.pop(k)
    undo = {}
    #: policies that keep entries for some queues: only those hear of a healthy queue
    keeping = {name for name, ps in named.items() if ps.get("queues")}
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
            if keeping and cfg.policy.name in keeping:
                kept = named[cfg.policy.name]
                if key in kept["queues"]:
                    healthy = getattr(policies(cfg.policy.name), "healthy", None)
                    if healthy is not None:
                        actions.extend(healthy(q, kept))
            continue
        breaches = measure(cfg, q, now, prev)
        ref = cfg.policy
        ps = named.get(ref.name)
        if ps is None:
            ps = {}
            named[ref.name] = ps
        entries = ps.get("queues")
        before = entries.get(key) if entries else None
        trigger = Trigger(
            queue=q,
            breaches=breaches,
            options=dict(ref.options),
            now=now,
            policy=ref.name,
            state=ps,
        )
        actions.extend(policies(ref.name)(trigger))
        if ps:  # a stateful policy: what to put back if the budget defers its step
            undo[(ref.name, q.vhost, q.name)] = (
                before if before is None or isinstance(before, int) else copy.deepcopy(before)
            )
    state["rates"] = rates
    if undo:
        state["undo"] = undo
    for ps in named.values():  # entries of queues that are gone (or out of scope) drop out
        for part in ("queues", "waits"):
            entries = ps.get(part)
            if entries:
                for k in [k for k in entries if k not in rates]:
                    del entries[k]
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


#: the steps of the Graduated policy, in order; a queue's level is how many it has taken
STEPS: tuple[str, ...] = slow_consumer_config.GRADUATED_STEPS
#: checks the close step waits for a consumer to come back before the queue is deleted
DEFAULT_CLOSE_WAIT = 3


class GraduatedPolicy:
    """Escalate one step per check that finds the queue still over a threshold; step back one
    per check that finds it healthy.

    The steps (:data:`STEPS`): ``log`` (a :class:`LogOnly`), ``prefetch`` (each manual-ack
    consumer's prefetch divided by option ``prefetch-divisor``, default 2, floor 1; an
    unlimited prefetch counts as what the consumer holds), ``cancel`` (a broker-sent
    basic.cancel to each consumer), ``close`` (every consuming or polling channel closed with
    506 ``Consuming too slow.``), ``delete`` (the queue deleted). A step with nothing to act on
    (every prefetch at 1 already, no consumer to cancel) is passed over in the same check,
    except ``close``: with nobody to close (the cancel step left the queue without consumers)
    it waits, one check at a time, for a consumer to come back (then 506, and ``delete`` at a
    later check), or for option ``close-wait`` checks (default 3), then deletes. Option
    ``max-step`` caps the escalation (default ``delete``); at its cap the policy repeats the
    cap's step. A durable queue without ``delete-persistent=true`` goes no further than
    ``prefetch`` (it is not disconnected, as with ``Delete``): beyond, each check gives
    :class:`Spared`.

    The level lives in ``trigger.state["queues"][(vhost, queue)]`` (the slow-consumer job's
    state), so the escalation is a pure function of the snapshots and that state: the backtest
    replays it. Stepping back does not raise a prefetch it lowered (no further reduction is
    asked for until the level climbs back to ``prefetch``).
    """

    def __call__(self, trigger: Trigger) -> list[Action]:
        q = trigger.queue
        opts = trigger.options
        key = (q.vhost, q.name)
        levels: dict[tuple[str, str], int] = trigger.state.setdefault("queues", {})
        level = levels.get(key, 0)
        top = STEPS.index(opts.get("max-step") or STEPS[-1]) + 1
        kept = q.durable and not _flag(opts, "delete-persistent")
        if kept:
            top = min(top, STEPS.index("prefetch") + 1)
        divisor = int(opts.get("prefetch-divisor") or 2)
        close_wait = int(opts.get("close-wait") or DEFAULT_CLOSE_WAIT)
        waits: dict[tuple[str, str], int] = trigger.state.setdefault("waits", {})
        fields = trigger.action_fields()
        step = min(level + 1, top)
        while True:
            name = STEPS[step - 1]
            fields["reason"] = f"{trigger.reason}; Graduated step {step} ({name})"
            actions = _graduated_step(name, q, fields, divisor)
            if not actions and name == "close" and step < top:
                # nobody to close (the cancel step left the queue without consumers): wait for
                # one to come back (then 506), or for close-wait checks, then delete
                n = waits.get(key, 0) + 1
                if n < close_wait:
                    waits[key] = n
                    levels[key] = step - 1  # the next check tries the close step again
                    fields["reason"] = (
                        f"{trigger.reason}; Graduated step {step} (close) waits for a consumer "
                        f"to come back ({n} of {close_wait} checks), then the queue is deleted"
                    )
                    return [LogOnly(**fields)]
                waits.pop(key, None)
                step += 1
                fields["reason"] = (
                    f"{trigger.reason}; Graduated step {step} (delete): no consumer came back "
                    f"in {close_wait} checks after the cancel step"
                )
                actions = _graduated_step("delete", q, fields, divisor)
                break
            if actions or step >= top:
                break
            step += 1
        if name != "close":
            waits.pop(key, None)
        levels[key] = step
        if actions:
            return actions
        if kept:
            fields["reason"] = (
                f"{trigger.reason}; durable queue kept at Graduated step {step} ({name}), "
                "option delete-persistent is not true"
            )
            return [Spared(**fields)]
        fields["reason"] = (
            f"{trigger.reason}; Graduated at its last step {step} ({name}), nothing to act on"
        )
        return [LogOnly(**fields)]

    def healthy(self, queue: QueueView, state: PolicyState) -> list[Action]:
        """One step back for a queue that is under every threshold again."""
        levels: dict[tuple[str, str], int] = state.get("queues", {})
        key = (queue.vhost, queue.name)
        state.get("waits", {}).pop(key, None)
        level = levels.get(key, 0)
        if level <= 1:
            levels.pop(key, None)
        else:
            levels[key] = level - 1
        log.info(
            "Graduated: vhost '%s' queue '%s' healthy, back to step %d",
            queue.vhost,
            queue.name,
            max(level - 1, 0),
        )
        return []


def _graduated_step(name: str, q: QueueView, fields: dict[str, Any], divisor: int) -> list[Action]:
    if name == "log":
        return [LogOnly(**fields)]
    if name == "prefetch":
        out: list[Action] = []
        for c in q.consumers:
            if c.no_ack:
                continue  # a prefetch window does not bound a no-ack consumer
            current = c.prefetch or c.unacked
            lowered = max(1, current // divisor)
            if c.prefetch == 0 or lowered < c.prefetch:
                out.append(
                    SetPrefetch(
                        **fields,
                        consumer_tag=c.tag,
                        connection_id=c.connection_id,
                        prefetch=lowered,
                    )
                )
        return out
    if name == "cancel":
        return [
            CancelConsumer(**fields, consumer_tag=c.tag, connection_id=c.connection_id)
            for c in q.consumers
        ]
    if name == "close":
        if not q.consumers and not q.getters:
            return []
        return [CloseConsumerChannels(**fields, code=RESOURCE_ERROR, text=SLOW_CONSUMER_TEXT)]
    return [DeleteQueue(**fields)]


graduated_policy = GraduatedPolicy()


def _flag(options: Mapping[str, str], name: str) -> bool:
    return (options.get(name) or "").strip().lower() in ("true", "1", "yes", "on")


@hookimpl(trylast=True)
def broker_register(registry: Registrar) -> None:
    registry.register_policy(slow_consumer_config.DELETE, delete_policy)
    registry.register_policy(slow_consumer_config.LOG, log_policy)
    registry.register_policy(slow_consumer_config.GRADUATED, graduated_policy)
    registry.register_policy_job(JOB_NAME, evaluate, section=SECTION)


@hookimpl(trylast=True)
def broker_add_config_elements(registry: ConfigElementRegistry) -> None:
    """``<consumer>`` is this plugin's section (parsed in :mod:`plugbroker.plugins.slow_consumer_config`)."""
    slow_consumer_config.add_config_elements(registry)

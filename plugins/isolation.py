"""Ack-timeout isolation of abnormal consumers on shared queues (the TDMQ for Pulsar design).

A consumer whose processing is stuck (a blocked disk, a hung call) keeps its connection, so the
broker keeps feeding it and its messages sit unacknowledged. This plugin finds such consumers
from running figures the core keeps for every consumer (its ack clock and how many messages it
holds unacked) and asks the core to isolate them:

1. the ack clock (:attr:`~plugbroker.policy.ConsumerView.busy_since`) starts when the consumer goes
   from nothing unacked to something unacked and restarts at each ack, nack or reject; a
   consumer whose clock is older than ``ackTimeout`` (it has held an unacked message that long
   without settling anything) is put on the queue's blocklist and all its unacked messages are
   requeued, redelivered, to the other consumers. A consumer back from an idle spell starts a
   fresh clock with its next delivery, so it is never overdue for the time it had nothing;
2. a blocklisted consumer gets no more deliveries;
3. it leaves the blocklist when it acks, nacks or rejects anything, or disconnects (the core
   does that at once, it is not a policy decision);
4. at most ``floor(maxIsolatedRatio x consumers)`` consumers of a queue are isolated at once
   (0.6 by default), so a fault that blocks everyone cannot starve the queue completely;
5. a task longer than the timeout must not run for ever: every time a consumer's clock runs
   out, the delivery it works on counts one more timed-out hand-out, whether the consumer is
   isolated or spared by the cap (a spared consumer counts again each further ``ackTimeout``:
   :class:`~plugbroker.policy.CountTimeout`). At ``poisonDeliveries`` timed-out hand-outs the
   core dead-letters the message with reason ``poison`` and releases the consumers isolated
   while working on it; the count is the message's, not a set of distinct consumers, so this
   holds with one, two or any number of consumers.

Isolation applies to ``shared`` queues only: never to ``key_shared`` (its key order would
break), ``exclusive`` or ``failover`` (there is no other consumer to hand the messages to).
The check runs every ``checkPeriod`` (the shortest configured), so a consumer is isolated no
later than ``ackTimeout + checkPeriod`` after its clock started; it costs
O(queues + consumers).

The check is a policy job (:class:`plugbroker.policy.Policy`) over the queues with an
``<isolation>`` section: the housekeeping pool runs :func:`evaluate` in the broker, and the
backtest replays the same function over the event journal.
"""

from __future__ import annotations

from typing import Any

from plugbroker.config import ConfigElementRegistry
from plugbroker.hookimpl import hookimpl
from plugbroker.plugins import isolation_config
from plugbroker.policy import (
    Action,
    ConsumerView,
    CountTimeout,
    IsolateConsumer,
    PolicyLookup,
    PolicyState,
    QueueView,
    Snapshot,
    Spared,
)
from plugbroker.registry import Registrar
from plugbroker.subscription import SHARED

JOB_NAME = "isolation"
POLICY = "Isolation"
#: the section element whose queues the check looks at
SECTION = isolation_config.SECTION


def stuck_since(consumer: ConsumerView) -> float | None:
    """When the consumer's ack clock started (``None``: it holds nothing unacked).

    The clock starts when the consumer goes from nothing unacked to something unacked and
    restarts at each ack, nack, reject or touch (``amq.touch``); the core keeps it as
    ``busy_since``. It lies in the future while the consumer holds only deliveries whose ETA
    header says they are not due yet (``<etaHeaders>``): such a consumer is never overdue.
    """
    return consumer.busy_since if consumer.unacked > 0 else None


def evaluate_queue(q: QueueView, cfg: Any, now: float) -> list[Action]:
    """The isolations one shared queue needs now, within its cap, and the timeouts to count
    for the overdue consumers the cap spares."""
    consumers = q.consumers
    timeout = cfg.ack_timeout
    overdue = []
    for c in consumers:
        if c.isolated or c.pardoned or c.unacked <= 0:
            continue  # a pardoned one is busy with a message already dead-lettered as poison
        since = stuck_since(c)
        if since is None or now - since <= timeout:
            continue
        overdue.append((since, c))
    if not overdue:
        return []
    overdue.sort(key=lambda pair: pair[0])  # the longest silent first
    cap = cfg.max_isolated(len(consumers))
    room = max(cap - sum(1 for c in consumers if c.isolated), 0)
    actions: list[Action] = []
    for since, c in overdue[:room]:
        reason = f"no ack for {now - since:.3f} s with {c.unacked} unacked"
        actions.append(IsolateConsumer(**_fields(q, since, now, timeout, reason), **_who(c)))
    for since, c in overdue[room:]:
        reason = (
            f"consumer {c.tag} (connection {c.connection_id}) is over its ack timeout "
            f"but the cap held: {cap} of {len(consumers)} consumers may be isolated "
            f"(maxIsolatedRatio {cfg.max_isolated_ratio:g})"
        )
        actions.append(Spared(**_fields(q, since, now, timeout, reason)))
        counted = c.timed_out_at
        if counted is None or now - counted >= timeout:
            # the delivery it works on timed out (again): it counts, spared or not
            reason = (
                f"no ack for {now - since:.3f} s; the cap spares the consumer, its "
                "delivery counts a timed-out hand-out"
            )
            actions.append(CountTimeout(**_fields(q, since, now, timeout, reason), **_who(c)))
    return actions


def _fields(q: QueueView, since: float, now: float, timeout: float, reason: str) -> dict[str, Any]:
    """The fields every isolation action of queue ``q`` has: who asks, why, and the clock."""
    return dict(
        vhost=q.vhost,
        queue=q.name,
        policy=POLICY,
        reason=reason,
        threshold="ackTimeout",
        configured=timeout,
        measured=round(now - since, 3),
    )


def _who(c: ConsumerView) -> dict[str, Any]:
    return {"consumer_tag": c.tag, "connection_id": c.connection_id}


def evaluate(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]:
    """All isolations the snapshot calls for. Pure: the same function runs in the backtest.

    A consumer the cap holds back is reported (:class:`Spared`) at every check it is held
    back: the core tells such a run of repeats once when it starts and once when it ends. The
    job keeps no state, and isolation names no policy, so ``state`` and ``policies`` are not
    used.
    """
    now = snapshot.taken_at
    actions: list[Action] = []
    for q in snapshot.queues:
        pol = q.policy
        cfg = pol.get(SECTION) if pol else None
        if cfg is None or q.subscription_type != SHARED:
            continue
        actions.extend(evaluate_queue(q, cfg, now))
    return actions


@hookimpl(trylast=True)
def broker_register(registry: Registrar) -> None:
    registry.register_policy_job(
        JOB_NAME, evaluate, section=SECTION, period_key="isolation.checkPeriod"
    )


@hookimpl(trylast=True)
def broker_add_config_elements(registry: ConfigElementRegistry) -> None:
    """``<isolation>`` is this plugin's section (parsed in :mod:`plugbroker.plugins.isolation_config`)."""
    isolation_config.add_config_elements(registry)

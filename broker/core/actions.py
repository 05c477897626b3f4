"""How policy actions are applied: one handler per action type, through the core API only.

A policy returns :class:`~plugbroker.policy.Action` values; the housekeeping pool hands them to
:func:`apply_actions` on the broker's loop. Each action type has one handler in
:data:`HANDLERS` (``{Action type: handler}``), which re-checks that the action still holds (the
queue and consumer are still there, the consumer did not ack since the snapshot) and returns
the outcome: ``applied``, ``logged``, ``spared``, ``stale`` (nothing left to act on), ``failed``
(the handler raised; logged), ``unknown`` (no handler for the type) or ``deferred`` (over the
vhost's blast-radius budget, see below). A subclass of an action type is applied by its base's
handler unless it has one of its own.

Before a handler runs, an action that counts (:func:`plugbroker.budget.counts`: not
:class:`~plugbroker.policy.LogOnly`, :class:`~plugbroker.policy.Spared` nor a release) is checked against
its vhost's ``<blastRadius>`` budget on the broker's clock: over it, the action is not applied,
a line is logged and the outcome is ``deferred``. An action that is applied is counted, with the
consumers it affected (the one it names, else every consumer of the queue).

Handlers see only :class:`~plugbroker.core.api.BrokerAPI`, so the same actions could be applied to
another broker by another applier with the same table shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from plugbroker.budget import ConsumerKey, counts
from plugbroker.core.api import BrokerAPI, ConsumerInfo
from plugbroker.policy import (
    Action,
    CancelConsumer,
    CloseConsumerChannels,
    CountTimeout,
    DeleteQueue,
    IsolateConsumer,
    LogOnly,
    ReleaseConsumer,
    SetPrefetch,
    Spared,
)
from plugbroker.streaks import Streaks

log = logging.getLogger("broker")
policy_log = logging.getLogger("plugbroker.policy")

#: ``handler(api, action, what) -> outcome``; ``what`` is the log prefix naming the policy,
#: the queue, the threshold and the consumers
ActionHandler = Callable[[BrokerAPI, Action, str], str]


def _log_only(api: BrokerAPI, a: Action, what: str) -> str:
    policy_log.info("%s: would act (%s) [log only]", what, a.reason)
    return "logged"


def _spared(api: BrokerAPI, a: Action, what: str) -> str:
    return "spared"  # logged by apply_actions (once per streak)


def _close_consumer_channels(api: BrokerAPI, a: Action, what: str) -> str:
    assert isinstance(a, CloseConsumerChannels)
    if not api.has_queue(a.vhost, a.queue):
        return "stale"
    tags = [c.tag for c in api.consumers(a.vhost, a.queue)]
    channels = api.queue_channels(a.vhost, a.queue)
    for conn_id, ch_id in channels:
        api.close_channel(conn_id, ch_id, a.code, a.text)
    policy_log.info(
        "%s: closed %d channel(s) with %d %r (consumers %s): %s",
        what,
        len(channels),
        a.code,
        a.text,
        ", ".join(tags) or "none",
        a.reason,
    )
    return "applied"


def _delete_queue(api: BrokerAPI, a: Action, what: str) -> str:
    q = api.queue(a.vhost, a.queue)
    if q is None:
        return "stale"
    n = q.messages
    api.delete_queue(a.vhost, a.queue, reason=f"policy:{a.policy}", detail=a.reason)
    policy_log.info("%s: queue deleted, %d messages released: %s", what, n, a.reason)
    return "applied"


def _overdue(api: BrokerAPI, a: Action) -> ConsumerInfo | None:
    """The consumer ``a`` names if it is still over its ack timeout (``a.configured``), on the
    same clock as the policy's; None if it settled something, or lost its deliveries, since."""
    tag = getattr(a, "consumer_tag", "")
    c = api.consumer(a.vhost, a.queue, tag, getattr(a, "connection_id", ""))
    if c is None:
        return None
    since = c.busy_since
    if (
        c.isolated
        or c.unacked <= 0
        or since is None
        or (a.configured is not None and api.clock.monotonic() - since <= a.configured)
    ):
        return None
    return c


def _isolate(api: BrokerAPI, a: Action, what: str) -> str:
    assert isinstance(a, IsolateConsumer)
    c = _overdue(api, a)
    if c is None:
        return "stale"
    since = c.busy_since or 0.0
    moved = api.isolate(a.vhost, a.queue, c.tag, c.connection_id, timeout=a.configured)
    after = api.consumer(a.vhost, a.queue, c.tag, c.connection_id)
    if after is not None and not after.isolated:
        policy_log.info(
            "%s: consumer %s (connection %s) not isolated: the message it works on timed out "
            "too often and was dead-lettered as poison",
            what,
            c.tag,
            c.connection_id,
        )
        return "applied"
    policy_log.info(
        "%s: consumer %s (connection %s) isolated: no ack for %.3f s, "
        "%d unacked moved to the other consumers",
        what,
        c.tag,
        c.connection_id,
        api.clock.monotonic() - since,
        moved or 0,
    )
    return "applied"


def _count_timeout(api: BrokerAPI, a: Action, what: str) -> str:
    assert isinstance(a, CountTimeout)
    c = _overdue(api, a)
    if c is None or a.configured is None:
        return "stale"
    counted = api.count_timeout(a.vhost, a.queue, c.tag, c.connection_id, timeout=a.configured)
    if counted is None:
        return "stale"
    mid, n, poison = counted
    policy_log.info(
        "%s: consumer %s (connection %s) is over its ack timeout and stays (the cap holds): "
        "message %d timed out %d time(s)%s",
        what,
        c.tag,
        c.connection_id,
        mid,
        n,
        ", dead-lettered as poison" if poison else "",
    )
    return "applied"


def _release(api: BrokerAPI, a: Action, what: str) -> str:
    assert isinstance(a, ReleaseConsumer)
    ok = api.release(a.vhost, a.queue, a.consumer_tag, a.connection_id, reason=a.reason)
    return "applied" if ok else "stale"


def _cancel(api: BrokerAPI, a: Action, what: str) -> str:
    assert isinstance(a, CancelConsumer)
    if not api.cancel_consumer(a.vhost, a.queue, a.consumer_tag, a.connection_id):
        return "stale"
    policy_log.info("%s: consumer %s cancelled: %s", what, a.consumer_tag, a.reason)
    return "applied"


def _set_prefetch(api: BrokerAPI, a: Action, what: str) -> str:
    assert isinstance(a, SetPrefetch)
    if not api.set_prefetch(a.vhost, a.queue, a.consumer_tag, a.connection_id, a.prefetch):
        return "stale"
    policy_log.info(
        "%s: consumer %s prefetch set to %d: %s", what, a.consumer_tag, a.prefetch, a.reason
    )
    return "applied"


#: how each action type is applied
HANDLERS: dict[type[Action], ActionHandler] = {
    LogOnly: _log_only,
    Spared: _spared,
    CloseConsumerChannels: _close_consumer_channels,
    DeleteQueue: _delete_queue,
    IsolateConsumer: _isolate,
    CountTimeout: _count_timeout,
    ReleaseConsumer: _release,
    CancelConsumer: _cancel,
    SetPrefetch: _set_prefetch,
}


def handler_for(action_type: type[Action]) -> ActionHandler | None:
    """The handler of ``action_type``, or of its nearest base that has one."""
    for cls in action_type.__mro__:
        h = HANDLERS.get(cls)
        if h is not None:
            return h
    return None


def describe(api: BrokerAPI, a: Action) -> str:
    """The log prefix of an action: policy, queue, the threshold that fired, the consumers."""
    what = f"{a.policy}: vhost '{a.vhost}' queue '{a.queue}'"
    if a.threshold and a.configured is not None and a.measured is not None:
        what += f" {a.threshold} configured {a.configured:g} measured {a.measured:g}"
    if api.has_queue(a.vhost, a.queue):
        what += f" consumers [{', '.join(c.tag for c in api.consumers(a.vhost, a.queue))}]"
    return what


def affected(api: BrokerAPI, a: Action) -> list[ConsumerKey]:
    """The consumers ``a`` would affect, as ``(connection_id, consumer_tag)``: the one it names,
    else every consumer of its queue."""
    tag = getattr(a, "consumer_tag", "")
    if tag:
        return [(getattr(a, "connection_id", ""), tag)]
    return [(c.connection_id, c.tag) for c in api.consumers(a.vhost, a.queue)]


def _protected(api: BrokerAPI, a: Action) -> str | None:
    """Why ``a`` must not be applied to its queue: a queue known as a dead-letter or retry
    target is never deleted by a policy (its messages are the ones nothing else kept)."""
    if isinstance(a, DeleteQueue):
        q = api.queue(a.vhost, a.queue)
        if q is not None and q.dead_letter_target:
            return f"the queue is a dead-letter or retry target: not deleted ({a.reason})"
    return None


def _streak_key(a: Action, outcome: str) -> tuple[str, ...]:
    return (
        outcome,
        a.policy,
        type(a).__name__,
        a.vhost,
        a.queue,
        getattr(a, "consumer_tag", ""),
        a.threshold,
    )


def apply_actions(
    api: BrokerAPI, actions: Sequence[Action], streaks: Streaks | None = None
) -> list[str]:
    """Apply ``actions`` in order on the loop; returns each one's outcome.

    Each outcome is counted (for metrics) and reported to ``broker_policy_action``; then what the
    actions made ready is dispatched and written out. An action over its vhost's blast-radius
    budget is ``deferred`` instead of applied; a :class:`~plugbroker.policy.DeleteQueue` of a
    dead-letter or retry target is ``spared``.

    With ``streaks`` (the job's, kept from one check to the next), a ``spared`` or ``deferred``
    decision that the job's previous check made too is neither logged nor reported again; when
    a check no longer makes it, one line and one report (outcome ``spared-ended`` or
    ``deferred-ended``) say how many checks in a row it lasted.
    """
    outcomes = []
    report = api.report_policy_action
    if streaks is not None:
        streaks.begin()
    for a in actions:
        handler = handler_for(type(a))
        protected = _protected(api, a)
        budget = api.budget(a.vhost) if counts(a) and protected is None else None
        why: str | None = None
        if protected is not None:
            outcome, why = "spared", protected
        elif budget is not None:
            now = api.clock.monotonic()
            hit = affected(api, a) if api.has_queue(a.vhost, a.queue) else []
            over = budget.check(now, hit)
            if over is not None:
                outcome = "deferred"
                why = (
                    f"{type(a).__name__} deferred by the blast-radius budget of vhost "
                    f"'{a.vhost}' ({over}): {a.reason}"
                )
        if why is None:
            if handler is None:
                log.error(
                    "no handler for policy action %s from policy %r", type(a).__name__, a.policy
                )
                outcome = "unknown"
            else:
                try:
                    outcome = handler(api, a, describe(api, a))
                except Exception:
                    log.exception("applying %r failed", a)
                    outcome = "failed"
            if outcome == "spared":
                why = f"spared: {a.reason}"
        if outcome in ("spared", "deferred"):
            outcomes.append(outcome)
            if streaks is not None and streaks.repeat(_streak_key(a, outcome), outcome, a):
                api.count_policy_action(a, outcome)  # said when the streak began
                continue
            policy_log.info("%s: %s", describe(api, a), why)
            report(a, outcome)
            continue
        if outcome == "stale":
            policy_log.debug(
                "%s: %s not applied (stale): %s", describe(api, a), type(a).__name__, a.reason
            )
        if budget is not None and outcome == "applied":
            budget.record(now, hit)
        outcomes.append(outcome)
        report(a, outcome)
    if streaks is not None:
        for s in streaks.end():
            a = s.action
            policy_log.info(
                "%s: no longer %s after %d check(s) in a row: %s",
                describe(api, a),
                s.outcome,
                s.count,
                a.reason,
            )
            report(
                replace(a, reason=f"{s.count} check(s) in a row: {a.reason}"),
                f"{s.outcome}-ended",
            )
    api.end_of_turn()
    return outcomes


__all__ = ["HANDLERS", "ActionHandler", "affected", "apply_actions", "describe", "handler_for"]

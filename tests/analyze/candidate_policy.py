"""A third-party policy plugin that the backtest tests name in a candidate's ``<plugins>``.

Nothing in the broker or the backtest knows this module: it is found the way any plugin is,
through the registry its ``broker_register`` fills.

* ``<backlogCap><messages>N</messages><prefetch>P</prefetch></backlogCap>`` (its own section
  element, under ``<virtualhost>``, ``<queue>`` or ``<topic>``): the policy job ``backlog-cap``
  narrows to ``P`` the prefetch window of every consumer of a queue that holds more than ``N``
  messages. Its state counts, per queue, the checks that found the queue over its cap; the
  reason of each action says which one it is, so a test sees that the state lives across checks.
* ``Throttle``: a named policy the built-in slow-consumer check can call from
  ``<consumer><policy name="Throttle"/>``; it asks for a prefetch of 1 on every consumer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugbroker.config import ConfigElementRegistry, ParseContext
from plugbroker.hookimpl import hookimpl
from plugbroker.policy import Action, PolicyLookup, PolicyState, SetPrefetch, Snapshot, Trigger
from plugbroker.registry import Registrar

SECTION = "backlogCap"
JOB = "backlog-cap"
POLICY = "BacklogCap"
PERIOD = 2.0  # seconds: the job's own period, whatever <housekeeping><period> says


@dataclass(frozen=True)
class BacklogCap:
    messages: int
    prefetch: int


def parse_backlog_cap(el: Any, ctx: ParseContext) -> BacklogCap:
    messages = ctx.integer(el, "messages", minimum=0)
    if messages is None:
        raise ctx.error(el, "<messages> is required")
    return BacklogCap(messages, ctx.integer(el, "prefetch", 1, minimum=1))


def evaluate(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]:
    """The policy job: a SetPrefetch for each wider consumer of each queue over its cap."""
    seen: dict[tuple[str, str], int] = state.setdefault("over", {})
    actions: list[Action] = []
    for q in snapshot.queues:
        cap: BacklogCap = q.policy[SECTION]
        if q.message_count <= cap.messages:
            continue
        key = (q.vhost, q.name)
        seen[key] = seen.get(key, 0) + 1
        actions.extend(
            SetPrefetch(
                vhost=q.vhost,
                queue=q.name,
                policy=POLICY,
                reason=f"over its cap at {seen[key]} check(s)",
                threshold="messages",
                configured=cap.messages,
                measured=q.message_count,
                consumer_tag=c.tag,
                connection_id=c.connection_id,
                prefetch=cap.prefetch,
            )
            for c in q.consumers
            if not c.no_ack and (c.prefetch == 0 or c.prefetch > cap.prefetch)
        )
    return actions


def throttle(trigger: Trigger) -> list[Action]:
    """Named policy: every consumer of the queue down to a prefetch of 1."""
    return [
        SetPrefetch(
            **trigger.action_fields(),
            consumer_tag=c.tag,
            connection_id=c.connection_id,
            prefetch=1,
        )
        for c in trigger.queue.consumers
        if c.prefetch != 1
    ]


@hookimpl
def broker_add_config_elements(registry: ConfigElementRegistry) -> None:
    registry.register(SECTION, parse_backlog_cap)


@hookimpl
def broker_register(registry: Registrar) -> None:
    registry.register_policy("Throttle", throttle)
    registry.register_policy_job(JOB, evaluate, section=SECTION, period=PERIOD)

"""Replaying a journal into the snapshots the live broker's policies see (the snapshot pattern).

:class:`Replayer` consumes journal events in order and keeps, per queue, the same running figures
the core keeps: the messages it holds (ready, unacked, awaiting the fate of a reject) with their
arrival times and sizes, acks since declaration, its consumers with their unacked counts, last
ack, first delivery and ack clock, its bindings (with exchange types) and so its resolved policy.
At each check time of the candidate configuration it builds a
:class:`plugbroker.policy.Snapshot` of those figures and calls the policy jobs the
candidate's plugins registered
(``registry.policy_jobs()``: the built-in slow-consumer and isolation checks and any plugin's,
found the same way), each at its own period, with its own state and the candidate's named
policies: the very functions the housekeeping pool runs in the broker, called the same way,
``policy(snapshot, state, policies)`` (:class:`plugbroker.policy.Policy`).

Time is the journal's wall clock in seconds; the policies only look at differences, so that
stands in for the broker's monotonic clock. The replay follows what really happened (the journal);
an action the candidate would have taken is recorded, and only its effect on the policy's own
view is simulated: a queue it would have deleted is out of later snapshots until it is declared
again, a consumer it would have isolated counts as isolated until it acks, rejects or leaves, a
consumer whose prefetch it would have set has that prefetch from then on.

The candidate's ``<blastRadius>`` budgets are applied as the core applies them
(:mod:`plugbroker.budget`, on the journal's clock): an action over its vhost's budget is recorded
with outcome ``deferred``, has no simulated effect, and is handed back to its job in
``state[DEFERRED]`` at the next check. One difference: the replay cannot tell that an action
would have found nothing to act on (``stale`` in the broker), so such an action counts here.

This module is plain Python (no Spark): :mod:`plugbroker.analyze.backtest` runs it in Spark tasks,
one per group of queues, and tests can run it directly.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugbroker.budget import Budgets, counts
from plugbroker.policy import (
    DEFERRED,
    Action,
    ConsumerView,
    CountTimeout,
    DeleteQueue,
    IsolateConsumer,
    LogOnly,
    Policy,
    PolicyLookup,
    QueueView,
    ReleaseConsumer,
    SetPrefetch,
    Snapshot,
    Spared,
)
from plugbroker.registry import resolve_period

if TYPE_CHECKING:
    from plugbroker.config import BrokerConfig
    from plugbroker.pluginhost import PluginHost

log = logging.getLogger("plugbroker.analyze.replay")

#: the columns a replayed event carries, in this order
COLUMNS = (
    "run",
    "seq",
    "ts",
    "event",
    "vhost",
    "queue",
    "exchange",
    "routing_key",
    "consumer_tag",
    "connection_id",
    "channel_id",
    "message_id",
    "body_size",
    "delivery_count",
    "no_ack",
    "requeue",
    "durable",
    "exclusive",
    "auto_delete",
    "count",
    "reason",
    "detail",
    "due",
)
(
    RUN,
    SEQ,
    TS,
    EVENT,
    VHOST,
    QUEUE,
    EXCHANGE,
    ROUTING_KEY,
    TAG,
    CONN,
    CHANNEL,
    MID,
    SIZE,
    DCOUNT,
    NO_ACK,
    REQUEUE,
    DURABLE,
    EXCLUSIVE,
    AUTO_DELETE,
    COUNT,
    REASON,
    DETAIL,
    DUE,
) = range(len(COLUMNS))

READY, UNACKED, PENDING = 0, 1, 2

#: outcome recorded for a backtest action, by action type
_OUTCOME = {LogOnly: "logged", Spared: "spared"}


# ---------------------------------------------------------------------------------- state


class ConsumerState:
    __slots__ = (
        "busy_since",
        "channel",
        "conn",
        "counted",
        "counted_at",
        "deferred",
        "first_delivery",
        "holding",
        "isolated",
        "isolated_for",
        "last_ack",
        "no_ack",
        "pardon",
        "prefetch",
        "tag",
        "unacked",
    )

    def __init__(
        self, tag: str, conn: str, channel: int, prefetch: int = 0, no_ack: bool = False
    ) -> None:
        self.tag = tag
        self.conn = conn
        self.channel = channel
        self.unacked = 0
        self.last_ack: float | None = None
        self.first_delivery: float | None = None
        #: the ack clock, rebuilt as the core keeps it (SPEC 6): set when unacked goes 0 -> 1,
        #: restarted at each ack, nack or reject, ``None`` while nothing is unacked
        self.busy_since: float | None = None
        #: deliveries it holds that were not due when delivered (ETA): message id -> due
        self.deferred: dict[int, float] = {}
        self.isolated = False  # simulated: isolated by the candidate's policy
        self.prefetch = prefetch
        self.no_ack = no_ack
        #: the message ids it holds unacked, in delivery order (its working delivery first)
        self.holding: dict[int, None] = {}
        #: bounded tries, simulated as the core keeps them (:mod:`plugbroker.domain.fate`): the
        #: delivery whose hand-out last counted a timeout and when, the one it was isolated
        #: for, the poison message it may still be busy with
        self.counted = 0
        self.counted_at: float | None = None
        self.isolated_for = 0
        self.pardon = 0

    def view(self) -> ConsumerView:
        return ConsumerView(
            self.tag,
            self.conn,
            self.channel,
            max(self.unacked, 0),
            self.last_ack,
            self.first_delivery,
            self.isolated,
            self.prefetch,
            self.no_ack,
            self.busy_since if self.unacked > 0 else None,
            self.counted_at if self.counted else None,
            self.pardon != 0,
        )


class QueueState:
    """One queue's running figures, as the core keeps them."""

    __slots__ = (
        "acks_total",
        "auto_delete",
        "bindings",
        "bytes",
        "consumers",
        "durable",
        "exclusive",
        "getters",
        "held",
        "name",
        "not_due",
        "pending",
        "policy",
        "ready",
        "subscription_type",
        "suppressed",
        "timeouts",
        "vhost",
    )

    def __init__(
        self,
        vhost: str,
        name: str,
        durable: bool = False,
        auto_delete: bool = False,
        exclusive: bool = False,
        subscription_type: str | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.exclusive = exclusive
        self.subscription_type = subscription_type or "shared"
        #: message id -> [arrival, size, state, holder key]; insertion order is arrival order
        self.held: dict[int, list[Any]] = {}
        #: held messages delivered before they were due: id -> due (the age counts from then)
        self.not_due: dict[int, float] = {}
        self.bytes = 0
        self.ready = 0
        self.pending = 0
        self.acks_total = 0
        self.consumers: dict[tuple[str, str], ConsumerState] = {}
        #: (exchange, key) -> exchange type
        self.bindings: dict[tuple[str, str], str] = {}
        self.getters: dict[tuple[str, int], None] = {}
        self.policy: Any = None  # resolved lazily, dropped when bindings change
        self.suppressed = False  # deleted by the candidate's policy (simulated)
        #: timed-out hand-outs of the messages that had one, under the candidate's isolation
        #: (simulated): message id -> count
        self.timeouts: dict[int, int] = {}

    def _oldest_counting(self) -> float | None:
        """As the core's ``Queue.oldest_counting``: a message not due yet counts from its due
        time, at most 64 such messages skipped at the head."""
        best: float | None = None
        for i, (mid, m) in enumerate(self.held.items()):
            due = self.not_due.get(mid)
            a = m[0] if due is None or due < m[0] else due
            if best is None or a < best:
                best = a
            if due is None or i >= 64:
                break
        return best

    def view(self, now: float, policy: Any) -> QueueView:
        held = self.held
        n = len(held)
        oldest = next(iter(held.values()))[0] if n else None
        if oldest is not None and self.not_due:
            oldest = self._oldest_counting()
        sub = getattr(policy, "subscription", None) or self.subscription_type
        return QueueView(
            self.vhost,
            self.name,
            self.durable,
            self.auto_delete,
            self.exclusive,
            sub,
            n,
            self.bytes,
            self.ready,
            max(n - self.ready - self.pending, 0),
            oldest,
            self.acks_total,
            tuple(c.view() for c in self.consumers.values()),
            tuple((ex, etype, key) for (ex, key), etype in self.bindings.items()),
            policy,
            tuple(self.getters),
        )


# ---------------------------------------------------------------------------------- policies


@dataclass
class PolicyCheck:
    """One policy job to replay: its name, the section its snapshot asks for (``None``: every
    queue), its period, the job itself and the named policies it may look up; ``state`` is the
    job's own, kept from check to check as the housekeeping pool keeps it."""

    name: str
    section: str | None
    period: float
    policy: Policy
    policies: PolicyLookup
    state: dict[str, Any] = field(default_factory=dict)
    next_due: float = 0.0
    checks: int = 0


def load_candidate(
    text: str, source_name: str = "candidate.xml"
) -> tuple[BrokerConfig, PluginHost]:
    """``(config, plugins)`` for a candidate configuration given as XML text.

    Loads the built-in plugins and any the candidate names (``<plugins>``), so its policies,
    policy jobs and plugin elements are known, then parses and validates the file exactly as the
    broker would.
    """
    from plugbroker.config import parse_config
    from plugbroker.runner import load_plugins

    fd, tmp = tempfile.mkstemp(suffix=".xml", prefix="plugbroker-candidate-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        plugins, registry = load_plugins(Path(tmp), origin=source_name)
    finally:
        os.unlink(tmp)
    config = parse_config(text, source_name, registry=registry)
    if plugins.configure is not None:
        plugins.configure(config=config)
    plugins.verify_policies(config)
    return config, plugins


def policy_checks(
    config: BrokerConfig, plugins: PluginHost, every: float | None = None
) -> list[PolicyCheck]:
    """The policy jobs the candidate's plugins registered, ready to replay, in registration order.

    Built-in and third-party jobs alike: whatever ``plugins.registry.policy_jobs()`` lists. Each
    runs at the period the broker's housekeeping would give it (its own, the configured duration
    its ``period_key`` names, else ``<housekeeping><period>``), unless ``every`` (seconds)
    overrides them all.
    """
    from plugbroker.runner import period_for

    registry = plugins.registry
    default = float(config.housekeeping_period)

    def configured(key: str) -> float | None:
        return period_for(config, key)

    return [
        PolicyCheck(
            name=job.name,
            section=job.section,
            period=every or resolve_period(job, default, configured),
            policy=job.policy,
            policies=registry.policy,
        )
        for job in registry.policy_jobs()
    ]


# ---------------------------------------------------------------------------------- replay


class Replayer:
    """Feed events in journal order (:meth:`feed`), then :meth:`finish`; read :attr:`actions`.

    :param runs: ``(run, start, end)`` of every broker run in the journal, in time order; checks
        happen only while a run is going, and every queue is forgotten when a run ends (the next
        run's journal opens with the queues, bindings and messages that survived).
    :param start: the journal's first event time; check ``k`` of a job happens at
        ``start + k * period`` (``k >= 1``), as the housekeeping pool first runs one period after
        it starts.
    """

    def __init__(
        self,
        config: BrokerConfig,
        checks: Sequence[PolicyCheck],
        runs: Sequence[tuple[str, float, float]],
        start: float,
    ) -> None:
        self.config = config
        self.checks = list(checks)
        self.runs = sorted(runs, key=lambda r: r[1])
        self.start = start
        for c in self.checks:
            c.next_due = start + c.period
        #: the earliest ``next_due`` of the checks: events before it need no look at the checks
        self._next_due = min((c.next_due for c in self.checks), default=float("inf"))
        self.queues: dict[tuple[str, str], QueueState] = {}
        self.actions: list[dict[str, Any]] = []
        self.events = 0
        self._run_idx = -1
        self._run: str | None = None
        self._clock = start
        self._open: dict[tuple[Any, ...], dict[str, Any]] = {}
        #: the candidate's blast-radius budgets, on the journal's clock
        self.budgets = Budgets()

    # -- driving ----------------------------------------------------------------------------------

    def feed(self, ev: Sequence[Any]) -> None:
        """One event, in journal order: the checks due before it run first."""
        self.feed_all((ev,))

    def feed_all(self, events: Iterable[Sequence[Any]]) -> Replayer:
        """:meth:`feed` each event (one loop, run once per event of the journal: its steps are
        written out here rather than a call per event)."""
        handlers = _HANDLERS
        for ev in events:
            ts = ev[TS]
            if ev[RUN] != self._run:
                self._switch_run(ev[RUN])
            if ts > self._clock:
                if ts > self._next_due:
                    self._checks_until(ts)
                self._clock = ts
            self.events += 1
            handler = handlers.get(ev[EVENT])
            if handler is not None:
                handler(self, ev, self._clock)
        return self

    def finish(self, end: float | None = None) -> list[dict[str, Any]]:
        """Run the checks due up to ``end`` (the last run's end by default); return the actions."""
        if end is None:
            end = self.runs[-1][2] if self.runs else self._clock
        self._checks_until(end, inclusive=True)
        self._clock = max(self._clock, end)
        return self.actions

    def _run_index(self, name: str) -> int:
        for i, (r, _, _) in enumerate(self.runs):
            if r == name:
                return i
        return len(self.runs)  # a run the driver did not list: treat it as the latest

    def _switch_run(self, name: str) -> None:
        idx = self._run_index(name)
        if self._run is not None and idx > self._run_idx and self._run_idx < len(self.runs):
            # the previous run ended: its checks up to its end, then what it held is gone
            end = self.runs[self._run_idx][2]
            if end > self._clock:
                self._checks_until(end, inclusive=True)
                self._clock = end
        if idx != self._run_idx:
            self.queues.clear()
            self._open.clear()
        self._run, self._run_idx = name, idx

    def _run_at(self, t: float) -> int | None:
        for i, (_, start, end) in enumerate(self.runs):
            if start <= t <= end:
                return i
        return None if self.runs else self._run_idx

    def _checks_until(self, t: float, inclusive: bool = False) -> None:
        while True:
            due = min(self.checks, key=lambda c: c.next_due, default=None)
            if due is None or due.next_due > t or (not inclusive and due.next_due == t):
                self._next_due = due.next_due if due is not None else float("inf")
                return
            at = due.next_due
            due.next_due = at + due.period
            idx = self._run_at(at)
            if idx is None or idx < self._run_idx:
                continue  # the broker was down, or a run this replay has already left
            if idx > self._run_idx:
                # a later run began and none of this replay's queues has spoken in it yet
                self.queues.clear()
                self._open.clear()
                self._run, self._run_idx = self.runs[idx][0], idx
            self._check(due, at)

    # -- checks -----------------------------------------------------------------------------------

    def snapshot(self, section: str | None, now: float) -> Snapshot:
        views = []
        for q in self.queues.values():
            if q.suppressed:
                continue
            pol = self._policy(q)
            if section is None or section in pol:
                views.append(q.view(now, pol))
        return Snapshot(now, tuple(views))

    def _policy(self, q: QueueState) -> Any:
        pol = q.policy
        if pol is None:
            vc = self.config.vhosts.get(q.vhost)
            pol = (
                vc.resolve(q.name, [(ex, etype, key) for (ex, key), etype in q.bindings.items()])
                if vc is not None
                else {}
            )
            q.policy = pol
        return pol

    def _check(self, check: PolicyCheck, now: float) -> None:
        check.checks += 1
        snap = self.snapshot(check.section, now)
        if not snap.queues:
            self._close_streaks(check.name)
            return
        actions = check.policy(snap, check.state, check.policies)
        seen: set[tuple[Any, ...]] = set()
        deferred: list[Action] = []
        for a in actions:
            outcome = self._budgeted(a, now)
            seen.add(self._record(check, a, now, outcome))
            if outcome == "deferred":
                deferred.append(a)
            else:
                self._simulate(a, now, check)
        if deferred:  # as the housekeeping pool tells the job (plugbroker.policy.DEFERRED)
            check.state[DEFERRED] = deferred
        self._close_streaks(check.name, keep=seen)

    def _budgeted(self, a: Action, now: float) -> str:
        """The outcome to record for ``a``: ``deferred`` when the candidate's ``<blastRadius>``
        for its vhost has no room at ``now`` (the same :class:`plugbroker.budget.Budget` the core
        applies), else as usual; an action that fits is counted."""
        outcome = _OUTCOME.get(type(a), "applied")
        if outcome != "applied" or not counts(a):
            return outcome
        vc = self.config.vhosts.get(a.vhost)
        br = vc.blast_radius if vc is not None else None
        budget = (
            self.budgets.get(a.vhost, br.max_actions_per_minute, br.max_consumers_affected)
            if br is not None
            else None
        )
        if budget is None:
            return outcome
        tag = getattr(a, "consumer_tag", "")
        if tag:
            hit = [(getattr(a, "connection_id", ""), tag)]
        else:
            q = self.queues.get((a.vhost, a.queue))
            hit = [(c.conn, c.tag) for c in q.consumers.values()] if q is not None else []
        if budget.check(now, hit) is not None:
            return "deferred"
        budget.record(now, hit)
        return outcome

    def _record(
        self, check: PolicyCheck, a: Action, now: float, outcome: str | None = None
    ) -> tuple[Any, ...]:
        if outcome is None:
            outcome = _OUTCOME.get(type(a), "applied")
        tag = getattr(a, "consumer_tag", "") or None
        conn = getattr(a, "connection_id", "") or None
        key = (check.name, a.vhost, a.queue, type(a).__name__, tag, conn, a.threshold)
        row = self._open.get(key)
        repeat = outcome in ("logged", "spared")
        if repeat and row is not None and row["_last_check"] == check.checks - 1:
            row["until"] = now
            row["checks"] += 1
            row["_last_check"] = check.checks
            if a.measured is not None:
                row["measured_max"] = max(row["measured_max"] or a.measured, a.measured)
            return key
        row = {
            "at": now,
            "until": now,
            "checks": 1,
            "job": check.name,
            "policy": a.policy,
            "action": type(a).__name__,
            "vhost": a.vhost,
            "queue": a.queue,
            "consumer_tag": tag,
            "connection_id": conn,
            "threshold": a.threshold or None,
            "configured": _f(a.configured),
            "measured": _f(a.measured),
            "measured_max": _f(a.measured),
            "reason": a.reason,
            "outcome": outcome,
            "_last_check": check.checks,
        }
        self.actions.append(row)
        if repeat:
            self._open[key] = row
        return key

    def _close_streaks(
        self,
        job: str,
        keep: frozenset[tuple[Any, ...]] | set[tuple[Any, ...]] = frozenset(),
    ) -> None:
        for key in [k for k in self._open if k[0] == job and k not in keep]:
            del self._open[key]

    def _simulate(self, a: Action, now: float, check: PolicyCheck) -> None:
        q = self.queues.get((a.vhost, a.queue))
        if q is None:
            return
        if isinstance(a, DeleteQueue):
            q.suppressed = True
        elif isinstance(a, (IsolateConsumer, CountTimeout)):
            c = _find(q, a.consumer_tag, a.connection_id)
            if c is None:
                return
            working = _working(q, c, now)
            if a.configured is not None and working is not None:
                if self._count_timeout(q, c, working, now, a.configured, check):
                    return  # poison: dead-lettered, and the consumer is not isolated for it
            if isinstance(a, IsolateConsumer):
                c.isolated = True
                c.isolated_for = working or 0
                c.counted, c.counted_at = 0, None
        elif isinstance(a, ReleaseConsumer):
            c = _find(q, a.consumer_tag, a.connection_id)
            if c is not None:
                c.isolated = False
        elif isinstance(a, SetPrefetch):
            c = _find(q, a.consumer_tag, a.connection_id)
            if c is not None:
                c.prefetch = a.prefetch

    def _count_timeout(
        self,
        q: QueueState,
        c: ConsumerState,
        mid: int,
        now: float,
        timeout: float,
        check: PolicyCheck,
    ) -> bool:
        """The core's count of a timed-out hand-out (:func:`plugbroker.domain.fate.count_timeout`)
        under the candidate's ``<poisonDeliveries>``; True when it made the message poison: it
        leaves the queue (later journal events about it find nothing), its holder is pardoned
        and the consumers isolated while working on it are released, and a ``Poison`` row says
        so."""
        if c.pardon:
            return False
        if c.counted == mid and c.counted_at is not None and now - c.counted_at < timeout:
            return False
        c.counted, c.counted_at = mid, now
        n = q.timeouts[mid] = q.timeouts.get(mid, 0) + 1
        iso = self._policy(q).get("isolation")
        limit = getattr(iso, "poison_deliveries", None)
        if not limit or n < limit:
            return False
        _take(q, mid)
        _restart_clock(c, now)
        c.pardon, c.counted, c.counted_at = mid, 0, None
        for other in q.consumers.values():
            if other.isolated and other.isolated_for == mid:
                other.isolated, other.isolated_for, other.pardon = False, 0, mid
        self.actions.append(
            {
                "at": now,
                "until": now,
                "checks": 1,
                "job": check.name,
                "policy": "Isolation",
                "action": "Poison",
                "vhost": q.vhost,
                "queue": q.name,
                "consumer_tag": c.tag,
                "connection_id": c.conn,
                "threshold": "poisonDeliveries",
                "configured": float(limit),
                "measured": float(n),
                "measured_max": float(n),
                "reason": f"message {mid} timed out {n} times: dead-lettered as poison",
                "outcome": "applied",
                "_last_check": check.checks,
            }
        )
        return True

    # -- state ------------------------------------------------------------------------------------

    def queue(self, ev: Sequence[Any]) -> QueueState:
        key = (ev[VHOST], ev[QUEUE])
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = QueueState(ev[VHOST], ev[QUEUE])
        return q


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _find(q: QueueState, tag: str, conn: str) -> ConsumerState | None:
    c = q.consumers.get((conn, tag))
    if c is not None:
        return c
    for c in q.consumers.values():
        if c.tag == tag and (not conn or c.conn == conn):
            return c
    return None


def _consumer(q: QueueState, ev: Sequence[Any]) -> ConsumerState | None:
    tag = ev[TAG]
    if tag is None:
        return None
    key = (ev[CONN], tag)
    c = q.consumers.get(key)
    if c is None:  # the journal began after it subscribed
        c = q.consumers[key] = ConsumerState(tag, ev[CONN], ev[CHANNEL] or 0)
    return c


def _settled_by(r: Replayer, q: QueueState, ev: Sequence[Any], now: float) -> None:
    """The consumer that acked or rejected: its clock restarts (it stops while it holds nothing)
    and it leaves the blocklist; it is past any poison message it was busy with, and the
    hand-out that timed out is over if it settled that one."""
    c = _consumer(q, ev)
    if c is not None:
        c.last_ack = now
        _restart_clock(c, now)
        c.isolated = False
        if c.pardon or c.counted == ev[MID]:
            c.pardon = c.counted = 0
            c.counted_at = None


def _working(q: QueueState, c: ConsumerState, now: float) -> int | None:
    """The delivery ``c`` works on: the oldest it holds that is due (as the core's
    :func:`plugbroker.domain.fate.working_delivery`)."""
    for mid in c.holding:
        due = c.deferred.get(mid) if c.deferred else None
        if due is None or due <= now:
            return mid
    return None


def _restart_clock(c: ConsumerState, now: float) -> None:
    """An ack, nack, reject or touch restarts the clock as the core does
    (:func:`plugbroker.domain.fate.restart_clock`): from now, or from the earliest due time when
    all it holds are deliveries not due yet."""
    if c.unacked <= 0:
        c.busy_since = None
    elif c.deferred and c.unacked <= len(c.deferred):
        due = min(c.deferred.values())
        c.busy_since = due if due > now else now
    else:
        c.busy_since = now


def _unhold(q: QueueState, holder: Any, mid: int) -> None:
    """The consumer keyed ``holder`` no longer holds message ``mid``."""
    c = q.consumers.get(holder) if holder is not None else None
    if c is not None:
        c.unacked -= 1
        c.holding.pop(mid, None)
        if c.deferred:
            c.deferred.pop(mid, None)


def _take(q: QueueState, mid: int) -> list[Any] | None:
    """Remove a message from the queue's figures; return its record."""
    m = q.held.pop(mid, None)
    if m is None:
        return None
    if q.not_due:
        q.not_due.pop(mid, None)
    if q.timeouts:
        q.timeouts.pop(mid, None)
    q.bytes -= m[1]
    if m[2] == READY:
        q.ready -= 1
    elif m[2] == UNACKED:
        _unhold(q, m[3], mid)
    elif m[2] == PENDING:
        q.pending -= 1
    return m


def _on_published(r: Replayer, ev: Sequence[Any], now: float) -> None:
    if ev[QUEUE] is None:
        return
    q = r.queue(ev)
    mid = ev[MID]
    if mid in q.held:
        return
    size = ev[SIZE] or 0
    q.held[mid] = [ev[TS], size, READY, None]
    q.bytes += size
    q.ready += 1


def _on_delivered(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queue(ev)
    mid = ev[MID]
    m = q.held.get(mid)
    if m is None:  # arrived without a published event (dead-letter copy, delayed, restored)
        size = ev[SIZE] or 0
        m = q.held[mid] = [ev[TS], size, READY, None]
        q.bytes += size
        q.ready += 1
    if m[2] == READY:
        q.ready -= 1
    elif m[2] == PENDING:
        q.pending -= 1
    elif m[2] == UNACKED:
        _unhold(q, m[3], mid)
    c = _consumer(q, ev)
    if c is None:
        q.getters[(ev[CONN], ev[CHANNEL] or 0)] = None
    elif c.first_delivery is None:
        c.first_delivery = now
    if ev[NO_ACK]:
        q.held.pop(mid, None)
        q.bytes -= m[1]
        q.acks_total += 1
        return
    m[2] = UNACKED
    m[3] = (c.conn, c.tag) if c is not None else None
    if c is not None:
        since = c.busy_since if c.unacked > 0 else None
        c.unacked += 1
        c.holding[mid] = None
        due = ev[DUE] if len(ev) > DUE else None
        if due is not None and due > now:  # not due yet (its ETA): off the clock until then
            c.deferred[mid] = due
            q.not_due[mid] = due
            start = due
        else:
            start = now  # the clock starts (at the latest now)
        if since is None or since > start:
            c.busy_since = start


def _on_acked(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queue(ev)
    _take(q, ev[MID])
    q.acks_total += 1
    _settled_by(r, q, ev, now)


def _on_rejected(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queue(ev)
    m = q.held.get(ev[MID])
    if m is not None:
        if m[2] == UNACKED:
            _unhold(q, m[3], ev[MID])
        elif m[2] == READY:
            q.ready -= 1
        if m[2] != PENDING:
            q.pending += 1
        m[2] = PENDING
        m[3] = None
    _settled_by(r, q, ev, now)


#: the ``redelivered`` reasons of a copy that arrives from another queue (a new message id)
_MOVED_IN = frozenset({"retry", "redrive"})


def _on_redelivered(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queue(ev)
    m = q.held.get(ev[MID])
    if m is None:
        if ev[REASON] in _MOVED_IN:  # a copy from a retry or dead-letter queue arrives
            _on_published(r, ev, now)
        return
    if m[2] == READY:
        return
    if m[2] == UNACKED:
        _unhold(q, m[3], ev[MID])
    else:
        q.pending -= 1
    m[2] = READY
    m[3] = None
    q.ready += 1


def _on_gone(r: Replayer, ev: Sequence[Any], now: float) -> None:
    """dead_lettered, dropped, expired: the message leaves (a settle if it was rejected)."""
    q = r.queues.get((ev[VHOST], ev[QUEUE]))
    if q is None:
        return
    m = _take(q, ev[MID])
    if m is not None and m[2] == PENDING:
        q.acks_total += 1


def _on_removed(r: Replayer, ev: Sequence[Any], now: float) -> None:
    """removed: purged, or gone back to its queue from a retry queue or a dead-letter queue
    (the core counts those two as settled: ``acks_total``)."""
    q = r.queues.get((ev[VHOST], ev[QUEUE]))
    if q is None:
        return
    m = _take(q, ev[MID])
    if m is not None and (m[2] == PENDING or ev[REASON] in ("retry", "redrive")):
        q.acks_total += 1


def _on_touched(r: Replayer, ev: Sequence[Any], now: float) -> None:
    """A consumer said it still works on a delivery (``amq.touch``): its clock restarts."""
    q = r.queues.get((ev[VHOST], ev[QUEUE]))
    c = _consumer(q, ev) if q is not None else None
    if c is not None:
        _restart_clock(c, now)


def _on_consumer_added(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queue(ev)
    q.consumers[(ev[CONN], ev[TAG])] = ConsumerState(
        ev[TAG], ev[CONN], ev[CHANNEL] or 0, int(ev[COUNT] or 0), bool(ev[NO_ACK])
    )


def _on_consumer_removed(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queues.get((ev[VHOST], ev[QUEUE]))
    if q is not None:
        q.consumers.pop((ev[CONN], ev[TAG]), None)


def _on_queue_declared(r: Replayer, ev: Sequence[Any], now: float) -> None:
    key = (ev[VHOST], ev[QUEUE])
    old = r.queues.get(key)
    q = QueueState(
        ev[VHOST],
        ev[QUEUE],
        bool(ev[DURABLE]),
        bool(ev[AUTO_DELETE]),
        bool(ev[EXCLUSIVE]),
        ev[DETAIL],
    )
    if old is not None and ev[REASON] == "existing":
        # the journal's opening inventory of a queue the replay already knows: keep its figures
        old.durable, old.auto_delete, old.exclusive = q.durable, q.auto_delete, q.exclusive
        old.subscription_type = q.subscription_type
        return
    r.queues[key] = q


def _on_queue_deleted(r: Replayer, ev: Sequence[Any], now: float) -> None:
    r.queues.pop((ev[VHOST], ev[QUEUE]), None)


def _on_bound(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queue(ev)
    q.bindings[(ev[EXCHANGE], ev[ROUTING_KEY])] = ev[DETAIL] or "direct"
    q.policy = None


def _on_unbound(r: Replayer, ev: Sequence[Any], now: float) -> None:
    q = r.queues.get((ev[VHOST], ev[QUEUE]))
    if q is not None:
        q.bindings.pop((ev[EXCHANGE], ev[ROUTING_KEY]), None)
        q.policy = None


_HANDLERS: dict[str, Callable[[Replayer, Sequence[Any], float], None]] = {
    "published": _on_published,
    "delivered": _on_delivered,
    "acked": _on_acked,
    "rejected": _on_rejected,
    "redelivered": _on_redelivered,
    "dead_lettered": _on_gone,
    "enqueued": _on_published,
    "removed": _on_removed,
    "dropped": _on_gone,
    "expired": _on_gone,
    "touched": _on_touched,
    "consumer_added": _on_consumer_added,
    "consumer_removed": _on_consumer_removed,
    "queue_declared": _on_queue_declared,
    "queue_deleted": _on_queue_deleted,
    "queue_bound": _on_bound,
    "queue_unbound": _on_unbound,
}


def replay_partition(
    rows: Iterator[Any],
    *,
    config_text: str,
    config_name: str,
    every: float | None,
    runs: Sequence[tuple[str, float, float]],
    start: float,
    end: float,
) -> Iterator[dict[str, Any]]:
    """A Spark ``mapPartitions`` function: replay the events of some queues (sorted by run and
    seq) and yield the actions the candidate's policies would have asked for."""
    config, plugins = load_candidate(config_text, config_name)
    replayer = Replayer(config, policy_checks(config, plugins, every), runs, start)
    replayer.feed_all(rows)
    for action in replayer.finish(end):
        action.pop("_last_check", None)
        yield action
    yield {"_stats": True, "events": replayer.events}

"""The housekeeping pool: plugins' periodic jobs, each on its own schedule, none stopping another.

This is the Qpid design's extension point (the virtual host housekeeping thread turned into a
scheduled pool so "any error in their operation does not prevent them from running on their
defined schedule"), built on APScheduler 3.x.

**The snapshot pattern.** A job runs on a pool thread, never on the broker's loop. The pool runs
two kinds (see :mod:`plugbroker.registry`):

- a **policy job** (a :class:`~plugbroker.policy.Policy`) is run by the pool itself, always the same
  way: a snapshot of the queues of its section is taken *on the loop*
  (``BrokerHandle.snapshot``), the policy computes actions from it *on the pool thread*, with
  its state kept across runs and the registry's named policies, and the actions are applied
  *on the loop* (``BrokerHandle.apply_actions``, where the core re-checks each still holds);
- a **plain job** ``func(ctx)`` does the same by hand through :meth:`JobContext.snapshot` and
  :meth:`JobContext.apply`, for periodic work that is not a policy.

Neither touches live broker objects, so neither needs locks.

**Guarantees, per job** (the guard is the job's own runner, so they hold under either driver):

- an exception is caught and logged with the plugin's name and the job's name; the next run
  happens on schedule;
- at most one run at a time (APScheduler ``max_instances=1`` plus the runner's own lock): a run
  that is due while the previous one is still going is skipped, counted and logged, so a hung
  job costs one pool thread, not the pool;
- runs that were missed while the pool was busy collapse into one (``coalesce=True``) and a run
  later than one period (rounded up to whole seconds, APScheduler's unit) is dropped, since the
  next one is never more than a period away.

With ``threads`` workers, up to ``threads - 1`` jobs can hang and the others still run.

**Two drivers, one runner.** :meth:`Housekeeping.start` schedules every job on a
``BackgroundScheduler`` with an interval trigger (real time). :meth:`Housekeeping.run_due`
is a deterministic driver over the injected clock: it submits, to the same pool, the jobs whose
time has come at ``clock.monotonic()``, with the same skip-if-running and coalescing rules. Why
both: APScheduler 3 reads ``datetime.now()`` and waits on real events, so a test of "job A
raised and still ran at its next period while job B hung" through it would sleep for periods.
The behaviour worth testing — error isolation, skip-while-running, per-job period, per-job state
— lives in the runner both drivers call, so the tests drive it in milliseconds with a
:class:`~plugbroker.clock.ManualClock`, and one test runs the real scheduler with sub-second periods.
:meth:`Housekeeping.run_job` runs one job now, in the calling thread (admin "run now", tests).

**Daemon threads.** The pool's workers are daemon threads (a small pool written here rather than
``concurrent.futures.ThreadPoolExecutor``, whose workers the interpreter joins at exit): a job
stuck in a plugin's code must not keep the broker process alive after shutdown.
:meth:`Housekeeping.stop` returns within ``wait`` seconds whatever the jobs are doing.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.executors.pool import BasePoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from plugbroker.policy import DEFERRED, ActionSink, SnapshotSource
from plugbroker.registry import Job, JobSpec, PluginError, PolicyJobSpec, resolve_period
from plugbroker.streaks import Streaks

if TYPE_CHECKING:
    from plugbroker.clock import Clock
    from plugbroker.policy import Action, NamedPolicy, Snapshot
    from plugbroker.registry import Registry

log = logging.getLogger(__name__)


class BrokerHandle(SnapshotSource, ActionSink, Protocol):
    """What the housekeeping pool needs from the broker (``plugbroker.app`` implements it): a
    :class:`~plugbroker.policy.SnapshotSource` and :class:`~plugbroker.policy.ActionSink` with a clock
    and a way onto its loop.

    ``snapshot`` and ``apply_actions`` run on the broker's loop; jobs reach them only through
    ``call_on_loop``, which a pool thread uses.
    """

    @property
    def clock(self) -> Clock:
        """The broker's clock (a plain attribute satisfies this)."""
        ...

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the broker's loop, block the calling pool thread until it ran, and
        return its result (or raise its exception). Must raise, not block forever, once the loop
        has stopped."""
        ...


class _RunLinesAtDebug(logging.Filter):
    """APScheduler logs two INFO lines per run of every job ("Running job ..." and "... executed
    successfully"): with a short period they drown the broker's log. This filter, on the
    executor's logger, turns them into DEBUG records, kept only when that logger is enabled
    for DEBUG (``--log-level DEBUG``, or the ``apscheduler`` logger set so); warnings and errors
    (a missed run, a job that raised) pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno = logging.DEBUG
        record.levelname = "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_RUN_LINES = _RunLinesAtDebug()


def quiet_scheduler_runs(alias: str = "default") -> None:
    """Put APScheduler's per-run lines of executor ``alias`` at DEBUG (idempotent)."""
    logger = logging.getLogger(f"apscheduler.executors.{alias}")
    if _RUN_LINES not in logger.filters:
        logger.addFilter(_RUN_LINES)


class HousekeepingStopped(RuntimeError):
    """Raised by :class:`JobContext` calls once the pool is stopping, so a job ends early."""


class JobContext:
    """One job's handle on the broker, kept across its runs: what a plain job receives, and
    where the pool keeps a policy job's ``state``."""

    __slots__ = (
        "_handle",
        "_registry",
        "_stopping",
        "clock",
        "name",
        "period",
        "plugin",
        "state",
        "streaks",
    )

    def __init__(
        self,
        *,
        name: str,
        plugin: str,
        period: float,
        handle: BrokerHandle,
        registry: Registry,
        stopping: threading.Event,
    ) -> None:
        self.name = name
        self.plugin = plugin
        #: seconds between runs, as resolved for this job
        self.period = period
        self.clock: Clock = handle.clock
        #: kept across runs of this job (e.g. a rate policy's last ``acks_total`` per queue)
        self.state: dict[str, Any] = {}
        #: its repeated spared or deferred decisions, told once (see :mod:`plugbroker.streaks`)
        self.streaks = Streaks()
        self._handle = handle
        self._registry = registry
        self._stopping = stopping

    @property
    def stopping(self) -> bool:
        """True once the pool is stopping; a long job should return."""
        return self._stopping.is_set()

    def snapshot(self, vhost: str | None = None, section: str | None = None) -> Snapshot:
        """Take a snapshot of ``vhost`` (all vhosts when ``None``) on the broker's loop.

        :param section: only queues whose resolved policy has this section element (a policy
            job asks for its own section, so queues it cannot act on cost it nothing).
        """
        self._check()
        handle = self._handle
        result: Snapshot = (
            handle.call_on_loop(handle.snapshot, vhost)
            if section is None
            else handle.call_on_loop(handle.snapshot, vhost, section)
        )
        return result

    def apply(self, actions: Iterable[Action]) -> list[str]:
        """Have the core apply ``actions`` on the loop; returns one outcome per action.

        An empty list costs nothing (no trip to the loop).
        """
        batch = list(actions)
        if not batch and not self.streaks.open:
            return []
        self._check()
        handle = self._handle
        outcomes: list[str] = handle.call_on_loop(handle.apply_actions, batch, self.streaks)
        return outcomes

    def policy(self, name: str) -> NamedPolicy:
        """The named policy registered under ``name`` (by any plugin); PluginError if none is.

        This is the :data:`~plugbroker.policy.PolicyLookup` a policy job gets as ``policies``."""
        return self._registry.policy(name)

    def _check(self) -> None:
        if self._stopping.is_set():
            raise HousekeepingStopped(f"housekeeping is stopping; job {self.name!r} ends")


@dataclass(slots=True)
class JobStats:
    """Running figures of one job, for the admin interface, metrics and tests."""

    runs: int = 0
    failures: int = 0
    skipped: int = 0
    last_error: str | None = None
    last_duration: float | None = None


def run_policy_job(spec: PolicyJobSpec, ctx: JobContext) -> None:
    """One run of a policy job: snapshot of its section on the loop, the policy here, with the
    job's state and the registry's named policies, then its actions applied on the loop."""
    snapshot = ctx.snapshot(section=spec.section)
    actions = spec.policy(snapshot, ctx.state, ctx.policy)
    if actions or ctx.streaks.open:  # an empty check ends the streaks still open
        outcomes = ctx.apply(actions)
        if "deferred" in outcomes:  # the budget held some back: the job hears of it next run
            ctx.state[DEFERRED] = [a for a, o in zip(actions, outcomes) if o == "deferred"]


class _JobRunner:
    """Runs one job: the error isolation and the one-at-a-time rule, shared by both drivers."""

    def __init__(self, spec: Job, period: float, ctx: JobContext) -> None:
        self.spec = spec
        self.period = period
        self.ctx = ctx
        self.stats = JobStats()
        self._lock = threading.Lock()
        self._body: Callable[[JobContext], None] = (
            spec.func if isinstance(spec, JobSpec) else partial(run_policy_job, spec)
        )

    @property
    def running(self) -> bool:
        return self._lock.locked()

    def run(self) -> bool:
        """Run once unless already running or stopping; never raises. Returns whether it ran."""
        if self.ctx.stopping:
            return False  # a run queued before stop() ends here, so stop() is not held up
        if not self._lock.acquire(blocking=False):
            self.skip()
            return False
        clock = self.ctx.clock
        started = clock.monotonic()
        try:
            self._body(self.ctx)
        except HousekeepingStopped:
            pass
        except Exception as exc:
            self.stats.failures += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.exception(
                "housekeeping job %r of plugin %r failed; it runs again in %gs",
                self.spec.name,
                self.spec.plugin,
                self.period,
            )
        finally:
            took = clock.monotonic() - started
            self.stats.runs += 1
            self.stats.last_duration = took
            self._lock.release()
        if took > self.period:
            log.warning(
                "housekeeping job %r of plugin %r took %.3fs, longer than its period %gs",
                self.spec.name,
                self.spec.plugin,
                took,
                self.period,
            )
        return True

    def skip(self) -> None:
        self.stats.skipped += 1
        log.warning(
            "housekeeping job %r of plugin %r is still running after its period %gs; "
            "skipping this run",
            self.spec.name,
            self.spec.plugin,
            self.period,
        )


class _Pool:
    """A fixed pool of daemon worker threads with a ``concurrent.futures``-style ``submit``.

    Also counts runs in flight so :meth:`Housekeeping.stop` can wait for them with a bound.
    Workers start with the first ``submit``, so a pool that never ran anything holds no thread.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ]
        self._queue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        self._started = False

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the housekeeping pool is stopped")
            if not self._started:
                self._started = True
                for t in self._threads:
                    t.start()
            self._in_flight += 1
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:
                        future.set_exception(exc)
            finally:
                with self._lock:
                    self._in_flight -= 1
                    self._idle.notify_all()

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking work and let the workers exit after what is queued; optionally join them.

        Queued runs are not cancelled: a cancelled future would make APScheduler's done-callback
        log a spurious error. They end at once instead, since a runner returns without calling
        its job once the pool is stopping.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._started:
                return
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()

    def wait_idle(self, timeout: float) -> bool:
        with self._lock:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout)


class _SharedPoolExecutor(BasePoolExecutor):
    """APScheduler executor over our pool, so both drivers share one set of threads."""

    def __init__(self, pool: _Pool) -> None:
        super().__init__(pool)


class Housekeeping:
    """Schedules the registry's jobs on a pool of ``threads`` daemon threads.

    :param registry: the jobs to run, as registered when this object is made (a job registered
        later runs from the next ``Housekeeping``); also where :meth:`JobContext.policy` looks.
    :param handle: the broker, for snapshots, actions and the clock.
    :param threads: pool size (``<housekeeping><threads>``).
    :param default_period: seconds, for jobs with neither ``period`` nor a resolvable
        ``period_key`` (``<housekeeping><period>``).
    :param period_for: resolves a job's ``period_key`` (e.g. ``"isolation.checkPeriod"``) to
        seconds from the configuration, or ``None`` when the key is not configured.
    """

    def __init__(
        self,
        registry: Registry,
        handle: BrokerHandle,
        *,
        threads: int = 4,
        default_period: float = 30.0,
        period_for: Callable[[str], float | None] | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"housekeeping needs at least one thread, not {threads}")
        if not default_period > 0:
            raise ValueError(f"the housekeeping period must be positive, not {default_period}")
        self._clock = handle.clock
        self._stopping = threading.Event()
        self._pool = _Pool(threads, "housekeeping")
        self._scheduler: BackgroundScheduler | None = None
        self._runners: dict[str, _JobRunner] = {}
        self._next_due: dict[str, float] = {}
        now = self._clock.monotonic()
        for spec in registry.jobs():
            period = resolve_period(spec, default_period, period_for)
            ctx = JobContext(
                name=spec.name,
                plugin=spec.plugin,
                period=period,
                handle=handle,
                registry=registry,
                stopping=self._stopping,
            )
            self._runners[spec.name] = _JobRunner(spec, period, ctx)
            self._next_due[spec.name] = now + period

    # -- introspection ----------------------------------------------------------------------------

    def job_names(self) -> tuple[str, ...]:
        return tuple(self._runners)

    def period_of(self, name: str) -> float:
        return self._runner(name).period

    def stats(self, name: str) -> JobStats:
        return self._runner(name).stats

    def context(self, name: str) -> JobContext:
        return self._runner(name).ctx

    # -- drivers ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Run every job at its period on a real-time APScheduler ``BackgroundScheduler``."""
        quiet_scheduler_runs()
        if self._stopping.is_set():
            raise RuntimeError("housekeeping was stopped; make a new one")
        if self._scheduler is not None:
            raise RuntimeError("housekeeping is already started")
        scheduler = BackgroundScheduler(
            executors={"default": _SharedPoolExecutor(self._pool)}, timezone="UTC"
        )
        for name, runner in self._runners.items():
            scheduler.add_job(
                runner.run,
                IntervalTrigger(seconds=runner.period),
                id=name,
                name=f"{runner.spec.plugin}:{name}",
                max_instances=1,
                coalesce=True,
                # APScheduler wants whole seconds here
                misfire_grace_time=max(1, math.ceil(runner.period)),
            )
        scheduler.add_listener(self._on_scheduler_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        scheduler.start()
        self._scheduler = scheduler
        log.info(
            "housekeeping started: %s",
            ", ".join(f"{n} every {r.period:g}s" for n, r in self._runners.items()) or "no jobs",
        )

    def run_due(self) -> list[Future[Any]]:
        """Submit to the pool every job due at ``clock.monotonic()``; the deterministic driver.

        A job is first due one period after this object was made, then one period after each
        time it was due. A job still running when due is skipped (and counted); runs missed
        between two calls collapse into one.
        """
        if self._stopping.is_set():
            return []
        now = self._clock.monotonic()
        submitted: list[Future[Any]] = []
        for name, runner in self._runners.items():
            due = self._next_due[name]
            if now < due:
                continue
            missed = int((now - due) // runner.period)
            self._next_due[name] = due + (missed + 1) * runner.period
            if runner.running:
                runner.skip()
                continue
            submitted.append(self._pool.submit(runner.run))
        return submitted

    def run_job(self, name: str) -> bool:
        """Run ``name`` now in the calling thread; ``False`` if it was already running."""
        return self._runner(name).run()

    def stop(self, wait: float = 5.0) -> bool:
        """Stop scheduling, end queued runs unstarted, and wait up to ``wait`` s for running ones.

        Jobs see :attr:`JobContext.stopping` and their next ``snapshot``/``apply`` raises
        :class:`HousekeepingStopped`. Returns whether every run finished in time; a job still
        running after that is logged by name and left to its daemon thread.
        """
        self._stopping.set()
        if self._scheduler is not None:
            # wait=False: the scheduler's own wait would join jobs without a bound
            self._scheduler.shutdown(wait=False)
        else:
            self._pool.shutdown(wait=False)
        finished = self._pool.wait_idle(timeout=max(0.0, wait))
        if not finished:
            stuck = [f"{r.spec.plugin}:{n}" for n, r in self._runners.items() if r.running]
            log.warning(
                "housekeeping stopped with jobs still running after %gs: %s",
                wait,
                ", ".join(stuck),
            )
        return finished

    # -- internals --------------------------------------------------------------------------------

    def _runner(self, name: str) -> _JobRunner:
        try:
            return self._runners[name]
        except KeyError:
            raise PluginError(
                f"no housekeeping job named {name!r}; jobs: {', '.join(self._runners) or 'none'}"
            ) from None

    def _on_scheduler_event(self, event: JobEvent) -> None:
        runner = self._runners.get(event.job_id)
        if runner is None:
            return
        if event.code == EVENT_JOB_MAX_INSTANCES:
            runner.skip()
        else:
            log.info(
                "housekeeping job %r of plugin %r missed a run (pool busy); it coalesces",
                event.job_id,
                runner.spec.plugin,
            )


__all__ = [
    "BrokerHandle",
    "Housekeeping",
    "HousekeepingStopped",
    "JobContext",
    "JobStats",
    "run_policy_job",
]

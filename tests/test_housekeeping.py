"""The housekeeping pool: per-job schedules, error isolation, hung jobs, bounded stop.

Most tests drive the pool with ``run_due`` over a ManualClock; real threads run the jobs, but
no test waits for a period to pass. One test runs the real APScheduler with sub-second periods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any

import pytest

from plugbroker.clock import Clock, ManualClock, SystemClock
from plugbroker.housekeeping import Housekeeping, HousekeepingStopped, JobContext
from plugbroker.policy import (
    Action,
    Breach,
    LogOnly,
    PolicyLookup,
    PolicyState,
    QueueView,
    Snapshot,
    Trigger,
)
from plugbroker.registry import JobSpec, PluginError, Registry

BOUND = 5.0  # seconds: the most any wait in these tests may take before it counts as a failure


class FakeBroker:
    """A BrokerHandle whose "loop" is a lock: call_on_loop runs fn under it, as one loop thread."""

    def __init__(self, clock: Clock, queues: tuple[QueueView, ...] = ()) -> None:
        self.clock = clock
        self.queues = queues
        self.loop_calls: list[str] = []
        self.sections: list[str | None] = []
        self.applied: list[Action] = []
        self.loop = threading.Lock()

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.loop:
            self.loop_calls.append(fn.__name__)
            return fn(*args)

    def snapshot(self, vhost: str | None = None, section: str | None = None) -> Snapshot:
        self.sections.append(section)
        return Snapshot(taken_at=self.clock.monotonic(), queues=self.queues)

    def apply_actions(self, actions: Sequence[Action], streaks: Any = None) -> list[str]:
        self.applied.extend(actions)
        return ["applied"] * len(actions)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def broker(clock: ManualClock) -> FakeBroker:
    return FakeBroker(clock)


@pytest.fixture
def pools() -> Iterator[list[Housekeeping]]:
    made: list[Housekeeping] = []
    yield made
    for hk in made:
        hk.stop(wait=1.0)


def _spec(
    name: str,
    func: Callable[[JobContext], None],
    period: float | None = 1.0,
    period_key: str | None = None,
    plugin: str = "acme",
) -> JobSpec:
    return JobSpec(name, plugin, func, period, period_key)


def _jobs(specs: list[JobSpec]) -> Registry:
    registry = Registry()
    for spec in specs:
        registry.register_job(
            spec.name, spec.func, period=spec.period, period_key=spec.period_key, plugin=spec.plugin
        )
    return registry


def _settle(futures: list[Future[Any]]) -> None:
    _, pending = wait(futures, timeout=BOUND)
    assert not pending, "a housekeeping run did not finish in time"


def _counter() -> tuple[list[int], Callable[[JobContext], None]]:
    runs: list[int] = []
    return runs, lambda ctx: runs.append(1)


def test_a_raising_job_is_logged_and_runs_again_and_others_run(
    clock: ManualClock,
    broker: FakeBroker,
    pools: list[Housekeeping],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bad(ctx: JobContext) -> None:
        raise ValueError("bug in plugin")

    good_runs, good = _counter()
    hk = Housekeeping(_jobs([_spec("bad", bad), _spec("good", good)]), broker, threads=2)
    pools.append(hk)
    with caplog.at_level(logging.ERROR, logger="plugbroker.housekeeping"):
        for _ in range(3):
            clock.advance(1.0)
            _settle(hk.run_due())
    assert hk.stats("bad").runs == 3 and hk.stats("bad").failures == 3
    assert hk.stats("bad").last_error == "ValueError: bug in plugin"
    assert len(good_runs) == 3 and hk.stats("good").failures == 0
    messages = [r.getMessage() for r in caplog.records]
    assert (
        messages.count("housekeeping job 'bad' of plugin 'acme' failed; it runs again in 1s") == 3
    )


def test_a_hanging_job_is_skipped_and_does_not_block_others(
    clock: ManualClock, broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    release = threading.Event()
    entered = threading.Event()

    def hang(ctx: JobContext) -> None:
        entered.set()
        release.wait(BOUND)

    good_runs, good = _counter()
    hk = Housekeeping(_jobs([_spec("hang", hang), _spec("good", good)]), broker, threads=2)
    pools.append(hk)
    try:
        clock.advance(1.0)
        first = hk.run_due()  # [hang, good], in registration order
        assert entered.wait(BOUND)
        _settle(first[1:])
        for _ in range(3):
            clock.advance(1.0)
            _settle(hk.run_due())  # only "good" is submitted: "hang" is still running
        assert len(good_runs) == 4
        assert hk.stats("hang").skipped == 3 and hk.stats("hang").runs == 0
    finally:
        release.set()
    _settle(first[:1])
    assert hk.stats("hang").runs == 1


def test_each_job_runs_at_its_own_period(
    clock: ManualClock, broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    counts: dict[str, int] = {}

    def count(name: str) -> Callable[[JobContext], None]:
        return lambda ctx: counts.__setitem__(name, counts.get(name, 0) + 1)

    periods = {"isolation.checkPeriod": 1.0}
    hk = Housekeeping(
        _jobs(
            [
                _spec("fast", count("fast"), period=0.5),
                _spec("default", count("default"), period=None),
                _spec("keyed", count("keyed"), period=None, period_key="isolation.checkPeriod"),
                _spec("unkeyed", count("unkeyed"), period=None, period_key="consumer.nothing"),
            ]
        ),
        broker,
        default_period=2.0,
        period_for=periods.get,
    )
    pools.append(hk)
    assert [hk.period_of(n) for n in hk.job_names()] == [0.5, 2.0, 1.0, 2.0]
    for _ in range(4):
        clock.advance(0.5)
        _settle(hk.run_due())
    assert counts == {"fast": 4, "keyed": 2, "default": 1, "unkeyed": 1}


def test_explicit_period_wins_over_period_key(
    broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    hk = Housekeeping(
        _jobs([_spec("j", lambda ctx: None, period=3.0, period_key="k")]),
        broker,
        period_for=lambda key: 9.0,
    )
    pools.append(hk)
    assert hk.period_of("j") == 3.0 and hk.context("j").period == 3.0


def test_a_bad_configured_period_is_refused(broker: FakeBroker) -> None:
    with pytest.raises(PluginError, match="job 'j' of plugin 'acme': k resolves to 0"):
        Housekeeping(
            _jobs([_spec("j", lambda ctx: None, period=None, period_key="k")]),
            broker,
            period_for=lambda key: 0,
        )


def test_missed_runs_coalesce_into_one(
    clock: ManualClock, broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    runs, job = _counter()
    hk = Housekeeping(_jobs([_spec("j", job)]), broker)
    pools.append(hk)
    clock.advance(3.5)  # three periods passed unseen
    _settle(hk.run_due())
    assert len(runs) == 1
    clock.advance(0.4)  # next due at 4.0, not 1.0 + 1
    assert hk.run_due() == []
    clock.advance(0.1)
    _settle(hk.run_due())
    assert len(runs) == 2


def test_state_survives_between_runs(
    clock: ManualClock, broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    def job(ctx: JobContext) -> None:
        ctx.state["n"] = ctx.state.get("n", 0) + 1

    hk = Housekeeping(_jobs([_spec("j", job)]), broker)
    pools.append(hk)
    for _ in range(3):
        clock.advance(1.0)
        _settle(hk.run_due())
    assert hk.context("j").state == {"n": 3}


def _noisy(trigger: Trigger) -> list[Action]:
    return [LogOnly(**trigger.action_fields())]


def _queue(name: str) -> QueueView:
    return QueueView("/", name, False, False, False, "shared", 1, 1, 1, 0, 0.0, 0, (), ())


def _trigger(q: QueueView, policy: str) -> Trigger:
    return Trigger(q, (Breach("messageCount", 0, q.message_count),), {}, 0.0, policy)


def test_snapshot_and_apply_go_through_the_loop(
    broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    registry = Registry()
    registry.register_policy("Noisy", _noisy)
    outcomes: list[list[str]] = []

    def job(ctx: JobContext) -> None:
        assert ctx.snapshot("/").queues == ()
        assert ctx.apply([]) == []  # nothing to apply: no trip to the loop
        outcomes.append(ctx.apply(ctx.policy("Noisy")(_trigger(_queue("q"), "Noisy"))))

    registry.register_job("j", job, period=1.0, plugin="acme")
    hk = Housekeeping(registry, broker)
    pools.append(hk)
    assert hk.run_job("j") is True
    assert broker.loop_calls == ["snapshot", "apply_actions"]
    assert outcomes == [["applied"]] and broker.applied[0].policy == "Noisy"


def test_a_policy_job_runs_snapshot_on_the_loop_evaluate_off_it_and_apply_on_it(
    clock: ManualClock, pools: list[Housekeeping]
) -> None:
    broker = FakeBroker(clock, (_queue("a"), _queue("b")))
    seen: list[tuple[bool, str, int]] = []

    def flag_every_queue(
        snapshot: Snapshot, state: PolicyState, policies: PolicyLookup
    ) -> list[Action]:
        state["runs"] = state.get("runs", 0) + 1
        seen.append((broker.loop.locked(), threading.current_thread().name, len(snapshot.queues)))
        noisy = policies("Noisy")
        return [a for q in snapshot.queues for a in noisy(_trigger(q, "Noisy"))]

    registry = Registry()
    registry.register_policy("Noisy", _noisy)
    registry.register_policy_job("flag", flag_every_queue, section="consumer", period=1.0)
    hk = Housekeeping(registry, broker)
    pools.append(hk)
    for _ in range(2):
        clock.advance(1.0)
        _settle(hk.run_due())
    assert broker.loop_calls == ["snapshot", "apply_actions"] * 2
    assert broker.sections == ["consumer", "consumer"]  # the job's own section, asked for
    assert [(locked, n) for locked, _, n in seen] == [(False, 2), (False, 2)]
    assert all(thread.startswith("housekeeping-") for _, thread, _ in seen)
    assert [a.queue for a in broker.applied] == ["a", "b", "a", "b"]
    assert hk.context("flag").state == {"runs": 2}  # one state, kept across runs


def test_a_policy_job_with_nothing_to_do_does_not_go_back_to_the_loop(
    broker: FakeBroker, pools: list[Housekeeping]
) -> None:
    registry = Registry()
    registry.register_policy_job("quiet", lambda snapshot, state, policies: [], section=None)
    hk = Housekeeping(registry, broker)
    pools.append(hk)
    assert hk.run_job("quiet") is True
    assert broker.loop_calls == ["snapshot"] and broker.sections == [None]


def test_a_failing_policy_job_is_logged_like_any_job(
    broker: FakeBroker, pools: list[Housekeeping], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(snapshot: Snapshot, state: PolicyState, policies: PolicyLookup) -> list[Action]:
        return policies("Missing")(_trigger(_queue("q"), "Missing"))

    registry = Registry()
    registry.register_policy_job("broken", broken, section=None, period=1.0, plugin="acme")
    hk = Housekeeping(registry, broker)
    pools.append(hk)
    with caplog.at_level(logging.ERROR, logger="plugbroker.housekeeping"):
        assert hk.run_job("broken") is True
    assert hk.stats("broken").failures == 1
    assert hk.stats("broken").last_error is not None
    assert "policy 'Missing' is not registered" in hk.stats("broken").last_error
    assert broker.applied == []
    assert "housekeeping job 'broken' of plugin 'acme' failed" in caplog.text


def test_stop_is_bounded_with_a_hung_job_and_ends_the_schedule(
    clock: ManualClock, broker: FakeBroker
) -> None:
    release = threading.Event()
    entered = threading.Event()
    seen_stopping: list[bool] = []

    def hang(ctx: JobContext) -> None:
        entered.set()
        release.wait(BOUND)
        seen_stopping.append(ctx.stopping)
        ctx.snapshot()  # raises HousekeepingStopped: the run ends quietly

    hk = Housekeeping(_jobs([_spec("hang", hang)]), broker, threads=1)
    clock.advance(1.0)
    futures = hk.run_due()
    assert entered.wait(BOUND)
    started = time.monotonic()
    assert hk.stop(wait=0.05) is False
    assert time.monotonic() - started < 1.0
    clock.advance(5.0)
    assert hk.run_due() == []
    release.set()
    _settle(futures)
    assert seen_stopping == [True] and hk.stats("hang").failures == 0
    with pytest.raises(HousekeepingStopped):
        hk.context("hang").snapshot()


def test_stop_waits_for_a_running_job_to_finish(clock: ManualClock, broker: FakeBroker) -> None:
    entered = threading.Event()
    finished = threading.Event()

    def job(ctx: JobContext) -> None:
        entered.set()
        time.sleep(0.05)  # a real thread doing real work; stop() must wait for it
        finished.set()

    hk = Housekeeping(_jobs([_spec("j", job)]), broker)
    clock.advance(1.0)
    hk.run_due()
    assert entered.wait(BOUND)
    assert hk.stop(wait=BOUND) is True
    assert finished.is_set() and hk.stats("j").runs == 1


def test_unknown_job_name_is_an_error(broker: FakeBroker, pools: list[Housekeeping]) -> None:
    hk = Housekeeping(Registry(), broker)
    pools.append(hk)
    with pytest.raises(PluginError, match="no housekeeping job named 'x'"):
        hk.run_job("x")


def test_real_scheduler_with_subsecond_periods() -> None:
    """APScheduler itself: a raising job, a hung job and a healthy job, all under 2 s."""
    broker = FakeBroker(SystemClock())
    release = threading.Event()
    enough = threading.Event()
    counts = {"good": 0, "bad": 0}
    lock = threading.Lock()

    def bump(name: str) -> None:
        with lock:
            counts[name] += 1
            if counts["good"] >= 3 and counts["bad"] >= 3:
                enough.set()

    def good(ctx: JobContext) -> None:
        bump("good")

    def bad(ctx: JobContext) -> None:
        bump("bad")
        raise RuntimeError("boom")

    def hang(ctx: JobContext) -> None:
        release.wait(BOUND)

    hk = Housekeeping(
        _jobs([_spec("good", good, 0.05), _spec("bad", bad, 0.07), _spec("hang", hang, 0.05)]),
        broker,
        threads=3,
    )
    started = time.monotonic()
    hk.start()
    try:
        assert enough.wait(1.5), f"jobs did not run on schedule: {counts}"
    finally:
        release.set()
        assert hk.stop(wait=1.0) is True
    assert time.monotonic() - started < 2.0
    assert hk.stats("bad").failures >= 3
    assert hk.stats("hang").skipped >= 1  # APScheduler refused a second instance
    with pytest.raises(RuntimeError, match="stopped"):
        hk.start()


def test_a_pool_that_never_ran_holds_no_thread_and_stops_twice(broker: FakeBroker) -> None:
    before = set(threading.enumerate())
    hk = Housekeeping(_jobs([_spec("j", lambda ctx: None)]), broker, threads=3)
    assert set(threading.enumerate()) - before == set()
    assert hk.stop(wait=BOUND) is True
    assert hk.stop(wait=BOUND) is True


def test_the_schedulers_per_run_lines_are_debug_not_info(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    ran = threading.Event()
    runs: list[int] = []

    def job(ctx: JobContext) -> None:
        runs.append(1)
        if len(runs) >= 3:
            ran.set()

    hk = Housekeeping(_jobs([_spec("often", job, 0.05)]), broker, threads=1)
    with caplog.at_level(logging.INFO):
        hk.start()
        try:
            assert ran.wait(BOUND), "the job did not run on schedule"
        finally:
            hk.stop(wait=1.0)
    runs_logged = [r for r in caplog.records if r.name.startswith("apscheduler.executors")]
    assert runs_logged == []  # at INFO: nothing per run
    assert any("housekeeping started" in r.getMessage() for r in caplog.records)
    caplog.clear()
    runs.clear()
    ran.clear()
    hk2 = Housekeeping(_jobs([_spec("often", job, 0.05)]), broker, threads=1)
    with caplog.at_level(logging.DEBUG):
        hk2.start()
        try:
            assert ran.wait(BOUND), "the job did not run on schedule"
        finally:
            hk2.stop(wait=1.0)
    per_run = [r for r in caplog.records if r.name == "apscheduler.executors.default"]
    assert per_run and {r.levelno for r in per_run} == {logging.DEBUG}
    assert any("executed successfully" in r.getMessage() for r in per_run)

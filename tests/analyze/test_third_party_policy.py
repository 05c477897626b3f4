"""A policy defined outside the broker (``candidate_policy`` beside this file), named in a
candidate's ``<plugins>``, is backtested exactly like the built-in policies: found through the
registry of the candidate's plugins, replayed at its own period with its own state, its named
policy called by the built-in slow-consumer check. No Spark: the replay engine on its own."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from plugbroker.analyze.replay import COLUMNS, Replayer, load_candidate, policy_checks
from plugbroker.clock import ManualClock
from plugbroker.housekeeping import Housekeeping
from plugbroker.pluginhost import BLOCK_ENV
from plugbroker.policy import Action, SetPrefetch, Snapshot

HERE = Path(__file__).parent
RUN = "20260101T000000-third-party"
T0 = 1_767_225_600.0

CANDIDATE = """<broker>
  <housekeeping><period>10s</period></housekeeping>
  <plugins><plugin>candidate_policy</plugin></plugins>
  <virtualhost name="/">
    <queue name="work">
      <backlogCap><messages>3</messages><prefetch>2</prefetch></backlogCap>
    </queue>
    <topic key="stocks.us.*">
      <consumer><messageCount>5</messageCount><policy name="Throttle"/></consumer>
    </topic>
  </virtualhost>
</broker>"""


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The plugin module, importable by name as an installed plugin would be."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delenv(BLOCK_ENV, raising=False)
    import candidate_policy

    yield candidate_policy
    sys.modules.pop("candidate_policy", None)


class Events:
    """Journal rows in the replay's column order, numbered in the order they are made."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, event: str, t: float, queue: str | None, **kw: Any) -> tuple[Any, ...]:
        self.seq += 1
        row: dict[str, Any] = dict.fromkeys(COLUMNS)
        row.update(run=RUN, seq=self.seq, ts=T0 + t, event=event, vhost="/", queue=queue)
        row.update(kw)
        return tuple(row[c] for c in COLUMNS)

    def consumer(self, t: float, queue: str, tag: str, prefetch: int) -> tuple[Any, ...]:
        return self(
            "consumer_added",
            t,
            queue,
            consumer_tag=tag,
            connection_id=f"{tag}#1",
            channel_id=1,
            count=prefetch,
            no_ack=False,
        )

    def publish(self, t: float, queue: str, mid: int) -> tuple[Any, ...]:
        return self("published", t, queue, message_id=mid, body_size=10)


def work_queue(ev: Events) -> list[tuple[Any, ...]]:
    """``work``: a consumer with a wide window and one already narrow, then a message a second
    from t=0.5 to t=6.5 (4 held at t=4, the first check over the cap of 3), and at t=7 a
    consumer with an unlimited window."""
    rows = [
        ev("queue_declared", 0, "work", durable=True, detail="shared"),
        ev.consumer(0, "work", "wide", 10),
        ev.consumer(0, "work", "narrow", 1),
    ]
    rows += [ev.publish(0.5 + i, "work", 100 + i) for i in range(7)]
    rows.append(ev.consumer(7, "work", "late", 0))
    return rows


def topic_queue(ev: Events) -> list[tuple[Any, ...]]:
    """A topic subscription with prefetch 5 that falls 6 messages behind by t=6."""
    return [
        ev("queue_declared", 0, "sub", exclusive=True, auto_delete=True, detail="shared"),
        ev(
            "queue_bound",
            0,
            "sub",
            exchange="amq.topic",
            routing_key="stocks.us.ibm",
            detail="topic",
        ),
        ev.consumer(0, "sub", "ticker", 5),
        *(ev.publish(1 + i, "sub", 200 + i) for i in range(6)),
    ]


def test_the_candidates_plugin_jobs_come_from_its_registry(module: ModuleType) -> None:
    config, plugins = load_candidate(CANDIDATE)
    checks = {c.name: c for c in policy_checks(config, plugins)}
    assert list(checks) == ["slow-consumer", "isolation", module.JOB]
    ours = checks[module.JOB]
    assert ours.policy is module.evaluate and ours.section == module.SECTION
    assert ours.period == module.PERIOD  # its own period, not <housekeeping><period>
    assert (checks["slow-consumer"].period, checks["isolation"].period) == (10.0, 10.0)
    assert ours.policies("Throttle") is module.throttle
    assert {c.period for c in policy_checks(config, plugins, every=0.5)} == {0.5}


def test_a_third_party_policy_job_is_backtested_like_the_built_ins(module: ModuleType) -> None:
    config, plugins = load_candidate(CANDIDATE)
    r = Replayer(config, policy_checks(config, plugins), [(RUN, T0, T0 + 30)], T0)
    ev = Events()
    rows = sorted(
        work_queue(ev) + topic_queue(ev),
        key=lambda row: (row[COLUMNS.index("ts")], row[COLUMNS.index("seq")]),
    )
    actions = r.feed_all(rows).finish(T0 + 30)

    ours = [a for a in actions if a["job"] == module.JOB]
    assert [(a["at"] - T0, a["consumer_tag"], a["reason"]) for a in ours] == [
        (4.0, "wide", "over its cap at 1 check(s)"),  # "narrow" is already at 1, under 2
        (8.0, "late", "over its cap at 3 check(s)"),  # "wide" now has 2: the state counted 3
    ]
    first = ours[0]
    assert (first["policy"], first["action"], first["queue"], first["outcome"]) == (
        module.POLICY,
        "SetPrefetch",
        "work",
        "applied",
    )
    assert (first["threshold"], first["configured"], first["measured"]) == ("messages", 3.0, 4.0)

    # the built-in slow-consumer check called the plugin's named policy, once: the consumer's
    # window counts as narrowed afterwards
    [slow] = [a for a in actions if a["job"] == "slow-consumer"]
    assert (slow["at"] - T0, slow["policy"], slow["action"], slow["queue"]) == (
        10.0,
        "Throttle",
        "SetPrefetch",
        "sub",
    )
    assert (slow["consumer_tag"], slow["threshold"], slow["measured"]) == (
        "ticker",
        "messageCount",
        6.0,
    )
    assert len(actions) == 3


class _ReplayedBroker:
    """A BrokerHandle over a replay: the housekeeping pool's snapshot is the replay's."""

    def __init__(self, replayer: Replayer, at: float) -> None:
        self.clock = ManualClock()
        self.replayer = replayer
        self.at = at
        self.sections: list[str | None] = []
        self.applied: list[Action] = []

    def call_on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def snapshot(self, vhost: str | None = None, section: str | None = None) -> Snapshot:
        self.sections.append(section)
        return self.replayer.snapshot(section, self.at)

    def apply_actions(self, actions: Sequence[Action], streaks: Any = None) -> list[str]:
        self.applied.extend(actions)
        return ["applied"] * len(actions)


def test_the_housekeeping_pool_runs_the_same_registration(module: ModuleType) -> None:
    """The broker's pool, given the candidate's registry, runs the job the replay ran, on the
    same snapshot, and gets the same action."""
    config, plugins = load_candidate(CANDIDATE)
    ev = Events()
    r = Replayer(config, [], [(RUN, T0, T0 + 30)], T0)
    r.feed_all(row for row in work_queue(ev) if row[COLUMNS.index("ts")] <= T0 + 4)
    handle = _ReplayedBroker(r, T0 + 4)
    hk = Housekeeping(plugins.registry, handle, threads=1, default_period=10.0)
    try:
        assert hk.period_of(module.JOB) == module.PERIOD
        assert hk.run_job(module.JOB) is True
    finally:
        hk.stop(wait=1.0)
    assert handle.sections == [module.SECTION]
    [a] = handle.applied
    assert isinstance(a, SetPrefetch) and (a.queue, a.consumer_tag, a.prefetch) == (
        "work",
        "wide",
        2,
    )
    assert hk.context(module.JOB).state == {"over": {("/", "work"): 1}}


def test_a_candidate_naming_a_missing_plugin_is_refused_with_its_own_name() -> None:
    from plugbroker.registry import PluginError

    text = CANDIDATE.replace("candidate_policy", "no_such_policy_module")
    with pytest.raises(PluginError) as err:
        load_candidate(text, "tuning/candidate.xml")
    assert "no_such_policy_module" in str(err.value)
    assert "tuning/candidate.xml" in str(err.value)
    assert "plugbroker-candidate-" not in str(err.value)  # not the temporary copy's name

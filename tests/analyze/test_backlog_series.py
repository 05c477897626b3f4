"""The backlog over time from per-bucket steps (no Spark: the driver-side part).

The Spark side sums each queue's backlog steps per time bucket
(:func:`plugbroker.analyze.events.backlog_deltas`) and counts its events per bucket
(:func:`plugbroker.analyze.events.queue_bucket_counts`); :func:`backlog_series` turns them into
what is held at each bucket's end. Here the steps are built by hand from a few messages whose
backlog is known, and the series is also checked against a direct count, message by message.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from plugbroker.analyze.events import MESSAGE_EVENTS, NEVER_BUCKET, backlog_series

T0, STEP = 100.0, 10.0


def bucket(t: float) -> int:
    return int((t - T0) // STEP)


def steps(messages: list[tuple[int, float, float | None, int]]) -> pa.Table:
    """The deltas of ``(queue, arrival, end or None, size)`` messages, as Spark sums them: a
    message that arrives and ends in the same bucket brings none (see backlog_steps)."""
    sums: dict[tuple[int, int], list[float | int | None]] = {}
    for q, arrival, end, size in messages:
        b_end = NEVER_BUCKET if end is None else bucket(end)
        if bucket(arrival) == b_end:
            continue
        for b, dn, db, arr in (
            (bucket(arrival), 1, size, None),
            (b_end, 0 if end is None else -1, 0 if end is None else -size, arrival),
        ):
            row = sums.setdefault((q, b), [0, 0, None])
            row[0] += dn  # type: ignore[operator]
            row[1] += db  # type: ignore[operator]
            if arr is not None:
                row[2] = arr if row[2] is None else min(row[2], arr)  # type: ignore[type-var]
    keys = sorted(sums)
    return pa.table(
        {
            "q": pa.array([k[0] for k in keys], pa.int64()),
            "bucket": pa.array([k[1] for k in keys], pa.int64()),
            "dn": pa.array([sums[k][0] for k in keys], pa.int64()),
            "db": pa.array([sums[k][1] for k in keys], pa.int64()),
            "min_arrival_ending": pa.array([sums[k][2] for k in keys], pa.float64()),
        }
    )


def counts(rows: list[tuple[int, int, int]]) -> pa.Table:
    """``(queue, bucket, published)`` rows as queue_bucket_counts gives them."""
    return pa.table(
        {
            "q": pa.array([r[0] for r in rows], pa.int64()),
            "bucket": pa.array([r[1] for r in rows], pa.int64()),
            **{
                e: pa.array([r[2] if e == "published" else 0 for r in rows], pa.int64())
                for e in MESSAGE_EVENTS
            },
        }
    )


def test_what_is_held_at_each_buckets_end():
    # queue 1: a message held from t=101 to t=135, one from 112 to the end, one in and out
    # within bucket 1 (it changes nothing); queue 2: nothing held, just events counted
    messages = [(1, 101.0, 135.0, 10), (1, 112.0, None, 5), (1, 114.0, 116.0, 99)]
    got = backlog_series(
        steps(messages), counts([(1, 0, 1), (1, 1, 2), (1, 3, 0), (2, 2, 7)]), T0, STEP
    ).to_pylist()
    q1 = {r["bucket"]: r for r in got if r["q"] == 1}
    assert sorted(q1) == [0, 1, 3]  # sparse: the buckets where something happened
    assert [q1[b]["messages"] for b in (0, 1, 3)] == [1, 2, 1]
    assert [q1[b]["bytes"] for b in (0, 1, 3)] == [10, 15, 5]
    assert q1[0]["t"] == 110.0 and q1[0]["oldest_age"] == pytest.approx(110.0 - 101.0)
    assert q1[1]["oldest_age"] == pytest.approx(120.0 - 101.0)
    assert q1[3]["oldest_age"] == pytest.approx(140.0 - 112.0)  # the first one left at 135
    assert q1[1]["published"] == 2
    (q2,) = [r for r in got if r["q"] == 2]
    assert q2["published"] == 7 and q2["messages"] == 0 and q2["oldest_age"] == 0.0
    assert all(r["bucket"] < NEVER_BUCKET for r in got)


def test_the_series_matches_a_count_message_by_message():
    rng = random.Random(7)
    messages = []
    for _ in range(400):
        q = rng.randrange(3)
        arrival = T0 + rng.uniform(0, 200)
        end = None if rng.random() < 0.1 else arrival + rng.expovariate(1 / rng.choice((1, 30)))
        messages.append((q, arrival, end, rng.randrange(1, 100)))
    events = sorted({(q, bucket(t)) for q, a, e, _ in messages for t in (a, e) if t is not None})
    got = backlog_series(
        steps(messages), counts([(q, b, 1) for q, b in events]), T0, STEP
    ).to_pylist()
    assert len(got) == len(events)
    for r in got:
        t = r["t"]
        held = [
            (a, s)
            for q, a, e, s in messages
            if q == r["q"] and a < t and (e is None or bucket(e) > r["bucket"])
        ]
        assert r["messages"] == len(held)
        assert r["bytes"] == sum(s for _, s in held)
        assert r["oldest_age"] == pytest.approx(t - min(a for a, _ in held) if held else 0.0)

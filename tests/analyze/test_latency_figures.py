"""The report's processing-time percentiles from fine counts (no Spark: the driver-side part).

The Spark side counts acks per queue, consumer, histogram bucket and fine code
(:func:`plugbroker.analyze.events.fine_code`); :func:`latency_figures` turns those counts into
percentiles. Here the counts are built with the same scale in numpy and the figures compared with
the exact percentiles of the values they came from.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from plugbroker.analyze.events import FINE_RATIO, FINE_ZERO
from plugbroker.analyze.report import latency_figures


def fine_counts(q: np.ndarray, consumer: np.ndarray, latency: np.ndarray) -> pa.Table:
    """What the report's Spark aggregation gives for these acks (bucket left out: one bucket)."""
    code = np.where(
        latency > 0,
        np.floor(np.log(np.maximum(latency, 1e-300) / 1e-6) / math.log(FINE_RATIO)),
        FINE_ZERO,
    ).astype(np.int32)
    t = pa.table({"q": q, "consumer": consumer, "code": code, "latency": latency})
    g = t.group_by(["q", "consumer", "code"]).aggregate([("latency", "count"), ("latency", "max")])
    return pa.table(
        {
            "q": g.column("q"),
            "consumer": g.column("consumer"),
            "bucket": pa.array(np.zeros(g.num_rows, dtype=np.int32)),
            "code": g.column("code"),
            "n": g.column("latency_count"),
            "vmax": g.column("latency_max"),
        }
    )


def exact(values: np.ndarray, pct: int) -> float:
    """The smallest value with at least pct% of the values at or below it."""
    s = np.sort(values)
    return float(s[max(1, -(-len(s) * pct // 100)) - 1])


def test_percentiles_are_within_the_fine_scale_of_the_exact_ones() -> None:
    rng = np.random.default_rng(7)
    n = 60_000
    q = rng.integers(0, 3, n).astype(np.int64)
    consumer = rng.integers(0, 4, n).astype(np.int64)
    # log-normal processing times from 50 us to minutes, a few exact zeros
    latency = np.exp(rng.normal(np.log(0.02) + q, 1.5, n))
    latency[rng.integers(0, n, 40)] = 0.0
    fine = fine_counts(q, consumer, latency)

    per_queue = latency_figures(fine, ["q"]).to_pylist()
    assert [r["q"] for r in per_queue] == [0, 1, 2]
    for row in per_queue:
        values = latency[q == row["q"]]
        assert row["latency_n"] == len(values)
        assert row["latency_max"] == values.max()
        for col, pct in (("latency_p50", 50), ("latency_p95", 95), ("latency_p99", 99)):
            want = exact(values, pct)
            # an observed value, from the fine bucket that holds the exact percentile
            assert row[col] in set(values.tolist())
            assert want <= row[col] <= want * FINE_RATIO, (col, row[col], want)

    per_consumer = latency_figures(fine, ["q", "consumer"]).to_pylist()
    assert len(per_consumer) == 12
    for row in per_consumer:
        values = latency[(q == row["q"]) & (consumer == row["consumer"])]
        assert row["latency_n"] == len(values)
        want = exact(values, 99)
        assert want <= row["latency_p99"] <= want * FINE_RATIO

    (overall,) = latency_figures(fine, []).to_pylist()
    assert overall["latency_n"] == n
    assert exact(latency, 50) <= overall["latency_p50"] <= exact(latency, 50) * FINE_RATIO


@pytest.mark.parametrize(
    ("values", "p50", "p99"),
    [
        ([0.0], 0.0, 0.0),
        ([0.25, 0.5], 0.25, 0.5),
        ([0.003] * 99 + [9.0], 0.003, 0.003),
        ([0.003] * 98 + [9.0, 9.0], 0.003, 9.0),
    ],
)
def test_small_samples_give_observed_values(values: list[float], p50: float, p99: float) -> None:
    v = np.array(values)
    ones = np.ones(len(v), dtype=np.int64)
    (row,) = latency_figures(fine_counts(ones, ones, v), ["q"]).to_pylist()
    assert (row["latency_p50"], row["latency_p99"], row["latency_n"]) == (p50, p99, len(v))


def test_no_acks_gives_empty_figures() -> None:
    empty = fine_counts(np.array([], np.int64), np.array([], np.int64), np.array([], np.float64))
    assert latency_figures(empty, ["q"]).num_rows == 0
    (overall,) = latency_figures(empty, []).to_pylist()
    assert overall == {
        "latency_p50": None,
        "latency_p95": None,
        "latency_p99": None,
        "latency_max": None,
        "latency_n": 0,
    }

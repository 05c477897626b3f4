"""plugbroker.heap on this process' own collector: every test hands back what it froze and
removes its callback."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from plugbroker.heap import CollectorWatch, collector_stats, freeze_start_heap


@pytest.fixture
def clean_collector() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _cycle() -> None:
    box: list[object] = []
    box.append(box)


def test_freeze_start_heap_puts_the_start_out_of_the_collectors_reach(
    clean_collector: None,
) -> None:
    frozen = freeze_start_heap()
    assert frozen == gc.get_freeze_count() > 1000  # at least the modules and their code
    _cycle()  # made after the freeze: still found
    assert gc.collect() >= 1


def test_the_watch_counts_and_times_every_collection() -> None:
    watch = CollectorWatch()
    watch.install()
    try:
        gc.collect()
        gc.collect(0)
        s = watch.stats
        assert s.timed
        assert s.collections[2] == 1 and s.pause_total[2] > 0 and s.pause_max[2] > 0
        assert s.collections[0] >= 1
        assert s.pause_max[2] <= s.pause_total[2]
    finally:
        watch.uninstall()
    assert watch._on_collection not in gc.callbacks
    watch.uninstall()  # twice is harmless


def test_collector_stats_without_a_watch_counts_collections(clean_collector: None) -> None:
    s = collector_stats()
    assert s.timed is False
    assert len(s.collections) == 3 and sum(s.collections) > 0

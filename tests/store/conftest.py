"""The ``world`` fixture of the SQLite store tests (see storeworld.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storeworld import World

from plugbroker.clock import ManualClock


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A restartable vhost on a store in ``tmp_path/store``; closed at the end."""
    w = World(tmp_path / "store", ManualClock())
    yield w
    w.store.close()
    for db in w.zombies:
        db.close()

"""The durable store behind the broker.

:class:`Store` (in :mod:`plugbroker.store.base`) is the interface the domain calls and the records
it returns at start; :class:`MemoryStore` keeps nothing (a broker with no ``<store>``, tests of
the domain); :class:`plugbroker.store.sqlite.SQLiteStore` keeps durable state in an embedded SQLite
database. The core rebuilds the broker from the records (:mod:`plugbroker.core.recovery`).
"""

from __future__ import annotations

from plugbroker.store.base import (
    BindingRecord,
    DelayedRecord,
    ExchangeRecord,
    MessageRecord,
    QueueKey,
    QueueRecord,
    Store,
    StoredTopology,
)
from plugbroker.store.memory import MemoryStore

__all__ = [
    "BindingRecord",
    "DelayedRecord",
    "ExchangeRecord",
    "MemoryStore",
    "MessageRecord",
    "QueueKey",
    "QueueRecord",
    "Store",
    "StoredTopology",
]

"""What the broker holds, counted by virtual host, and handing freed heap back to the system.

The memory alarm (:mod:`plugbroker.alarms`) is raised on the process' resident size; this
module's accounting says *who* holds the memory, so the alarm blocks the heaviest tenants
first, and the admin shows it. The figures per object were measured on CPython 3.11 with
bench/attack_bench.py (resident size over 150,000 queues, 41,000 channels, 6,000
connections) and ``tracemalloc`` (bindings, consumers); what they leave out (the
interpreter, allocator slack) is in the resident size, not here.

Freed memory: bodies and headers of 64 KiB or more are allocated with ``mmap`` (glibc's
``M_MMAP_THRESHOLD``, set once at start) and go back to the system as soon as they are freed;
smaller blocks go back through ``malloc_trim(0)``, called once what the accounting holds has
fallen by :data:`TRIM_STEP` since the last call (a purge, a queue deletion, a drained flood).
Python's own small-object arenas are returned only when wholly empty: what a purge leaves in
them is the part of the resident size that does not come back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugbroker.app import Broker
    from plugbroker.domain.queue import Queue
    from plugbroker.session import Connection

log = logging.getLogger("plugbroker.memory")

#: bytes a queued message costs beyond its body and its properties (the message object, its
#: entries in the queue's maps)
MESSAGE_OVERHEAD = 700
#: bytes an empty queue costs (665 MB of resident size for 150,000 queues)
QUEUE_OVERHEAD = 4400
#: bytes a binding costs (a topic binding; a direct one costs about half)
BINDING_OVERHEAD = 1100
#: bytes an idle connection costs (31 MB for 6,000), each of its channels (55 MB for 41,000)
#: and each consumer
CONNECTION_OVERHEAD = 5200
CHANNEL_OVERHEAD = 1400
CONSUMER_OVERHEAD = 1000
#: what the accounting holds falling by this much since the last trim calls ``malloc_trim``
TRIM_STEP = 64 * 1024 * 1024
#: blocks of this size or more are mapped on their own (``M_MMAP_THRESHOLD``), so that freeing
#: a large body or header gives the memory back at once
MMAP_THRESHOLD = 64 * 1024
_M_MMAP_THRESHOLD = -3


def _libc() -> Any:
    try:
        name = ctypes.util.find_library("c")
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim(libc: Any) -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where there is none."""
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    return lambda: fn(0) and None


def map_large_blocks(libc: Any) -> bool:
    """Have glibc map blocks of :data:`MMAP_THRESHOLD` or more on their own (True: done)."""
    fn = getattr(libc, "mallopt", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class Trimmer:
    """Calls ``malloc_trim(0)`` once the accounting has fallen by ``step`` since the last call
    (or since its highest figure after it)."""

    def __init__(self, step: int = TRIM_STEP) -> None:
        libc = _libc()
        self.trim = _malloc_trim(libc) if libc is not None else None
        self.large_blocks_mapped = map_large_blocks(libc) if libc is not None else False
        self.step = step
        self.mark = 0
        #: calls made and the seconds the last one took (admin, metrics, the bench)
        self.calls = 0
        self.last_seconds = 0.0

    def update(self, held: int) -> bool:
        """The accounting now holds ``held`` bytes; trim if it fell far enough (True: did)."""
        if held > self.mark:
            self.mark = held
            return False
        if self.trim is None or held >= self.mark - self.step:
            return False
        self.mark = held
        started = time.perf_counter()
        self.trim()
        self.calls += 1
        self.last_seconds = time.perf_counter() - started
        log.debug("malloc_trim(0) took %.1f ms", self.last_seconds * 1000)
        return True


def queue_bytes(q: Queue) -> int:
    """What queue ``q`` holds: its messages' bodies (less those a store paged out), their
    properties (headers), a fixed cost per message, and the queue itself."""
    n = len(q.held)
    if not n:
        return QUEUE_OVERHEAD
    body = q.bytes
    paged = getattr(q.ready, "paged", 0)
    if paged > 0:
        body -= body * min(paged, n) // n
    return QUEUE_OVERHEAD + body + q.header_bytes + n * MESSAGE_OVERHEAD


def connection_bytes(conn: Connection) -> int:
    """What connection ``conn`` holds: bodies still arriving, unparsed input, unsent output, and
    the connection, its channels and their consumers."""
    channels = conn.channels
    consumers = sum(len(ch.consumers) for ch in channels.values())
    return (
        conn.held_bytes()
        + CONNECTION_OVERHEAD
        + len(channels) * CHANNEL_OVERHEAD
        + consumers * CONSUMER_OVERHEAD
    )


def by_vhost(broker: Broker) -> dict[str, int]:
    """Bytes held per virtual host: its queues and bindings, and its connections
    (``""``: connections still logging in). O(queues + connections + channels)."""
    held: dict[str, int] = {}
    for name, vh in broker.vhosts.items():
        total = vh.binding_count * BINDING_OVERHEAD
        for q in vh.queues.values():
            total += queue_bytes(q)
        held[name] = total
    for conn in broker.connections.values():
        where = conn.vhost
        key = where.name if where is not None else ""
        held[key] = held.get(key, 0) + connection_bytes(conn)
    return held


def heaviest(held: dict[str, int], spare: int) -> frozenset[str]:
    """The virtual hosts to block: the heaviest first, until those left hold less than
    ``spare`` bytes together."""
    left = sum(held.values())
    chosen: set[str] = set()
    for name, n in sorted(held.items(), key=lambda kv: -kv[1]):
        if left < spare:
            break
        chosen.add(name)
        left -= n
    return frozenset(chosen)


def top(held: dict[str, int], n: int = 3) -> Iterable[tuple[str, int]]:
    """The ``n`` heaviest entries of ``held``."""
    return sorted(held.items(), key=lambda kv: -kv[1])[:n]


__all__ = [
    "BINDING_OVERHEAD",
    "CHANNEL_OVERHEAD",
    "CONNECTION_OVERHEAD",
    "CONSUMER_OVERHEAD",
    "MESSAGE_OVERHEAD",
    "QUEUE_OVERHEAD",
    "TRIM_STEP",
    "Trimmer",
    "by_vhost",
    "connection_bytes",
    "heaviest",
    "queue_bytes",
]

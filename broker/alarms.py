"""Resource alarms: memory, disk and store, raised and cleared independently.

While any alarm is raised, publishing connections are blocked: they get connection.blocked
(when they advertised the capability) and the broker stops reading from them; consumers keep
being served, so queues can drain. The reason a client sees names the resources as RabbitMQ
does: ``low on memory``, ``low on disk``, ``low on memory & disk`` (the store's write failure
counts as disk).

:class:`ResourceMonitor` raises and clears the memory and disk alarms from a timer on the
broker's clock; the store raises its own through ``Store.attach(clock, on_alarm)``.

What the memory alarm counts (:meth:`ResourceMonitor.memory_used`), O(queues + connections):

* the process' resident size when the broker started (the interpreter, its modules, the
  recovered state): the watermark bounds the whole process, as RabbitMQ's does;
* queued messages: each queue's byte total (kept as messages come and go) plus a fixed
  per-message overhead (:data:`MESSAGE_OVERHEAD`), less the bodies a store has paged out;
* message bodies still arriving (the codec's ``partial_bytes``) and unparsed input;
* output not yet written to the socket (the transport's write buffer).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugbroker.app import Broker

log = logging.getLogger("plugbroker.alarms")

#: the alarm names and the resource each one blocks for
MEMORY = "memory"
DISK = "disk"
STORE = "store"
RESOURCE = {MEMORY: "memory", DISK: "disk", STORE: "disk"}

#: the memory alarm clears below this fraction of the high watermark
LOW_WATERMARK_RATIO = 0.9
#: bytes a queued message costs beyond its body (the message object, its properties, its
#: entries in the queue's maps); measured with bench/flood_bench.py on CPython 3.12
MESSAGE_OVERHEAD = 700
#: the memory check's period; it stretches so that a check costs at most 2% of the loop
MEMORY_CHECK_PERIOD = 0.1
MEMORY_CHECK_MAX_PERIOD = 1.0
#: the disk check's period
DISK_CHECK_PERIOD = 1.0
#: the least input between two checks the input triggers (below the watermark)
INGEST_MIN_ROOM = 256 * 1024
#: while an alarm is raised, input re-checks memory at most once per this many bytes read
INGEST_RECHECK = 16 * 1024 * 1024
#: memory used falling by this much since the last trim hands freed heap pages back to the
#: system (``malloc_trim``): freed bodies otherwise stay in the process' heap
TRIM_STEP = 64 * 1024 * 1024


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``, or None where there is none."""
    try:
        name = ctypes.util.find_library("c")
        if not name:
            return None
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    return lambda: fn(0) and None


@dataclass(frozen=True, slots=True)
class Alarm:
    name: str
    #: what the log and admin show: the measured value and the limit
    detail: str
    #: wall-clock seconds (the broker's clock) when it was raised
    since: float


def blocked_reason(alarms: dict[str, Alarm]) -> str | None:
    """The text connection.blocked carries while ``alarms`` are raised (None: none are)."""
    if not alarms:
        return None
    resources = []
    for name in (MEMORY, DISK, STORE):
        if name in alarms and RESOURCE[name] not in resources:
            resources.append(RESOURCE[name])
    return "low on " + " & ".join(resources)


def physical_memory() -> int | None:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if lower."""
    total: int | None = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
        break
    return total


def rss_bytes() -> int | None:
    """This process' resident set size (Linux), for the admin view and metrics only."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop returns


class ResourceMonitor:
    """Checks memory and free disk space on the broker's timer heap (its clock)."""

    #: count the process' RSS at start in the memory used (False for a broker that shares its
    #: process with something else, e.g. a test run, whose size is not the broker's)
    count_start_rss = True

    def __init__(self, broker: Broker, *, statvfs: Callable[[str], Any] = os.statvfs) -> None:
        self.broker = broker
        #: replaceable (tests): ``os.statvfs``'s signature
        self.statvfs = statvfs
        limits = broker.limits
        if limits.memory_high_watermark_bytes is not None:
            self.high_watermark: int | None = limits.memory_high_watermark_bytes
        else:
            phys = physical_memory()
            frac = limits.memory_high_watermark or 0.4
            self.high_watermark = int(phys * frac) if phys else None
        self.low_watermark = (
            int(self.high_watermark * LOW_WATERMARK_RATIO) if self.high_watermark else None
        )
        self.disk_free_limit = limits.disk_free_limit
        store_dir = getattr(broker.store, "dir", None)
        #: the directory whose filesystem the disk check watches (None: no store on disk)
        self.disk_path: str | None = str(store_dir) if store_dir is not None else None
        self.memory_used_last = 0
        #: the process' RSS when the checks started (counted in :meth:`memory_used`)
        self.baseline = 0
        self.disk_free_last: int | None = None
        self.memory_period = MEMORY_CHECK_PERIOD
        #: bytes read from clients since the last memory check (:meth:`Connection.data_received`
        #: adds to it); past :attr:`ingest_room` the memory check runs at once, so a burst cannot
        #: overshoot the watermark by more than one read between two timed checks
        self.ingested = 0
        self.ingest_room = 1 << 62
        self._trim = _malloc_trim()
        self._trim_mark = 0
        self._timers: list[Any] = []
        self.running = False

    # ------------------------------------------------------------------ scheduling

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        self.baseline = (rss_bytes() or 0) if self.count_start_rss else 0
        high = self.high_watermark
        if high is not None and self.baseline >= (self.low_watermark or high):
            log.warning(
                "memoryHighWatermark %s is not above the process' size at start (%s): the "
                "memory alarm will stay raised",
                format_bytes(high),
                format_bytes(self.baseline),
            )
        self._memory_tick()
        if self.disk_path is not None:
            self._disk_tick()

    def stop(self) -> None:
        self.running = False
        for t in self._timers:
            self.broker.timers.cancel(t)
        self._timers.clear()

    def _memory_tick(self) -> None:
        if not self.running:
            return
        started = time.perf_counter()
        self.check_memory()
        self.broker.check_stalled_bodies()
        cost = time.perf_counter() - started
        self.memory_period = min(MEMORY_CHECK_MAX_PERIOD, max(MEMORY_CHECK_PERIOD, 50 * cost))
        self._timers = [t for t in self._timers if not t.cancelled]
        self._timers.append(self.broker.timers.call_later(self.memory_period, self._memory_tick))

    def _disk_tick(self) -> None:
        if not self.running:
            return
        self.check_disk()
        self._timers = [t for t in self._timers if not t.cancelled]
        self._timers.append(self.broker.timers.call_later(DISK_CHECK_PERIOD, self._disk_tick))

    # ------------------------------------------------------------------ checks

    def memory_used(self) -> int:
        """What the broker holds, in bytes (see the module's docstring): O(queues + conns)."""
        total = self.baseline
        overhead = MESSAGE_OVERHEAD
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                n = len(q.held)
                if not n:
                    continue
                body = q.bytes
                paged = getattr(q.ready, "paged", 0)
                if paged > 0:
                    body -= body * min(paged, n) // n
                total += body + n * overhead
        for conn in self.broker.connections.values():
            total += conn.held_bytes()
        return total

    def check_memory(self) -> int:
        used = self.memory_used_last = self.memory_used()
        self.ingested = 0
        high = self.high_watermark
        if self._trim is not None:
            if used > self._trim_mark:
                self._trim_mark = used
            elif used < self._trim_mark - TRIM_STEP:
                self._trim_mark = used
                self._trim()
        if high is None:
            return used
        self.ingest_room = max(high - used, INGEST_MIN_ROOM)
        raised = MEMORY in self.broker.alarms
        if not raised and used > high:
            self.broker.raise_alarm(
                MEMORY,
                f"memory used {format_bytes(used)} is above the high watermark "
                f"{format_bytes(high)}",
            )
        elif raised and self.low_watermark is not None and used < self.low_watermark:
            self.broker.clear_alarm(
                MEMORY,
                f"memory used {format_bytes(used)} is below the low watermark "
                f"{format_bytes(self.low_watermark)}",
            )
        if MEMORY in self.broker.alarms:
            self.ingest_room = max(self.ingest_room, INGEST_RECHECK)
        return used

    def check_disk(self) -> int | None:
        if self.disk_path is None:
            return None
        try:
            st = self.statvfs(self.disk_path)
        except OSError as exc:
            log.warning("disk free space check on %s failed: %s", self.disk_path, exc)
            return None
        free = int(st.f_bavail * st.f_frsize)
        self.disk_free_last = free
        limit = self.disk_free_limit
        raised = DISK in self.broker.alarms
        if not raised and free < limit:
            self.broker.raise_alarm(
                DISK,
                f"free disk space {format_bytes(free)} on {self.disk_path} is below the limit "
                f"{format_bytes(limit)}",
            )
        elif raised and free >= limit:
            self.broker.clear_alarm(
                DISK,
                f"free disk space {format_bytes(free)} on {self.disk_path} is back at or above "
                f"the limit {format_bytes(limit)}",
            )
        return free


__all__ = [
    "DISK",
    "LOW_WATERMARK_RATIO",
    "MEMORY",
    "MESSAGE_OVERHEAD",
    "STORE",
    "Alarm",
    "ResourceMonitor",
    "blocked_reason",
    "physical_memory",
    "rss_bytes",
]

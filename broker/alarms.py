"""Resource alarms: memory, disk and store, raised and cleared independently.

While any alarm is raised, publishing connections are blocked: they get connection.blocked
(when they advertised the capability) and the broker stops reading from them; consumers keep
being served, so queues can drain. The reason a client sees names the resources as RabbitMQ
does: ``low on memory``, ``low on disk``, ``low on memory & disk`` (the store's write failure
counts as disk).

:class:`ResourceMonitor` raises and clears the memory and disk alarms from a timer on the
broker's clock; the store raises its own through ``Store.attach(clock, on_alarm)``.

The memory alarm watches the process' resident set size (RSS, read from ``/proc/self/statm``),
as RabbitMQ's watches the memory its VM holds: message bodies and headers, queues, bindings,
channels, connections, the interpreter and the allocator's slack all count. RSS is read every
:data:`MEMORY_CHECK_PERIOD` and whenever clients have sent a share of the room left below the
watermark (O(1)); the accounting of :mod:`plugbroker.memory` (what each virtual host's queues and
connections hold, O(queues + connections)) runs at a period stretched to its cost and chooses
whom the alarm blocks: the heaviest virtual hosts, until those left hold less than
:data:`SPARE_SHARE` of the watermark together. If the resident size still rises to
:data:`BLOCK_ALL_RATIO` times the watermark, the alarm blocks every connection. Where there is no
RSS to read (not Linux, or a broker sharing its process with a test run), the alarm counts the
accounting alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugbroker import memory
from plugbroker.memory import MESSAGE_OVERHEAD, Trimmer

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
#: the memory alarm blocks every connection once the resident size reaches this multiple of the
#: high watermark (it blocks the heaviest virtual hosts first)
BLOCK_ALL_RATIO = 1.1
#: the virtual hosts the memory alarm spares hold less than this share of the watermark together
SPARE_SHARE = 0.1
#: the RSS check's period
MEMORY_CHECK_PERIOD = 0.1
#: the accounting's least and greatest period; in between, it stretches so that it costs at most
#: 2% of the loop
ACCOUNTING_PERIOD = 0.1
ACCOUNTING_MAX_PERIOD = 2.0
#: the disk check's period
DISK_CHECK_PERIOD = 1.0
#: input re-checks memory at least this often (bytes), and at most once per this many bytes
#: while an alarm is raised; below the watermark, once per :data:`INGEST_SHARE` of the room left
INGEST_MIN_ROOM = 256 * 1024
INGEST_RECHECK = 16 * 1024 * 1024
INGEST_SHARE = 4


class RssReader:
    """This process' resident set size, read from ``/proc/self/statm`` through a descriptor
    kept open (one ``pread``: a few microseconds)."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/self/statm", os.O_RDONLY)
        self.page = os.sysconf("SC_PAGE_SIZE")

    def __call__(self) -> int | None:
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) * self.page
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        os.close(self.fd)


def rss_reader() -> Callable[[], int | None] | None:
    """An :class:`RssReader`, or None where there is no ``/proc/self/statm``."""
    try:
        return RssReader()
    except OSError:
        return None


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
    """This process' resident set size (Linux), read once (the alarm uses an :class:`RssReader`)."""
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

    #: watch the process' resident size (False for a broker that shares its process with
    #: something else, e.g. a test run, whose size is not the broker's: the accounting alone
    #: counts then)
    watch_rss = True

    def __init__(self, broker: Broker, *, statvfs: Callable[[str], Any] = os.statvfs) -> None:
        self.broker = broker
        #: replaceable (tests): ``os.statvfs``'s signature
        self.statvfs = statvfs
        #: replaceable (tests): the process' resident size in bytes (None: not known)
        self.read_rss: Callable[[], int | None] | None = rss_reader() if self.watch_rss else None
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
        #: what the memory alarm last compared with the watermark: the resident size (or the
        #: accounting, if it is larger or there is no resident size)
        self.memory_used_last = 0
        #: the accounting's last figures: in total and by virtual host
        self.accounted_last = 0
        self.held_by_vhost: dict[str, int] = {}
        self.disk_free_last: int | None = None
        self.accounting_period = ACCOUNTING_PERIOD
        self._accounting_due = 0.0
        #: bytes read from clients since the last memory check (:meth:`Connection.data_received`
        #: adds to it); past :attr:`ingest_room` the memory check runs at once, so a burst cannot
        #: overshoot the watermark by more than one read between two timed checks
        self.ingested = 0
        self.ingest_room = 1 << 62
        self.trimmer = Trimmer()
        self._timers: list[Any] = []
        self.running = False

    # ------------------------------------------------------------------ scheduling

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        high = self.high_watermark
        size = self.read_rss() if self.read_rss is not None else None
        if high is not None and size is not None and size >= (self.low_watermark or high):
            log.warning(
                "memoryHighWatermark %s is not above the process' size at start (%s): the "
                "memory alarm will stay raised",
                format_bytes(high),
                format_bytes(size),
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
        now = self.broker.clock.monotonic()
        if now >= self._accounting_due or self.read_rss is None:
            started = time.perf_counter()
            self.check_memory()
            self.broker.check_stalled_bodies()
            cost = time.perf_counter() - started
            self.accounting_period = min(ACCOUNTING_MAX_PERIOD, max(ACCOUNTING_PERIOD, 50 * cost))
            self._accounting_due = now + self.accounting_period
        else:
            self.check_rss()
        self._timers = [t for t in self._timers if not t.cancelled]
        self._timers.append(self.broker.timers.call_later(MEMORY_CHECK_PERIOD, self._memory_tick))

    def _disk_tick(self) -> None:
        if not self.running:
            return
        self.check_disk()
        self._timers = [t for t in self._timers if not t.cancelled]
        self._timers.append(self.broker.timers.call_later(DISK_CHECK_PERIOD, self._disk_tick))

    # ------------------------------------------------------------------ checks

    def memory_used(self) -> int:
        """What the accounting says the broker holds, in bytes (:mod:`plugbroker.memory`):
        O(queues + connections)."""
        return sum(memory.by_vhost(self.broker).values())

    def ingest(self, n: int) -> None:
        """``n`` bytes were read from a client: check memory once enough came in."""
        self.ingested += n
        if self.ingested > self.ingest_room:
            self.check_rss()

    def check_rss(self) -> int | None:
        """The O(1) check: read the resident size, and run the full :meth:`check_memory` only
        if the alarm may change (None: there is no resident size; the full check ran)."""
        self.ingested = 0
        rss = self.read_rss() if self.read_rss is not None else None
        high = self.high_watermark
        if rss is None or high is None:
            self.check_memory()
            return None
        used = self.memory_used_last = max(rss, self.accounted_last)
        raised = MEMORY in self.broker.alarms
        if (
            (not raised and used > high)
            or (raised and self.low_watermark is not None and used < self.low_watermark)
            or (raised and used >= high * BLOCK_ALL_RATIO and self.broker.memory_scope)
        ):
            self.check_memory()
        else:
            self._set_room(used, raised)
        return rss

    def check_memory(self) -> int:
        """The full check: the accounting (whom to block), the resident size, the alarm."""
        held = self.held_by_vhost = memory.by_vhost(self.broker)
        accounted = self.accounted_last = sum(held.values())
        self.trimmer.update(accounted)
        rss = self.read_rss() if self.read_rss is not None else None
        used = self.memory_used_last = max(rss or 0, accounted)
        self.ingested = 0
        high = self.high_watermark
        if high is None:
            return used
        raised = MEMORY in self.broker.alarms
        if used > high:
            if used >= high * BLOCK_ALL_RATIO:
                scope = None
            else:
                scope = memory.heaviest(held, int(high * SPARE_SHARE))
            self.broker.raise_alarm(MEMORY, self._detail(used, held), scope or None)
        elif raised and self.low_watermark is not None and used < self.low_watermark:
            self.broker.clear_alarm(
                MEMORY,
                f"memory used {format_bytes(used)} is below the low watermark "
                f"{format_bytes(self.low_watermark)}",
            )
        self._set_room(used, MEMORY in self.broker.alarms)
        return used

    def _detail(self, used: int, held: dict[str, int]) -> str:
        heavy = ", ".join(f"'{name}' {format_bytes(n)}" for name, n in memory.top(held) if name)
        return (
            f"memory used {format_bytes(used)} is above the high watermark "
            f"{format_bytes(self.high_watermark or 0)} (heaviest vhosts: {heavy or 'none'})"
        )

    def _set_room(self, used: int, raised: bool) -> None:
        high = self.high_watermark
        if high is None:
            self.ingest_room = 1 << 62
        elif raised:
            self.ingest_room = INGEST_RECHECK
        else:
            self.ingest_room = max((high - used) // INGEST_SHARE, INGEST_MIN_ROOM)

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
    "RssReader",
    "blocked_reason",
    "physical_memory",
    "rss_bytes",
]

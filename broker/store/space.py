"""Giving disk space back while the broker runs, in bounded steps on the store's writer thread.

SQLite never shrinks a database file by itself: the pages of deleted rows go on a free list and
are reused by later writes, and the write-ahead log keeps its size once grown. A broker whose
disk filled up (the disk alarm blocks publishers) would get no space back as consumers drain
its queues, and the alarm would stay raised until a restart. So the store:

* keeps the database in ``auto_vacuum=INCREMENTAL`` mode (set when the file is created; an
  older file is switched over once, with a ``VACUUM``, when it is first opened);
* after a batch that deleted rows, looks at the free list (two cheap pragmas); when at least
  :data:`MIN_FREE_PAGES` pages and a :data:`FREE_FRACTION` of the file are free, it hands them
  back to the filesystem, :data:`STEP_PAGES` pages per step (``PRAGMA incremental_vacuum``);
* then checkpoints and truncates the write-ahead log (``wal_checkpoint(TRUNCATE)``), which is
  when the file really shrinks; the log is also truncated whenever it grows past
  :data:`WAL_LIMIT`.

Each step is one short transaction of its own. Steps run between the writer's batches: one
after each batch while work is left, and more while nothing else is waiting, so a publisher's
confirm never waits behind more than one step. Free pages below the thresholds stay for reuse
(a queue that is filled and drained over and over does not move pages back and forth).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

log = logging.getLogger("plugbroker.store")

#: pages handed back per step (4 MiB with SQLite's default 4 KiB pages)
STEP_PAGES = 1024
#: hand free pages back once at least this many are free...
MIN_FREE_PAGES = 256
#: ...and they are at least this fraction of the file
FREE_FRACTION = 0.25
#: truncate the write-ahead log once it is larger than this many bytes
WAL_LIMIT = 16 * 1024 * 1024

_INCREMENTAL = 2  # PRAGMA auto_vacuum value


def set_mode(db: sqlite3.Connection) -> None:
    """On a connection just opened, before anything else: a new database is created in
    incremental auto-vacuum mode (an existing one is switched by :func:`prepare`)."""
    db.execute(f"PRAGMA auto_vacuum={_INCREMENTAL}")


def prepare(db: sqlite3.Connection, file: Path) -> bool:
    """Put the database of ``file`` in incremental auto-vacuum mode; True when it is.

    A file in another mode is rewritten once (``VACUUM``, which needs about as much free space
    as the file takes); if that fails, the store works as before: free pages are reused, not
    given back, and a warning says so."""
    if db.execute("PRAGMA auto_vacuum").fetchone()[0] == _INCREMENTAL:
        return True
    db.execute(f"PRAGMA auto_vacuum={_INCREMENTAL}")
    if not db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
        return True
    size = file.stat().st_size
    log.warning(
        "store %s: rewriting the file once (%.1f MiB) so that it can give space back as "
        "messages are consumed",
        file,
        size / 1048576,
    )
    try:
        db.execute("VACUUM")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as exc:
        log.warning(
            "store %s: could not be rewritten (%s); it will reuse the space of consumed "
            "messages but not give it back to the filesystem until it is rewritten at a "
            "later start",
            file,
            exc,
        )
        return False
    return bool(db.execute("PRAGMA auto_vacuum").fetchone()[0] == _INCREMENTAL)


class SpaceKeeper:
    """The writer thread's bookkeeping for :func:`step` (see the module's docstring)."""

    def __init__(self, db: sqlite3.Connection, file: Path) -> None:
        self.db = db
        self.file = file
        self.wal = file.with_name(file.name + "-wal")
        #: rows were deleted since the free list was last looked at
        self.dirty = True
        #: a pass handing free pages back is under way
        self.vacuuming = False
        #: the write-ahead log is to be truncated at the next step
        self.truncate = False
        #: bytes of the file when the current pass started (for its log line)
        self._start_bytes = 0
        #: steps run and bytes given back (tests, the benchmark)
        self.steps = 0
        self.pages_freed = 0
        self.truncations = 0

    def deleted(self) -> None:
        """A committed batch deleted rows: free pages may be worth handing back."""
        self.dirty = True

    @property
    def pending(self) -> bool:
        return self.dirty or self.vacuuming or self.truncate

    def step(self) -> bool:
        """One bounded step; True when more steps are due. Call outside any transaction."""
        db = self.db
        try:
            # (flags are set before others are cleared: ``pending`` is read from other threads)
            if self.dirty:
                free, pages = self._free_pages()
                if free >= MIN_FREE_PAGES and free >= FREE_FRACTION * pages:
                    if not self.vacuuming:
                        # the log first: its space may be what moving pages needs
                        self._start_bytes = self._file_bytes() + self._wal_bytes()
                        self.truncate = True
                    self.vacuuming = True
                elif self._wal_bytes() > WAL_LIMIT:
                    self.truncate = True
                self.dirty = False
            if self.truncate:
                if db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                    # a reader is in the way: try again after the next batch
                    self.dirty = True
                    self.vacuuming = self.truncate = False
                    return False
                self.truncate = False
                self.truncations += 1
                if self.vacuuming:
                    return True
                if self._start_bytes:
                    now = self._file_bytes() + self._wal_bytes()
                    log.info(
                        "store %s: gave back %.1f MiB to the filesystem (file now %.1f MiB)",
                        self.file,
                        max(self._start_bytes - now, 0) / 1048576,
                        now / 1048576,
                    )
                    self._start_bytes = 0
                return False
            if self.vacuuming:
                before = self._free_pages()[0]
                db.executescript(f"PRAGMA incremental_vacuum({STEP_PAGES})")
                self.steps += 1
                after = self._free_pages()[0]
                self.pages_freed += max(before - after, 0)
                if after == 0 or after >= before:
                    self.truncate = True  # the file shrinks at this checkpoint
                    self.vacuuming = False
                elif self._wal_bytes() > WAL_LIMIT:
                    self.truncate = True
                return True
        except (sqlite3.Error, OSError) as exc:
            # e.g. the disk is full: stop here, try again after the next batch
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            log.warning("store %s: giving space back failed (%s); will try again", self.file, exc)
            self.dirty = True
            self.vacuuming = self.truncate = False
        return False

    def _free_pages(self) -> tuple[int, int]:
        db = self.db
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        return int(free), int(pages)

    def _file_bytes(self) -> int:
        try:
            return os.stat(self.file).st_size
        except OSError:
            return 0

    def _wal_bytes(self) -> int:
        try:
            return os.stat(self.wal).st_size
        except OSError:
            return 0


__all__ = [
    "FREE_FRACTION",
    "MIN_FREE_PAGES",
    "STEP_PAGES",
    "WAL_LIMIT",
    "SpaceKeeper",
    "prepare",
    "set_mode",
]

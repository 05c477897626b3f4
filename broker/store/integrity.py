"""What the SQLite store checks so that damage is found, not delivered.

* **A checksum per stored message.** Each message row carries a CRC-32 of its raw properties
  and body (``zlib.crc32``: in the standard library, about 1 GB/s, computed on the store's
  writer thread, never on the event loop). It is checked wherever a body comes back from disk:
  when recovery reads a queue's messages, when a paged body is read back ahead of dispatch, and
  when a single body is read on demand. A row written before checksums existed has none
  (``NULL``) and is not checked.
* **A row count kept in the database.** The writer keeps the number of message rows in the
  ``meta`` table, in the same transaction as the rows it adds and deletes. At start, fewer rows
  than that count means rows were deleted behind the broker's back: the store is refused (or,
  with ``acceptLoss``, started with a warning), whatever the marker file beside the database
  says or whether it is there at all.
* **The file's own size.** A database file shorter than the page count in its header was
  truncated (checked only when no write-ahead log could still complete it).
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

#: the ``meta`` key holding the number of rows of the ``messages`` table
ROWS_KEY = "message_rows"


def checksum(properties: bytes, body: bytes) -> int:
    """The checksum stored with a message: CRC-32 of its raw properties, then its body."""
    return zlib.crc32(body, zlib.crc32(properties))


def intact(crc: int | None, properties: bytes, body: bytes) -> bool:
    """Whether a row read back matches its checksum (a row without one is taken as intact)."""
    return crc is None or zlib.crc32(body, zlib.crc32(properties)) == crc


def stored_rows(db: sqlite3.Connection) -> int | None:
    """The message row count the writer last committed, None when the store keeps none."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (ROWS_KEY,)).fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except (TypeError, ValueError):
        return None


def count_rows(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM messages").fetchone()[0])


def set_rows(db: sqlite3.Connection, n: int) -> None:
    """Inside the caller's transaction: the message row count is now ``n``."""
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (ROWS_KEY, str(n)))


def missing_rows(db: sqlite3.Connection) -> tuple[int, int] | None:
    """``(rows held, rows counted)`` when the table holds fewer message rows than the count the
    writer committed with them, else None."""
    expected = stored_rows(db)
    held = count_rows(db)
    if expected is not None and held < expected:
        return held, expected
    return None


def check_rows(db: sqlite3.Connection, loss: Callable[[str], None]) -> int:
    """At start: ``loss(problem)`` (which refuses the start, or logs when the loss is
    accepted) if message rows are missing against the kept count; then the count is made
    what the table holds. Returns that number of rows."""
    missing = missing_rows(db)
    if missing is not None:
        loss(
            f"the store holds {missing[0]} persistent messages where its own count says "
            f"{missing[1]}: message rows were deleted behind the broker's back"
        )
    rows = count_rows(db)
    if stored_rows(db) != rows:
        db.execute("BEGIN IMMEDIATE")
        set_rows(db, rows)
        db.execute("COMMIT")
    return rows


def header_bytes(path: Path) -> int | None:
    """The size the header of SQLite database ``path`` gives it (page size times page count), or
    None when the header is unreadable or its page count is not valid (an older writer)."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError:
        return None
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        return None
    (page_size,) = struct.unpack_from(">H", head, 16)
    if page_size == 1:
        page_size = 65536
    (change,) = struct.unpack_from(">I", head, 24)
    (pages,) = struct.unpack_from(">I", head, 28)
    (valid_for,) = struct.unpack_from(">I", head, 92)
    if not pages or change != valid_for:
        return None
    return int(page_size) * int(pages)


__all__ = [
    "ROWS_KEY",
    "check_rows",
    "checksum",
    "count_rows",
    "header_bytes",
    "intact",
    "missing_rows",
    "set_rows",
    "stored_rows",
]

"""A restartable world for store tests: a virtual host on a :class:`SQLiteStore` with the real
domain on a manual clock, and a fake loop collecting what the store schedules.

No sockets: :meth:`SQLiteStore.flush` waits for the writer, and :meth:`FakeLoop.run` runs the
callbacks the writer posted back.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.core.recovery import recover
from plugbroker.domain.exchange import DelayedExchange
from plugbroker.domain.message import Message
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import VirtualHost
from plugbroker.store import sqlite as S
from plugbroker.store.sqlite import SQLiteStore


class FakeLoop:
    def __init__(self) -> None:
        self.ready: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.lock = threading.Lock()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        with self.lock:
            self.ready.append((fn, args))

    call_soon_threadsafe = call_soon

    def run(self) -> int:
        n = 0
        while True:
            with self.lock:
                batch, self.ready = self.ready, []
            if not batch:
                return n
            for fn, args in batch:
                fn(*args)
                n += 1


class World:
    """A vhost on a store, restartable: :meth:`restart` closes the store and recovers a new
    vhost from the same directory."""

    def __init__(self, path: Path, clock: ManualClock) -> None:
        self.path = path
        self.clock = clock
        self.zombies: list[sqlite3.Connection] = []
        self.open()

    def open(self) -> None:
        self.store = SQLiteStore(self.path)
        self.timers = Timers(self.clock)
        self.vh = VirtualHost("/", clock=self.clock, timers=self.timers, store=self.store)
        self.store.attach(self.clock, lambda reason: None)
        self.stats = recover(self.store, {"/": self.vh}, clock=self.clock, ids=self.vh.ids)
        self.loop = FakeLoop()
        self.store.bind_loop(self.loop)

    def sync(self) -> None:
        """Hand over this turn's operations, wait for the commit, run what comes back."""
        self.loop.run()
        assert self.store.flush(10)
        self.loop.run()

    def restart(self, *, graceful: bool = True) -> None:
        if graceful:
            self.store.close()
        else:  # what kill -9 leaves: no checkpoint, no final flush of the pending turn
            self.store._pending.clear()
            self.store._stopping = True
            self.store._wake.set()
            self.store._thread.join(5)
            # a killed process never closes SQLite (closing the last connection would
            # checkpoint and delete the write-ahead log): keep it open until the end
            self.zombies.append(self.store._db)
            os.close(self.store._lock_fd)
        self.open()

    def publish(
        self,
        queue: str,
        body: bytes,
        *,
        persistent: bool = True,
        exchange: str = "",
        headers: dict[str, Any] | None = None,
    ) -> Message:
        props: dict[str, Any] = {"delivery_mode": 2 if persistent else 1}
        if headers:
            props["application_headers"] = headers
        raw = P.encode(props)
        msg = Message.from_publish(
            self.vh.ids.next(),
            exchange,
            queue,
            raw,
            body,
            len(body),
            self.clock.monotonic(),
            self.clock.time(),
        )
        ex = self.vh.exchanges[exchange]
        if isinstance(ex, DelayedExchange):
            self.vh.hold_delayed(ex, msg, DelayedExchange.delay_of(msg))
        else:
            self.vh.deliver_to_queues(self.vh.route(ex, msg), msg)
        return msg

    def rows(self, sql: str = "SELECT count(*) FROM messages") -> Any:
        db = sqlite3.connect(str(self.path / S.DB_NAME))
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()


def bodies(q: Any) -> list[bytes]:
    return [m.body for m in q.ready]


def take_all(world: World, q: Any) -> list[Message]:
    """basic.get until empty, letting the writer read paged bodies back when the head has
    none (q.get() answers None meanwhile)."""
    got = []
    stalls = 0
    while len(q.ready):
        m = q.get()
        if m is None:
            stalls += 1
            assert stalls < 100
            world.sync()
            continue
        got.append(m)
    return got


__all__ = ["FakeLoop", "World", "bodies", "take_all"]

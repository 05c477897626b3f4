"""A disk that fills up recovers by itself: the store lives on a small filesystem of its own
(a tmpfs mounted for the test), a publisher fills it until the disk alarm blocks publishing, a
consumer drains the queue, the store gives the space back while running, and the alarm clears
without a restart. A bystander publishes persistent messages with confirms throughout and
loses none."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from brokerutil import drain_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

from procutil import tmpfs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KB = 1024
MB = 1024 * KB
#: the filesystem the store lives on, and the free space below which the disk alarm is raised
FS_SIZE = 32 * MB
FREE_LIMIT = 10 * MB


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/store`` (where a test broker keeps its store) on a tmpfs of FS_SIZE bytes;
    unmounted after the brokers stopped (this fixture is set up first, torn down last)."""
    mnt = tmp_path / "store"
    with tmpfs(mnt, FS_SIZE) as why:
        if why is not None:
            pytest.skip(why)
        yield mnt


def _amqp(b: Any, **kw: Any) -> amqp.Connection:
    c = amqp.Connection(
        f"127.0.0.1:{b.port}", userid="guest", password="guest", connect_timeout=5, **kw
    )
    c.connect()
    return c


def _until(b: Any, pred: Any, timeout: float) -> float:
    """Wait until ``pred(broker)`` holds on the broker's loop; returns the seconds it took."""
    t0 = time.monotonic()
    while not b.call(lambda: pred(b.broker)):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _disk_low(broker: Any) -> bool:
    """Measure the free space now (the monitor's own check); whether the disk alarm is up."""
    broker.monitor.check_disk()
    return "disk" in broker.alarms


class Bystander(threading.Thread):
    """Another connection publishing small persistent messages with confirms until stopped;
    each publish waits for its confirm (through a block, if one comes)."""

    def __init__(self, b: Any) -> None:
        super().__init__(daemon=True)
        self.conn = _amqp(b, confirm_publish=True)
        self.ch = self.conn.channel()
        self.ch.queue_declare("bystander", durable=True, auto_delete=False)
        self.confirmed = 0
        self.worst = 0.0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                self.ch.basic_publish(
                    amqp.Message(b"b%d" % self.confirmed, delivery_mode=2),
                    routing_key="bystander",
                )
                self.worst = max(self.worst, time.monotonic() - t0)
                self.confirmed += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_filled_store_drained_clears_the_disk_alarm_without_a_restart(
    small_fs: Path, broker_factory: Any
) -> None:
    b = broker_factory(
        store=True, limits=f"<limits><diskFreeLimit>{FREE_LIMIT // MB}MB</diskFreeLimit></limits>"
    )
    assert b.call(lambda br: br.monitor.disk_path, b.broker) == str(small_fs)
    events: list[str] = []
    pub = _amqp(
        b,
        confirm_publish=True,
        on_blocked=lambda reason: events.append(reason),
        on_unblocked=lambda: events.append("unblocked"),
    )
    bystander = Bystander(b)
    bystander.start()
    try:
        ch = pub.channel()
        ch.queue_declare("fill", durable=True, auto_delete=False)
        body = b"x" * (64 * KB)
        sent = 0
        # fill: each publish is confirmed (on disk), then the free space is measured at once,
        # so the alarm is raised as the limit is crossed, before the filesystem is full
        for _ in range(FS_SIZE // len(body)):
            ch.basic_publish(amqp.Message(body, delivery_mode=2), routing_key="fill")
            sent += 1
            if b.call(_disk_low, b.broker):
                break
        assert "disk" in b.call(lambda: dict(b.broker.alarms)), "the filesystem never filled"
        drain_until(pub, lambda: bool(events))
        assert len(events) == 1 and events[0] != "unblocked"  # connection.blocked

        # drain the filled queue from a connection that never publishes
        consumer = _amqp(b)
        cch = consumer.channel()
        got = 0
        while (m := cch.basic_get("fill", no_ack=True)) is not None:
            got += len(m.body)
        assert got == sent * len(body)

        # the store gives the space back by itself; the monitor's own check clears the alarm
        took = _until(b, lambda br: "disk" not in br.alarms, timeout=30)
        print(f"disk alarm cleared {took:.2f} s after the queue was drained")
        drain_until(pub, lambda: events[-1:] == ["unblocked"], timeout=10)
        # and not just a little: nearly all of what the queue took comes back
        _until(b, lambda br: _free(small_fs) > FS_SIZE - 4 * MB, timeout=30)
        # publishing resumes
        ch.basic_publish(amqp.Message(b"after", delivery_mode=2), routing_key="fill")
        assert cch.queue_declare("fill", passive=True).message_count == 1
    finally:
        bystander.stop.set()
        for name in list(b.call(lambda: list(b.broker.alarms))):
            b.call(lambda n=name: b.broker.clear_alarm(n))
        bystander.join(30)
    assert bystander.error is None and not bystander.is_alive()
    assert bystander.confirmed > 0
    print(f"bystander: {bystander.confirmed} confirmed, worst wait {bystander.worst:.2f} s")
    # nothing confirmed is lost, across a restart on the same small filesystem too
    assert cch.queue_declare("bystander", passive=True).message_count == bystander.confirmed
    for c in (pub, consumer, bystander.conn):
        c.close()
    b.stop()
    b2 = broker_factory(store=True)
    conn = _amqp(b2)
    try:
        n = conn.channel().queue_declare("bystander", passive=True).message_count
        assert n == bystander.confirmed
    finally:
        conn.close()

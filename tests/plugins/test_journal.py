"""The journal writer on its own: buffer, batches, Parquet files, rolling, hiding, drops.

No broker and no sockets: events are put in the buffer the way the recorder's hooks do, with a
clock the test moves.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from plugbroker.clock import ManualClock
from plugbroker.plugins import journal as J
from plugbroker.policy import CloseConsumerChannels, IsolateConsumer


class Msg:
    def __init__(self, id: int, size: int = 10, count: int = 0) -> None:
        self.id = id
        self.body_size = size
        self.delivery_count = count


def visible(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))


def hidden(path: Path) -> list[Path]:
    return sorted(path.rglob(".*.parquet"))


def make(tmp_path: Path, clock: ManualClock | None = None, **kw: Any) -> J.Journal:
    clock = clock or ManualClock(wall_offset=1_767_225_600.0)
    kw.setdefault("flush_interval", 3600.0)  # the tests drive the writer with flush()/close()
    return J.Journal(tmp_path / "journal", clock=clock.time, **kw)


def acked(j: J.Journal, mid: int, queue: str = "q") -> None:
    j.append((J.ACKED, j.clock(), "/", queue, "ctag", "conn#1", 1, mid, 10, 0))


def test_schema_is_versioned_in_a_column_and_in_the_file_metadata(tmp_path):
    j = make(tmp_path).start()
    acked(j, 1)
    j.close()
    [f] = visible(j.path)
    schema = pq.read_schema(f)
    assert schema.metadata[J.METADATA_KEY] == str(J.SCHEMA_VERSION).encode()
    assert [n for n in schema.names] == [n for n, _ in J.FIELDS]
    table = J.read_journal(j.path)
    assert set(table.column("schema_version").to_pylist()) == {J.SCHEMA_VERSION}


def test_events_come_out_in_order_with_every_field(tmp_path):
    clock = ManualClock(start=0.0, wall_offset=1_767_225_600.0)
    j = make(tmp_path, clock).start()
    t = clock.time()
    j.append((J.PUBLISHED, t, "/", "ex", "rk", 7, 100, ("a", "b"), None))
    j.append((J.PUBLISHED, t, "/", "ex", "nowhere", 8, 5, (), None))
    j.append(
        (J.DELIVERED, t + 0.5, "/", "a", "ctag", "conn#1", 2, 1, 7, 100, 0, False, False, None)
    )
    due_us = round((t + 30) * 1e6)
    j.append(
        (J.DELIVERED, t + 0.5, "/", "a", "ctag", "conn#1", 2, 2, 9, 10, 0, False, False, due_us)
    )
    j.append((J.DELIVERY_TOUCHED, t + 0.6, "/", "a", "ctag", "conn#1", 2, 2, 9))
    j.append((J.ACKED, t + 0.75, "/", "a", "ctag", "conn#1", 2, 7, 100, 0))
    j.append(
        J.action_event(
            t + 1,
            CloseConsumerChannels(
                vhost="/",
                queue="b",
                policy="Delete",
                reason="messageCount 9 (limit 5)",
                threshold="messageCount",
                configured=5,
                measured=9,
            ),
            "applied",
        )
    )
    j.append(
        J.action_event(
            t + 2,
            IsolateConsumer(
                vhost="/",
                queue="a",
                policy="Isolation",
                reason="no ack",
                threshold="ackTimeout",
                configured=60.0,
                measured=61.5,
                consumer_tag="ctag",
                connection_id="conn#1",
            ),
            "applied",
        )
    )
    j.close()
    rows = [
        r
        for r in J.read_journal(j.path).to_pylist()
        if r["event"] not in ("journal_started", "journal_stopped")
    ]
    assert [r["event"] for r in rows] == [
        "published",
        "published",
        "published",
        "delivered",
        "delivered",
        "touched",
        "acked",
        "policy_action",
        "policy_action",
    ]
    # one row per queue the message was routed to, one row with no queue when unroutable
    assert [(r["queue"], r["message_id"]) for r in rows[:3]] == [("a", 7), ("b", 7), (None, 8)]
    assert rows[2]["reason"] == "unroutable"
    d = rows[3]
    assert (
        d["consumer_tag"],
        d["connection_id"],
        d["channel_id"],
        d["delivery_tag"],
        d["body_size"],
        d["redelivered"],
        d["no_ack"],
    ) == ("ctag", "conn#1", 2, 1, 100, False, False)
    assert d["due_us"] is None
    assert d["ts_us"] == round((t + 0.5) * 1e6)
    # a delivery not due yet carries its due time; a touch names the delivery
    assert (rows[4]["message_id"], rows[4]["due_us"]) == (9, due_us)
    assert (rows[5]["delivery_tag"], rows[5]["message_id"], rows[5]["consumer_tag"]) == (
        2,
        9,
        "ctag",
    )
    assert rows[6]["ts_us"] - d["ts_us"] == 250_000
    close = rows[7]
    assert (
        close["policy"],
        close["action"],
        close["threshold"],
        close["configured"],
        close["measured"],
        close["outcome"],
        close["code"],
    ) == ("Delete", "CloseConsumerChannels", "messageCount", 5.0, 9.0, "applied", 506)
    iso = rows[8]
    assert (iso["action"], iso["consumer_tag"], iso["connection_id"], iso["measured"]) == (
        "IsolateConsumer",
        "ctag",
        "conn#1",
        61.5,
    )
    seqs = [r["seq"] for r in J.read_journal(j.path).to_pylist()]
    assert seqs == sorted(seqs)


def test_a_file_is_hidden_while_written_and_renamed_when_closed(tmp_path):
    j = make(tmp_path).start()
    acked(j, 1)
    j.flush()
    assert visible(j.path) == [] and len(hidden(j.path)) == 1
    j.close()
    assert hidden(j.path) == [] and len(visible(j.path)) == 1
    assert visible(j.path)[0].parent.name.startswith("hour=")
    assert visible(j.path)[0].parent.parent.name.startswith("date=")


def test_files_roll_at_the_hour(tmp_path):
    clock = ManualClock(start=0.0, wall_offset=1_767_225_600.0 + 3600 - 1)  # 00:59:59
    j = make(tmp_path, clock).start()
    acked(j, 1)
    clock.advance(2.0)  # 01:00:01
    acked(j, 2)
    j.close()
    files = visible(j.path)
    assert [f.parent.name for f in files] == ["hour=00", "hour=01"]
    first = pq.read_table(files[0]).column("message_id").to_pylist()
    assert 1 in first and 2 not in first


def test_files_roll_by_size(tmp_path):
    j = make(tmp_path, roll_bytes=1).start()
    for i in range(3):
        acked(j, i)
        j.flush()
    j.close()
    assert len(visible(j.path)) >= 3


def test_files_roll_after_roll_seconds_without_shutdown(tmp_path):
    j = make(tmp_path, flush_interval=0.02, roll_seconds=0.05).start()
    acked(j, 1)
    deadline = time.monotonic() + 5
    while not visible(j.path) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert visible(j.path), "the writer thread should close a file after roll_seconds"
    j.close()


def test_the_writer_thread_writes_in_the_background(tmp_path):
    j = make(tmp_path, flush_interval=0.02, batch_rows=1).start()
    for i in range(100):
        acked(j, i)
    deadline = time.monotonic() + 5
    while j.written < 101 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert j.written >= 101 and not j.buffer  # journal_started + 100 acks
    j.close()


def test_a_full_buffer_drops_counts_and_logs_never_blocks(tmp_path, caplog):
    j = make(tmp_path, max_buffer=10)
    j.path.mkdir(parents=True)
    started = time.perf_counter()
    for i in range(25):
        acked(j, i)
    assert time.perf_counter() - started < 0.5
    assert len(j.buffer) == 10 and j.dropped == 15
    with caplog.at_level(logging.WARNING, logger="plugbroker.plugins.journal"):
        j.start()
        j.close()
    assert any("15 event(s) dropped" in r.getMessage() for r in caplog.records)
    rows = J.read_journal(j.path).to_pylist()
    [drop] = [r for r in rows if r["event"] == "journal_dropped"]
    assert drop["count"] == 15
    [stop] = [r for r in rows if r["event"] == "journal_stopped"]
    assert stop["count"] == 15


def test_the_recorder_hot_path_only_appends(tmp_path):
    clock = ManualClock(wall_offset=1_767_225_600.0)
    j = make(tmp_path, clock)

    class NoBroker:
        """The hot-path hooks must not consult the broker at all."""

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the recorder's hot path looked up {name!r}")

    rec = J.Recorder(NoBroker(), j)  # type: ignore[arg-type]
    rec.broker_message_published(
        vhost="/", exchange="", routing_key="q", message=Msg(1), queues=("q",)
    )
    rec.broker_message_acked(
        vhost="/", queue="q", consumer_tag="c", connection_id="x", channel_id=1, message=Msg(1)
    )
    assert [e[0] for e in j.buffer] == [J.PUBLISHED, J.ACKED]
    assert not j.files and not j.path.exists()  # nothing was written by the hooks


def test_every_event_kind_has_a_layout_and_a_unique_name():
    assert len(set(J.EVENTS)) == len(J.EVENTS) == len(J.LAYOUTS)
    columns = {n for n, _ in J.FIELDS}
    for name, layout in J.LAYOUTS.values():
        assert set(layout) <= columns, name


def test_leftover_hidden_files_are_reported(tmp_path, caplog):
    folder = tmp_path / "journal" / "date=2026-01-01" / "hour=00"
    folder.mkdir(parents=True)
    (folder / ".events-crashed-00001.parquet").write_bytes(b"PAR1")
    with caplog.at_level(logging.WARNING, logger="plugbroker.plugins.journal"):
        j = make(tmp_path).start()
        j.close()
    assert any("did not shut down cleanly" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", sorted(J.LAYOUTS))
def test_each_kind_converts(tmp_path, kind):
    name, layout = J.LAYOUTS[kind]
    sample: dict[str, Any] = {
        "vhost": "/",
        "queue": "q",
        "exchange": "x",
        "routing_key": "k",
        "consumer_tag": "c",
        "connection_id": "n#1",
        "channel_id": 1,
        "message_id": 3,
        "delivery_tag": 4,
        "body_size": 5,
        "delivery_count": 1,
        "redelivered": True,
        "requeue": False,
        "no_ack": False,
        "durable": True,
        "exclusive": False,
        "auto_delete": False,
        "count": 2,
        "code": 200,
        "reason": "r",
        "detail": "d",
        "policy": "p",
        "action": "a",
        "threshold": "t",
        "configured": 1.0,
        "measured": 2.0,
        "outcome": "o",
        "due_us": 1_767_225_630_000_000,
    }
    values = tuple(sample[c] for c in layout)
    if kind == J.PUBLISHED:
        values = values[:5] + (("q",),) + values[6:]
    j = make(tmp_path)
    table = j._to_table([(kind, 1.5) + values], 0)
    [row] = table.to_pylist()
    assert row["event"] == name
    for c in layout:
        assert row[c] == sample[c], c

"""Durability end to end: restarts, kill -9 and a refused store, with real clients.

The kill -9 cycles and the tests that must survive SIGKILL run the broker as a subprocess
(``python3 -m plugbroker run``); the graceful-restart tests use the in-process harness.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import amqp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

from kill9cycle import run_cycle
from procutil import BrokerProcess, write_config

from plugbroker.retry import reconsume_later

pytestmark = pytest.mark.e2e

KILL9_CYCLES = 20


def _channel(port: int) -> tuple[Any, Any]:
    conn = amqp.Connection(f"127.0.0.1:{port}", heartbeat=0)
    conn.connect()
    return conn, conn.channel()


def _restart(broker_factory: Any, b: Any) -> Any:
    b.stop()
    return broker_factory(store=True)


def _drain(ch: Any, queue: str) -> list[Any]:
    out = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = ch.basic_get(queue, no_ack=True)
        if m is None:
            _, left, _ = ch.queue_declare(queue, passive=True)
            if not left:
                return out
            time.sleep(0.01)
            continue
        out.append(m)
    raise AssertionError(f"queue {queue} did not drain")


def test_kill9_cycles_lose_no_confirmed_message(tmp_path: Path) -> None:
    """20 cycles of publish-with-confirms + consume-and-ack, SIGKILL at a seeded random
    moment, restart, drain: every confirmed and unacked message is there."""
    t0 = time.monotonic()
    results = [
        run_cycle(seed, tmp_path / f"cycle{seed}", kill_between=(0.05, 0.5))
        for seed in range(KILL9_CYCLES)
    ]
    elapsed = time.monotonic() - t0
    bad = [r for r in results if not r.ok]
    summary = (
        f"{len(results)} cycles in {elapsed:.1f} s: confirmed "
        f"{sum(r.confirmed for r in results)}, acked {sum(r.acked for r in results)}, "
        f"lost {sum(len(r.lost) for r in results)}, duplicates "
        f"{sum(r.duplicates for r in results)}"
    )
    print(summary)
    assert not bad, f"{summary}; failing: {bad[:2]}"
    assert all(r.confirmed > 0 for r in results), "a cycle was killed before any confirm"


def test_restart_keeps_durable_topology_and_drops_transient(broker_factory: Any) -> None:
    b = broker_factory(store=True)
    conn, ch = _channel(b.port)
    ch.exchange_declare("dx", "topic", durable=True, auto_delete=False)
    ch.exchange_declare("dx2", "direct", durable=True, auto_delete=False)
    ch.exchange_declare("tx", "fanout", durable=False, auto_delete=False)
    ch.queue_declare(
        "dq",
        durable=True,
        auto_delete=False,
        arguments={"x-subscription-type": "failover", "x-message-ttl": 60_000},
    )
    ch.queue_declare("tq", durable=False, auto_delete=False)
    ch.queue_bind("dq", "dx", "a.*")
    ch.queue_bind("tq", "dx", "a.*")
    ch.queue_bind("dq", "tx", "")
    ch.exchange_bind("dx", "dx2", "k")
    conn.close()
    b = _restart(broker_factory, b)

    def topology() -> dict[str, Any]:
        vh = b.broker.vhosts["/"]
        dq = vh.queues["dq"]
        return {
            "exchanges": sorted(n for n in vh.exchanges if n and not n.startswith("amq.")),
            "queues": sorted(vh.queues),
            "dq": (dq.durable, dq.subscription_type, dq.message_ttl, dict(dq.arguments)),
            "dq_bindings": sorted(dq.bindings()),
            "e2e": sorted(
                (b_.source.name, b_.destination.name, b_.routing_key)
                for b_ in vh.exchanges["dx2"].bindings.values()
            ),
        }

    t = b.call(topology)
    assert t["exchanges"] == ["dx", "dx2"]
    assert t["queues"] == ["dq"]
    assert t["dq"] == (
        True,
        "failover",
        60_000,
        {"x-subscription-type": "failover", "x-message-ttl": 60_000},
    )
    assert t["dq_bindings"] == [("dx", "topic", "a.*")]
    assert t["e2e"] == [("dx2", "dx", "k")]
    conn, ch = _channel(b.port)  # and the restored bindings route
    ch.basic_publish(amqp.Message("via dx2", delivery_mode=2), "dx2", "k")
    ch.basic_publish(amqp.Message("via dx", delivery_mode=2), "dx", "a.b")
    assert [m.body for m in _drain(ch, "dq")] == ["via dx"]
    conn.close()


def test_transient_messages_are_gone_after_restart(broker_factory: Any) -> None:
    b = broker_factory(store=True)
    conn, ch = _channel(b.port)
    ch.queue_declare("dq", durable=True, auto_delete=False)
    ch.queue_declare("tq", durable=False, auto_delete=False)
    for i in range(3):
        ch.basic_publish_confirm(amqp.Message(f"persistent {i}", delivery_mode=2), "", "dq")
        ch.basic_publish_confirm(amqp.Message(f"transient {i}", delivery_mode=1), "", "dq")
        ch.basic_publish_confirm(amqp.Message(f"persistent in tq {i}", delivery_mode=2), "", "tq")
    conn.close()
    b = _restart(broker_factory, b)
    conn, ch = _channel(b.port)
    assert [m.body for m in _drain(ch, "dq")] == [f"persistent {i}" for i in range(3)]
    with pytest.raises(amqp.exceptions.NotFound):
        ch.queue_declare("tq", passive=True)
    conn.close()


def test_delivery_count_and_redelivered_survive_kill9(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, tmp_path / "store")
    b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
    try:
        conn, ch = _channel(b.port)
        ch.queue_declare("q", durable=True, auto_delete=False)
        for body in ("counted", "delivered once", "never delivered"):
            ch.basic_publish_confirm(amqp.Message(body, delivery_mode=2), "", "q")
        m = ch.basic_get("q")
        ch.basic_reject(m.delivery_tag, requeue=True)  # delivery count 1
        m = ch.basic_get("q")
        assert m.body == "counted" and m.headers == {"x-delivery-count": 1}
        m2 = ch.basic_get("q")
        assert m2.body == "delivered once" and not m2.delivery_info["redelivered"]
        time.sleep(0.3)  # the delivered flags are written in the next batch
        b.kill9()
        b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
        conn, ch = _channel(b.port)
        got = _drain(ch, "q")
        assert [
            (m.body, m.delivery_info["redelivered"], (m.headers or {}).get("x-delivery-count"))
            for m in got
        ] == [
            ("counted", True, 1),
            ("delivered once", True, None),
            ("never delivered", False, None),
        ]
        conn.close()
    finally:
        b.kill9()


def test_delayed_message_survives_kill9_and_keeps_its_due_time(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, tmp_path / "store")
    b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
    try:
        conn, ch = _channel(b.port)
        ch.exchange_declare(
            "later",
            "x-delayed-message",
            durable=True,
            auto_delete=False,
            arguments={"x-delayed-type": "direct"},
        )
        ch.queue_declare("q", durable=True, auto_delete=False)
        ch.queue_bind("q", "later", "k")
        t_pub = time.monotonic()
        ch.basic_publish_confirm(
            amqp.Message("later", delivery_mode=2, application_headers={"x-delay": 2500}),
            "later",
            "k",
        )
        b.kill9()  # the confirm came back: it is on disk
        b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
        conn, ch = _channel(b.port)
        assert ch.queue_declare("q", passive=True)[1] == 0
        while ch.queue_declare("q", passive=True)[1] == 0:
            assert time.monotonic() - t_pub < 10
            time.sleep(0.05)
        waited = time.monotonic() - t_pub
        assert 2.3 <= waited < 6, waited
        assert [m.body for m in _drain(ch, "q")] == ["later"]
        conn.close()
    finally:
        b.kill9()


def _retry_broker(tmp_path: Path, level: str) -> tuple[Path, Any, Any, Any]:
    """A broker process whose durable queue ``work`` retries after ``level``, holding one
    persistent message that ``basic.get`` has taken (unacked): ``(config, broker, channel,
    message)``."""
    cfg = write_config(
        tmp_path,
        tmp_path / "store",
        vhost=(
            f'<queue name="work" durable="true"><deadLetter><retry><levels>{level}</levels>'
            "</retry></deadLetter></queue>"
        ),
    )
    b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
    _, ch = _channel(b.port)
    ch.queue_declare("work", durable=True, auto_delete=False)
    ch.basic_publish_confirm(amqp.Message("again", delivery_mode=2), "", "work")
    m = ch.basic_get("work")
    assert m is not None
    return cfg, b, ch, m


def test_retry_queue_hold_survives_kill9_and_keeps_its_due_time(tmp_path: Path) -> None:
    cfg, b, ch, m = _retry_broker(tmp_path, "3s")
    try:
        t_pub = time.monotonic()
        # the broker copies it into work-RETRY (level 1: 3 s) and confirms; then the helper acks
        reconsume_later(m)
        # a later confirmed write: the store has the ack too (else the original would come
        # back after the kill as well: a duplicate, never a loss)
        ch.queue_declare("marker", durable=True, auto_delete=False)
        ch.basic_publish_confirm(amqp.Message("m", delivery_mode=2), "", "marker")
        b.kill9()  # confirmed: on disk with its due time
        b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
        conn, ch = _channel(b.port)
        while ch.queue_declare("work", passive=True)[1] == 0:
            assert time.monotonic() - t_pub < 10
            time.sleep(0.05)
        waited = time.monotonic() - t_pub
        assert 2.8 <= waited < 5.5, waited  # the original 3 s, not 3 s after the restart
        [back] = _drain(ch, "work")
        assert back.body == "again" and back.headers["RECONSUMETIMES"] == 1
        assert ch.queue_declare("work-RETRY", passive=True)[1] == 0
        conn.close()
    finally:
        b.kill9()


def test_a_retry_copy_is_confirmed_only_once_the_store_has_it(tmp_path: Path) -> None:
    """The retry request's confirm means the copy is on disk: kill -9 right after it, with no
    other persistent write in between (a later write would flush the store and hide the
    window). The original was never acked: it comes back too (a duplicate, never a loss)."""
    cfg, b, ch, m = _retry_broker(tmp_path, "1s")
    try:
        request = amqp.Message(
            b"",
            application_headers={
                "x-reconsume-channel": ch.channel_id,
                "x-reconsume-tag": m.delivery_tag,
            },
        )
        ch.basic_publish_confirm(request, "amq.retry", "")  # waits for the broker's confirm
        b.kill9()
        b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
        conn, ch = _channel(b.port)
        # the original at once (it was never acked), the copy when its second is over
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            m = ch.basic_get("work", no_ack=True)
            if m is None:
                time.sleep(0.05)  # polling a condition, bounded by the deadline
                continue
            got.append(m)
        times = sorted((x.headers or {}).get("RECONSUMETIMES", 0) for x in got)
        assert [x.body for x in got] == ["again", "again"] and times == [0, 1]
        conn.close()
    finally:
        b.kill9()


def test_tx_commit_ok_means_on_disk(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, tmp_path / "store")
    b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
    try:
        conn, ch = _channel(b.port)
        ch.queue_declare("q", durable=True, auto_delete=False)
        ch.tx_select()
        for i in range(100):
            ch.basic_publish(amqp.Message(str(i), delivery_mode=2), "", "q")
        ch.tx_commit()
        b.kill9()
        b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
        conn, ch = _channel(b.port)
        assert [int(m.body) for m in _drain(ch, "q")] == list(range(100))
        conn.close()
    finally:
        b.kill9()


def test_graceful_stop_flushes_unconfirmed_publishes(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, tmp_path / "store")
    b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
    try:
        conn, ch = _channel(b.port)
        ch.queue_declare("q", durable=True, auto_delete=False)
        n = 5000
        for i in range(n):
            ch.basic_publish(amqp.Message(str(i), delivery_mode=2), "", "q")
        assert ch.queue_declare("q", passive=True)[1] == n  # the broker has them all
        assert b.stop() == 0  # SIGTERM right away: pending writes are flushed on the way out
        b = BrokerProcess(cfg, log=tmp_path / "broker.log").start()
        conn, ch = _channel(b.port)
        assert [int(m.body) for m in _drain(ch, "q")] == list(range(n))
        conn.close()
    finally:
        b.kill9()


def test_corrupt_store_is_refused_with_a_message_naming_the_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    db = store / "plugbroker.db"
    db.write_bytes(b"\x00garbage, not SQLite\x00" * 512)
    cfg = write_config(tmp_path, store)
    proc = subprocess.run(
        [sys.executable, "-m", "plugbroker", "run", "--config", str(cfg), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == 2, proc.stderr
    assert f"plugbroker: {db}: the store is corrupt or unreadable" in proc.stderr
    assert "refusing to start" in proc.stderr
    assert db.read_bytes().startswith(b"\x00garbage")  # never emptied or rewritten

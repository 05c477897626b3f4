"""Store integrity and signals with the broker as a real process (``python3 -m plugbroker run``)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import amqp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procutil import ROOT, BrokerProcess, free_port, write_config

from plugbroker.codec import properties as P
from plugbroker.store import sqlite as S
from plugbroker.store.sqlite import SQLiteStore


def _big_store(store: Path, n: int) -> None:
    """A store holding one durable queue with ``n`` persistent messages, written in bulk."""
    SQLiteStore(store).close()  # the layout and its marker
    db = sqlite3.connect(str(store / S.DB_NAME))
    props = P.encode({"delivery_mode": 2})
    now = time.time()
    with db:
        db.execute("INSERT INTO queues VALUES (1, '/', 'big', 0, ?, 'shared', 0)", (S._table({}),))
        db.executemany(
            "INSERT INTO messages VALUES (?, 1, ?, '', 'big', ?, ?, ?, ?, 0, 0, NULL, 0, NULL)",
            ((i, i, props, b"x" * 64, now, now) for i in range(1, n + 1)),
        )
    db.close()


def _run(config: Path, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugbroker",
            "--log-level",
            "INFO",
            "run",
            "--config",
            str(config),
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
        env=env,
        cwd=str(ROOT),
    )


def _db_open(pid: int, db: Path) -> bool:
    try:
        return any(
            os.readlink(f"/proc/{pid}/fd/{fd}") == str(db) for fd in os.listdir(f"/proc/{pid}/fd")
        )
    except OSError:
        return False


def test_sighup_and_sigterm_during_recovery_do_not_kill_the_broker(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _big_store(store, 300_000)
    config = write_config(tmp_path, store)
    log = tmp_path / "broker.log"
    port = free_port()
    proc = _run(config, port, log)
    try:
        deadline = time.monotonic() + 60
        while not _db_open(proc.pid, store / S.DB_NAME):  # the store is open: recovery is on
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening": recovery finished, the broker lives on
        assert b"listening" in line, (proc.poll(), log.read_text()[-3000:])
        text = log.read_text()
        assert "while starting" in text, text[-3000:]  # the signals came during the start
        conn = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest")
        conn.connect()
        try:
            _, count, _ = conn.channel().queue_declare("big", passive=True)
            assert count == 300_000
        finally:
            conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sigterm_during_recovery_stops_cleanly_once_started(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _big_store(store, 100_000)
    config = write_config(tmp_path, store)
    log = tmp_path / "broker.log"
    proc = _run(config, free_port(), log)
    try:
        deadline = time.monotonic() + 60
        while not _db_open(proc.pid, store / S.DB_NAME):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # it stopped cleanly: the next start is not refused, nothing was lost
    assert '"state": "stopped"' in (store / S.MARKER_NAME).read_text()


def _publish(port: int, n: int) -> None:
    conn = amqp.Connection(
        f"127.0.0.1:{port}", userid="guest", password="guest", confirm_publish=True
    )
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare("kept", durable=True, auto_delete=False)
        for i in range(n):
            ch.basic_publish(amqp.Message(f"m{i}", delivery_mode=2), "", "kept", timeout=5)
    finally:
        conn.close()


@pytest.mark.parametrize("damage", ["lost-wal", "empty-db"])
def test_a_store_damaged_after_kill9_is_refused_then_started_with_accept_loss(
    tmp_path: Path, damage: str
) -> None:
    store = tmp_path / "store"
    config = write_config(tmp_path, store)
    log = tmp_path / "broker.log"
    b = BrokerProcess(config, log=log).start()
    _publish(b.port, 500)
    b.kill9()
    db = store / S.DB_NAME
    if damage == "lost-wal":
        (store / (S.DB_NAME + "-wal")).unlink()
        words = "write-ahead log"
    else:
        db.write_bytes(b"")
        words = "empty (0 bytes)"
    refused = subprocess.run(
        [sys.executable, "-m", "plugbroker", "run", "--config", str(config), "--port", "0"],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=str(ROOT),
        timeout=60,
    )
    err = refused.stderr.decode()
    assert refused.returncode == 2, err
    assert words in err and "--accept-store-loss" in err and "acceptLoss" in err
    port = free_port()
    proc = _run(config, port, log, "--accept-store-loss")
    try:
        assert proc.stdout is not None
        assert b"listening" in proc.stdout.readline(), log.read_text()[-3000:]
        assert "starting anyway (acceptLoss)" in log.read_text()
        _publish(port, 5)  # a working broker on what was left
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # the loss was accepted once; the next ordinary start works
    again = BrokerProcess(config, log=log).start()
    assert again.stop() == 0

"""One kill -9 cycle against a broker subprocess with a store, and the clients it runs.

A cycle: start the broker on a fresh store; a publisher process publishes persistent messages
(body = a sequence number) with publisher confirms collected asynchronously and records each
confirmed number; a consumer process consumes and acks, recording each number delivered and
each acked; at a random moment (seeded) the broker gets SIGKILL; the clients notice and write
what they recorded; the broker restarts on the same store and the queue is drained. Then:

* lost = confirmed - acked - drained must be empty (a confirm means it is on disk);
* every drained number was published, and none is drained twice;
* duplicates (drained numbers the consumer had already received) are messages delivered but
  whose ack the store had not written before the kill: reported, allowed.

Used by tests/e2e/test_durability.py (20 cycles) and bench/soak_kill9.py (200).
Clients: ``python3 kill9cycle.py publish|consume PORT OUTFILE``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procutil import BrokerProcess, free_port, write_config

QUEUE = "k9"


def _connect(port: int, deadline: float) -> Any:
    import amqp

    while True:
        try:
            conn = amqp.Connection(f"127.0.0.1:{port}", heartbeat=0, connect_timeout=2)
            conn.connect()
            return conn
        except (OSError, amqp.exceptions.AMQPError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _declare(ch: Any) -> None:
    ch.queue_declare(QUEUE, durable=True, auto_delete=False)


def client_publish(port: int, out: Path, window: int = 200) -> None:
    import amqp

    confirmed: list[int] = []
    nacked: list[int] = []
    sent = 0
    error = ""
    try:
        conn = _connect(port, time.monotonic() + 30)
        ch = conn.channel()
        _declare(ch)
        ch.confirm_select()
        done = [0]  # highest seq settled (the broker confirms in order)

        def settle(tag: int, multiple: bool, into: list[int]) -> None:
            lo = done[0] + 1 if multiple else tag
            for seq in range(lo, tag + 1):
                into.append(seq - 1)
            done[0] = max(done[0], tag)

        ch.events["basic_ack"].add(lambda t, m: settle(t, m, confirmed))
        ch.events["basic_nack"].add(lambda t, m: settle(t, m, nacked))
        while True:
            while sent - done[0] < window:
                ch.basic_publish(amqp.Message(str(sent), delivery_mode=2), "", QUEUE)
                sent += 1
            conn.drain_events(timeout=10)
    except Exception as exc:  # the broker was killed: that is the point
        error = f"{type(exc).__name__}: {exc}"
    finally:
        out.write_text(
            json.dumps({"sent": sent, "confirmed": confirmed, "nacked": nacked, "error": error})
        )


def client_consume(port: int, out: Path, prefetch: int = 50) -> None:
    delivered: list[int] = []
    acked: list[int] = []
    redelivered: list[int] = []
    error = ""
    try:
        conn = _connect(port, time.monotonic() + 30)
        ch = conn.channel()
        _declare(ch)
        ch.basic_qos(0, prefetch, False)

        def on_msg(m: Any) -> None:
            n = int(m.body)
            delivered.append(n)
            if m.delivery_info.get("redelivered"):
                redelivered.append(n)
            ch.basic_ack(m.delivery_tag)
            acked.append(n)

        ch.basic_consume(QUEUE, callback=on_msg)
        while True:
            conn.drain_events(timeout=10)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        out.write_text(
            json.dumps(
                {"delivered": delivered, "acked": acked, "redelivered": redelivered, "error": error}
            )
        )


def drain(port: int) -> tuple[list[int], list[int]]:
    """Everything in the queue after the restart: ``(numbers in order, redelivered ones)``."""
    conn = _connect(port, time.monotonic() + 30)
    try:
        ch = conn.channel()
        _, count, _ = ch.queue_declare(QUEUE, passive=True)
        got: list[int] = []
        redelivered: list[int] = []
        while True:
            m = ch.basic_get(QUEUE, no_ack=True)
            if m is None:
                _, left, _ = ch.queue_declare(QUEUE, passive=True)
                if left == 0:
                    break
                time.sleep(0.01)  # the head's body is being read back from disk
                continue
            n = int(m.body)
            got.append(n)
            if m.delivery_info.get("redelivered"):
                redelivered.append(n)
        assert len(got) >= count
        return got, redelivered
    finally:
        conn.close()


@dataclass
class CycleResult:
    seed: int
    killed_after: float
    sent: int = 0
    confirmed: int = 0
    acked: int = 0
    delivered: int = 0
    drained: int = 0
    lost: list[int] = field(default_factory=list)
    phantom: list[int] = field(default_factory=list)
    drained_twice: list[int] = field(default_factory=list)
    duplicates: int = 0
    acked_reappeared: int = 0
    unconfirmed_kept: int = 0
    restart_s: float = 0.0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.phantom or self.drained_twice)


def run_cycle(
    seed: int,
    work: Path,
    *,
    kill_between: tuple[float, float] = (0.15, 0.9),
    env: dict[str, str] | None = None,
) -> CycleResult:
    t0 = time.monotonic()
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    cfg = write_config(work, store)
    port = free_port()
    log = work / "broker.log"
    pub_out, con_out = work / "pub.json", work / "con.json"
    here = Path(__file__).resolve()
    cenv = dict(os.environ)
    clients = [
        subprocess.Popen([sys.executable, str(here), role, str(port), str(path)], env=cenv)
        for role, path in (("publish", pub_out), ("consume", con_out))
    ]
    b = BrokerProcess(cfg, port=port, log=log, env=env)
    try:
        b.start()
        wait = rng.uniform(*kill_between)
        # let the publisher get going before the clock starts
        deadline = time.monotonic() + 10
        while not _store_has_data(store) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(wait)
        b.kill9()
        res = CycleResult(seed=seed, killed_after=round(wait, 3))
        for c in clients:
            try:
                c.wait(20)
            except subprocess.TimeoutExpired:
                c.kill()
                res.notes.append("a client hung after the kill")
        pub = json.loads(pub_out.read_text())
        con = json.loads(con_out.read_text())
        b = BrokerProcess(cfg, port=free_port(), log=log, env=env).start()
        res.restart_s = round(b.started_in, 2)
        got, _redelivered = drain(b.port)
        b.stop()
    finally:
        b.kill9()
        for c in clients:
            if c.poll() is None:
                c.kill()
    confirmed, acked = set(pub["confirmed"]), set(con["acked"])
    delivered = set(con["delivered"])
    drained = set(got)
    res.sent = pub["sent"]
    res.confirmed = len(confirmed)
    res.acked = len(acked)
    res.delivered = len(delivered)
    res.drained = len(got)
    res.lost = sorted(confirmed - acked - drained)
    res.phantom = sorted(n for n in drained if not 0 <= n < pub["sent"])
    res.drained_twice = (
        sorted({n for n in got if got.count(n) > 1}) if len(drained) != len(got) else []
    )
    res.duplicates = len(drained & delivered)
    res.acked_reappeared = len(drained & acked)
    res.unconfirmed_kept = len(drained - confirmed)
    res.seconds = round(time.monotonic() - t0, 2)
    return res


def _store_has_data(store: Path) -> bool:
    wal = store / "plugbroker.db-wal"
    return wal.exists() and wal.stat().st_size > 64 * 1024


if __name__ == "__main__":
    role, port_s, path_s = sys.argv[1:4]
    if role == "publish":
        client_publish(int(port_s), Path(path_s))
    elif role == "consume":
        client_consume(int(port_s), Path(path_s))
    else:
        raise SystemExit(f"unknown role {role}")

"""A synthetic journal of any size, for benchmarks and for trying the pipeline without a broker.

    python3 -m plugbroker.analyze.synth --events 10000000 --out /tmp/journal [--queues 24]
        [--consumers 3] [--rate 2000] [--seed 1]

It writes the same schema, directory layout and file naming as the journal plugin (files rolled by
hour and by ``--file-rows``), with traffic that exercises every part of the report:

* queues with different processing-time distributions (log-normal, medians from 2 ms to 400 ms)
  and a Zipf-like share of the traffic;
* about 1% of deliveries nacked with requeue and redelivered, 0.1% rejected without requeue and
  dead-lettered, and messages expiring on one queue;
* a backlog that builds up and drains on one queue (its consumers slow down for a while);
* on ``work-0`` a consumer that stalls holding its prefetch, and is isolated after a minute
  (a real ``policy_action`` and ``consumer_isolated``; its messages go to the others);
* a topic subscription whose consumer falls behind and is disconnected by the slow-consumer
  policy (506 and queue deleted).

Generation is vectorised with numpy: 10 million events take a few tens of seconds.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plugbroker.plugins.journal import FIELDS, SCHEMA, SCHEMA_VERSION

_STRING_COLS = [n for n, t in FIELDS if t == pa.string() and n != "run"]
_NUMERIC = {
    n: t for n, t in FIELDS if t != pa.string() and n not in ("ts_us", "seq", "schema_version")
}


@dataclass
class _Builder:
    """Columns gathered chunk by chunk: numbers as numpy arrays, strings as codes in a table."""

    strings: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    chunks: list[dict[str, Any]] = field(default_factory=list)

    def code(self, s: str | None) -> int:
        if s is None:
            return -1
        got = self.index.get(s)
        if got is None:
            got = self.index[s] = len(self.strings)
            self.strings.append(s)
        return got

    def codes(self, values: list[str]) -> np.ndarray:
        return np.array([self.code(v) for v in values], dtype=np.int32)

    def add(self, event: str, ts: np.ndarray, **cols: Any) -> None:
        n = len(ts)
        if n == 0:
            return
        chunk: dict[str, Any] = {
            "n": n,
            "ts": np.asarray(ts, dtype=np.float64),
            "event": np.full(n, self.code(event), dtype=np.int32),
        }
        for name, value in cols.items():
            if name in _STRING_COLS:
                if isinstance(value, str) or value is None:
                    value = np.full(n, self.code(value), dtype=np.int32)
                chunk[name] = np.asarray(value, dtype=np.int32)
            elif value is not None:
                chunk[name] = np.broadcast_to(np.asarray(value), (n,))
        self.chunks.append(chunk)

    def build(self, run: str, start_seq: int = 0) -> tuple[pa.Table, np.ndarray]:
        n = sum(c["n"] for c in self.chunks)
        ts = np.concatenate([c["ts"] for c in self.chunks])
        order = np.argsort(ts, kind="stable")
        ts_us = np.round(ts[order] * 1e6).astype(np.int64)
        dictionary = pa.array(self.strings, pa.string())
        arrays: list[pa.Array] = []
        for name, ftype in FIELDS:
            if name == "schema_version":
                arrays.append(pa.array(np.full(n, SCHEMA_VERSION, dtype=np.int16)))
            elif name == "ts_us":
                arrays.append(pa.array(ts_us))
            elif name == "seq":
                arrays.append(pa.array(np.arange(start_seq, start_seq + n, dtype=np.int64)))
            elif name == "run":
                arrays.append(
                    pa.array([run] * n, pa.string())
                    if n < 1_000_000
                    else pa.DictionaryArray.from_arrays(
                        pa.array(np.zeros(n, dtype=np.int32)), pa.array([run])
                    ).cast(pa.string())
                )
            elif name in _STRING_COLS or name == "event":
                codes = np.concatenate(
                    [
                        c[name] if name in c else np.full(c["n"], -1, dtype=np.int32)
                        for c in self.chunks
                    ]
                )[order]
                mask = codes < 0
                taken = dictionary.take(pa.array(np.where(mask, 0, codes)))
                if mask.any():
                    taken = _with_nulls(taken, mask)
                arrays.append(taken)
            else:
                np_type = ftype.to_pandas_dtype()
                vals = np.concatenate(
                    [
                        np.asarray(c[name], dtype=np_type)
                        if name in c
                        else np.zeros(c["n"], dtype=np_type)
                        for c in self.chunks
                    ]
                )
                mask = np.concatenate(
                    [
                        np.zeros(c["n"], dtype=bool) if name in c else np.ones(c["n"], dtype=bool)
                        for c in self.chunks
                    ]
                )
                arrays.append(pa.array(vals[order], type=ftype, mask=mask[order]))
        return pa.Table.from_arrays(arrays, schema=SCHEMA), ts_us


def _with_nulls(arr: pa.Array, mask: np.ndarray) -> pa.Array:
    import pyarrow.compute as pc

    return pc.if_else(pa.array(mask), pa.nulls(len(arr), pa.string()), arr)


def generate(
    out: str | Path,
    *,
    events: int = 1_000_000,
    queues: int = 24,
    consumers: int = 3,
    rate: float = 2000.0,
    seed: int = 1,
    start: float = 1_767_225_600.0,
    file_rows: int = 2_000_000,
    quiet: bool = False,
) -> dict[str, Any]:
    """Write a synthetic journal of about ``events`` events to ``out``; returns a summary."""
    t_start = time.monotonic()
    rng = np.random.default_rng(seed)
    b = _Builder()
    run = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(start))}-synth{seed:03d}"
    vhost = "/"
    per_msg = 3.03  # events per message on average (publish, deliver, ack, plus the extras)
    m = max(int(events / per_msg), 10)
    duration = m / rate
    names = [f"work-{i}" for i in range(queues)]
    weights = 1.0 / np.arange(1, queues + 1) ** 0.8
    weights /= weights.sum()
    medians = np.geomspace(0.002, 0.4, queues)
    rng.shuffle(medians)
    cons_tags = [[f"ctag-{i}-{j}" for j in range(consumers)] for i in range(queues)]
    conn_ids = [
        [
            f"10.0.{i % 250}.{j + 10}:{40000 + i * consumers + j}#{1 + i * consumers + j}"
            for j in range(consumers)
        ]
        for i in range(queues)
    ]
    q_codes = b.codes(names)
    tag_codes = np.array([b.codes(t) for t in cons_tags])
    conn_codes = np.array([b.codes(c) for c in conn_ids])

    # -- topology at the start
    t_top = start - 1.0
    for i, name in enumerate(names):
        b.add(
            "queue_declared",
            np.array([t_top]),
            vhost=vhost,
            queue=name,
            durable=True,
            exclusive=False,
            auto_delete=False,
            detail="shared",
        )
        b.add(
            "queue_bound",
            np.array([t_top]),
            vhost=vhost,
            queue=name,
            exchange="jobs",
            routing_key=name,
            detail="direct",
        )
        for j in range(consumers):
            b.add(
                "connection_opened",
                np.array([t_top]),
                connection_id=conn_ids[i][j],
                detail=conn_ids[i][j].split("#")[0],
                reason="guest",
                vhost=vhost,
            )
            b.add(
                "consumer_added",
                np.array([t_top + 0.1]),
                vhost=vhost,
                queue=name,
                consumer_tag=cons_tags[i][j],
                connection_id=conn_ids[i][j],
                channel_id=1,
                no_ack=False,
                count=50,
                exclusive=False,
            )

    # -- the messages
    arrival = start + np.cumsum(rng.exponential(1.0 / rate, m))
    q = rng.choice(queues, size=m, p=weights)
    c = rng.integers(0, consumers, size=m)
    mid = np.arange(1, m + 1, dtype=np.int64)
    size = rng.lognormal(np.log(600), 0.9, m).astype(np.int64) + 20
    wait = rng.exponential(0.003, m)
    # a backlog on the second busiest queue: its consumers slow down in the middle of the run
    slow_q = 1 % queues
    a, z = start + 0.35 * duration, start + 0.55 * duration
    in_burst = (q == slow_q) & (arrival > a) & (arrival < z)
    ramp = np.where(in_burst, (arrival - a) / (z - a), 0.0)
    wait = wait + ramp * min(0.1 * duration, 120.0)
    proc = rng.lognormal(np.log(medians[q]), 0.7)
    delivered = arrival + wait
    acked = delivered + proc

    # fates: 1% nacked with requeue once, 0.1% rejected to the dead-letter queue, expiries on
    # the last queue
    u = rng.random(m)
    nack = u < 0.01
    dead = (u >= 0.01) & (u < 0.011)
    exp_q = queues - 1
    expire = (q == exp_q) & (u >= 0.011) & (u < 0.05)

    def add_msgs(event: str, sel: np.ndarray, ts: np.ndarray, **extra: Any) -> None:
        idx = np.nonzero(sel)[0] if sel.dtype == bool else sel
        cols: dict[str, Any] = {
            "vhost": vhost,
            "queue": q_codes[q[idx]],
            "message_id": mid[idx],
            "body_size": size[idx],
        }
        for k, v in extra.items():
            cols[k] = v[idx] if isinstance(v, np.ndarray) and len(v) == m else v
        b.add(event, ts[idx] if len(ts) == m else ts, **cols)

    everyone = np.ones(m, dtype=bool)
    add_msgs(
        "published",
        everyone,
        arrival,
        exchange="jobs",
        routing_key=q_codes[q],
        delivery_count=np.zeros(m, dtype=np.int32),
    )
    live = ~expire
    tag = tag_codes[q, c]
    conn = conn_codes[q, c]
    dtag = np.zeros(m, dtype=np.int64)
    key = q * consumers + c
    order = np.lexsort((delivered, key))
    counts = np.bincount(key, minlength=queues * consumers)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m) - np.repeat(starts, counts)
    dtag[:] = rank + 1
    dl = {
        "consumer_tag": tag,
        "connection_id": conn,
        "channel_id": np.int32(1),
        "delivery_tag": dtag,
        "delivery_count": np.zeros(m, dtype=np.int32),
        "redelivered": False,
        "no_ack": False,
    }
    add_msgs("delivered", live, delivered, **dl)
    ok = live & ~nack & ~dead
    add_msgs(
        "acked",
        ok,
        acked,
        consumer_tag=tag,
        connection_id=conn,
        channel_id=np.int32(1),
        delivery_count=np.zeros(m, dtype=np.int32),
    )
    # nack with requeue, redelivered to another consumer of the queue, then acked
    add_msgs(
        "rejected",
        nack,
        acked,
        consumer_tag=tag,
        connection_id=conn,
        channel_id=np.int32(1),
        delivery_count=np.zeros(m, dtype=np.int32),
        requeue=True,
    )
    add_msgs(
        "redelivered",
        nack,
        acked + 1e-4,
        delivery_count=np.ones(m, dtype=np.int32),
        reason="rejected",
    )
    c2 = (c + 1) % consumers
    redel_at = acked + 0.002
    add_msgs(
        "delivered",
        nack,
        redel_at,
        consumer_tag=tag_codes[q, c2],
        connection_id=conn_codes[q, c2],
        channel_id=np.int32(1),
        delivery_tag=dtag + 10_000_000,
        delivery_count=np.ones(m, dtype=np.int32),
        redelivered=True,
        no_ack=False,
    )
    add_msgs(
        "acked",
        nack,
        redel_at + proc,
        consumer_tag=tag_codes[q, c2],
        connection_id=conn_codes[q, c2],
        channel_id=np.int32(1),
        delivery_count=np.ones(m, dtype=np.int32),
    )
    # poison: rejected without requeue, dead-lettered
    add_msgs(
        "rejected",
        dead,
        acked,
        consumer_tag=tag,
        connection_id=conn,
        channel_id=np.int32(1),
        delivery_count=np.zeros(m, dtype=np.int32),
        requeue=False,
    )
    add_msgs(
        "dead_lettered",
        dead,
        acked + 1e-4,
        delivery_count=np.zeros(m, dtype=np.int32),
        reason="rejected",
        exchange="dlx",
        routing_key=q_codes[q],
    )
    # expiry on the last queue (its consumers are away): expired, then dropped
    ttl_at = arrival + 30.0
    add_msgs("expired", expire, ttl_at, delivery_count=np.zeros(m, dtype=np.int32))
    add_msgs(
        "dropped", expire, ttl_at, delivery_count=np.zeros(m, dtype=np.int32), reason="expired"
    )

    # -- a stalled consumer on work-0, isolated after a minute (ackTimeout 60 s)
    t_stall = start + 0.2 * duration
    stall_tag, stall_conn = "ctag-stalled", "10.0.99.9:49999#9999"
    b.add(
        "connection_opened",
        np.array([t_stall - 1]),
        connection_id=stall_conn,
        detail="10.0.99.9:49999",
        reason="guest",
        vhost=vhost,
    )
    b.add(
        "consumer_added",
        np.array([t_stall - 1]),
        vhost=vhost,
        queue=names[0],
        consumer_tag=stall_tag,
        connection_id=stall_conn,
        channel_id=1,
        no_ack=False,
        count=10,
        exclusive=False,
    )
    held = 10_000_000_000 + np.arange(10, dtype=np.int64)
    th = t_stall + np.arange(10) * 0.01
    common = {"vhost": vhost, "queue": names[0], "message_id": held, "body_size": 512}
    b.add("published", th - 0.001, exchange="jobs", routing_key=names[0], **common)
    b.add(
        "delivered",
        th,
        consumer_tag=stall_tag,
        connection_id=stall_conn,
        channel_id=1,
        delivery_tag=np.arange(1, 11),
        delivery_count=0,
        redelivered=False,
        no_ack=False,
        **common,
    )
    t_iso = t_stall + 90.0
    b.add("redelivered", np.full(10, t_iso), delivery_count=1, reason="consumer-isolated", **common)
    b.add(
        "consumer_isolated",
        np.array([t_iso + 1e-4]),
        vhost=vhost,
        queue=names[0],
        consumer_tag=stall_tag,
        connection_id=stall_conn,
        measured=90.0,
        count=10,
    )
    b.add(
        "policy_action",
        np.array([t_iso + 2e-4]),
        vhost=vhost,
        queue=names[0],
        policy="Isolation",
        action="IsolateConsumer",
        reason="no ack for 90.000 s",
        threshold="ackTimeout",
        configured=60.0,
        measured=90.0,
        outcome="applied",
        consumer_tag=stall_tag,
        connection_id=stall_conn,
    )
    b.add(
        "delivered",
        np.full(10, t_iso + 0.01),
        consumer_tag=cons_tags[0][0],
        connection_id=conn_ids[0][0],
        channel_id=1,
        delivery_tag=20_000_000 + np.arange(10),
        delivery_count=1,
        redelivered=True,
        no_ack=False,
        **common,
    )
    b.add(
        "acked",
        np.full(10, t_iso + 0.05),
        consumer_tag=cons_tags[0][0],
        connection_id=conn_ids[0][0],
        channel_id=1,
        delivery_count=1,
        **common,
    )

    # -- a topic subscription that falls behind and is disconnected (slow-consumer policy)
    sub = "amq.gen-slowsubscriber"
    t_sub = start + 0.6 * duration
    sub_conn = "10.0.98.1:48000#9998"
    b.add(
        "queue_declared",
        np.array([t_sub]),
        vhost=vhost,
        queue=sub,
        durable=False,
        exclusive=True,
        auto_delete=True,
        detail="shared",
    )
    b.add(
        "queue_bound",
        np.array([t_sub]),
        vhost=vhost,
        queue=sub,
        exchange="amq.topic",
        routing_key="stocks.us.*",
        detail="topic",
    )
    b.add(
        "consumer_added",
        np.array([t_sub]),
        vhost=vhost,
        queue=sub,
        consumer_tag="ctag-sub",
        connection_id=sub_conn,
        channel_id=1,
        no_ack=False,
        count=1,
        exclusive=False,
    )
    n_sub = 60
    sub_ids = 20_000_000_000 + np.arange(n_sub, dtype=np.int64)
    ts_sub = t_sub + 0.5 + np.arange(n_sub) * 0.5
    sc = {"vhost": vhost, "queue": sub, "message_id": sub_ids, "body_size": 100}
    b.add("published", ts_sub, exchange="amq.topic", routing_key="stocks.us.ibm", **sc)
    b.add(
        "delivered",
        ts_sub[:1] + 0.001,
        consumer_tag="ctag-sub",
        connection_id=sub_conn,
        channel_id=1,
        delivery_tag=np.array([1]),
        delivery_count=0,
        redelivered=False,
        no_ack=False,
        vhost=vhost,
        queue=sub,
        message_id=sub_ids[:1],
        body_size=100,
    )
    t_kill = ts_sub[-1] + 1.0
    for k, (action, outcome) in enumerate(
        (("CloseConsumerChannels", "applied"), ("DeleteQueue", "applied"))
    ):
        b.add(
            "policy_action",
            np.array([t_kill + k * 1e-4]),
            vhost=vhost,
            queue=sub,
            policy="Delete",
            action=action,
            reason=f"messageCount {n_sub} (limit 50)",
            threshold="messageCount",
            configured=50.0,
            measured=float(n_sub),
            outcome=outcome,
            code=506 if k == 0 else None,
        )
    b.add(
        "consumer_removed",
        np.array([t_kill]),
        vhost=vhost,
        queue=sub,
        consumer_tag="ctag-sub",
        connection_id=sub_conn,
        channel_id=1,
        reason="channel-closed",
    )
    b.add(
        "queue_deleted", np.array([t_kill + 2e-4]), vhost=vhost, queue=sub, reason="policy:Delete"
    )

    # -- the end
    t_end = float(max(acked.max(), t_kill)) + 1.0
    b.add("journal_started", np.array([start - 2.0]), detail="synthetic", count=SCHEMA_VERSION)
    b.add("journal_stopped", np.array([t_end]), count=0, detail="synthetic")

    table, ts_us = b.build(run)
    gen_s = time.monotonic() - t_start
    files = _write(table, ts_us, Path(out), run, file_rows)
    took = time.monotonic() - t_start
    summary = {
        "events": table.num_rows,
        "messages": m,
        "queues": queues,
        "span_s": t_end - start,
        "files": len(files),
        "generate_s": round(gen_s, 2),
        "total_s": round(took, 2),
        "out": str(out),
    }
    if not quiet:
        print(
            f"synthetic journal: {table.num_rows:,} events ({m:,} messages, {queues} queues, "
            f"{(t_end - start) / 60:.1f} min of traffic) in {len(files)} file(s) under {out}; "
            f"{took:.1f} s",
            file=sys.stderr,
        )
    return summary


def _write(table: pa.Table, ts_us: np.ndarray, out: Path, run: str, file_rows: int) -> list[Path]:
    from datetime import datetime

    hours = ts_us // 3_600_000_000
    files: list[Path] = []
    bounds = np.nonzero(np.diff(hours))[0] + 1
    cuts = [0, *bounds.tolist(), len(hours)]
    n = 0
    for lo, hi in itertools.pairwise(cuts):
        when = datetime.fromtimestamp(int(hours[lo]) * 3600, tz=UTC)
        folder = out / f"date={when:%Y-%m-%d}" / f"hour={when:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        for a in range(lo, hi, file_rows):
            n += 1
            part = table.slice(a, min(file_rows, hi - a))
            final = folder / f"events-{run}-{n:05d}.parquet"
            hidden = folder / f".{final.name}"
            pq.write_table(part, hidden, compression="zstd", row_group_size=256_000)
            hidden.rename(final)
            files.append(final)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m plugbroker.analyze.synth",
        description="write a synthetic plugbroker journal",
    )
    ap.add_argument("--out", required=True, help="journal directory to write")
    ap.add_argument("--events", type=float, default=1e6, help="about how many events (1e7 ok)")
    ap.add_argument("--queues", type=int, default=24)
    ap.add_argument("--consumers", type=int, default=3, help="consumers per queue")
    ap.add_argument("--rate", type=float, default=2000.0, help="messages per second")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--file-rows", type=int, default=2_000_000)
    args = ap.parse_args(argv)
    generate(
        args.out,
        events=int(args.events),
        queues=args.queues,
        consumers=args.consumers,
        rate=args.rate,
        seed=args.seed,
        file_rows=args.file_rows,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

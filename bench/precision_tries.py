"""Bounded tries in the policy precision matrix: messages on which every consumer's ack clock
runs out, and a dead-letter queue that a vhost-wide Delete policy must spare, across a restart.

Scenarios of ``bench/policy_precision.py``, run and judged with the others, under the same scaled
configuration (``ackTimeout`` 1 s, the default ``maxIsolatedRatio`` 0.6 and ``poisonDeliveries``
3). Each is also judged on two counts of its own, from the clients' side:

* **endless loops**: the message handed out more often than the broker allows, counting its
  deliveries to every consumer of the queue: ``poisonDeliveries`` hand-outs for a message whose
  hand-outs time out, ``maxRedeliveries`` + 1 for one that kills its consumer at once;
* **dead letters lost**: a message that is not in the dead-letter queue it should be in, with
  its reason, once the broker bounded it (or, across a restart, one that was in the dead-letter
  queue before and is not after).

A driver here waits for its outcome (the message in the dead-letter queue, the control queue
deleted), each wait bounded; the matrix waits for it before stopping the clients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import amqp
from brokerutil import BrokerThread, write_config

from bench.policy_precision import (
    ACK_TIMEOUT,
    SLOW_CHECK,
    Ctx,
    Publisher,
    Recorder,
    Run,
    Scenario,
    _start,
    pace,
)

POISON_DELIVERIES = 3  # the broker's default for <poisonDeliveries>
#: how long a consumer works on the poison message before it dies: past ackTimeout, so the
#: hand-out times out (at the check, or when its channel closes)
POISON_HANG = ACK_TIMEOUT + 0.1
#: the body of the task that runs longer than ackTimeout (its consumers never settle it)
LONG = b"long task"
#: ``x-delivery-limit`` of the queue whose message kills its consumer at once
DELIVERY_LIMIT = 3


def wait_consumers(pub: Publisher, queue: str, n: int, stop: Any, timeout: float = 10.0) -> None:
    """Until ``queue`` has ``n`` consumers (RuntimeError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while pub.ch.queue_declare(queue, passive=True).consumer_count < n:
        if time.monotonic() > deadline or stop.is_set():
            raise RuntimeError(f"{n} consumers did not start on {queue} in time")
        stop.wait(0.02)


def depth(conn: amqp.Connection, queue: str) -> int:
    """Messages in ``queue``; 0 while it does not exist (a channel of its own: a 404 closes it)."""
    ch = conn.channel()
    try:
        return int(ch.queue_declare(queue, passive=True).message_count)
    except amqp.exceptions.NotFound:
        return 0
    finally:
        if ch.is_open:
            ch.close()


def take_all(ch: Any, queue: str) -> list[tuple[bytes, str]]:
    """Every message in ``queue`` (taken): its body and its first ``x-death`` reason."""
    got = []
    for _ in range(10_000):
        m = ch.basic_get(queue, no_ack=True)
        if m is None:
            break
        deaths = (m.headers or {}).get("x-death") or [{}]
        body = m.body if isinstance(m.body, bytes) else str(m.body).encode()
        got.append((body, str(deaths[0].get("reason", ""))))
    return got


def settle(
    ctx: Ctx, run: Run, pub: Publisher, queue: str, dlq: str, reason: str, limit: int
) -> None:
    """Wait (bounded) until ``dlq`` holds something, then judge ``queue``'s bounded message
    (``LONG`` or ``b"poison"``): how often it was handed out against ``limit``, whether it is
    in ``dlq`` with ``reason``; anything else in ``dlq`` is a false positive. Its holders are the
    faulty consumers: any other consumer isolated or timed out is a bystander touched."""
    body = LONG if queue.startswith("pp.tries") else b"poison"
    deadline = time.monotonic() + (limit + 2) * ACK_TIMEOUT + 10.0
    while not depth(pub.conn, dlq) and time.monotonic() < deadline and not ctx.stop.is_set():
        ctx.stop.wait(0.05)
    dead = take_all(pub.ch, dlq) if depth(pub.conn, dlq) else []  # (it may not exist)
    run.lost = 0 if (body, reason) in dead else 1
    run.wrong += [f"{b!r} dead-lettered ({r})" for b, r in dead if b != body]
    if dead.count((body, reason)) > 1:
        run.wrong.append(f"{body!r} dead-lettered {dead.count((body, reason))} times")
    handed = sorted(h for c in run.consumers for h in c.handed if h[2] == body)
    run.loops = 1 if len(handed) > limit else 0
    run.faulty_tags = tuple(sorted({h[1] for h in handed}))
    counts = ",".join(str(h[3]) for h in handed)
    where = f"in {dlq} ({reason})" if not run.lost else f"NOT in {dlq}"
    run.note = f"handed out {len(handed)}x (x-ack-timeout-count {counts}), then {where}"
    if reason == "delivery_limit":
        crashes = sorted(t for c in run.consumers for t in c.crashes)
        run.crossed_at = crashes[-1] if crashes else None
        return
    # the limit-th timeout was due one ackTimeout after the later of: the last hand-out, the
    # count before it (a consumer the cap spares holds the message on and counts again)
    before = [
        e.at
        for e in list(ctx.recorder.events)
        if e.queue == queue and e.kind == "timed_out" and e.detail == f"count {limit - 1}"
    ]
    if handed:
        run.crossed_at = max([handed[:limit][-1][0], *before]) + ACK_TIMEOUT


def poison(ctx: Ctx, run: Run) -> None:
    """Three consumers; one message makes whoever takes it hang past ackTimeout, then die (it
    reconnects): each hand-out of it times out, whether the check or the close counts it."""
    pub = Publisher(ctx.port)
    dlq = "pp.poison.dlq"
    pub.declare(dlq)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    pub.declare("pp.poison", arguments=args)
    for i in range(3):
        _start(
            run,
            ctx,
            "pp.poison",
            f"poison{i}",
            prefetch=1,
            work=lambda b: POISON_HANG if b == b"poison" else 0.005,
            crash=lambda b: b == b"poison",
            reconnect=0.2,
        )
    wait_consumers(pub, "pp.poison", 3, ctx.stop)
    pub.send("pp.poison", b"poison")
    pace(ctx.stop, ctx.until, 20, lambda i: pub.send("pp.poison", b"%d" % i))
    settle(ctx, run, pub, "pp.poison", dlq, "poison", POISON_DELIVERIES)
    pub.close()


def poison_now(ctx: Ctx, run: Run) -> None:
    """Three consumers; one message makes whoever takes it die at once (it reconnects): no ack
    clock runs out, nothing counts a timeout; the queue's delivery limit bounds it."""
    pub = Publisher(ctx.port)
    q, dlq = "pp.poison.now", "pp.poison.now.dlq"
    pub.declare(dlq)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    pub.declare(q, arguments={**args, "x-delivery-limit": DELIVERY_LIMIT})
    crash: Callable[[bytes], bool] = lambda b: b == b"poison"  # noqa: E731
    for i in range(3):
        _start(run, ctx, q, f"now{i}", prefetch=1, work=lambda b: 0.005, crash=crash)
    wait_consumers(pub, q, 3, ctx.stop)
    pub.send(q, b"poison")
    pace(ctx.stop, ctx.until, 20, lambda i: pub.send(q, b"%d" % i))
    settle(ctx, run, pub, q, dlq, "delivery_limit", DELIVERY_LIMIT + 1)
    pub.close()


def _tries(n: int) -> Callable[[Ctx, Run], None]:
    def drive(ctx: Ctx, run: Run) -> None:
        q = f"pp.tries{n}"
        pub = Publisher(ctx.port)
        pub.declare(q)
        for i in range(n):
            hang: Callable[[bytes], bool] = lambda b: b == LONG  # noqa: E731
            _start(run, ctx, q, f"tries{n}-{i}", prefetch=1, work=lambda b: 0.005, hang=hang)
        wait_consumers(pub, q, n, ctx.stop)
        pub.send(q, LONG)
        pace(ctx.stop, ctx.until, 10, lambda i: pub.send(q, b"%d" % i))
        # no dead-letter target: the broker parks it in {queue}-DLQ
        settle(ctx, run, pub, q, f"{q}-DLQ", "poison", POISON_DELIVERIES)
        pub.close()

    drive.__doc__ = (
        f"{n} consumer(s), prefetch 1, acking 10 msg/s of 5 ms work; one task runs longer than "
        "the scenario on whoever takes it (never settled, no touch)"
    )
    return drive


#: the restart scenario's own broker: a vhost-wide Delete policy that reaches durable topic
#: subscriptions, and a queue whose dead-letter queue the configuration names
RS_COUNT = 20
RESTART_VHOST = f"""
    <consumer>
      <messageCount>{RS_COUNT}</messageCount>
      <policy name="Delete">
        <options><option name="delete-persistent" value="true"/></options>
      </policy>
    </consumer>
    <queue name="pp.rs.work"><deadLetter><queue>pp.rs.dlq</queue></deadLetter></queue>"""
RS_DEAD = 10  # dead letters made before the restart
RS_TOPIC = RS_COUNT + 5  # messages published to the topic in each life of the broker


def dlq_across_restart(ctx: Ctx, run: Run) -> None:
    """A broker of its own with the store on: ``pp.rs.dlq``, named by ``<deadLetter><queue>``,
    bound to ``amq.topic`` ``pp.rs.#`` and holding dead letters, and the control ``pp.rs.sub``
    bound the same way, both durable and over ``messageCount``; the broker is restarted and
    the control declared again. The control must be deleted in each life of the broker, the
    dead-letter queue never, and every message it held still there at the end."""
    d = ctx.workdir / "restart"
    d.mkdir(exist_ok=True)
    cfg = write_config(d, RESTART_VHOST, store=True, period=f"{SLOW_CHECK * 1000:g}ms")
    for life in ("before", "after"):
        b = BrokerThread(cfg).start()
        rec = Recorder()
        b.call(b.broker.api.register_plugin, rec, "precision-restart-recorder")
        try:
            _life(ctx, run, b.port, rec, life)
        finally:
            b.stop()
            run.events += rec.events
    deleted = sum(e.kind == "deleted" and e.queue == "pp.rs.sub" for e in run.events)
    run.note += f"; the control deleted {deleted}x"
    run.wrong += [
        f"{e.kind} {e.queue} {e.detail}"
        for e in run.events
        if e.queue == "pp.rs.dlq" and (e.kind == "deleted" or "applied" in e.detail)
    ]


def _life(ctx: Ctx, run: Run, port: int, rec: Recorder, life: str) -> None:
    """One life of the restart scenario's broker: fill the queues, wait for the check to delete
    the control; after the restart, take the dead-letter queue's messages and count them."""
    conn = amqp.Connection(host=f"127.0.0.1:{port}", connect_timeout=5)
    conn.connect()
    ch = conn.channel()
    ch.confirm_select()
    for q in ("pp.rs.dlq", "pp.rs.sub"):
        ch.queue_declare(q, durable=True, auto_delete=False)
        ch.queue_bind(q, "amq.topic", "pp.rs.#")
    if life == "before":
        ch.queue_declare("pp.rs.work", durable=True, auto_delete=False)
        for i in range(RS_DEAD):
            ch.basic_publish_confirm(amqp.Message(b"bad %d" % i, delivery_mode=2), "", "pp.rs.work")
            m = ch.basic_get("pp.rs.work")
            ch.basic_reject(m.delivery_tag, requeue=False)
    for i in range(RS_TOPIC):
        ch.basic_publish_confirm(amqp.Message(b"t %d" % i, delivery_mode=2), "amq.topic", "pp.rs.x")
    if run.crossed_at is None:
        run.crossed_at = time.monotonic()  # both over messageCount from here
    kept = depth(conn, "pp.rs.dlq")
    deadline = time.monotonic() + 10 * SLOW_CHECK + 5.0
    while not any(e.kind == "deleted" and e.queue == "pp.rs.sub" for e in list(rec.events)):
        if time.monotonic() > deadline:
            run.misses.append(f"the control subscription was not deleted {life} the restart")
            break
        ctx.stop.wait(0.05)
    if (now := depth(conn, "pp.rs.dlq")) != kept:
        run.wrong.append(f"pp.rs.dlq went from {kept} to {now} messages {life} the restart")
    if life == "after":
        dead = take_all(ch, "pp.rs.dlq")
        rejected = sum(r == "rejected" for _, r in dead)
        total = RS_DEAD + 2 * RS_TOPIC
        run.lost = max(total - len(dead), 0) + (RS_DEAD - rejected)
        run.note = (
            f"pp.rs.dlq kept {len(dead)} of {total} messages ({rejected} of {RS_DEAD} dead "
            "letters, reason rejected)"
        )
    conn.close()


def tries_name(n: int) -> str:
    return f"task longer than ackTimeout, {n} consumer{'s' if n > 1 else ''}, no touch"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "poison message",
        False,
        "dead-lettered: poison",
        ("pp.poison", "pp.poison.dlq"),
        poison,
        ("poison",),
    ),
    Scenario(
        "poison message that kills at once",
        False,
        "dead-lettered: delivery_limit (x-delivery-limit 3)",
        ("pp.poison.now", "pp.poison.now.dlq"),
        poison_now,
        ("delivery_limit",),
    ),
    *(
        Scenario(
            tries_name(n),
            False,
            "dead-lettered: poison",
            (f"pp.tries{n}", f"pp.tries{n}-DLQ"),
            _tries(n),
            ("poison",),
        )
        for n in (1, 2, 3)
    ),
    Scenario(
        "DLQ bound to a topic under a vhost Delete policy, across a restart",
        False,
        "control deleted, DLQ kept",
        ("pp.rs.work", "pp.rs.dlq", "pp.rs.sub"),
        dlq_across_restart,
        ("deleted",),
        SLOW_CHECK,
    ),
)

#: all quick (a few seconds of checks each): all in the suite's small matrix
SMALL = tuple(s.name for s in SCENARIOS)

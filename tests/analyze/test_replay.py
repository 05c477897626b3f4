"""The replay engine on its own (no Spark): journal events in, snapshots and actions out.

The last test records a live broker and checks that the replay rebuilds the very snapshot the
broker held at a given moment, figure by figure.
"""

from __future__ import annotations

import time
from typing import Any

import amqp
import pytest

from plugbroker.analyze.replay import COLUMNS, Replayer, load_candidate, policy_checks
from plugbroker.config import parse_config

RUN = "20260101T000000-test"
T0 = 1_767_225_600.0


def ev(event: str, t: float, queue: str | None = "q", run: str = RUN, **kw: Any) -> tuple[Any, ...]:
    ev.seq += 1  # type: ignore[attr-defined]
    row = dict.fromkeys(COLUMNS)
    row.update(run=run, seq=ev.seq, ts=T0 + t, event=event, vhost="/", queue=queue)  # type: ignore[attr-defined]
    row.update(kw)
    return tuple(row[c] for c in COLUMNS)


ev.seq = 0  # type: ignore[attr-defined]


def replayer(
    xml: str, every: float = 1.0, runs: list[tuple[str, float, float]] | None = None
) -> Replayer:
    config, plugins = load_candidate(f"<broker><virtualhost name='/'>{xml}</virtualhost></broker>")
    return Replayer(
        config, policy_checks(config, plugins, every), runs or [(RUN, T0, T0 + 100.0)], T0
    )


def topic_queue(t: float = 0.0, name: str = "q") -> list[tuple[Any, ...]]:
    return [
        ev(
            "queue_declared",
            t,
            name,
            durable=False,
            exclusive=True,
            auto_delete=True,
            detail="shared",
        ),
        ev(
            "queue_bound",
            t,
            name,
            exchange="amq.topic",
            routing_key="stocks.us.ibm",
            detail="topic",
        ),
        ev(
            "consumer_added",
            t,
            name,
            consumer_tag="c1",
            connection_id="conn#1",
            channel_id=1,
            count=1,
            no_ack=False,
        ),
    ]


def publish(
    t: float, mid: int, queue: str = "q", size: int = 10, run: str = RUN
) -> tuple[Any, ...]:
    return ev("published", t, queue, run=run, message_id=mid, body_size=size)


def test_slow_consumer_delete_fires_once_at_the_first_check_over_the_threshold():
    r = replayer(
        '<topic key="stocks.us.*"><consumer><messageCount>5</messageCount>'
        '<policy name="Delete"/></consumer></topic>'
    )
    r.feed_all(topic_queue())
    r.feed_all(publish(2.55 + i * 0.1, i) for i in range(8))  # the 6th lands at t=3.05
    actions = r.finish(T0 + 20)
    assert [a["action"] for a in actions] == ["CloseConsumerChannels", "DeleteQueue"]
    first = actions[0]
    assert first["at"] == T0 + 4.0  # checks at t=1, 2, 3, 4...; at t=3 the count is 5
    assert (first["threshold"], first["configured"], first["measured"]) == (
        "messageCount",
        5.0,
        8.0,
    )
    assert first["outcome"] == "applied"


def test_graduated_escalates_and_the_budget_defers_in_the_replay_as_in_the_broker():
    """Graduated's state is the job's, so the replay escalates step by step as the broker does;
    the candidate's <blastRadius> defers the third action that counts, and the step it held
    back is asked for again (not passed over) until the window has room."""
    r = replayer(
        '<blastRadius maxActionsPerMinute="2"/>'
        '<topic key="stocks.us.*"><consumer><messageCount>5</messageCount>'
        '<policy name="Graduated"/></consumer></topic>',
        every=20.0,
    )
    r.feed_all(topic_queue())
    r.feed(
        ev("consumer_added", 0.0, consumer_tag="c1", connection_id="conn#1", channel_id=1, count=8)
    )
    r.feed_all(publish(0.5 + i * 0.01, i) for i in range(8))
    actions = r.finish(T0 + 100.0)
    assert [(a["at"] - T0, a["action"], a["outcome"]) for a in actions] == [
        (20.0, "LogOnly", "logged"),
        (40.0, "SetPrefetch", "applied"),
        (60.0, "CancelConsumer", "applied"),
        (80.0, "CloseConsumerChannels", "deferred"),  # 2 in the minute since t=40
        (100.0, "CloseConsumerChannels", "applied"),  # asked again; t=40 left the window
    ]
    assert actions[1]["consumer_tag"] == "c1"


def test_a_vhost_consumer_reaches_only_topic_subscriptions_in_the_replay_too():
    r = replayer('<consumer><messageCount>5</messageCount><policy name="Delete"/></consumer>')
    for name, exchange, etype in (("work", "amq.direct", "direct"), ("sub", "amq.topic", "topic")):
        r.feed_all(
            [
                ev("queue_declared", 0, name, durable=False, detail="shared"),
                ev("queue_bound", 0, name, exchange=exchange, routing_key=name, detail=etype),
            ]
        )
        r.feed_all(publish(1 + i * 0.1, i + (100 if name == "sub" else 0), name) for i in range(8))
    actions = r.finish(T0 + 5)
    assert {a["queue"] for a in actions} == {"sub"}


def test_snapshot_figures_follow_the_messages():
    r = replayer("")
    r.feed_all(topic_queue())
    r.feed_all(
        [
            publish(1, 1, size=100),
            publish(2, 2, size=50),
            publish(3, 3, size=7),
            ev(
                "delivered",
                4,
                consumer_tag="c1",
                connection_id="conn#1",
                channel_id=1,
                message_id=1,
                delivery_tag=1,
                no_ack=False,
            ),
            ev(
                "delivered",
                5,
                consumer_tag="c1",
                connection_id="conn#1",
                channel_id=1,
                message_id=2,
                delivery_tag=2,
                no_ack=False,
            ),
            ev("acked", 6, consumer_tag="c1", connection_id="conn#1", channel_id=1, message_id=1),
            ev(
                "rejected",
                7,
                consumer_tag="c1",
                connection_id="conn#1",
                channel_id=1,
                message_id=2,
                requeue=True,
            ),
            ev("redelivered", 7, message_id=2, reason="rejected"),
        ]
    )
    [q] = r.snapshot(None, T0 + 10).queues
    assert (q.message_count, q.message_bytes, q.ready_count, q.unacked_count, q.acks_total) == (
        2,
        57,
        2,
        0,
        1,
    )
    assert q.oldest_arrival == T0 + 2 and q.age(T0 + 10) == 8
    [c] = q.consumers
    assert (c.tag, c.unacked, c.last_ack, c.first_delivery) == ("c1", 0, T0 + 7, T0 + 4)
    assert c.busy_since is None  # it holds nothing: its ack clock is stopped
    assert q.bindings == (("amq.topic", "topic", "stocks.us.ibm"),)
    assert q.exclusive and q.auto_delete and q.subscription_type == "shared"


def _delivered(t: float, mid: int) -> tuple[Any, ...]:
    return ev(
        "delivered",
        t,
        consumer_tag="c1",
        connection_id="conn#1",
        channel_id=1,
        message_id=mid,
        delivery_tag=mid,
        no_ack=False,
    )


def _acked(t: float, mid: int) -> tuple[Any, ...]:
    return ev("acked", t, consumer_tag="c1", connection_id="conn#1", channel_id=1, message_id=mid)


def test_the_replay_rebuilds_the_ack_clock_and_isolates_no_consumer_back_from_idle():
    xml = "<isolation><ackTimeout>5s</ackTimeout><checkPeriod>1s</checkPeriod></isolation>"
    r = replayer(xml)
    r.feed_all(topic_queue())
    r.feed_all(
        [
            ev(
                "consumer_added",
                0,
                consumer_tag="c2",
                connection_id="conn#2",
                channel_id=1,
                count=2,
                no_ack=False,
            ),
            publish(1, 1),
            _delivered(1, 1),
            _acked(2, 1),  # then 30 s of quiet, far past ackTimeout
            publish(32, 2),
            publish(32, 3),
            _delivered(32, 2),
            _delivered(33, 3),
        ]
    )
    [q] = r.snapshot(None, T0 + 34).queues
    c1 = next(c for c in q.consumers if c.tag == "c1")
    assert (c1.unacked, c1.last_ack, c1.busy_since) == (2, T0 + 2, T0 + 32)
    r.feed_all([_acked(35, 2)])  # an ack restarts the clock while it still holds one
    [q] = r.snapshot(None, T0 + 36).queues
    c1 = next(c for c in q.consumers if c.tag == "c1")
    assert (c1.unacked, c1.busy_since) == (1, T0 + 35)
    r.feed_all([_acked(37, 3)])
    actions = r.finish(T0 + 60)
    assert [a["action"] for a in actions] == []  # never held anything 5 s without settling


def test_no_ack_delivery_settles_and_a_deleted_queue_is_forgotten():
    r = replayer("")
    r.feed_all(topic_queue())
    r.feed_all(
        [
            publish(1, 1),
            ev(
                "delivered",
                2,
                consumer_tag="c1",
                connection_id="conn#1",
                channel_id=1,
                message_id=1,
                no_ack=True,
            ),
        ]
    )
    [q] = r.snapshot(None, T0 + 3).queues
    assert q.message_count == 0 and q.acks_total == 1
    r.feed(ev("queue_deleted", 4, reason="client"))
    assert r.snapshot(None, T0 + 5).queues == ()


def test_isolation_of_a_consumer_that_stops_acking():
    r = replayer(
        '<queue name="work"><isolation><ackTimeout>5s</ackTimeout></isolation></queue>', every=1.0
    )
    r.feed(ev("queue_declared", 0, "work", detail="shared"))
    for tag in ("fast", "stuck"):
        r.feed(
            ev(
                "consumer_added",
                0,
                "work",
                consumer_tag=tag,
                connection_id=f"{tag}#1",
                channel_id=1,
                count=10,
            )
        )
    mid = 0
    for t in range(1, 15):
        for tag in ("fast", "stuck"):
            mid += 1
            r.feed(publish(t, mid, "work"))
            r.feed(
                ev(
                    "delivered",
                    t + 0.01,
                    "work",
                    consumer_tag=tag,
                    connection_id=f"{tag}#1",
                    channel_id=1,
                    message_id=mid,
                )
            )
            if tag == "fast":
                r.feed(
                    ev(
                        "acked",
                        t + 0.02,
                        "work",
                        consumer_tag=tag,
                        connection_id=f"{tag}#1",
                        channel_id=1,
                        message_id=mid,
                    )
                )
    actions = r.finish(T0 + 15)
    [iso] = [a for a in actions if a["action"] == "IsolateConsumer"]
    assert (iso["consumer_tag"], iso["threshold"], iso["configured"]) == (
        "stuck",
        "ackTimeout",
        5.0,
    )
    # its clock started at its first delivery (t=1.01); the first check past 5 s is t=7
    assert iso["at"] == T0 + 7 and iso["measured"] == pytest.approx(5.99, abs=0.01)
    assert iso["outcome"] == "applied"
    assert len([a for a in actions if a["action"] == "IsolateConsumer"]) == 1


def test_log_streaks_collapse_into_one_row():
    r = replayer(
        '<queue name="q"><consumer><messageCount>2</messageCount>'
        '<policy name="Log"/></consumer></queue>'
    )
    r.feed(ev("queue_declared", 0, detail="shared"))
    r.feed_all(publish(0.5 + i * 0.01, i) for i in range(3))
    r.feed(ev("queue_deleted", 6.5, reason="client"))
    [a] = r.finish(T0 + 10)
    assert a["action"] == "LogOnly" and a["outcome"] == "logged"
    assert (a["at"], a["until"], a["checks"]) == (T0 + 1, T0 + 6, 6)


def test_a_broker_restart_forgets_what_the_old_run_held():
    runs = [("run-a", T0, T0 + 10), ("run-b", T0 + 20, T0 + 40)]
    r = replayer(
        '<queue name="q"><consumer><messageCount>2</messageCount>'
        '<policy name="Log"/></consumer></queue>',
        runs=runs,
    )
    r.feed(ev("queue_declared", 0, run="run-a", detail="shared"))
    r.feed_all(publish(1 + i * 0.01, i, run="run-a") for i in range(3))
    r.feed(ev("consumer_added", 25, "other", run="run-b", consumer_tag="x", connection_id="x"))
    actions = r.finish(T0 + 40)
    [a] = actions
    assert a["until"] <= T0 + 10  # nothing after the run that held the messages ended


def test_policy_checks_use_the_configured_periods():
    config = parse_config("""<broker><housekeeping><period>7s</period></housekeeping>
      <virtualhost name="/"><queue name="w"><isolation><ackTimeout>1m</ackTimeout>
      <checkPeriod>3s</checkPeriod></isolation></queue></virtualhost></broker>""")
    from plugbroker.runner import load_plugins

    plugins, _ = load_plugins(None)
    periods = {c.name: c.period for c in policy_checks(config, plugins)}
    assert periods == {"slow-consumer": 7.0, "isolation": 3.0}
    assert {c.name: c.period for c in policy_checks(config, plugins, 0.5)} == {
        "slow-consumer": 0.5,
        "isolation": 0.5,
    }


@pytest.mark.e2e
def test_the_replay_rebuilds_the_live_broker_snapshot(broker_factory, tmp_path):
    """Drive a broker, take its snapshot on the loop, then replay the journal up to that
    moment: every figure the policies read must match."""
    from plugbroker.plugins.journal import journal_of, read_journal

    b = broker_factory(
        '<topic key="t.#"><consumer><messageCount>1000</messageCount>'
        '<policy name="Log"/></consumer></topic>',
        journal=True,
        period="600000",
    )
    conn = amqp.Connection(host=f"127.0.0.1:{b.port}", userid="guest", password="guest")
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare("shared-q", auto_delete=False)
        ch.queue_bind("shared-q", "amq.topic", "t.a")
        ch.basic_qos(0, 4, False)
        got: list[amqp.Message] = []
        ch.basic_consume("shared-q", callback=got.append)
        for i in range(12):
            ch.basic_publish(amqp.Message(b"x" * (i + 1)), "amq.topic", "t.a")
        deadline = time.monotonic() + 5
        while len(got) < 4 and time.monotonic() < deadline:
            conn.drain_events(timeout=0.2)
        ch.basic_ack(got[0].delivery_tag)
        ch.basic_reject(got[1].delivery_tag, requeue=True)
        poll = conn.channel()
        poll.basic_get("shared-q")  # a basic.get poller holding one message
        time.sleep(0.3)
        other = conn.channel()
        other.queue_declare("noack-q")
        other.basic_publish(amqp.Message(b"n"), "", "noack-q")
        other.basic_consume("noack-q", no_ack=True, callback=lambda m: None)
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.1)
            except TimeoutError:
                pass

        def take() -> tuple[Any, float, int]:
            return (b.broker.snapshot(), b.broker.clock.time(), journal_of(b.broker.api).position())

        live, wall, upto = b.call(take)
    finally:
        conn.close()
    b.stop()
    events = [e for e in read_journal(tmp_path / "journal").to_pylist() if e["seq"] < upto]
    events.sort(key=lambda e: e["seq"])
    for e in events:
        e["ts"] = e["ts_us"] / 1e6
    config, _ = load_candidate((tmp_path / "broker0.xml").read_text())
    r = Replayer(config, [], [(events[0]["run"], events[0]["ts"], wall)], events[0]["ts"])
    r.feed_all(tuple(e.get(c) for c in COLUMNS) for e in events)
    replayed = {q.name: q for q in r.snapshot(None, wall).queues}
    shift = wall - live.taken_at  # wall clock minus the broker's monotonic clock
    checked = 0
    for q in live.queues:
        if q.name not in ("shared-q", "noack-q"):
            continue
        checked += 1
        rq = replayed[q.name]
        for field in (
            "message_count",
            "message_bytes",
            "ready_count",
            "unacked_count",
            "acks_total",
            "durable",
            "auto_delete",
            "exclusive",
            "subscription_type",
        ):
            assert getattr(rq, field) == getattr(q, field), (q.name, field)
        assert set(rq.bindings) == set(q.bindings), q.name
        assert set(rq.getters) == set(q.getters), q.name
        assert rq.policy.keys() == q.policy.keys(), q.name
        if q.oldest_arrival is not None:
            assert rq.oldest_arrival == pytest.approx(q.oldest_arrival + shift, abs=0.05)
        live_c = {c.tag: c for c in q.consumers}
        for c in rq.consumers:
            lc = live_c.pop(c.tag)
            assert (c.unacked, c.channel_id, c.isolated) == (lc.unacked, lc.channel_id, lc.isolated)
            for t_attr in ("last_ack", "first_delivery", "busy_since"):
                lv, rv = getattr(lc, t_attr), getattr(c, t_attr)
                assert (lv is None) == (rv is None), (c.tag, t_attr)
                if lv is not None:
                    assert rv == pytest.approx(lv + shift, abs=0.05)
        assert not live_c
    assert checked == 2


def test_the_replay_counts_timed_out_hand_outs_and_dead_letters_at_poison_deliveries():
    r = replayer(
        '<queue name="work"><isolation><ackTimeout>5s</ackTimeout><checkPeriod>1s</checkPeriod>'
        "<maxIsolatedRatio>1</maxIsolatedRatio><poisonDeliveries>2</poisonDeliveries>"
        "</isolation></queue>"
    )
    r.feed(ev("queue_declared", 0, "work", durable=False, detail="shared"))
    for tag in ("a", "b", "c"):
        r.feed(
            ev(
                "consumer_added",
                0,
                "work",
                consumer_tag=tag,
                connection_id=f"{tag}#1",
                channel_id=1,
                count=1,
            )
        )

    def delivered(t: float, tag: str, mid: int) -> tuple[Any, ...]:
        return ev(
            "delivered",
            t,
            "work",
            consumer_tag=tag,
            connection_id=f"{tag}#1",
            channel_id=1,
            message_id=mid,
        )

    r.feed(publish(1, 1, "work"))
    r.feed(delivered(1.01, "a", 1))
    # the live broker isolated a (its own check): the message came back unsettled, went to b
    r.feed(ev("redelivered", 7.5, "work", message_id=1, reason="consumer-isolated"))
    r.feed(delivered(7.51, "b", 1))
    actions = r.finish(T0 + 16)
    by_tag = [(a["action"], a["consumer_tag"]) for a in actions]
    # a is isolated at the check at t=7 (5.99 s on its clock): message 1's first timed-out
    # hand-out; b, its second holder, is over its ack timeout at t=13: the second, and with
    # <poisonDeliveries>2 the message is dead-lettered instead of b being isolated
    assert by_tag == [("IsolateConsumer", "a"), ("IsolateConsumer", "b"), ("Poison", "b")]
    [p] = [a for a in actions if a["action"] == "Poison"]
    assert p["at"] == T0 + 13 and p["threshold"] == "poisonDeliveries"
    assert (p["configured"], p["measured"]) == (2.0, 2.0)
    q = r.queues[("/", "work")]
    # in the replay the message left; a (isolated for it) is released, b is not isolated
    assert 1 not in q.held and not any(c.isolated for c in q.consumers.values())


def test_a_settled_message_leaves_no_poison_record_in_the_replay():
    r = replayer(
        '<queue name="work"><isolation><ackTimeout>5s</ackTimeout><checkPeriod>1s</checkPeriod>'
        "<maxIsolatedRatio>1</maxIsolatedRatio><poisonDeliveries>2</poisonDeliveries>"
        "</isolation></queue>"
    )
    r.feed(ev("queue_declared", 0, "work", durable=False, detail="shared"))
    for tag in ("a", "b"):
        r.feed(
            ev(
                "consumer_added",
                0,
                "work",
                consumer_tag=tag,
                connection_id=f"{tag}#1",
                channel_id=1,
                count=1,
            )
        )
    kw = dict(channel_id=1, message_id=1)
    r.feed(publish(1, 1, "work"))
    r.feed(ev("delivered", 1.01, "work", consumer_tag="a", connection_id="a#1", **kw))
    r.feed(ev("redelivered", 2.0, "work", message_id=1, reason="channel-closed"))
    r.feed(ev("delivered", 2.01, "work", consumer_tag="b", connection_id="b#1", **kw))
    r.feed(ev("rejected", 3.0, "work", consumer_tag="b", connection_id="b#1", requeue=True, **kw))
    r.feed(ev("redelivered", 3.0, "work", message_id=1, reason="rejected"))
    r.feed(ev("delivered", 3.01, "work", consumer_tag="b", connection_id="b#1", **kw))
    actions = r.finish(T0 + 10)
    # b rejected it once (a consumer got through it): b, stuck afterwards, is isolated
    assert [(a["action"], a["consumer_tag"]) for a in actions] == [("IsolateConsumer", "b")]


def _eta_replay(touch_every: float | None, due: float | None) -> list[dict[str, Any]]:
    """Two consumers of a shared queue under isolation (ackTimeout 5 s); ``slow`` holds one
    message from t=1 to t=20, due at ``due``, touched every ``touch_every`` seconds."""
    r = replayer(
        '<queue name="work"><isolation><ackTimeout>5s</ackTimeout></isolation></queue>', every=1.0
    )
    r.feed(ev("queue_declared", 0, "work", detail="shared"))
    who = {"consumer_tag": "slow", "connection_id": "slow#1", "channel_id": 1}
    for tag in ("slow", "idle"):
        r.feed(ev("consumer_added", 0, "work", consumer_tag=tag, connection_id=f"{tag}#1", count=4))
    r.feed(publish(1, 1, "work"))
    r.feed(ev("delivered", 1.0, "work", message_id=1, due=None if due is None else T0 + due, **who))
    t = 1.0
    while touch_every is not None and t + touch_every < 20:
        t += touch_every
        r.feed(ev("touched", t, "work", message_id=1, delivery_tag=1, **who))
    r.feed(ev("acked", 20.0, "work", message_id=1, **who))
    return [a for a in r.finish(T0 + 21) if a["action"] == "IsolateConsumer"]


def test_the_replay_honours_a_delivery_due_later_and_touches():
    # not due before t=12: its clock starts then, so it is isolated at the first check past 17
    [iso] = _eta_replay(None, due=12.0)
    assert iso["at"] == T0 + 18 and iso["measured"] == pytest.approx(6.0, abs=0.01)
    # due at t=12, touched every 2 s from t=3: never 5 s without a sign of life
    assert _eta_replay(2.0, due=12.0) == []
    assert _eta_replay(2.0, due=None) == []
    # neither: isolated 5 s after the delivery, at the first check past t=6
    [iso] = _eta_replay(None, due=None)
    assert iso["at"] == T0 + 7

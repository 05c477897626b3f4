"""ETA awareness and amq.touch end to end (issue 17): a delivery not due yet is off the ack
clock, a touch restarts it, a stale touch is harmless, and the client learns the ack timeout."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import amqp
import pytest

from plugbroker.contrib.touch import ACK_TIMEOUT_HEADER, ack_timeout, touch
from plugbroker.domain import exchange as core_exchange

pytestmark = pytest.mark.e2e

CONFIG = (
    '<queue name="work" subscription="shared"><isolation><ackTimeout>300ms</ackTimeout>'
    "<checkPeriod>50ms</checkPeriod>{extra}</isolation></queue>"
)


class Client:
    """A py-amqp consumer of ``work`` on its own connection, acking only when told."""

    def __init__(self, url_port: int, prefetch: int = 10) -> None:
        self.conn = amqp.Connection(f"127.0.0.1:{url_port}", userid="guest", password="guest")
        self.conn.connect()
        self.ch = self.conn.channel()
        self.ch.queue_declare("work", auto_delete=False)
        self.ch.basic_qos(0, prefetch, False)
        self.got: list[amqp.Message] = []
        self.tag = self.ch.basic_consume("work", callback=self.got.append)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.conn.drain_events(timeout=min(0.02, max(deadline - time.monotonic(), 0.001)))
            except TimeoutError:
                pass

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def publish(port: int, bodies: list[bytes], headers: dict | None = None) -> None:
    conn = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest")
    conn.connect()
    try:
        ch = conn.channel()
        ch.confirm_select()
        for body in bodies:
            ch.basic_publish(
                amqp.Message(body, application_headers=dict(headers or {})),
                exchange="",
                routing_key="work",
            )
    finally:
        conn.close()


def isolated(b) -> list[str]:
    return b.call(
        lambda: [c.tag for c in b.broker.vhosts["/"].queues["work"].consumers if c.isolated]
    )


def run(clients: list[Client], seconds: float, each: Callable[[], None] | None = None) -> None:
    """Drain every client for ``seconds`` (bounded), calling ``each`` between rounds."""
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline and rounds < 10_000:
        rounds += 1
        for c in clients:
            c.drain(0.02)
        if each is not None:
            each()


@pytest.fixture
def clients():
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


def test_contrib_constants_match_the_broker():
    from plugbroker.contrib import touch as t

    assert t.TOUCH_EXCHANGE == core_exchange.TOUCH_EXCHANGE
    assert t.TOUCH_TAG_HEADER == core_exchange.TOUCH_TAG_HEADER
    assert t.ACK_TIMEOUT_HEADER == core_exchange.ACK_TIMEOUT_HEADER


def test_deliveries_carry_the_ack_timeout(broker_factory, clients):
    b = broker_factory(CONFIG.format(extra=""))
    a = Client(b.port)
    clients.append(a)
    publish(b.port, [b"x"], {"k": 1})
    run([a], 0.3)
    [m] = a.got
    assert m.headers[ACK_TIMEOUT_HEADER] == 300
    assert m.headers["k"] == 1  # the publisher's headers stay
    assert ack_timeout(m) == 0.3
    a.ch.basic_ack(m.delivery_tag)


def test_a_delivery_not_due_yet_is_off_the_ack_clock_until_it_is(broker_factory, clients):
    b = broker_factory(CONFIG.format(extra=""))
    holder, other = Client(b.port), Client(b.port)
    clients += [holder, other]
    other.ch.basic_cancel(other.tag)  # deliveries go to `holder` first
    eta = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.2)).isoformat()
    publish(b.port, [b"later"], {"eta": eta})
    run([holder], 0.2)
    assert [m.body for m in holder.got] == [b"later"]
    other.tag = other.ch.basic_consume("work", callback=other.got.append)
    # held for 0.8 s (> ackTimeout 300 ms) but not due before 1.2 s: not isolated
    run([holder, other], 0.8)
    assert isolated(b) == [] and other.got == []
    # nor is it old for the slow-consumer check's messageAge: its age counts from its due time
    snap = b.call(lambda: b.broker.snapshot())
    [work] = [q for q in snap.queues if q.name == "work"]
    assert work.message_count == 1 and work.age(snap.taken_at) == 0.0
    # once due, the clock runs: held past due + ackTimeout without an ack, it is isolated
    run([holder, other], 1.2, lambda: None)
    assert isolated(b) == [holder.tag]
    assert [m.body for m in other.got] == [b"later"] and other.got[0].delivery_info["redelivered"]
    other.ch.basic_ack(other.got[0].delivery_tag)


def test_an_eta_without_timezone_is_utc_and_a_bad_one_counts_at_once(broker_factory, clients):
    b = broker_factory(CONFIG.format(extra="<etaHeaders>x-not-before eta</etaHeaders>"))
    holder, other = Client(b.port), Client(b.port)
    clients += [holder, other]
    other.ch.basic_cancel(other.tag)
    naive = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.0)).replace(tzinfo=None)
    publish(b.port, [b"naive"], {"x-not-before": naive.isoformat()})
    run([holder], 0.6)
    assert isolated(b) == []  # not due before 1 s
    holder.ch.basic_ack(holder.got[0].delivery_tag)
    publish(b.port, [b"garbage"], {"eta": "next tuesday"})
    run([holder], 0.1)
    other.tag = other.ch.basic_consume("work", callback=other.got.append)
    run([holder, other], 0.6)
    assert isolated(b) == [holder.tag]  # unreadable: due at once, and it did not ack
    assert [m.body for m in other.got] == [b"garbage"]


def test_touch_keeps_a_long_delivery_off_isolation_and_without_it_isolation_comes(
    broker_factory, clients
):
    # enough tries that the message is not dead-lettered as poison within the test's second
    b = broker_factory(CONFIG.format(extra="<poisonDeliveries>20</poisonDeliveries>"))
    worker, other = Client(b.port), Client(b.port)
    clients += [worker, other]
    other.ch.basic_cancel(other.tag)
    publish(b.port, [b"long"])
    run([worker], 0.1)
    [m] = worker.got
    other.tag = other.ch.basic_consume("work", callback=other.got.append)
    last = [time.monotonic()]

    def touch_often() -> None:
        if time.monotonic() - last[0] >= 0.1:
            assert touch(m)
            last[0] = time.monotonic()

    run([worker, other], 1.0, touch_often)  # over three ack timeouts, touched every 100 ms
    assert isolated(b) == [] and other.got == []
    run([worker, other], 1.0)  # no more touches: isolated, the message moves
    assert isolated(b) == [worker.tag]
    assert [x.body for x in other.got] == [b"long"]
    other.ch.basic_ack(other.got[0].delivery_tag)
    # its late ack is accepted, it is released; a touch for it now changes nothing, closes nothing
    worker.ch.basic_ack(m.delivery_tag)
    run([worker], 0.1)
    assert isolated(b) == []
    assert touch(m)  # py-amqp messages have no `acknowledged`: the stale touch is sent
    run([worker], 0.1)
    # the broker ignores it: the channel stays open, the worker holds nothing, its clock is off
    assert worker.ch.is_open

    def holds() -> list[tuple[int, float | None]]:
        q = b.broker.vhosts["/"].queues["work"]
        return [(c.unacked, c.busy_since) for c in q.consumers if c.tag == worker.tag]

    assert b.call(holds) == [(0, None)] and isolated(b) == []


def test_stale_or_malformed_touches_are_harmless_or_clear_and_a_bystander_is_unaffected(
    broker_factory, clients
):
    b = broker_factory(CONFIG.format(extra=""))
    bystander = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
    bystander.connect()
    try:
        bch = bystander.channel()
        bch.confirm_select()
        bch.queue_declare("side", auto_delete=False)
        worker = Client(b.port)
        clients.append(worker)
        # a stale tag without confirms: nothing happens, the channel stays open
        worker.ch.basic_publish(
            amqp.Message(b"", application_headers={"x-touch-tag": 999}), exchange="amq.touch"
        )
        run([worker], 0.1)
        assert worker.ch.is_open
        bch.basic_publish(amqp.Message(b"b1"), exchange="", routing_key="side")
        # in confirm mode a stale tag is nacked, returned with 404 when mandatory
        cch = worker.conn.channel()
        returned: list = []
        cch.events["basic_return"].add(lambda *a: returned.append(a))
        with pytest.raises(amqp.exceptions.MessageNacked):
            cch.basic_publish_confirm(
                amqp.Message(b"", application_headers={"x-touch-tag": 1}),
                exchange="amq.touch",
                mandatory=True,
            )
        assert returned and returned[0][0].reply_code == 404
        assert "no unacked delivery with tag 1" in returned[0][0].reply_text
        # a touch without the tag header is a client bug: 406 with the reason
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="x-touch-tag"):
            worker.ch.basic_publish(amqp.Message(b""), exchange="amq.touch")
            run([worker], 0.2)
            worker.ch.basic_qos(0, 1, False)  # a synchronous call surfaces the close
        # amq.touch exists in every vhost and cannot be redeclared as something else
        other = bystander.channel()
        with pytest.raises(amqp.exceptions.PreconditionFailed, match=r"amq\.touch"):
            other.exchange_declare("amq.touch", "direct")
        bch.basic_publish(amqp.Message(b"b2"), exchange="", routing_key="side")
        assert bch.queue_declare("side", passive=True).message_count == 2
    finally:
        bystander.close()

"""Screenshots of every page of the management web UI, for docs/admin.md.

Starts a broker on free loopback ports (admin interface on), gives it something to show with
real clients (a backlog, consumers of which one is isolated for not acking, a slow topic
subscriber the Log policy reports, dead letters of two reasons), then opens each page in
headless Chromium and saves ``docs/img/ui-<page>.png``::

    python3 docs/tools/ui_screenshots.py            # into docs/img/
    python3 docs/tools/ui_screenshots.py --out /tmp/shots

Needs Debian's ``chromium`` and ``chromium-driver`` and selenium (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import amqp  # noqa: E402
import kombu  # noqa: E402
from brokerutil import ADMIN_GUEST, BrokerThread, write_config  # noqa: E402
from browserutil import chromium, missing_reason  # noqa: E402

VHOST = """
    <queue name="orders" durable="true">
      <deadLetter><maxRedeliveries>1</maxRedeliveries></deadLetter>
    </queue>
    <queue name="work" subscription="shared">
      <isolation><ackTimeout>1s</ackTimeout><checkPeriod>200ms</checkPeriod></isolation>
    </queue>
    <topic key="stocks.us.*">
      <consumer><messageCount>20</messageCount><policy name="Log"/></consumer>
    </topic>
"""

PAGES = ["overview", "queues", "consumers", "connections", "dead-letters", "timeline", "config"]


def connect(b: BrokerThread) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
    conn.connect()
    return conn


def populate(b: BrokerThread) -> list[amqp.Connection]:
    """Real clients making the state the pages show; the connections are kept open."""
    url = b.url()
    with kombu.Connection(url) as conn:
        q = kombu.Queue("orders", routing_key="orders", durable=True)
        prod = conn.Producer()
        for i in range(5):
            prod.publish({"order": i}, routing_key="orders", declare=[q], delivery_mode=2)
        q = q(conn.default_channel)
        for _ in range(3):
            q.get(no_ack=False).reject(requeue=False)
        for _ in range(2):  # maxRedeliveries 1: the second requeue dead-letters it
            q.get(no_ack=False).requeue()
    kept: list[amqp.Connection] = []
    # two consumers of the shared queue "work": one acks, one holds its message
    for acks in (True, False):
        c = connect(b)
        ch = c.channel()
        ch.queue_declare("work", auto_delete=False)
        ch.basic_qos(0, 1, False)

        def on(m: amqp.Message, ch: amqp.Channel = ch, acks: bool = acks) -> None:
            if acks:
                ch.basic_ack(m.delivery_tag)

        ch.basic_consume("work", callback=on)
        kept.append(c)
    # a topic subscriber that never reads: the Log policy reports it
    sub = connect(b)
    sch = sub.channel()
    qname = sch.queue_declare("ticker-ibm", auto_delete=False)[0]
    sch.queue_bind(qname, "amq.topic", "stocks.us.ibm")
    kept.append(sub)
    pub = connect(b)
    pch = pub.channel()
    pch.confirm_select()
    pch.queue_declare("backlog", auto_delete=False)
    admin = b.running.admin.admin
    for step in range(24):  # samples for the sparklines, a little apart
        for _ in range(3 + step % 5):
            pch.basic_publish(amqp.Message(b"job"), "", "backlog")
        pch.basic_publish(amqp.Message(b"w"), "", "work")
        pch.basic_publish(amqp.Message(b"tick"), "amq.topic", "stocks.us.ibm")
        for c in kept[:2]:
            try:
                c.drain_events(timeout=0.05)
            except TimeoutError:
                pass
        b.call(lambda: admin.history.sample(b.broker.api))
        time.sleep(0.1)
    kept.append(pub)
    time.sleep(1.5)  # the stuck consumer passes its ack timeout
    b.running.housekeeping.run_job("slow-consumer")
    return kept


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = p.parse_args()
    why = missing_reason()
    if why is not None:
        print(f"ui_screenshots: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerThread(
            write_config(Path(tmp), VHOST, admin=True, users=ADMIN_GUEST, period="600000")
        ).start()
        b.call(b.running.admin._sampler.cancel)  # this script takes the samples
        try:
            kept = populate(b)
            with chromium(1400, 860) as d:
                d.get(f"http://127.0.0.1:{b.running.admin.port}/")
                d.find_element("id", "login-user").send_keys("guest")
                d.find_element("id", "login-password").send_keys("guest")
                d.find_element("id", "login-submit").click()
                for page in PAGES:
                    d.get(f"http://127.0.0.1:{b.running.admin.port}/#{page}")
                    d.refresh()
                    time.sleep(1.0)
                    if page == "dead-letters":
                        d.find_element("css selector", 'button[data-action="browse"]').click()
                        d.find_element("css selector", 'button[data-action="dry-run"]').click()
                        time.sleep(0.5)
                    out = args.out / f"ui-{page}.png"
                    d.save_screenshot(str(out))
                    print(out)
            for c in kept:
                c.close()
        finally:
            b.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The admin commands (purge, delete, close, cancel, release) and what the web UI shows, with
real clients: each command through the HTTP API or ``plugbroker admin``, its effect seen by a
py-amqp or kombu client, its audit line in the log; the CLI's tables and its errors."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import amqp
import kombu
import pytest
from adminutil import AUTH, BusyBystander, Bystander, connect, request
from brokerutil import ADMIN_GUEST, drain_until

from plugbroker.cli import main as cli
from plugbroker.hookimpl import hookimpl

pytestmark = pytest.mark.e2e

KEY = "stocks.us.ibm"


@pytest.fixture
def b(broker_factory):
    return broker_factory(admin=True, users=ADMIN_GUEST)


def url(b) -> str:
    return f"http://127.0.0.1:{b.running.admin.port}"


def test_purge_through_the_cli_empties_the_queue_and_logs_who(b, capsys, caplog) -> None:
    caplog.set_level(logging.INFO, logger="plugbroker.admin")
    by = Bystander(b)
    with kombu.Connection(b.url()) as conn:
        q = kombu.Queue("orders", routing_key="orders", auto_delete=False)
        producer = conn.Producer()
        for i in range(7):
            producer.publish({"n": i}, routing_key="orders", declare=[q])
        by.publish()
        assert cli(["admin", "purge", "orders", "--url", url(b)]) == 0
        assert capsys.readouterr().out.split() == ["purged", "7"]
        assert q(conn.default_channel).queue_declare(passive=True).message_count == 0
    by.check()
    [line] = [r.getMessage() for r in caplog.records if "purged" in r.getMessage()]
    assert line == "admin: user 'guest' purged queue 'orders' in vhost '/': 7 messages"


class DeletedQueues:
    """A plugin recording ``broker_queue_deleted``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    @hookimpl
    def broker_queue_deleted(self, vhost: str, queue: str, reason: str) -> None:
        self.seen.append((vhost, queue, reason))


def test_delete_cancels_the_consumers_and_removes_the_queue(b, caplog) -> None:
    caplog.set_level(logging.INFO, logger="plugbroker.admin")
    deleted = DeletedQueues()
    b.call(lambda: b.broker.api.register_plugin(deleted, "test-deleted"))
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare("doomed", auto_delete=False)
    cancelled: list[str] = []
    ch.basic_consume(
        "doomed", consumer_tag="c1", callback=lambda m: None, on_cancel=cancelled.append
    )
    ch.basic_publish(amqp.Message(b"x"), "", "doomed")
    status, body = request(b.running.admin.port, "POST", "/api/queues/%2F/doomed/delete")
    assert status == 200 and body == {"deleted": True, "messages": 0}  # the one is unacked
    drain_until(conn, lambda: cancelled == ["c1"])
    assert not b.call(lambda: "doomed" in b.broker.vhosts["/"].queues)
    assert any("deleted queue 'doomed'" in r.getMessage() for r in caplog.records)
    assert deleted.seen == [("/", "doomed", "admin")]  # what plugins and the journal are told
    status, body = request(b.running.admin.port, "POST", "/api/queues/%2F/doomed/delete")
    assert status == 404 and body == {"error": "no queue 'doomed' in vhost '/'"}
    conn.close()


# ------------------------------------------------------------------ big queues, in steps


class RemovedWhileServing:
    """A plugin on ``broker_message_removed``: for each message a purge or redrive lets go,
    how many messages the bystander's queue had taken by then (its published counter)."""

    def __init__(self, api) -> None:
        self.api = api
        self.seen: list[int] = []

    @hookimpl
    def broker_message_removed(self, vhost, queue, message, reason) -> None:
        if queue != "bystander":
            info = self.api.queue("/", "bystander")
            self.seen.append(info.published_total if info is not None else -1)


def _fill(b, queue: str, n: int, **declare) -> None:
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(queue, auto_delete=False, **declare)
    for i in range(n):
        ch.basic_publish(amqp.Message(b"m%d" % i), "", queue)
    ch.queue_declare(queue, passive=True)  # a round trip: all are in
    conn.close()


@pytest.fixture
def small_steps(monkeypatch):
    """Steps of 20 messages, and the interpreter switching threads often: the broker and the
    bystander's thread share this process, and by default a thread holds the GIL for 5 ms,
    longer than a whole purge of these queues."""
    import sys

    from plugbroker.domain import fate

    monkeypatch.setattr(fate, "STEP_MESSAGES", 20)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


def test_a_big_purge_goes_in_steps_while_a_bystander_is_served(b, small_steps, caplog) -> None:
    caplog.set_level(logging.INFO, logger="plugbroker.admin")
    _fill(b, "big", 3000)
    seen = RemovedWhileServing(b.broker.api)
    b.call(lambda: b.broker.api.register_plugin(seen, "test-removed"))
    busy = BusyBystander(b)
    status, body = request(b.running.admin.port, "POST", "/api/queues/%2F/big/purge")
    busy.check()
    assert status == 200 and body == {"purged": 3000}
    assert len(seen.seen) == 3000
    # the bystander's publishes were taken between the steps, not only before or after
    assert len(set(seen.seen)) > 1, "no bystander publish between the purge's steps"
    assert b.call(lambda: b.broker.api.queue("/", "big").messages) == 0
    assert any("purged queue 'big' in vhost '/': 3000" in r.getMessage() for r in caplog.records)


def test_a_big_delete_answers_once_its_messages_are_let_go(b, small_steps) -> None:
    _fill(b, "big", 3000)
    busy = BusyBystander(b)
    status, body = request(b.running.admin.port, "POST", "/api/queues/%2F/big/delete")
    busy.check()
    assert status == 200 and body == {"deleted": True, "messages": 3000}
    assert not b.call(lambda: b.broker.api.has_queue("/", "big"))
    assert b.call(lambda: len(b.broker.api._stepping)) == 0


def test_a_big_redrive_goes_in_steps_while_a_bystander_is_served(b, small_steps) -> None:
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare("work-dlq", auto_delete=False)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work-dlq"}
    conn.close()
    _fill(b, "work", 1500, arguments=args)
    conn = connect(b)
    ch = conn.channel()
    got: list[int] = []
    ch.basic_consume("work", callback=lambda m: got.append(m.delivery_tag))
    drain_until(conn, lambda: len(got) == 1500, timeout=10)
    for tag in got:
        ch.basic_reject(tag, requeue=False)
    ch.queue_declare("work-dlq", passive=True)  # a round trip: all rejected
    conn.close()
    assert b.call(lambda: b.broker.api.queue("/", "work-dlq").messages) == 1500
    seen = RemovedWhileServing(b.broker.api)
    b.call(lambda: b.broker.api.register_plugin(seen, "test-removed"))
    busy = BusyBystander(b)
    status, body = request(b.running.admin.port, "POST", "/api/queues/%2F/work-dlq/redrive")
    busy.check()
    assert status == 200 and body == {"moved": {"work": 1500}, "kept": 0}
    assert len(seen.seen) == 1500 and len(set(seen.seen)) > 1
    assert b.call(lambda: b.broker.api.queue("/", "work").messages) == 1500
    assert b.call(lambda: b.broker.api.queue("/", "work-dlq").messages) == 0


def test_a_purge_whose_client_goes_away_still_completes(b, small_steps) -> None:
    _fill(b, "big", 3000)
    port = b.running.admin.port
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"POST /api/queues/%2F/big/purge HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
        + AUTH.encode()
        + b"\r\nContent-Length: 0\r\n\r\n"
    )
    sock.close()  # gone before the answer
    for _ in range(200):
        if b.call(lambda: b.broker.api.queue("/", "big").messages) == 0:
            break
        time.sleep(0.02)
    assert b.call(lambda: b.broker.api.queue("/", "big").messages) == 0
    assert b.call(lambda: b.broker.api.queue("/", "big").bytes) == 0


def test_close_connection_sends_320_with_the_text_and_spares_the_others(b, capsys) -> None:
    by = Bystander(b)
    victim = connect(b)
    victim.channel()
    cid = next(
        c["id"]
        for c in request(b.running.admin.port, "GET", "/api/connections")[1]
        if c["peer"].endswith(str(victim.sock.getsockname()[1]))
    )
    assert cli(["admin", "close", cid, "--reason", "maintenance", "--url", url(b)]) == 0
    assert "closed" in capsys.readouterr().out
    with pytest.raises(amqp.exceptions.ConnectionForced) as err:
        drain_until(victim, lambda: False, timeout=3)
    assert err.value.reply_code == 320 and "CONNECTION_FORCED - maintenance" in str(err.value)
    by.check()
    status, _ = request(b.running.admin.port, "POST", f"/api/connections/{quote(cid)}/close")
    assert status == 404


def test_cancel_and_release_one_consumer(b, capsys) -> None:
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare("work", auto_delete=False)
    cancelled: list[str] = []
    ch.basic_consume("work", consumer_tag="keep", callback=lambda m: None)
    ch.basic_consume(
        "work", consumer_tag="drop", callback=lambda m: None, on_cancel=cancelled.append
    )
    api = b.broker.api
    assert b.call(lambda: api.isolate("/", "work", "keep")) == 0
    common = ["--url", url(b)]
    assert cli(["admin", "blocklist", *common]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["vhost", "queue", "tag"] and "keep" in table[1]
    assert cli(["admin", "release", "work", "--tag", "keep", *common]) == 0
    assert b.call(lambda: api.consumers(isolated_only=True)) == []
    assert cli(["admin", "cancel", "work", "--tag", "drop", *common]) == 0
    drain_until(conn, lambda: cancelled == ["drop"])
    assert [c.tag for c in b.call(api.consumers)] == ["keep"]
    capsys.readouterr()
    assert cli(["admin", "cancel", "work", "--tag", "drop", *common]) == 1
    assert "404 no consumer 'drop' on queue 'work'" in capsys.readouterr().err
    ch.basic_publish(amqp.Message(b"still"), "", "work")  # the channel stays usable
    conn.close()


def test_tables_are_aligned_and_json_on_request(b, capsys) -> None:
    with kombu.Connection(b.url()) as conn:
        for name, n in (("a", 1), ("a-much-longer-name", 12)):
            q = kombu.Queue(name, routing_key=name, auto_delete=False)
            for _ in range(n):
                conn.Producer().publish(b"x", routing_key=name, declare=[q])
    assert cli(["admin", "queues", "--url", url(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head, rows = lines[0], lines[1:]
    col = head.index("messages") + len("messages")  # numbers are right-aligned under it
    assert sorted(r[:col].split()[-1] for r in rows) == ["1", "12"]
    at = head.index("name")  # text columns are left-aligned under their heading
    assert sorted(r[at:].split()[0] for r in rows) == ["a", "a-much-longer-name"]
    assert cli(["admin", "queues", "--json", "--url", url(b)]) == 0
    got = {q["name"]: q["messages"] for q in json.loads(capsys.readouterr().out)}
    assert got == {"a": 1, "a-much-longer-name": 12}


def test_history_samples_backlog_and_oldest_age_per_queue(broker_factory) -> None:
    from plugbroker.clock import ManualClock

    clock = ManualClock()
    b = broker_factory(admin=True, users=ADMIN_GUEST, clock=clock)
    server = b.running.admin
    b.call(server._sampler.cancel)  # the test takes the samples, at times it sets
    admin = server.admin
    with kombu.Connection(b.url()) as conn:
        q = kombu.Queue("spark", routing_key="spark", auto_delete=False)
        for _ in range(3):
            clock.advance(5)
            conn.Producer().publish(b"x", routing_key="spark", declare=[q])
            b.call(lambda: admin.history.sample(b.broker.api))
        with conn.Consumer(q, callbacks=[lambda body, m: m.ack()]):
            for _ in range(30):
                if b.call(lambda: b.broker.api.queue("/", "spark").messages) == 0:
                    break
                conn.drain_events(timeout=0.2)
        clock.advance(5)
        b.call(lambda: admin.history.sample(b.broker.api))
    status, body = request(b.running.admin.port, "GET", "/api/history")
    assert status == 200
    [row] = [r for r in body["queues"] if r["name"] == "spark"]
    assert row["messages"][-4:] == [1, 2, 3, 0]
    assert row["oldest_age_s"][-4:] == [0.0, 5.0, 10.0, 0.0]
    assert row["ack_rate"] == 0.6  # 3 acks in 5 s
    assert body["broker"]["ack_rate"][-1] == 0.6


def test_the_timeline_lists_policy_actions(broker_factory) -> None:
    b = broker_factory(
        '<topic key="stocks.us.*"><consumer><messageCount>2</messageCount>'
        '<policy name="Log"/></consumer></topic>',
        admin=True,
        users=ADMIN_GUEST,
        period="600000",
    )
    conn = connect(b)
    ch = conn.channel()
    qname = ch.queue_declare("", exclusive=True)[0]
    ch.queue_bind(qname, "amq.topic", KEY)
    pub = conn.channel()
    pub.confirm_select()
    for _ in range(5):
        pub.basic_publish(amqp.Message(b"x"), "amq.topic", KEY)
    assert b.running.housekeeping.run_job("slow-consumer") is True
    status, rows = request(b.running.admin.port, "GET", "/api/policy-actions")
    assert status == 200 and rows, rows
    assert rows[0]["queue"] == qname and rows[0]["threshold"] == "messageCount"
    assert rows[0]["policy"] == "Log" and rows[0]["measured"] == 5
    conn.close()


def test_running_config_hides_passwords(b) -> None:
    status, body = request(b.running.admin.port, "GET", "/api/config")
    assert status == 200 and body["source"].endswith(".xml")
    assert 'password="********"' in body["xml"] and 'password="guest"' not in body["xml"]
    assert "admin http://127.0.0.1" in body["summary"]


def test_a_post_from_another_site_is_refused(b) -> None:
    port = b.running.admin.port
    with kombu.Connection(b.url()) as conn:
        conn.Producer().publish(
            b"x", routing_key="kept", declare=[kombu.Queue("kept", auto_delete=False)]
        )
    evil = {"Origin": "http://evil.example"}
    status, body = request(port, "POST", "/api/queues/%2F/kept/purge", evil)
    assert status == 403 and body == {"error": "cross-site request refused"}
    assert b.call(lambda: b.broker.api.queue("/", "kept").messages) == 1
    same = {"Origin": f"http://127.0.0.1:{port}"}
    assert request(port, "POST", "/api/queues/%2F/kept/purge", same) == (200, {"purged": 1})


def test_a_rebound_host_name_is_refused_from_loopback(b) -> None:
    """A page at evil.example that points its name at 127.0.0.1 sends Host and Origin
    evil.example: same origin to the browser, and guest logs in from loopback; refused."""
    port = b.running.admin.port
    with kombu.Connection(b.url()) as conn:
        conn.Producer().publish(
            b"x", routing_key="kept2", declare=[kombu.Queue("kept2", auto_delete=False)]
        )
    rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    for method, path in (("GET", "/api/queues"), ("POST", "/api/queues/%2F/kept2/purge")):
        status, body = request(port, method, path, rebound)
        assert status == 403 and body == {"error": "request for another host name refused"}
    assert b.call(lambda: b.broker.api.queue("/", "kept2").messages) == 1
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
        status, _ = request(port, "GET", "/api/overview", {"Host": host})
        assert status == 200, host


ADMIN_EL = '<admin host="127.0.0.1" port="0"/>'


def test_allowed_hosts_let_a_reverse_proxy_name_through(broker_factory, tmp_path) -> None:
    """``<admin allowedHosts>``: a proxy on this machine forwarding ``Host: admin.example``
    is served; other names are still refused; a reload replaces the list."""
    from brokerutil import write_config

    path = write_config(tmp_path, admin=True, users=ADMIN_GUEST, name="proxy.xml")
    text = path.read_text()
    assert ADMIN_EL in text
    path.write_text(
        text.replace(ADMIN_EL, ADMIN_EL[:-2] + ' allowedHosts="Admin.Example, ops.internal"/>')
    )
    b = broker_factory(config_path=path)
    port = b.running.admin.port
    bystander = Bystander(b)
    for host in ("admin.example", "ADMIN.example:443", "ops.internal.", f"ops.internal:{port}"):
        status, body = request(port, "GET", "/api/overview", {"Host": host})
        assert status == 200 and body["product"] == "plugbroker", host
    status, _ = request(
        port,
        "POST",
        "/api/queues/%2F/bystander/purge",
        {"Host": "admin.example", "Origin": "https://admin.example"},
    )
    assert status == 200
    for host in ("evil.example", "admin.example.evil.example", "xadmin.example"):
        status, body = request(port, "GET", "/api/overview", {"Host": host})
        assert status == 403 and body == {"error": "request for another host name refused"}
    path.write_text(text.replace(ADMIN_EL, ADMIN_EL[:-2] + ' allowedHosts="new.example"/>'))
    status, _ = request(port, "POST", "/api/reload")
    assert status == 200
    assert request(port, "GET", "/api/overview", {"Host": "new.example"})[0] == 200
    assert request(port, "GET", "/api/overview", {"Host": "admin.example"})[0] == 403
    bystander.check()


def test_the_ui_page_needs_no_login_and_the_api_no_dialog_for_it(b) -> None:
    port = b.running.admin.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert b"/ui/app.js" in resp.read()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui/app.js", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/javascript")
    for path, code in (("/ui/../admin.py", 404), ("/ui/nothing.js", 404)):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
        assert err.value.code == code
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/overview")
    req.add_header("X-Plugbroker-UI", "1")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 401 and "WWW-Authenticate" not in err.value.headers


def test_the_ui_files_are_read_once_and_revalidated_with_their_etag(b, monkeypatch) -> None:
    import plugbroker.admin_http as admin_http

    port = b.running.admin.port

    def no_disk(*_a, **_kw):
        raise AssertionError("a UI file was read from disk for a request")

    # the server has its copy: a request does not go back to the package's files
    monkeypatch.setattr(admin_http.resources, "files", no_disk)
    tags = {}
    for path in ("/", "/ui/app.js", "/ui/style.css"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            body = resp.read()
            tags[path] = resp.headers["ETag"]
            assert resp.headers["Cache-Control"] == "no-cache" and body
            assert tags[path].startswith('"') and tags[path].endswith('"')
    assert len(set(tags.values())) == 3
    for path, tag in tags.items():
        for sent in (tag, f"W/{tag}", f'"other", {tag}', "*"):
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
            req.add_header("If-None-Match", sent)
            with pytest.raises(urllib.error.HTTPError) as err:  # urllib raises on a 304
                urllib.request.urlopen(req, timeout=5)
            assert err.value.code == 304 and err.value.read() == b""
            assert err.value.headers["ETag"] == tag
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        req.add_header("If-None-Match", '"stale"')
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200 and resp.read()


# ------------------------------------------------------------------------- the CLI's errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_admin_interface_says_how_to_enable_it(capsys) -> None:
    assert cli(["admin", "overview", "--url", f"http://127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert "connection refused" in err and '<admin host="127.0.0.1" port="15672"/>' in err


def test_pointed_at_the_amqp_port_it_says_so(broker, capsys) -> None:
    assert cli(["admin", "overview", "--url", f"http://127.0.0.1:{broker.port}"]) == 1
    err = capsys.readouterr().err
    assert "is an AMQP port" in err and "BadStatusLine" not in err and "Traceback" not in err


def test_a_refused_reload_prints_the_config_error_with_file_and_line(b, capsys) -> None:
    path = b.running.config.source
    good = path.read_text()
    path.write_text(good.replace("<housekeeping>", "<housekeeping><nonsense/>"))
    try:
        assert cli(["admin", "reload", "--url", url(b)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("plugbroker admin: 400 reload refused")
        assert f"{path}:" in err and "nonsense" in err
    finally:
        path.write_text(good)
    assert cli(["admin", "reload", "--url", url(b)]) == 0
    assert capsys.readouterr().out.split() == ["reloaded", "yes"]


POISON = (
    '<queue name="work" subscription="shared">'
    "<isolation><ackTimeout>10s</ackTimeout><poisonDeliveries>3</poisonDeliveries></isolation>"
    "</queue>"
)


def test_consumers_show_isolated_ones_and_the_timed_out_one_the_cap_spares(broker_factory) -> None:
    """Three consumers that never settle the one message: the first is isolated (the default
    cap allows one of three), the second holds it past its timeout and is spared, its delivery
    counted as timed out (shown as how long ago)."""
    from plugbroker.clock import ManualClock

    clock = ManualClock()
    b = broker_factory(POISON, admin=True, users=ADMIN_GUEST, clock=clock, period="600000")
    conns = [connect(b) for _ in range(3)]
    for i, conn in enumerate(conns):
        ch = conn.channel()
        ch.queue_declare("work", auto_delete=False)
        ch.basic_qos(0, 1, False)
        ch.basic_consume("work", consumer_tag=f"w{i}", callback=lambda m: None)
    pub = conns[0].channel()
    pub.confirm_select()
    pub.basic_publish(amqp.Message(b"poison"), "", "work")

    def rows() -> dict[str, dict]:
        return {c["tag"]: c for c in request(b.running.admin.port, "GET", "/api/consumers")[1]}

    def held_by_a_free_consumer() -> bool:
        return any(c["unacked"] and not c["isolated"] for c in rows().values())

    for _ in range(2):
        # the message is redelivered on the loop after a run: wait for it (bounded), so the
        # next holder's ack clock starts before the clock moves on
        deadline = time.monotonic() + 5
        while not held_by_a_free_consumer() and time.monotonic() < deadline:
            time.sleep(0.02)
        clock.advance(11)
        assert b.running.housekeeping.run_job("isolation") is True
    deadline = time.monotonic() + 5
    while not held_by_a_free_consumer() and time.monotonic() < deadline:
        time.sleep(0.02)
    got = rows()
    isolated = sorted(t for t, c in got.items() if c["isolated"])
    [holder] = [c for t, c in got.items() if c["unacked"]]
    assert len(isolated) == 1 and all(got[t]["unacked"] == 0 for t in isolated)
    assert not holder["isolated"] and holder["timed_out_age_s"] == 0.0
    idle = [c for c in got.values() if not c["isolated"] and not c["unacked"]]
    assert len(idle) == 1 and idle[0]["timed_out_age_s"] is None
    for conn in conns:
        conn.close()

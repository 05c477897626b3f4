"""Management tags over every admin endpoint, with real HTTP requests (and the CLI through it).

administrator: everything; monitoring: reads everything; management: reads and acts in the
vhosts it has permissions on, on its own connections and consumers; no tag: no admin API.
Refusals are RabbitMQ's 401
``{"error": "not_authorized", "reason": ...}``.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest

from plugbroker.admin_http import ENDPOINTS
from plugbroker.cli import main as cli

pytestmark = pytest.mark.e2e

USERS = """
<user name="root" password="pw" vhosts="/ other" tags="administrator"/>
<user name="mon" password="pw" vhosts="other" tags="monitoring"/>
<user name="mgmt" password="pw" vhosts="/" tags="management"/>
<user name="pm" password="pw" vhosts="/" tags="policymaker"/>
<user name="elsewhere" password="pw" vhosts="other" tags="management"/>
<user name="app" password="pw" vhosts="/ other"/>
"""

#: (method, template, path asked)
REQUESTS = [
    ("GET", "/api/overview", "/api/overview"),
    ("GET", "/api/queues", "/api/queues"),
    ("GET", "/api/consumers", "/api/consumers"),
    ("GET", "/api/blocklist", "/api/blocklist"),
    ("GET", "/api/connections", "/api/connections"),
    ("GET", "/api/dead-letters", "/api/dead-letters"),
    ("GET", "/api/queues/{vhost}/{queue}/messages", "/api/queues/%2F/work/messages"),
    ("PUT", "/api/queues/{vhost}/{queue}", "/api/queues/%2F/made"),
    ("POST", "/api/queues/{vhost}/{queue}/redrive", "/api/queues/%2F/work/redrive"),
    ("POST", "/api/queues/{vhost}/{queue}/purge", "/api/queues/%2F/work/purge"),
    ("POST", "/api/queues/{vhost}/{queue}/delete", "/api/queues/%2F/doomed/delete"),
    ("POST", "/api/connections/{id}/close", "/api/connections/{mgmt_connection}/close"),
    ("POST", "/api/consumers/{vhost}/{queue}/{tag}/cancel", "/api/consumers/%2F/work/c1/cancel"),
    (
        "POST",
        "/api/consumers/{vhost}/{queue}/{tag}/release",
        "/api/consumers/%2F/work/c1/release",
    ),
    ("GET", "/api/whoami", "/api/whoami"),
    ("GET", "/api/history", "/api/history"),
    ("GET", "/api/policy-actions", "/api/policy-actions"),
    ("GET", "/api/config", "/api/config"),
    ("POST", "/api/reload", "/api/reload"),
    ("GET", "/metrics", "/metrics"),
]
READS = {t for m, t, _ in REQUESTS if ENDPOINTS[m, t] == "management"}
IN_SLASH = {t for m, t, _ in REQUESTS if ENDPOINTS[m, t] == "vhost"}
#: closing a connection: an administrator any, a management user its own (mgmt's here)
CLOSE = "/api/connections/{id}/close"
#: cancelling or releasing a consumer: an administrator any, another user its own only (c1
#: is root's here)
OWNED = {
    "/api/consumers/{vhost}/{queue}/{tag}/cancel",
    "/api/consumers/{vhost}/{queue}/{tag}/release",
}

#: user -> the templates it may use (with the vhost "/" in the path)
ALLOWED = {
    "root": {t for _, t, _ in REQUESTS},
    "mon": READS | {"/metrics"},
    "mgmt": READS | (IN_SLASH - OWNED) | {CLOSE},
    "pm": READS | (IN_SLASH - OWNED),
    "elsewhere": READS,
    "app": set(),
}
REASON = {
    "/api/reload": "Not administrator user",
    "/api/config": "Not administrator user",
    CLOSE: "Not administrator user",
    "/metrics": "Not monitor user",
    "/api/queues/{vhost}/{queue}/messages": "User not authorised to access virtual host",
    **{t: "User not authorised to access virtual host" for t in IN_SLASH},
}


def call(port: int, method: str, path: str, user: str, password: str = "pw"):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method != "GET" else None
    )
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read().decode()
            ctype = resp.headers["Content-Type"]
            return resp.status, json.loads(body) if ctype.startswith("application/json") else body
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from brokerutil import BrokerThread, write_config

    path = write_config(tmp_path_factory.mktemp("tags"), admin=True, users=USERS)
    b = BrokerThread(path).start()
    b.call(lambda: b.broker.vhosts["/"].declare_queue("work"))
    b.call(lambda: b.broker.vhosts["other"].declare_queue("job"))
    yield b
    b.stop()


def test_the_matrix_covers_every_endpoint() -> None:
    assert {(m, t) for m, t, _ in REQUESTS} == set(ENDPOINTS)


@pytest.mark.parametrize("user", sorted(ALLOWED))
@pytest.mark.parametrize(("method", "template", "path"), REQUESTS, ids=[r[2] for r in REQUESTS])
def test_tag_matrix(broker, user: str, method: str, template: str, path: str) -> None:
    import amqp

    # what the request acts on: a queue to delete, a connection of mgmt's, a consumer c1
    broker.call(lambda: broker.broker.vhosts["/"].declare_queue("doomed"))
    mine = amqp.Connection(f"127.0.0.1:{broker.port}", userid="mgmt", password="pw")
    mine.connect()
    other = amqp.Connection(f"127.0.0.1:{broker.port}", userid="root", password="pw")
    other.connect()
    other.channel().basic_consume("work", consumer_tag="c1", callback=lambda m: None)
    try:
        [cid] = [c.id for c in broker.running.broker.api.connections() if c.user == "mgmt"]
        path = path.replace("{mgmt_connection}", quote(cid, safe=""))
        status, body = call(broker.running.admin.port, method, path, user)
    finally:
        for conn in (mine, other):
            try:
                conn.close()
            except Exception:  # closed by the request under test
                pass
    if template in ALLOWED[user]:
        assert status in ((200, 201) if method == "PUT" else (200,)), body
    else:
        assert status == 401, body
        assert body["error"] == "not_authorized"
        want = "Not management user" if user == "app" else REASON[template]
        if template in OWNED and user in ("mgmt", "pm"):
            want = "Not administrator user"  # in its vhost, but not its consumer
        assert body["reason"] == want


def test_a_wrong_password_is_a_401_whatever_the_tags(broker) -> None:
    status, body = call(broker.running.admin.port, "GET", "/api/overview", "root", "wrong")
    assert status == 401 and body["error"] == "not_authorized"


def test_management_sees_only_its_vhosts(broker) -> None:
    port = broker.running.admin.port
    names = {
        user: {(q["vhost"], q["name"]) for q in call(port, "GET", "/api/queues", user)[1]}
        for user in ("root", "mon", "mgmt", "elsewhere")
    }
    assert {("/", "work"), ("other", "job")} <= names["root"] == names["mon"]
    assert ("/", "work") in names["mgmt"] and all(v == "/" for v, _ in names["mgmt"])
    assert ("other", "job") in names["elsewhere"]
    assert all(v == "other" for v, _ in names["elsewhere"])
    assert call(port, "GET", "/api/overview", "elsewhere")[1]["vhosts"] == ["other"]
    assert call(port, "GET", "/api/overview", "root")[1]["vhosts"] == ["/", "other"]


def test_monitoring_and_management_act_in_their_own_vhost(broker) -> None:
    port = broker.running.admin.port
    for user in ("mon", "elsewhere"):
        assert call(port, "GET", "/api/queues/other/job/messages", user)[0] == 200
        assert call(port, "POST", "/api/queues/other/job/redrive", user)[0] == 200


def test_the_cli_is_refused_what_the_user_may_not_do(broker, capsys) -> None:
    url = f"http://127.0.0.1:{broker.running.admin.port}"
    common = ["--url", url, "--password", "pw"]
    assert cli(["admin", "reload", "--user", "mgmt", *common]) == 1
    err = capsys.readouterr().err
    assert "401" in err and "Not administrator user" in err
    assert cli(["admin", "reload", "--user", "root", *common]) == 0
    assert cli(["admin", "queues", "--user", "app", *common]) == 1
    assert "Not management user" in capsys.readouterr().err
    assert cli(["admin", "redrive", "work", "--user", "elsewhere", *common]) == 1
    assert cli(["admin", "redrive", "work", "--user", "mgmt", *common]) == 0

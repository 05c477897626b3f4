"""Tenants stay apart through the admin API: every route, as every kind of user, against a
resource inside the user's patterns and one outside them (another tenant's).

Each user ``U`` has RabbitMQ-style permissions ``configure="^U-" write="^U-" read="^U-"`` on
vhost ``/``, the way RabbitMQ shops give each team its own prefix; ``victim`` is the other
tenant. Each case asserts the HTTP status and, when refused, that nothing in the broker
changed (queues, message counts, consumers, connections). The AMQP door gives the same answer
for the same operation (:func:`test_http_and_amqp_refuse_in_the_same_words`).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import amqp
import pytest
from brokerutil import BrokerThread, write_config

pytestmark = pytest.mark.e2e


def _user(name: str, tags: str = "") -> str:
    p = f"^{name}-"
    tag = f' tags="{tags}"' if tags else ""
    return (
        f'<user name="{name}" password="pw"{tag}>'
        f'<permission vhost="/" configure="{p}" write="{p}" read="{p}"/></user>'
    )


#: kind of user -> its name
KINDS = {
    "management": "bob",
    "policymaker": "pm",
    "monitoring": "mon",
    "administrator": "root",
    "none": "app",
}
USERS = (
    _user("victim", "management")
    + _user("bob", "management")
    + _user("pm", "policymaker")
    + _user("mon", "monitoring")
    + _user("root", "administrator")
    + _user("app")
    + '<user name="setup" password="pw" vhosts="/"/>'
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    path = write_config(tmp_path_factory.mktemp("tenants"), admin=True, users=USERS)
    b = BrokerThread(path).start()
    yield b
    b.stop()


def call(
    b: BrokerThread, method: str, path: str, user: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    assert b.running is not None and b.running.admin is not None
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(
        f"http://127.0.0.1:{b.running.admin.port}{path}", method=method, data=data
    )
    token = base64.b64encode(f"{user}:pw".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def connect(b: BrokerThread, user: str) -> amqp.Connection:
    conn = amqp.Connection(f"127.0.0.1:{b.port}", userid=user, password="pw")
    conn.connect()
    return conn


def state(b: BrokerThread) -> tuple[Any, ...]:
    """Everything a refused request must leave as it was."""

    def read() -> tuple[Any, ...]:
        api = b.broker.api
        return (
            sorted((q.name, q.messages, q.consumers) for q in api.queues("/")),
            sorted((c.queue, c.tag, c.connection_id) for c in api.consumers("/")),
            sorted(c.id for c in api.connections()),
        )

    return b.call(read)


class World:
    """Per case: the victim's queues, messages, connection and consumer, and the same for
    the user under test (named by its prefix)."""

    def __init__(self, b: BrokerThread, user: str) -> None:
        self.b = b
        self.user = user
        self.conns: list[amqp.Connection] = []
        setup = connect(b, "setup")
        ch = setup.channel()
        for p in ("victim", user):
            for q in (f"{p}-q", f"{p}-work", f"{p}-dlq", f"{p}-dlq-out", f"{p}-doomed"):
                ch.queue_declare(q, durable=False, auto_delete=False)
            for _ in range(3):
                ch.basic_publish(amqp.Message(b"x"), exchange="", routing_key=f"{p}-q")
            dead = {"REAL_TOPIC": f"{p}-q"}
            ch.basic_publish(
                amqp.Message(b"d", application_headers=dead), exchange="", routing_key=f"{p}-dlq"
            )
            # a dead letter whose header names the other tenant's queue
            out = {"REAL_TOPIC": "victim-q" if p == user else "bob-q"}
            ch.basic_publish(
                amqp.Message(b"d", application_headers=out),
                exchange="",
                routing_key=f"{p}-dlq-out",
            )
        ch.basic_qos(0, 0, False)  # a round trip: the publishes are in
        setup.close()
        self.victim = self._consumer("victim")
        self.mine = self._consumer(user)

    def _consumer(self, p: str) -> str:
        conn = connect(self.b, p)
        self.conns.append(conn)
        conn.channel().basic_consume(f"{p}-work", consumer_tag=f"{p}-c", callback=lambda m: None)
        conn.channel().basic_qos(0, 0, False)
        api = self.b.broker.api
        [cid] = [
            c.connection_id for c in self.b.call(lambda: api.consumers("/")) if c.tag == f"{p}-c"
        ] or [""]
        return cid

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.close()
            except Exception:  # closed by the request under test
                pass

        def clear() -> None:
            vh = self.b.broker.vhosts["/"]
            for q in list(vh.queues.values()):
                vh.delete_queue(q, reason="test")

        self.b.call(clear)


@pytest.fixture
def world_for(broker: BrokerThread) -> Iterator[Callable[[str], World]]:
    made: list[World] = []

    def make(user: str) -> World:
        w = World(broker, user)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


V = "%2F"

#: route -> (method, path, JSON body) for a tenant prefix ``p`` and the world; "inside" uses
#: the user's own prefix, "outside" the victim's
Route = Callable[[str, World], tuple[str, str, dict[str, Any] | None]]
ROUTES: dict[str, Route] = {
    "peek": lambda p, w: ("GET", f"/api/queues/{V}/{p}-q/messages", None),
    "declare": lambda p, w: ("PUT", f"/api/queues/{V}/{p}-new", None),
    "purge": lambda p, w: ("POST", f"/api/queues/{V}/{p}-q/purge", None),
    "delete": lambda p, w: ("POST", f"/api/queues/{V}/{p}-doomed/delete", None),
    "redrive": lambda p, w: ("POST", f"/api/queues/{V}/{p}-dlq/redrive", None),
    "cancel": lambda p, w: (
        "POST",
        f"/api/consumers/{V}/{p}-work/{p}-c/cancel?connection="
        + quote(w.victim if p == "victim" else w.mine, safe=""),
        None,
    ),
    "release": lambda p, w: (
        "POST",
        f"/api/consumers/{V}/{p}-work/{p}-c/release?connection="
        + quote(w.victim if p == "victim" else w.mine, safe=""),
        None,
    ),
    "close": lambda p, w: (
        "POST",
        "/api/connections/" + quote(w.victim if p == "victim" else w.mine, safe="") + "/close",
        None,
    ),
    # the user's own queue, with a dead-letter exchange inside or outside its patterns
    "declare-dlx": lambda p, w: (
        "PUT",
        f"/api/queues/{V}/{w.user}-dlx-q",
        {"arguments": {"x-dead-letter-exchange": f"{p}-dlx"}},
    ),
    # the user's own dead-letter queue, whose message names a queue inside or outside
    "redrive-into": lambda p, w: (
        "POST",
        f"/api/queues/{V}/{w.user}-{'dlq' if p == w.user else 'dlq-out'}/redrive",
        None,
    ),
    "list-connections": lambda p, w: ("GET", "/api/connections", None),
    "list-consumers": lambda p, w: ("GET", "/api/consumers", None),
    "list-queues": lambda p, w: ("GET", "/api/queues", None),
}
LISTS = {"list-connections", "list-consumers", "list-queues"}
#: routes that only read, inside the patterns too
READ_ONLY = LISTS | {"peek"}


def expected(route: str, kind: str, where: str) -> int:
    if kind == "none":
        return 401  # no management tag: no admin API at all
    if route in LISTS or route == "redrive-into":
        return 200  # a listing is filtered; a refused target keeps its message (below)
    if where == "inside":
        return 201 if route.startswith("declare") else 200
    if route == "close" and kind == "administrator":
        return 200  # an administrator closes any connection, as in RabbitMQ
    return 401


@pytest.mark.parametrize("where", ["inside", "outside"])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_as_every_kind_of_user(
    broker: BrokerThread, world_for: Callable[[str], World], route: str, kind: str, where: str
) -> None:
    user = KINDS[kind]
    w = world_for(user)
    p = user if where == "inside" else "victim"
    method, path, body = ROUTES[route](p, w)
    before = state(broker)
    status, answer = call(broker, method, path, user, body)
    after = state(broker)
    want = expected(route, kind, where)
    assert status == want, answer
    if status == 401:
        assert answer["error"] == "not_authorized"
        assert after == before, "a refused request changed the broker"
        if kind == "none":
            assert answer["reason"] == "Not management user"
        elif route in ("close",):
            assert answer["reason"] == "Not administrator user"
        else:  # the AMQP refusal, word for word
            assert answer["reason"].startswith("ACCESS_REFUSED - "), answer
            assert f"refused for user '{user}'" in answer["reason"]
        return
    if route == "redrive-into":
        if where == "inside":
            assert answer["moved"] == {f"{user}-q": 1}
        else:  # the header names the victim's queue: it stays, the victim's queue untouched
            assert answer["moved"] == {} and answer["refused"] == {"victim-q": 1}
            assert after == before
        return
    if route in LISTS:
        rows = answer
        sees_all = kind in ("monitoring", "administrator")
        if route == "list-connections":
            users = {r["user"] for r in rows}
            assert user in users
            assert ("victim" in users) == sees_all
            assert all("peer" in r for r in rows)
        elif route == "list-consumers":
            tags = {r["tag"] for r in rows}
            assert f"{user}-c" in tags
            assert ("victim-c" in tags) == sees_all
        else:  # queue names of a vhost the user may open: as RabbitMQ lists them
            assert {"victim-q", f"{user}-q"} <= {r["name"] for r in rows}
        assert after == before
        return
    if route == "release":  # the consumer was not isolated: nothing to see
        assert answer == {"released": True}
    elif route in READ_ONLY:
        assert after == before
    else:
        assert after != before, f"{route} as {user} inside its patterns did nothing"


def test_the_table_covers_every_admin_route_that_names_a_resource() -> None:
    from plugbroker.admin_http import ENDPOINTS

    named = {t for (_m, t), need in ENDPOINTS.items() if need in ("vhost", "connection")}
    covered = {
        "/api/queues/{vhost}/{queue}/messages",
        "/api/queues/{vhost}/{queue}",
        "/api/queues/{vhost}/{queue}/purge",
        "/api/queues/{vhost}/{queue}/delete",
        "/api/queues/{vhost}/{queue}/redrive",
        "/api/consumers/{vhost}/{queue}/{tag}/cancel",
        "/api/consumers/{vhost}/{queue}/{tag}/release",
        "/api/connections/{id}/close",
    }
    assert named == covered


def test_http_and_amqp_refuse_in_the_same_words(
    broker: BrokerThread, world_for: Callable[[str], World]
) -> None:
    """The two doors ask one table: bob's purge of the victim's queue is refused with the
    same text over HTTP as over AMQP, and neither purges."""
    world_for("bob")
    status, answer = call(broker, "POST", f"/api/queues/{V}/victim-q/purge", "bob")
    assert status == 401
    conn = connect(broker, "bob")
    try:
        with pytest.raises(amqp.exceptions.AccessRefused) as info:
            conn.channel().queue_purge("victim-q")
    finally:
        conn.close()
    assert answer["reason"] == info.value.reply_text
    assert answer["reason"] == (
        "ACCESS_REFUSED - read access to queue 'victim-q' in vhost '/' refused for user 'bob'"
    )
    assert dict((n, m) for n, m, _c in state(broker)[0])["victim-q"] == 3


def test_a_redrive_moves_what_the_asker_may_write_and_keeps_the_rest(
    broker: BrokerThread, world_for: Callable[[str], World]
) -> None:
    """carol's case: one dead-letter queue holding a message for its own queue and one whose
    ``REAL_TOPIC`` names another tenant's queue. The first goes back, the second stays."""
    w = world_for("bob")
    setup = connect(broker, "setup")
    ch = setup.channel()
    ch.basic_publish(
        amqp.Message(b"own", application_headers={"REAL_TOPIC": "bob-q"}),
        exchange="",
        routing_key="bob-dlq-out",
    )
    ch.basic_qos(0, 0, False)
    setup.close()
    status, answer = call(broker, "POST", f"/api/queues/{V}/bob-dlq-out/redrive", "bob")
    assert status == 200
    assert answer["moved"] == {"bob-q": 1}
    assert answer["refused"] == {"victim-q": 1}
    counts = {n: m for n, m, _c in state(broker)[0]}
    assert counts["victim-q"] == 3 and counts["bob-dlq-out"] == 1 and counts["bob-q"] == 4
    # a dry run says the same
    status, answer = call(
        broker, "POST", f"/api/queues/{V}/bob-dlq-out/redrive?dry_run=true", "bob"
    )
    assert status == 200 and answer["refused"] == {"victim-q": 1}
    assert w.user == "bob"

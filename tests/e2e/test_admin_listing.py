"""Listings paged, filtered and sorted as RabbitMQ's management API answers them, built in
bounded steps; /metrics aggregated and /metrics/per-object."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.parse
from typing import Any

import pytest
from adminutil import BusyBystander, request
from brokerutil import ADMIN_GUEST

from plugbroker.admin_steps import CHUNK, Steps
from plugbroker.admin_walk import sample_in_steps

pytestmark = pytest.mark.e2e

PAGED_KEYS = [
    "filtered_count",
    "item_count",
    "items",
    "page",
    "page_count",
    "page_size",
    "total_count",
]


@pytest.fixture
def b(broker_factory):
    return broker_factory(admin=True, users=ADMIN_GUEST)


def declare(b, names: list[str], vhost: str = "/") -> None:
    def run() -> None:
        vh = b.broker.vhosts[vhost]
        for n in names:
            vh.declare_queue(n)

    b.call(run)


def get(b, path: str, **params: Any) -> tuple[int, Any]:
    qs = urllib.parse.urlencode(params)
    return request(b.running.admin.port, "GET", path + ("?" + qs if qs else ""))


def names(rows: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in rows]


def test_a_page_has_rabbitmqs_shape_and_counts(b) -> None:
    declare(b, [f"q{i}" for i in (5, 3, 6, 1, 4, 2, 0)])
    declare(b, ["elsewhere"], vhost="other")
    status, body = get(b, "/api/queues", page=2, page_size=3)
    assert status == 200 and sorted(body) == PAGED_KEYS
    assert {k: v for k, v in body.items() if k != "items"} == {
        "filtered_count": 8,
        "item_count": 3,
        "page": 2,
        "page_count": 3,
        "page_size": 3,
        "total_count": 8,
    }
    # sorted by vhost, then name: "/" q0..q6, then "other"
    assert names(body["items"]) == ["q3", "q4", "q5"]
    status, last = get(b, "/api/queues", page=3, page_size=3)
    assert [(r["vhost"], r["name"]) for r in last["items"]] == [("/", "q6"), ("other", "elsewhere")]
    assert last["item_count"] == 2
    # page_size defaults to 100; an unpaged request keeps the plain list
    assert get(b, "/api/queues", page=1)[1]["page_size"] == 100
    _, plain = get(b, "/api/queues")
    assert isinstance(plain, list) and len(plain) == 8


def test_bad_paging_is_a_400_as_rabbitmq_words_it(b) -> None:
    declare(b, [f"q{i}" for i in range(6)])
    assert get(b, "/api/queues", page=0) == (
        400,
        {
            "error": "invalid_pagination_parameters",
            "reason": "Invalid pagination parameters: page number 0, page size undefined",
        },
    )
    assert get(b, "/api/queues", page=1, page_size=501) == (
        400,
        {
            "error": "invalid_pagination_parameters",
            "reason": "Invalid pagination parameters: page number 1, page size 501",
        },
    )
    assert get(b, "/api/queues", page=1, page_size=0)[0] == 400
    assert get(b, "/api/queues", page="two") == (
        400,
        {"error": "bad_request", "reason": "Pagination parameters are invalid"},
    )
    assert get(b, "/api/queues", page=5, page_size=2) == (
        400,
        {"error": "page_out_of_range", "reason": "Page out of range, page: 5 page size: 2, len: 6"},
    )
    assert get(b, "/api/queues", page=2, page_size=2, name="q1")[1]["reason"] == (
        "Page out of range, page: 2 page size: 2, len: 1"  # counted after the name filter
    )
    # the page just past the last full one is empty, not an error (RabbitMQ's sublist)
    status, body = get(b, "/api/queues", page=3, page_size=3)
    assert status == 200 and body["items"] == [] and body["page_count"] == 2
    assert get(b, "/api/queues", page=1, page_size=500)[0] == 200
    too_long = "a" * 1025
    assert get(b, "/api/queues", page=1, name=too_long, use_regex="true") == (
        400,
        {"error": "invalid_pagination_parameters", "reason": "name filter regex is too long"},
    )


def test_name_filters_by_substring_or_regex_in_any_case(b) -> None:
    declare(b, ["Orders", "orders-dlq", "billing", "audit"])
    _, body = get(b, "/api/queues", page=1, name="ORDER")
    assert names(body["items"]) == ["Orders", "orders-dlq"]
    assert (body["filtered_count"], body["total_count"]) == (2, 4)
    _, body = get(b, "/api/queues", page=1, name="^(b|a)", use_regex="true")
    assert names(body["items"]) == ["audit", "billing"]
    _, body = get(b, "/api/queues", page=1, name="dlq$", use_regex="true")
    assert names(body["items"]) == ["orders-dlq"]
    # a pattern that does not compile matches nothing, as in RabbitMQ
    status, body = get(b, "/api/queues", page=1, name="(", use_regex="true")
    assert status == 200 and body["items"] == [] and body["filtered_count"] == 0
    # without use_regex the text is taken literally
    assert get(b, "/api/queues", page=1, name="^(b|a)")[1]["filtered_count"] == 0
    # unpaged, the filter applies too and the answer stays a list
    assert names(get(b, "/api/queues", name="order")[1]) == ["Orders", "orders-dlq"]


def test_sort_reverse_and_columns(b) -> None:
    declare(b, ["a", "b", "c"])
    conn_msgs = {"a": 2, "b": 0, "c": 5}
    import amqp

    c = amqp.Connection(host=f"127.0.0.1:{b.port}", userid="guest", password="guest")
    c.connect()
    ch = c.channel()
    for q, n in conn_msgs.items():
        for i in range(n):
            ch.basic_publish(amqp.Message(b"x" * (i + 1)), "", q)
    ch.queue_declare("a", passive=True)
    c.close()
    _, body = get(b, "/api/queues", page=1, sort="messages")
    assert names(body["items"]) == ["b", "a", "c"]
    _, body = get(b, "/api/queues", page=1, sort="messages", sort_reverse="true")
    assert names(body["items"]) == ["c", "a", "b"]
    _, rows = get(b, "/api/queues", sort="name", sort_reverse="true", columns="name,messages")
    assert rows == [
        {"name": "c", "messages": 5},
        {"name": "b", "messages": 0},
        {"name": "a", "messages": 2},
    ]
    # a nested column by dotted path; a missing column sorts as 0, before everything
    body = get(b, "/api/queues", page=1, columns="name,policy.none", sort="nothing")[1]
    assert body["items"] == [
        {"name": "a", "policy": {}},
        {"name": "b", "policy": {}},
        {"name": "c", "policy": {}},
    ]


def test_other_listings_page_too(b) -> None:
    import amqp

    c = amqp.Connection(host=f"127.0.0.1:{b.port}", userid="guest", password="guest")
    c.connect()
    ch = c.channel()
    for q in ("x1", "x2", "x3"):
        ch.queue_declare(q)
        ch.basic_consume(q, consumer_tag=f"t-{q}", callback=lambda m: None)
    _, body = get(b, "/api/consumers", page=1, page_size=2, name="x")
    assert [r["queue"] for r in body["items"]] == ["x1", "x2"] and body["page_count"] == 2
    body = get(b, "/api/connections", page=1)[1]
    assert body["total_count"] == 1 and body["items"][0]["user"] == "guest"
    assert get(b, "/api/blocklist", page=1)[1]["total_count"] == 0
    assert get(b, "/api/dead-letters", page=1)[1]["items"] == []
    c.close()


# ------------------------------------------------------------------ bounded steps


class LoopWatch:
    """A task on the broker's loop that wakes at every turn it gets and records how many
    queues the listings read since its previous turn."""

    def __init__(self, b) -> None:
        self.b = b
        self.admin = b.running.admin.admin
        self.deltas: list[int] = []
        self.stop = False
        self.task = asyncio.run_coroutine_threadsafe(self._run(), b.loop)

    async def _run(self) -> None:
        last = self.admin.rows_built
        while not self.stop:
            await asyncio.sleep(0)
            now = self.admin.rows_built
            if now != last:
                self.deltas.append(now - last)
            last = now

    def done(self) -> list[int]:
        self.stop = True
        self.task.result(5)
        return self.deltas


@pytest.fixture
def fast_switch():
    """The broker and the bystander's thread share this process: switch threads often."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(interval)


N_QUEUES = 3000


@pytest.mark.parametrize("path", ["/api/queues", "/metrics/per-object", "/api/consumers"])
def test_a_big_listing_is_built_a_chunk_per_loop_turn(b, fast_switch, path) -> None:
    declare(b, [f"tenant-{i:05d}" for i in range(N_QUEUES)])
    busy = BusyBystander(b)
    watch = LoopWatch(b)
    port = b.running.admin.port
    if path.startswith("/metrics"):
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
        assert text.count("plugbroker_queue_messages{") == N_QUEUES + 1  # and the bystander's
    else:
        status, rows = request(port, "GET", path)
        assert status == 200
        if path == "/api/queues":
            assert len(rows) == N_QUEUES + 1
    deltas = watch.done()
    busy.check()  # every confirm came
    # the loop turned between every two chunks: never more than a chunk of queues at once
    assert deltas and max(deltas) <= CHUNK, max(deltas)
    assert sum(deltas) >= N_QUEUES and len(deltas) >= N_QUEUES // CHUNK


def test_a_user_whose_vhost_is_empty_reads_nothing_of_the_others(broker_factory) -> None:
    users = ADMIN_GUEST + '<user name="small" password="pw" vhosts="other" tags="management"/>'
    b = broker_factory(admin=True, users=users)
    b.call(b.running.admin._sampler.cancel)  # the sampler reads every queue: not now
    declare(b, [f"big-{i}" for i in range(2 * CHUNK)])
    before = b.running.admin.admin.rows_built
    import base64
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{b.running.admin.port}/api/queues?page=1")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"small:pw").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["total_count"] == 0 and body["items"] == []
    assert b.running.admin.admin.rows_built == before  # not one queue of "/" was read


# ------------------------------------------------------------------ metrics


def test_metrics_are_aggregated_by_default_and_per_object_on_request(b) -> None:
    import amqp

    declare(b, ["m1", "m2"])
    c = amqp.Connection(host=f"127.0.0.1:{b.port}", userid="guest", password="guest")
    c.connect()
    ch = c.channel()
    for q, n in (("m1", 2), ("m2", 3)):
        for _ in range(n):
            ch.basic_publish(amqp.Message(b"x"), "", q)
    ch.queue_declare("m1", passive=True)
    c.close()
    admin = b.running.admin.admin
    asyncio.run_coroutine_threadsafe(sample_in_steps(admin, Steps()), b.loop).result(5)
    port = b.running.admin.port
    import urllib.request

    def scrape(path: str) -> str:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.read().decode()

    agg = scrape("/metrics").splitlines()
    assert "plugbroker_queue_messages 5" in agg
    assert "plugbroker_queue_published_total 5" in agg
    assert not any(line.startswith("plugbroker_queue_messages{") for line in agg)
    assert "plugbroker_resource_alarm 0" in agg  # the broker's own families are there too
    per = scrape("/metrics/per-object").splitlines()
    assert 'plugbroker_queue_messages{vhost="/",queue="m1"} 2' in per
    assert 'plugbroker_queue_messages{vhost="/",queue="m2"} 3' in per
    assert "plugbroker_resource_alarm 0" in per
    ov = get(b, "/api/overview")[1]
    assert ov["messages"] == 5 and ov["queues"] == 2

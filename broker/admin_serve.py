"""The admin's answers that grow with the broker's objects: the listings (``/api/queues``,
``/api/consumers``, ``/api/blocklist``, ``/api/connections``, ``/api/dead-letters``) and the
metrics (``/metrics``, ``/metrics/per-object``).

Each is read from the core API a bounded step at a time (:mod:`plugbroker.admin_walk`),
paged, filtered and sorted as RabbitMQ's management API does (:mod:`plugbroker.admin_listing`),
and written to the client a piece at a time, so neither its building nor its text holds the
loop for long, and an answer of tens of megabytes is never held whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from plugbroker.admin import Admin
from plugbroker.admin_access import Principal
from plugbroker.admin_listing import answer, encode_in_steps, parse_listing
from plugbroker.admin_steps import Steps
from plugbroker.admin_walk import (
    aggregated_metrics,
    consumer_chunks,
    per_object_metrics,
    queue_chunks,
    row_chunks,
)

__all__ = ["LISTINGS", "serve_listing", "serve_metrics"]

Row = dict[str, Any]

#: each listing's own order (after the ``sort`` column asked for) and the field ``name``
#: filters on
LISTINGS: dict[str, tuple[tuple[str, ...], str]] = {
    "queues": (("vhost", "name"), "name"),
    "consumers": (("vhost", "queue", "tag", "connection"), "queue"),
    "blocklist": (("vhost", "queue", "tag", "connection"), "queue"),
    "connections": (("vhost", "id"), "id"),
    "dead-letters": (("vhost", "queue"), "queue"),
}

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def serve_listing(
    request: web.BaseRequest,
    admin: Admin,
    who: Principal,
    what: str,
    query: dict[str, list[str]],
) -> web.StreamResponse:
    """A listing as ``who`` may see it (RabbitMQ's management rules: monitoring and
    administrator everything; other users the objects of their vhosts and, of connections
    and consumers, their own only), paged and filtered as the query asks."""
    listing = parse_listing(query)  # a bad parameter answers before any work
    steps = Steps()
    visible = who.visible()
    vhosts = [v for v in admin.api.vhosts() if visible is None or v in visible]
    default_sort, name_key = LISTINGS[what]
    body = await answer(
        listing,
        _rows(admin, who, what, vhosts, steps),
        default_sort=default_sort,
        name_key=name_key,
        steps=steps,
    )
    return await _stream(request, "application/json", encode_in_steps(body, steps))


def _rows(
    admin: Admin, who: Principal, what: str, vhosts: list[str], steps: Steps
) -> AsyncIterator[list[Row]]:
    if what == "queues":
        return queue_chunks(admin, vhosts, steps)
    if what in ("consumers", "blocklist"):
        keep = None
        if not who.sees_all:
            mine = {c["id"] for c in admin.connections() if who.sees(c["user"])}

            def keep(row: Row) -> bool:
                return row["connection"] in mine

        return consumer_chunks(admin, vhosts, steps, isolated_only=what == "blocklist", keep=keep)
    if what == "connections":
        seen = set(vhosts)
        rows = [
            c
            for c in admin.connections()
            if who.sees_all or (c["vhost"] in seen and who.sees(c["user"]))
        ]
        return row_chunks(rows, steps)
    return row_chunks(admin.dead_letters(frozenset(vhosts)), steps)


async def serve_metrics(
    request: web.BaseRequest, admin: Admin, *, per_object: bool
) -> web.StreamResponse:
    """``/metrics`` (every per-object family summed, from the last sample: O(vhosts)) or
    ``/metrics/per-object`` (a sample per queue and consumer, read in steps)."""
    if not per_object:
        return web.Response(
            body=aggregated_metrics(admin).encode(), headers={"Content-Type": METRICS_TYPE}
        )
    return await _stream(request, METRICS_TYPE, per_object_metrics(admin, Steps()))


async def _stream(
    request: web.BaseRequest, ctype: str, pieces: AsyncIterator[bytes]
) -> web.StreamResponse:
    """The answer written a piece at a time as ``pieces`` come (chunked transfer encoding);
    a client that does not read holds up only its own answer."""
    first = await anext(pieces, b"")  # a failure before it is still a plain error answer
    resp = web.StreamResponse(headers={"Content-Type": ctype})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(first)
    async for piece in pieces:
        await resp.write(piece)
    await resp.write_eof()
    return resp

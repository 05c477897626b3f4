"""The admin's walks over every queue, each a bounded step at a time (:mod:`plugbroker.admin_steps`).

* the rows of ``/api/queues``, ``/api/consumers`` and ``/api/blocklist``: the vhosts the asker
  may see, queue by queue, a chunk of queues per loop turn (an asker whose vhosts are empty
  costs nothing, whatever the other vhosts hold);
* the sampler: every queue's figures for the web UI's sparklines and the per-vhost sums that
  ``/api/overview`` and the aggregated ``/metrics`` read, so that those answer in
  O(vhosts) from the last sample instead of walking the queues per request;
* the per-object ``/metrics`` text, family by family.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from plugbroker.admin import consumer_json, queue_json
from plugbroker.admin_metrics import (
    Figures,
    VhostSample,
    aggregated_families,
    broker_lines,
    consumer_rows,
    family_lines,
    object_families,
    queue_figures,
    queue_labels,
)
from plugbroker.admin_steps import Steps, chunked

if TYPE_CHECKING:
    from plugbroker.admin import Admin

__all__ = [
    "aggregated_metrics",
    "consumer_chunks",
    "per_object_metrics",
    "queue_chunks",
    "row_chunks",
    "sample_in_steps",
]

Row = dict[str, Any]


async def _queue_names(
    admin: Admin, vhosts: Iterable[str], steps: Steps
) -> AsyncIterator[tuple[str, Sequence[str], float]]:
    """``(vhost, a chunk of its queue names, now)`` for every queue of ``vhosts``, a turn of
    the loop after each chunk (a queue deleted meanwhile is not found by its name)."""
    api = admin.api
    for vhost in vhosts:
        for names in chunked(api.queue_names(vhost), steps.chunk):
            yield vhost, names, api.clock.monotonic()
            admin.rows_built += len(names)
            await steps.turn()


async def queue_chunks(
    admin: Admin, vhosts: Iterable[str], steps: Steps
) -> AsyncIterator[list[Row]]:
    """The rows of every queue of ``vhosts``, a chunk of queues per loop turn."""
    api = admin.api
    async for vhost, names, now in _queue_names(admin, vhosts, steps):
        rows = []
        for name in names:
            q = api.queue(vhost, name)
            if q is not None:
                rows.append(queue_json(q, now))
        yield rows


async def consumer_chunks(
    admin: Admin,
    vhosts: Iterable[str],
    steps: Steps,
    *,
    isolated_only: bool = False,
    keep: Callable[[Row], bool] | None = None,
) -> AsyncIterator[list[Row]]:
    """The rows of the consumers of every queue of ``vhosts`` (those ``keep`` accepts), a
    chunk of queues per loop turn."""
    api = admin.api
    async for vhost, names, now in _queue_names(admin, vhosts, steps):
        rows = []
        for name in names:
            for c in api.consumers(vhost, name, isolated_only=isolated_only):
                row = consumer_json(c, now)
                if keep is None or keep(row):
                    rows.append(row)
        yield rows


async def row_chunks(rows: Sequence[Row], steps: Steps) -> AsyncIterator[list[Row]]:
    """Rows read at once (connections, dead-letter queues) handed on a chunk at a time."""
    for part in chunked(rows, steps.chunk):
        yield list(part)
        await steps.turn()


async def sample_in_steps(admin: Admin, steps: Steps) -> None:
    """One sample of every queue for the web UI's history and the per-vhost sums
    (:attr:`Admin.sampled`), a chunk of queues per loop turn."""
    api = admin.api
    history = admin.history
    history.begin()
    sampled: dict[str, VhostSample] = {v: VhostSample() for v in api.vhosts()}
    async for vhost, names, now in _queue_names(admin, list(sampled), steps):
        fig = sampled[vhost]
        for name in names:
            q = api.queue(vhost, name)
            if q is None:
                continue
            history.add(q, now)
            fig.add_queue(queue_figures(q, now))
            if q.consumers:
                for c in api.consumers(vhost, name):
                    fig.add_consumer((c.unacked, c.isolated))
    conns = api.connections()
    for conn in conns:
        if conn.vhost in sampled:
            sampled[conn.vhost].connections += 1
    now = api.clock.monotonic()
    history.finish(now, len(conns))
    admin.sampled = sampled
    admin.sampled_at = now


def aggregated_metrics(admin: Admin) -> str:
    """``/metrics``: the per-object families summed over the last sample, and the broker's
    own families: O(vhosts + connections), whatever the number of queues."""
    total = VhostSample()
    for fig in admin.sampled.values():
        total.merge(fig)
    lines: list[str] = []
    for fam in aggregated_families(total):
        lines.extend(family_lines(*fam))
    lines.extend(broker_lines(admin.api))
    return "\n".join(lines) + "\n"


async def per_object_metrics(admin: Admin, steps: Steps) -> AsyncIterator[bytes]:
    """``/metrics/per-object``: a sample per queue and per consumer, read a chunk of queues
    per loop turn, then written family by family a chunk of lines at a time."""
    api = admin.api
    queues: list[tuple[str, Figures]] = []
    consumers: list[tuple[str, Figures]] = []
    async for vhost, names, now in _queue_names(admin, api.vhosts(), steps):
        for name in names:
            q = api.queue(vhost, name)
            if q is None:
                continue
            queues.append((queue_labels(vhost, name), queue_figures(q, now)))
            if q.consumers:
                consumers.extend(consumer_rows(api.consumers(vhost, name)))
    for fam in object_families(queues, consumers):
        lines: list[str] = []
        for line in family_lines(*fam):
            lines.append(line)
            if len(lines) >= steps.chunk * 8:  # a line costs far less than a queue
                yield ("\n".join(lines) + "\n").encode()
                lines = []
                await steps.turn()
        if lines:
            yield ("\n".join(lines) + "\n").encode()
    yield ("\n".join(broker_lines(api)) + "\n").encode()

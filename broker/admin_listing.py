"""Listings of the admin API as RabbitMQ's management API answers them: paged, filtered,
sorted and cut to columns, built in bounded steps so that the event loop serves every client
between two of them.

The query parameters and their errors are RabbitMQ's (``rabbit_mgmt_util``):

* ``page`` (from 1) asks for a paged answer, ``page_size`` rows a page (default 100, at most
  :data:`MAX_PAGE_SIZE`): ``{"filtered_count", "item_count", "items", "page", "page_count",
  "page_size", "total_count"}``. Without ``page`` the answer is the list it always was.
* ``name`` keeps the rows whose name contains it (any case), or with ``use_regex=true`` that
  the regular expression matches (any case, at most :data:`MAX_FILTER_LENGTH` characters).
* ``sort`` orders by a column (dotted for a nested one: ``policy.isolation``), then by the
  listing's own key (vhost and name for queues); ``sort_reverse=true`` reverses the order.
* ``columns`` (comma-separated, dotted for nested ones) keeps those fields of each row.

A bad parameter is a 400 as RabbitMQ gives it: ``{"error": "invalid_pagination_parameters",
"reason": "Invalid pagination parameters: page number 0, page size 100"}``, ``bad_request``
for a page that is no integer, ``page_out_of_range`` for a page past the last one.

The rows come from the core API a chunk at a time (:class:`plugbroker.admin_steps.Steps` yields to
the loop between two chunks), and every later stage (filter, sort keys, sorted runs, their
merge, the JSON text) goes the same bounded step at a time, so a listing of 100,000 queues
costs the other clients a few milliseconds per turn, never the whole listing at once.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from plugbroker.admin import AdminError
from plugbroker.admin_steps import Steps

__all__ = [
    "MAX_PAGE_SIZE",
    "Listing",
    "answer",
    "encode_in_steps",
    "parse_listing",
]

#: RabbitMQ's default and largest page size
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
#: RabbitMQ's bound on a ``name`` regular expression
MAX_FILTER_LENGTH = 1024
#: how long one ``name`` regular expression may run on one name (seconds)
REGEX_TIMEOUT = 0.002


Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Listing:
    """What a listing request asks for (see the module docstring)."""

    page: int | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    name: str | None = None
    use_regex: bool = False
    #: column paths (``("policy", "isolation")``), None: every column
    columns: tuple[tuple[str, ...], ...] | None = None
    #: the column to sort by first, None: the listing's own order
    sort: str | None = None
    sort_reverse: bool = False


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def parse_listing(query: dict[str, list[str]]) -> Listing:
    """The listing parameters of a request, or RabbitMQ's 400 for a bad one."""
    raw_page, raw_size = _one(query, "page"), _one(query, "page_size")
    try:
        page = int(raw_page) if raw_page is not None else None
        size = int(raw_size) if raw_size is not None else None
    except ValueError:
        raise AdminError(400, "bad_request", reason="Pagination parameters are invalid") from None
    name = _one(query, "name") or None
    use_regex = _one(query, "use_regex") == "true"
    if name is not None and use_regex and len(name) > MAX_FILTER_LENGTH:
        raise AdminError(
            400, "invalid_pagination_parameters", reason="name filter regex is too long"
        )
    if page is not None and (page < 1 or (size is not None and not 0 < size <= MAX_PAGE_SIZE)):
        raise AdminError(
            400,
            "invalid_pagination_parameters",
            reason="Invalid pagination parameters: page number "
            f"{page}, page size {'undefined' if size is None else size}",
        )
    cols = _one(query, "columns")
    columns = (
        tuple(tuple(p for p in c.split(".") if p) for c in cols.split(",") if c.strip("."))
        if cols is not None
        else None
    )
    return Listing(
        page=page,
        page_size=size if size is not None and page is not None else DEFAULT_PAGE_SIZE,
        name=name,
        use_regex=use_regex,
        columns=columns,
        sort=_one(query, "sort") or None,
        sort_reverse=_one(query, "sort_reverse") == "true",
    )


# ------------------------------------------------------------------------------ filter


def name_filter(listing: Listing, key: str) -> Callable[[Row], bool] | None:
    """The test a row's ``key`` passes for ``name``: a substring in any case, or a regular
    expression (any case) under a time bound; None without a ``name``."""
    name = listing.name
    if name is None:
        return None
    if not listing.use_regex:
        low = name.lower()
        return lambda row: low in str(row.get(key, "")).lower()
    try:
        pattern = regex.compile(name, regex.IGNORECASE)
    except regex.error:
        return lambda row: False  # RabbitMQ: a pattern that does not compile matches nothing

    def match(row: Row) -> bool:
        try:
            return pattern.search(str(row.get(key, "")), timeout=REGEX_TIMEOUT) is not None
        except TimeoutError:
            raise AdminError(
                400,
                "invalid_pagination_parameters",
                reason=f"name filter regex took over {REGEX_TIMEOUT * 1000:g} ms on one name",
            ) from None

    return match


# ------------------------------------------------------------------------------ sort


def _dotted(row: Any, path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(row, dict) or part not in row:
            return 0  # RabbitMQ: "nothing" sorts as 0, before everything else
        row = row[part]
    return row


def sort_key(value: Any) -> tuple[int, Any]:
    """A total order over JSON values in the spirit of Erlang's term order, which RabbitMQ
    sorts by: numbers, then atoms (false, null, true), then objects, then lists, then
    strings (byte by byte)."""
    if isinstance(value, bool):
        return (1, "true" if value else "false")
    if isinstance(value, (int, float)):
        return (0, value)
    if value is None:
        return (1, "null")
    if isinstance(value, dict):
        return (2, json.dumps(value, sort_keys=True, default=str))
    if isinstance(value, (list, tuple)):
        return (3, json.dumps(value, default=str))
    return (4, str(value).encode("utf-8", "surrogatepass"))


Keyed = tuple[tuple[tuple[int, Any], ...], int]


async def sorted_in_steps(keyed: list[Keyed], reverse: bool, steps: Steps) -> list[int]:
    """The indices of ``keyed`` ``(sort key, index)`` in sorted order: runs of a step's
    length sorted, then merged, a bounded step at a time."""
    runs = []
    for start in range(0, len(keyed), steps.chunk):
        runs.append(sorted(keyed[start : start + steps.chunk]))
        await steps.tick(steps.chunk)
    order: list[int] = []
    for _key, i in heapq.merge(*runs):
        order.append(i)
        await steps.tick()
    if reverse:
        order.reverse()
    return order


def merge_sorts(sort: str | None, default: Sequence[str]) -> list[str]:
    """RabbitMQ's order of sort columns: the requested one, then the listing's own."""
    return list(dict.fromkeys(([sort] if sort else []) + list(default)))


# ------------------------------------------------------------------------------ columns


def _descend(key: str, cols: list[tuple[str, ...]]) -> list[tuple[str, ...]] | None:
    """The column paths under ``key`` (None: all of it)."""
    sub = []
    for c in cols:
        if c[0] == key:
            if len(c) == 1:
                return None
            sub.append(c[1:])
    return sub


def extract_columns(item: Any, cols: list[tuple[str, ...]] | None) -> Any:
    """``item`` cut to the column paths ``cols`` as RabbitMQ's ``columns`` does: an object
    keeps the keys named (nested ones by dotted path); a list is cut element by element."""
    if cols is None:
        return item
    if isinstance(item, dict):
        wanted = {c[0] for c in cols}
        return {k: extract_columns(v, _descend(k, cols)) for k, v in item.items() if k in wanted}
    if isinstance(item, list):
        return [extract_columns(x, cols) for x in item]
    return item


# ------------------------------------------------------------------------------ answer


@dataclass(slots=True)
class Answer:
    """A listing's answer: each row's JSON text in order, and for a page what RabbitMQ puts
    around them. The rows are kept as text, not objects: 100,000 rows held as dicts would
    feed CPython's cycle collector a million objects to walk."""

    rows: list[str]
    #: the paged answer's other fields, None when not paged
    page: dict[str, int] | None = None


async def answer(
    listing: Listing,
    chunks: AsyncIterator[list[Row]],
    *,
    default_sort: Sequence[str],
    name_key: str = "name",
    steps: Steps,
) -> Answer:
    """The listing's answer from ``chunks`` of rows (each bounded by its producer, who yields
    between two): every row the asker may see, filtered, sorted and paged as asked."""
    keep = name_filter(listing, name_key)
    paths = [tuple(c.split(".")) for c in merge_sorts(listing.sort, default_sort)]
    cols = list(listing.columns) if listing.columns is not None else None
    total = 0
    keyed: list[Keyed] = []
    texts: list[str] = []
    async for chunk in chunks:
        total += len(chunk)
        for row in chunk:
            if keep is None or keep(row):
                keyed.append((tuple(sort_key(_dotted(row, p)) for p in paths), len(texts)))
                texts.append(json.dumps(extract_columns(row, cols)))
            await steps.tick()
    order = await sorted_in_steps(keyed, listing.sort_reverse, steps)
    if listing.page is None:
        return Answer([texts[i] for i in order])
    page, size = listing.page, listing.page_size
    start = (page - 1) * size
    if start > len(order):
        raise AdminError(
            400,
            "page_out_of_range",
            reason=f"Page out of range, page: {page} page size: {size}, len: {len(order)}",
        )
    items = [texts[i] for i in order[start : start + size]]
    return Answer(
        items,
        {
            "filtered_count": len(order),
            "item_count": len(items),
            "page": page,
            "page_count": (len(order) + size - 1) // size,
            "page_size": size,
            "total_count": total,
        },
    )


async def encode_in_steps(body: Answer, steps: Steps) -> AsyncIterator[bytes]:
    """The JSON text of a listing's answer in pieces, a bounded number of rows each (the
    caller writes each to the client, which yields to the loop too)."""
    if body.page is not None:
        yield (json.dumps(body.page)[:-1] + ', "items": [').encode()
    else:
        yield b"["
    for start in range(0, len(body.rows), steps.chunk):
        part = ",\n".join(body.rows[start : start + steps.chunk])
        yield (part if start == 0 else ",\n" + part).encode()
        await steps.tick(steps.chunk)
    yield b"]}" if body.page is not None else b"]"

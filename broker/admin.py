"""The admin interface: a small HTTP API for operators and a Prometheus metrics endpoint.

Enabled by ``<admin host="127.0.0.1" port="15672"/>`` (HTTPS with a ``<tls>`` child). This
module holds the operations (:class:`Admin`, on the core API only) and the metrics text;
:mod:`plugbroker.admin_http` serves them with aiohttp on the broker's event loop, so every read and
every change runs on the loop, sees a consistent state and never races it. Requests
authenticate with HTTP Basic as a configured broker user.

==========================================  ================================================
``GET  /api/overview``                      version, connections, queues, messages, alarm
``GET  /api/queues``                        every queue with its running figures and policy
``GET  /api/consumers``                     every consumer: unacked, prefetch, last ack age
``GET  /api/blocklist``                     isolated consumers
``GET  /api/connections``                   client connections
``GET  /api/dead-letters``                  dead-letter queues: what they hold by reason and source
``GET  /api/queues/{vhost}/{queue}/messages``  peek at ready messages (``?limit=20``)
``POST /api/queues/{vhost}/{queue}/redrive`` move dead letters back to their original queue
                                            (``?limit=``, ``?reason=``, ``?reset=false``,
                                            ``?dry_run=true``, ``?rate=`` messages/s)
``POST /api/reload``                        re-read the configuration (like SIGHUP)
``GET  /metrics``                           Prometheus text format
==========================================  ================================================

Vhost names in paths are URL-encoded (``/`` is ``%2F``), as in RabbitMQ's management API.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from plugbroker.admin_metrics import VhostSample
from plugbroker.core.api import (
    BrokerAPI,
    ConsumerInfo,
    LimitsInfo,
    NotFound,
    QueueInfo,
    RedriveResult,
)
from plugbroker.errors import ChannelError
from plugbroker.hookimpl import hookimpl

if TYPE_CHECKING:
    from plugbroker.config import BrokerConfig
    from plugbroker.policy import Action

log = logging.getLogger("plugbroker.admin")

T = TypeVar("T")


class Reloader(Protocol):
    """What a reload needs from the process that runs the broker (``plugbroker.runner.Running``)."""

    def prepare_reload(self) -> BrokerConfig | None:
        """Read and validate the configuration file (any thread); None if it did not validate."""
        ...

    def apply_reload(self, cfg: BrokerConfig) -> None:
        """Put a validated configuration in effect (on the loop)."""
        ...

    @property
    def reload_error(self) -> str | None:
        """Why the last ``prepare_reload`` returned None (the configuration error, with file
        and line), or None."""
        ...


class AdminError(Exception):
    """An answer other than 200: ``{"error": message}`` (and ``"reason"`` when given)."""

    def __init__(self, status: int, message: str, *, reason: str | None = None) -> None:
        super().__init__(message if reason is None else f"{message}: {reason}")
        self.status = status
        self.message = message
        self.reason = reason


# ------------------------------------------------------------------------ views (JSON)


def queue_json(q: QueueInfo, now: float) -> dict[str, Any]:
    oldest = q.oldest_arrival
    return {
        "vhost": q.vhost,
        "name": q.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive,
        "subscription_type": q.subscription_type,
        "messages": q.messages,
        "ready": q.ready,
        "unacked": q.unacked,
        "delayed": q.delayed,
        "bytes": q.bytes,
        "oldest_age_s": round(now - oldest, 3) if oldest is not None else 0.0,
        "consumers": q.consumers,
        "acks_total": q.acks_total,
        "delivery_limit": q.delivery_limit,
        "retry_target": q.retry_target,
        "arguments": _jsonable(q.arguments),
        "bindings": [{"exchange": e, "type": t, "key": k} for e, t, k in q.bindings],
        "policy": dict(q.policy_source),
    }


def consumer_json(c: ConsumerInfo, now: float) -> dict[str, Any]:
    since = c.ack_clock
    return {
        "vhost": c.vhost,
        "queue": c.queue,
        "tag": c.tag,
        "connection": c.connection_id,
        "channel": c.channel_id,
        "unacked": c.unacked,
        "prefetch": c.prefetch,
        "no_ack": c.no_ack,
        "isolated": c.isolated,
        "delivered": c.delivered,
        "last_ack_age_s": round(now - since, 3) if since is not None else None,
        # how long ago the delivery it works on last counted a timed-out hand-out
        "timed_out_age_s": (round(now - c.timed_out_at, 3) if c.timed_out_at is not None else None),
    }


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


class Admin:
    """The operations behind the HTTP API, on the core API; each runs on the broker's loop
    (called there by the admin server; from another thread, :meth:`on_loop` hops over)."""

    def __init__(self, api: BrokerAPI, reloader: Reloader) -> None:
        self.api = api
        self.reloader = reloader
        self.history = History()
        self.timeline = Timeline(api.clock.time)
        #: each vhost's figures at the last sample (:func:`plugbroker.admin_walk.sample_in_steps`)
        self.sampled: dict[str, VhostSample] = {}
        self.sampled_at = api.clock.monotonic()
        #: queues the admin's walks (listings, metrics, samples) have read so far (a test
        #: watches it across loop turns)
        self.rows_built = 0

    def on_loop(self, fn: Callable[[], T]) -> T:
        try:
            result: T = self.api.call_on_loop(fn)
        except NotFound as exc:
            raise AdminError(404, str(exc)) from None
        return result

    def overview(self, vhosts: frozenset[str] | None = None) -> dict[str, Any]:
        """The broker at a glance; with ``vhosts``, the figures of those vhosts only (what a
        ``management`` user may see). O(vhosts): messages, consumers and the connections of
        a vhost are the last sample's (:attr:`sampled`, ``sampled_age_s`` old), the rest is
        read now."""

        def read() -> dict[str, Any]:
            api = self.api
            names = sorted(v for v in api.vhosts() if vhosts is None or v in vhosts)
            total = VhostSample()
            for v in names:
                fig = self.sampled.get(v)
                if fig is not None:
                    total.merge(fig)
            li = api.limits()
            return {
                "product": "plugbroker",
                "version": api.version,
                "connections": li.open_connections if vhosts is None else total.connections,
                "vhosts": names,
                "queues": sum(li.vhost_queues.get(v, 0) for v in names),
                "messages": total.queues[0],
                "consumers": total.consumer_count,
                "isolated": total.consumers[1],
                "sampled_age_s": round(api.clock.monotonic() - self.sampled_at, 3),
                "delayed_pending": (
                    api.delayed_pending()
                    if vhosts is None
                    else sum(api.delayed_pending(v) for v in names)
                ),
                "alarm": api.alarm,
                "alarms": [
                    {"name": a.name, "detail": a.detail, "since": a.since} for a in api.alarms()
                ],
                "resources": _resources_json(api),
                "plugins": list(api.plugin_names()),
                **({"limits": limits_json(li)} if vhosts is None else {}),
                **({"failures": _failures_json(api)} if vhosts is None else {}),
            }

        return self.on_loop(read)

    def connections(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [
                {
                    "id": c.id,
                    "peer": c.peer,
                    "user": c.user,
                    "vhost": c.vhost,
                    "channels": c.channels,
                    "heartbeat": c.heartbeat,
                    "blocked": c.blocked,
                    "output_paused": c.output_paused,
                    "partial_bytes": c.partial_bytes,
                    "unsent_bytes": c.unsent_bytes,
                }
                for c in self.api.connections()
            ]

        return self.on_loop(read)

    def dead_letters(self, vhosts: frozenset[str] | None = None) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            api = self.api
            return [
                {
                    "vhost": d.vhost,
                    "queue": d.queue,
                    "messages": d.messages,
                    "received_by_reason": dict(d.received_by_reason),
                    "by_reason": dict(d.by_reason),
                    "sources": dict(d.sources),
                }
                for v in api.vhosts()
                if vhosts is None or v in vhosts
                for d in api.dead_letters(v)
            ]

        return self.on_loop(read)

    def messages(self, vhost: str, name: str, limit: int = 20) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [
                {
                    "id": m.id,
                    "exchange": m.exchange,
                    "routing_key": m.routing_key,
                    "size": m.size,
                    "delivery_count": m.delivery_count,
                    "redelivered": m.redelivered,
                    "properties": _jsonable(m.decoded_properties()),
                }
                for m in self.api.messages(vhost, name, limit=limit)
            ]

        return self.on_loop(read)

    async def redrive(
        self,
        vhost: str,
        name: str,
        limit: int | None = None,
        *,
        reasons: list[str] | None = None,
        reset: bool = True,
        dry_run: bool = False,
        rate: float | None = None,
        by: str = "",
        allowed: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Move the ready messages of a dead-letter queue back to the queue each came from
        (``REAL_TOPIC``, else the last ``x-death`` queue). Messages whose origin is unknown or
        gone, or that ``allowed`` says the asker may not write, stay where they are. See
        :meth:`plugbroker.core.api.BrokerAPI.redrive` for the options. Without a rate (and for a
        dry run) the work goes a bounded step per loop turn
        (:meth:`plugbroker.core.api.BrokerAPI.redrive_in_steps`); on the loop only."""
        opts: dict[str, Any] = {
            "limit": limit,
            "reasons": reasons,
            "reset": reset,
            "dry_run": dry_run,
            "allowed": allowed,
        }
        if rate is None:
            try:
                result = await self.api.redrive_in_steps(vhost, name, **opts)
            except NotFound as exc:
                raise AdminError(404, str(exc)) from None
            return self._redrive_answer(vhost, name, result, reasons, reset, dry_run, rate, by)

        def run() -> dict[str, Any]:
            result = self.api.redrive(vhost, name, rate=rate, **opts)
            return self._redrive_answer(vhost, name, result, reasons, reset, dry_run, rate, by)

        return self.on_loop(run)

    def _redrive_answer(
        self,
        vhost: str,
        name: str,
        result: RedriveResult,
        reasons: list[str] | None,
        reset: bool,
        dry_run: bool,
        rate: float | None,
        by: str,
    ) -> dict[str, Any]:
        """The log line and the JSON answer of a redrive."""
        log.info(
            "redrive of '%s' in vhost '%s'%s%s: %s moved back, %d kept%s%s",
            name,
            vhost,
            f" by user '{by}'" if by else "",
            " (dry run)" if dry_run else "",
            dict(result.planned if dry_run else result.moved) or "nothing",
            result.kept,
            f" ({dict(result.refused)} refused: no write permission)" if result.refused else "",
            f", {result.pending} to follow at {rate:g}/s" if result.pending else "",
        )
        out: dict[str, Any] = {"moved": dict(result.moved), "kept": result.kept}
        if result.refused:
            out["refused"] = dict(result.refused)
        if dry_run or rate is not None or reasons or not reset:
            out.update(
                planned=dict(result.planned),
                pending=result.pending,
                dry_run=result.dry_run,
                reset=reset,
            )
        return out

    # -- commands (each writes one audit line: who did what to what) -------------------------

    def declare_queue(
        self,
        vhost: str,
        name: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        by: str,
    ) -> tuple[bool, dict[str, Any]]:
        """Declare a queue as a client would, within ``<limits><maxQueuesPerVhost>``; returns
        ``(created, queue view)``. A refusal (the limit, an argument a client would be refused
        for, an existing queue declared otherwise) is a 400 with the AMQP reply text."""

        def run() -> tuple[bool, dict[str, Any]]:
            api = self.api
            existed = api.has_queue(vhost, name)
            try:
                info = api.declare_queue(
                    vhost,
                    name,
                    durable=durable,
                    auto_delete=auto_delete,
                    arguments=arguments,
                    limited=True,
                )
            except ChannelError as exc:
                raise AdminError(400, "bad_request", reason=exc.reply_text) from None
            if not existed:
                log.info(
                    "admin: user '%s' declared queue '%s' in vhost '%s'%s",
                    by,
                    name,
                    vhost,
                    " (durable)" if durable else "",
                )
            return not existed, queue_json(info, api.clock.monotonic())

        return self.on_loop(run)

    async def purge_queue(self, vhost: str, name: str, *, by: str) -> dict[str, Any]:
        """Purge a queue, a bounded step per loop turn (a queue may hold millions); answers
        when it is done. On the loop only."""
        try:
            n = await self.api.purge_queue_in_steps(vhost, name)
        except NotFound as exc:
            raise AdminError(404, str(exc)) from None
        log.info(
            "admin: user '%s' purged queue '%s' in vhost '%s': %d messages", by, name, vhost, n
        )
        return {"purged": n}

    async def delete_queue(self, vhost: str, name: str, *, by: str) -> dict[str, Any]:
        """Delete a queue at once, its messages freed a bounded step per loop turn; answers
        when it is done. On the loop only."""
        try:
            n = await self.api.delete_queue_in_steps(
                vhost, name, reason="admin", detail=f"deleted by user '{by}'"
            )
        except NotFound as exc:
            raise AdminError(404, str(exc)) from None
        log.info(
            "admin: user '%s' deleted queue '%s' in vhost '%s' (%d ready messages)",
            by,
            name,
            vhost,
            n,
        )
        self.history.forget(vhost, name)
        return {"deleted": True, "messages": n}

    def connection(self, connection_id: str) -> dict[str, Any] | None:
        """One connection's row, or None."""
        for row in self.connections():
            if row["id"] == connection_id:
                return row
        return None

    def close_connection(self, connection_id: str, *, by: str, reason: str = "") -> dict[str, Any]:
        text = reason or f"Closed via management plugin by user '{by}'"

        def run() -> dict[str, Any]:
            if not self.api.close_connection(connection_id, text):
                raise AdminError(404, f"no connection '{connection_id}'")
            self.api.end_of_turn()
            log.info("admin: user '%s' closed connection '%s': %s", by, connection_id, text)
            return {"closed": True}

        return self.on_loop(run)

    def consumer(self, vhost: str, queue: str, tag: str, connection_id: str) -> ConsumerInfo:
        def run() -> ConsumerInfo:
            c = self.api.consumer(vhost, queue, tag, connection_id)
            if c is None:
                raise AdminError(404, f"no consumer '{tag}' on queue '{queue}' in vhost '{vhost}'")
            return c

        return self.on_loop(run)

    def cancel_consumer(
        self, vhost: str, queue: str, tag: str, connection_id: str = "", *, by: str
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            if not self.api.cancel_consumer(vhost, queue, tag, connection_id):
                raise AdminError(404, f"no consumer '{tag}' on queue '{queue}' in vhost '{vhost}'")
            self.api.end_of_turn()
            log.info(
                "admin: user '%s' cancelled consumer '%s' of queue '%s' in vhost '%s'",
                by,
                tag,
                queue,
                vhost,
            )
            return {"cancelled": True}

        return self.on_loop(run)

    def release_consumer(
        self, vhost: str, queue: str, tag: str, connection_id: str = "", *, by: str
    ) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            if not self.api.release(vhost, queue, tag, connection_id, reason=f"admin: {by}"):
                raise AdminError(404, f"no consumer '{tag}' on queue '{queue}' in vhost '{vhost}'")
            self.api.end_of_turn()
            log.info(
                "admin: user '%s' released consumer '%s' of queue '%s' in vhost '%s'",
                by,
                tag,
                queue,
                vhost,
            )
            return {"released": True}

        return self.on_loop(run)

    # -- what the web UI draws -------------------------------------------------------------

    def queue_history(self, vhosts: frozenset[str] | None = None) -> dict[str, Any]:
        return self.on_loop(lambda: self.history.json(vhosts))

    def policy_actions(self, vhosts: frozenset[str] | None = None) -> list[dict[str, Any]]:
        return [a for a in self.timeline.rows() if vhosts is None or a["vhost"] in vhosts]

    def running_config(self) -> dict[str, Any]:
        """The configuration in effect: its summary and its file, passwords hidden."""

        def read() -> tuple[str, str | None]:
            cfg = self.api.config
            return cfg.describe(), str(cfg.source) if cfg.source is not None else None

        summary, source = self.on_loop(read)
        text = None
        if source is not None:
            try:
                text = hide_secrets(Path(source).read_text(encoding="utf-8"))
            except OSError as exc:
                text = f"(cannot read {source}: {exc.strerror})"
        return {"source": source, "summary": summary, "xml": text}

    def reload(self, cfg: BrokerConfig | None) -> dict[str, Any]:
        """Put ``cfg`` in effect: a configuration ``Reloader.prepare_reload`` read and
        validated off the loop (None: it did not validate, and the running one stays)."""
        if cfg is None:
            why = getattr(self.reloader, "reload_error", None) or "see the broker's log"
            raise AdminError(
                400,
                f"reload refused, the running configuration stays: {why}",
            )
        self.on_loop(lambda: self.reloader.apply_reload(cfg))
        return {"reloaded": True}


_SECRET = re.compile(r"""(\b(?:password|passwordHash)\s*=\s*)("[^"]*"|'[^']*')""")


def hide_secrets(xml: str) -> str:
    """The configuration text with every ``password`` and ``passwordHash`` value replaced."""
    return _SECRET.sub(lambda m: m.group(1) + '"********"', xml)


class History:
    """A small bounded ring of samples per queue (and one for the broker) for the web UI's
    sparklines and rates: each :meth:`sample` costs O(queues), never O(messages)."""

    def __init__(self, size: int = 120, max_queues: int = 5000) -> None:
        self.size = size
        #: queues with a ring of their own; beyond, a queue counts in the broker's sums only
        #: (100,000 rings of 120 samples would be a million objects for the cycle collector)
        self.max_queues = max_queues
        self._seen: set[tuple[str, str]] = set()
        self._sums = [0, 0]
        #: (vhost, queue) -> samples ``(t, messages, oldest_age_s, acks_total)``
        self.queues: dict[tuple[str, str], deque[tuple[float, int, float, int]]] = {}
        #: samples ``(t, messages, acks_total, connections)`` over the whole broker
        self.totals: deque[tuple[float, int, int, int]] = deque(maxlen=size)

    def sample(self, api: BrokerAPI) -> None:
        """One sample of every queue at once (O(queues)); the admin server takes them a
        bounded step at a time (:meth:`Admin.sample_in_steps`)."""
        now = api.clock.monotonic()
        self.begin()
        for q in api.queues():
            self.add(q, now)
        self.finish(now, len(api.connections()))

    def begin(self) -> None:
        """A new sample starts: :meth:`add` each queue, then :meth:`finish`."""
        self._seen = set()
        self._sums = [0, 0]

    def add(self, q: QueueInfo, now: float) -> None:
        self._sums[0] += q.messages
        self._sums[1] += q.acks_total
        key = (q.vhost, q.name)
        ring = self.queues.get(key)
        if ring is None:
            if len(self.queues) >= self.max_queues:
                return
            ring = self.queues[key] = deque(maxlen=self.size)
        self._seen.add(key)
        age = now - q.oldest_arrival if q.oldest_arrival is not None else 0.0
        ring.append((now, q.messages, round(age, 3), q.acks_total))

    def finish(self, now: float, connections: int) -> None:
        seen = self._seen
        for key in [k for k in self.queues if k not in seen]:
            del self.queues[key]
        messages, acks = self._sums
        # acks of deleted queues leave the sum: carry the last rate's base over
        if self.totals and acks < self.totals[-1][2]:
            self.totals.clear()
        self.totals.append((now, messages, acks, connections))

    def forget(self, vhost: str, name: str) -> None:
        self.queues.pop((vhost, name), None)

    def json(self, vhosts: frozenset[str] | None = None) -> dict[str, Any]:
        def rate(samples: list[tuple[float, int]]) -> float:
            if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
                return 0.0
            (t0, a0), (t1, a1) = samples[-2], samples[-1]
            return round(max(a1 - a0, 0) / (t1 - t0), 2) if t1 > t0 else 0.0

        out: dict[str, Any] = {"queues": []}
        for (vhost, name), ring in self.queues.items():
            if vhosts is not None and vhost not in vhosts:
                continue
            out["queues"].append(
                {
                    "vhost": vhost,
                    "name": name,
                    "t": [round(s[0], 3) for s in ring],
                    "messages": [s[1] for s in ring],
                    "oldest_age_s": [s[2] for s in ring],
                    "ack_rate": rate([(s[0], s[3]) for s in ring]),
                }
            )
        if vhosts is None:
            tot = list(self.totals)
            acks = [(s[0], s[2]) for s in tot]
            out["broker"] = {
                "t": [round(s[0], 3) for s in tot],
                "messages": [s[1] for s in tot],
                "connections": [s[3] for s in tot],
                "ack_rate": [
                    round((a1 - a0) / (t1 - t0), 2) if t1 > t0 else 0.0
                    for (t0, a0), (t1, a1) in pairwise(acks)
                ],
            }
        return out


class Timeline:
    """The latest policy actions, for the web UI's timeline: a plugin on the
    ``broker_policy_action`` hook keeping a bounded ring."""

    def __init__(self, wall: Callable[[], float], size: int = 500) -> None:
        self.actions: deque[dict[str, Any]] = deque(maxlen=size)
        self.wall = wall

    @hookimpl(trylast=True)
    def broker_policy_action(self, action: Action, outcome: str) -> None:
        row: dict[str, Any] = {
            "time": round(self.wall(), 3),
            "vhost": action.vhost,
            "queue": action.queue,
            "policy": action.policy,
            "action": type(action).__name__,
            "outcome": outcome,
            "reason": action.reason,
            "threshold": action.threshold,
            "configured": action.configured,
            "measured": action.measured,
        }
        tag = getattr(action, "consumer_tag", "")
        if tag:
            row["consumer"] = tag
        self.actions.append(row)

    def rows(self) -> list[dict[str, Any]]:
        return list(reversed(self.actions))


def limits_json(li: LimitsInfo) -> dict[str, Any]:
    """The limits view of /api/overview (a 0 limit is shown as None: no limit)."""
    return {
        "max_connections": li.max_connections or None,
        "max_connections_per_user": li.max_connections_per_user or None,
        "max_queues_per_vhost": li.max_queues_per_vhost or None,
        "channel_max": li.channel_max,
        "open_connections": li.open_connections,
        "user_connections": dict(li.user_connections),
        "vhost_queues": dict(li.vhost_queues),
        "refusals": dict(li.refusals),
        "login_failures": li.login_failures,
        "login_throttled": li.login_throttled,
        "login_throttled_peers": li.login_throttled_peers,
        "login_turned_away": li.login_turned_away,
        "accept_failures": li.accept_failures,
        "accept_backing_off": li.accept_backing_off,
    }


def _resources_json(api: BrokerAPI) -> dict[str, Any]:
    r = api.resources()
    return {
        "memory_used": r.memory_used,
        "memory_high_watermark": r.memory_high_watermark,
        "memory_low_watermark": r.memory_low_watermark,
        "rss": r.rss,
        "disk_free": r.disk_free,
        "disk_free_limit": r.disk_free_limit,
    }


def _failures_json(api: BrokerAPI) -> dict[str, Any]:
    f = api.failures()
    return {
        "store_records_failed": f.store_records_failed,
        "hook_failures": sum(f.hook_failures.values()),
        "hook_failures_by_plugin": [
            {"plugin": plugin, "hook": hook, "count": n}
            for (plugin, hook), n in sorted(f.hook_failures.items())
        ],
        "dispatch_failures": sum(f.dispatch_failures.values()),
        "dispatch_failures_by_queue": [
            {"vhost": vhost, "queue": queue, "count": n}
            for (vhost, queue), n in sorted(f.dispatch_failures.items())
        ],
    }

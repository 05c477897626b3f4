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
        "poison_suspects": c.poison_suspects,
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

    def on_loop(self, fn: Callable[[], T]) -> T:
        try:
            result: T = self.api.call_on_loop(fn)
        except NotFound as exc:
            raise AdminError(404, str(exc)) from None
        return result

    def overview(self, vhosts: frozenset[str] | None = None) -> dict[str, Any]:
        """The broker at a glance; with ``vhosts``, the figures of those vhosts only (what a
        ``management`` user may see)."""

        def read() -> dict[str, Any]:
            api = self.api

            def mine(vhost: str | None) -> bool:
                return vhosts is None or vhost in vhosts

            queues = [q for q in api.queues() if mine(q.vhost)]
            consumers = [c for c in api.consumers() if mine(c.vhost)]
            names = sorted(v for v in api.vhosts() if mine(v))
            return {
                "product": "plugbroker",
                "version": api.version,
                "connections": sum(1 for c in api.connections() if mine(c.vhost)),
                "vhosts": names,
                "queues": len(queues),
                "messages": sum(q.messages for q in queues),
                "consumers": len(consumers),
                "isolated": sum(c.isolated for c in consumers),
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
                **({"limits": limits_json(api.limits())} if vhosts is None else {}),
                **({"failures": _failures_json(api)} if vhosts is None else {}),
            }

        return self.on_loop(read)

    def queues(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            now = self.api.clock.monotonic()
            return [queue_json(q, now) for q in self.api.queues()]

        return self.on_loop(read)

    def consumers(self, isolated_only: bool = False) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            now = self.api.clock.monotonic()
            return [consumer_json(c, now) for c in self.api.consumers(isolated_only=isolated_only)]

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

    def dead_letters(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [
                {
                    "vhost": d.vhost,
                    "queue": d.queue,
                    "messages": d.messages,
                    "received_by_reason": dict(d.received_by_reason),
                    "by_reason": dict(d.by_reason),
                    "sources": dict(d.sources),
                }
                for d in self.api.dead_letters()
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
    ) -> dict[str, Any]:
        """Move the ready messages of a dead-letter queue back to the queue each came from
        (``REAL_TOPIC``, else the last ``x-death`` queue). Messages whose origin is unknown or
        gone stay where they are. See :meth:`plugbroker.core.api.BrokerAPI.redrive` for the
        options. Without a rate (and for a dry run) the work goes a bounded step per loop turn
        (:meth:`plugbroker.core.api.BrokerAPI.redrive_in_steps`); on the loop only."""
        if rate is None:
            try:
                result = await self.api.redrive_in_steps(
                    vhost, name, limit=limit, reasons=reasons, reset=reset, dry_run=dry_run
                )
            except NotFound as exc:
                raise AdminError(404, str(exc)) from None
            return self._redrive_answer(vhost, name, result, reasons, reset, dry_run, rate)

        def run() -> dict[str, Any]:
            result = self.api.redrive(
                vhost, name, limit=limit, reasons=reasons, reset=reset, dry_run=dry_run, rate=rate
            )
            return self._redrive_answer(vhost, name, result, reasons, reset, dry_run, rate)

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
    ) -> dict[str, Any]:
        """The log line and the JSON answer of a redrive."""
        log.info(
            "redrive of '%s' in vhost '%s'%s: %s moved back, %d kept%s",
            name,
            vhost,
            " (dry run)" if dry_run else "",
            dict(result.planned if dry_run else result.moved) or "nothing",
            result.kept,
            f", {result.pending} to follow at {rate:g}/s" if result.pending else "",
        )
        out: dict[str, Any] = {"moved": dict(result.moved), "kept": result.kept}
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

    def sample(self) -> None:
        """Take one sample of every queue for the sparklines and rates (O(queues))."""
        self.on_loop(lambda: self.history.sample(self.api))

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

    def metrics(self) -> str:
        return self.on_loop(lambda: prometheus_text(self.api))


_SECRET = re.compile(r"""(\b(?:password|passwordHash)\s*=\s*)("[^"]*"|'[^']*')""")


def hide_secrets(xml: str) -> str:
    """The configuration text with every ``password`` and ``passwordHash`` value replaced."""
    return _SECRET.sub(lambda m: m.group(1) + '"********"', xml)


class History:
    """A small bounded ring of samples per queue (and one for the broker) for the web UI's
    sparklines and rates: each :meth:`sample` costs O(queues), never O(messages)."""

    def __init__(self, size: int = 120) -> None:
        self.size = size
        #: (vhost, queue) -> samples ``(t, messages, oldest_age_s, acks_total)``
        self.queues: dict[tuple[str, str], deque[tuple[float, int, float, int]]] = {}
        #: samples ``(t, messages, acks_total, connections)`` over the whole broker
        self.totals: deque[tuple[float, int, int, int]] = deque(maxlen=size)

    def sample(self, api: BrokerAPI) -> None:
        now = api.clock.monotonic()
        seen: set[tuple[str, str]] = set()
        messages = acks = 0
        for q in api.queues():
            key = (q.vhost, q.name)
            seen.add(key)
            ring = self.queues.get(key)
            if ring is None:
                ring = self.queues[key] = deque(maxlen=self.size)
            age = now - q.oldest_arrival if q.oldest_arrival is not None else 0.0
            ring.append((now, q.messages, round(age, 3), q.acks_total))
            messages += q.messages
            acks += q.acks_total
        for key in [k for k in self.queues if k not in seen]:
            del self.queues[key]
        # acks of deleted queues leave the sum: carry the last rate's base over
        if self.totals and acks < self.totals[-1][2]:
            self.totals.clear()
        self.totals.append((now, messages, acks, len(api.connections())))

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


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(api: BrokerAPI) -> str:
    """Metrics in the Prometheus text exposition format (0.0.4)."""
    now = api.clock.monotonic()
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{{{labels}}} {value:g}" if labels else f"{name} {value:g}")

    queues = api.queues()

    def ql(vhost: str, queue: str) -> str:
        return f'vhost="{_label(vhost)}",queue="{_label(queue)}"'

    family(
        "plugbroker_connections",
        "gauge",
        "Open client connections.",
        [("", len(api.connections()))],
    )
    family(
        "plugbroker_queue_messages",
        "gauge",
        "Messages held: ready, unacked and delayed.",
        [(ql(q.vhost, q.name), q.messages) for q in queues],
    )
    family(
        "plugbroker_queue_messages_ready",
        "gauge",
        "Messages ready for delivery.",
        [(ql(q.vhost, q.name), q.ready) for q in queues],
    )
    family(
        "plugbroker_queue_messages_unacked",
        "gauge",
        "Messages delivered, not yet acked.",
        [(ql(q.vhost, q.name), q.unacked) for q in queues],
    )
    family(
        "plugbroker_queue_bytes",
        "gauge",
        "Body bytes held.",
        [(ql(q.vhost, q.name), q.bytes) for q in queues],
    )
    family(
        "plugbroker_queue_oldest_message_age_seconds",
        "gauge",
        "Age of the oldest message held (0 when empty).",
        [
            (ql(q.vhost, q.name), (now - q.oldest_arrival) if q.oldest_arrival is not None else 0.0)
            for q in queues
        ],
    )
    family(
        "plugbroker_queue_consumers",
        "gauge",
        "Consumers of the queue.",
        [(ql(q.vhost, q.name), q.consumers) for q in queues],
    )
    family(
        "plugbroker_queue_acks_total",
        "counter",
        "Messages settled since the queue was declared.",
        [(ql(q.vhost, q.name), q.acks_total) for q in queues],
    )
    for field, help_ in _QUEUE_COUNTERS:
        family(
            f"plugbroker_queue_{field}_total",
            "counter",
            help_,
            [(ql(q.vhost, q.name), getattr(q, f"{field}_total")) for q in queues],
        )
    consumers = api.consumers()
    family(
        "plugbroker_consumer_unacked",
        "gauge",
        "Unacked messages a consumer holds.",
        [(f'{ql(c.vhost, c.queue)},consumer="{_label(c.tag)}"', c.unacked) for c in consumers],
    )
    family(
        "plugbroker_consumer_isolated",
        "gauge",
        "1 while the consumer is on the blocklist.",
        [
            (f'{ql(c.vhost, c.queue)},consumer="{_label(c.tag)}"', int(c.isolated))
            for c in consumers
        ],
    )
    family(
        "plugbroker_delayed_messages",
        "gauge",
        "Messages held by delayed exchanges.",
        [(f'vhost="{_label(vh)}"', api.delayed_pending(vh)) for vh in api.vhosts()],
    )
    family(
        "plugbroker_policy_actions_total",
        "counter",
        "Policy actions by policy and outcome.",
        [
            (f'policy="{_label(p)}",outcome="{_label(o)}"', n)
            for (p, o), n in sorted(api.policy_action_counts().items())
        ],
    )
    li = api.limits()
    family(
        "plugbroker_limit_refusals_total",
        "counter",
        "Connections, channels, queues and bindings refused by a limit, by limit.",
        [(f'limit="{_label(k)}"', n) for k, n in sorted(li.refusals.items())],
    )
    family(
        "plugbroker_login_failures_total",
        "counter",
        "Failed logins.",
        [("", li.login_failures)],
    )
    family(
        "plugbroker_login_throttled_total",
        "counter",
        "Failed logins whose answer was delayed (login throttling).",
        [("", li.login_throttled)],
    )
    family(
        "plugbroker_login_turned_away_total",
        "counter",
        "Connections closed at once: their address had too many failed logins waiting.",
        [("", li.login_turned_away)],
    )
    family(
        "plugbroker_accept_failures_total",
        "counter",
        "accept() calls that failed for want of a resource (EMFILE, ENFILE ...).",
        [("", li.accept_failures)],
    )
    family(
        "plugbroker_accept_backing_off",
        "gauge",
        "1 while a listener waits before accepting again after such a failure.",
        [("", int(li.accept_backing_off))],
    )
    family(
        "plugbroker_resource_alarm",
        "gauge",
        "1 while a resource alarm blocks publishers.",
        [("", int(api.alarm is not None))],
    )
    raised = {a.name: a for a in api.alarms()}
    family(
        "plugbroker_alarm",
        "gauge",
        "1 while the named resource alarm (memory, disk, store) is raised.",
        [(f'alarm="{n}"', int(n in raised)) for n in ("memory", "disk", "store")],
    )
    family(
        "plugbroker_alarm_since_seconds",
        "gauge",
        "Unix time the named resource alarm was raised (present while it is).",
        [(f'alarm="{n}"', a.since) for n, a in raised.items()],
    )
    conns = api.connections()
    family(
        "plugbroker_connections_blocked",
        "gauge",
        "Connections not read from because a resource alarm blocks their publishing.",
        [("", sum(c.blocked for c in conns))],
    )
    family(
        "plugbroker_connections_output_paused",
        "gauge",
        "Connections whose client does not read its socket (output past the water mark).",
        [("", sum(c.output_paused for c in conns))],
    )
    r = api.resources()
    family(
        "plugbroker_memory_used_bytes",
        "gauge",
        "What the memory alarm counts: queued messages, partial bodies, unsent output.",
        [("", r.memory_used)],
    )
    if r.memory_high_watermark is not None:
        family(
            "plugbroker_memory_high_watermark_bytes",
            "gauge",
            "The memory alarm goes on above this.",
            [("", r.memory_high_watermark)],
        )
    if r.rss is not None:
        family(
            "plugbroker_process_rss_bytes",
            "gauge",
            "The process' resident set size.",
            [("", r.rss)],
        )
    if r.disk_free is not None:
        family(
            "plugbroker_disk_free_bytes",
            "gauge",
            "Free space on the store's filesystem at the last check.",
            [("", r.disk_free)],
        )
    family(
        "plugbroker_disk_free_limit_bytes",
        "gauge",
        "The disk alarm goes on below this much free space.",
        [("", r.disk_free_limit)],
    )
    f = api.failures()
    family(
        "plugbroker_store_records_failed_total",
        "counter",
        "Store operations that could not be written and were left out.",
        [("", f.store_records_failed)],
    )
    for name, text, counts in (
        ("hook_failures", "Hook calls that raised and were contained", f.hook_failures),
        ("hook_slow_calls", "Hook calls over <limits><hookBudget> on the loop", f.hook_slow_calls),
    ):
        rows = [(f'plugin="{_label(p)}",hook="{_label(h)}"', n) for (p, h), n in counts.items()]
        family(f"plugbroker_{name}_total", "counter", f"{text}, by plugin and hook.", sorted(rows))
    family(
        "plugbroker_dispatch_failures_total",
        "counter",
        "Queue dispatches that raised and were contained, by queue.",
        [(ql(vhost, queue), n) for (vhost, queue), n in sorted(f.dispatch_failures.items())],
    )
    gcs = api.collector()
    gens = range(len(gcs.collections))
    family(
        "plugbroker_gc_collections_total",
        "counter",
        "CPython cycle collections by generation (2 is a full collection).",
        [(f'generation="{g}"', gcs.collections[g]) for g in gens],
    )
    if gcs.timed:  # by plugbroker run's collector watch (plugbroker.heap)
        family(
            "plugbroker_gc_pause_seconds_total",
            "counter",
            "Time the event loop stood still in cycle collections, by generation.",
            [(f'generation="{g}"', gcs.pause_total[g]) for g in gens],
        )
        family(
            "plugbroker_gc_pause_seconds_max",
            "gauge",
            "The longest cycle collection since the start, by generation.",
            [(f'generation="{g}"', gcs.pause_max[g]) for g in gens],
        )
    family(
        "plugbroker_gc_frozen_objects",
        "gauge",
        "Objects frozen out of the cycle collector's reach (gc.freeze; see docs/operations.md).",
        [("", gcs.frozen)],
    )
    return "\n".join(lines) + "\n"


#: per-queue counters (``QueueInfo.<field>_total``), kept incrementally by the domain
_QUEUE_COUNTERS = (
    ("published", "Messages that entered the queue since it was declared."),
    ("delivered", "Deliveries to consumers and basic.get since the queue was declared."),
    ("acked", "Deliveries acked (basic.ack) since the queue was declared."),
    (
        "redelivered",
        "Messages put back for redelivery (reject or nack with requeue, channel close, recover, "
        "isolation, nack backoff) since the queue was declared.",
    ),
    ("dead_lettered", "Messages dead-lettered from the queue since it was declared."),
)

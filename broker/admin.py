"""The admin interface: a small HTTP API for operators and a Prometheus metrics endpoint.

Enabled by ``<admin host="127.0.0.1" port="15672"/>``. It runs on the standard library's
``ThreadingHTTPServer`` in a thread of its own; every read and every change runs on the broker's
event loop through :meth:`broker.app.Broker.call_on_loop`, so it sees a consistent state and
never races the loop. Requests authenticate with HTTP Basic as a configured broker user.

==========================================  ================================================
``GET  /api/overview``                      version, connections, queues, messages, alarm
``GET  /api/queues``                        every queue with its running figures and policy
``GET  /api/consumers``                     every consumer: unacked, prefetch, last ack age
``GET  /api/blocklist``                     isolated consumers
``GET  /api/connections``                   client connections
``GET  /api/dead-letters``                  queues that received dead letters, by reason
``GET  /api/queues/{vhost}/{queue}/messages``  peek at ready messages (``?limit=20``)
``POST /api/queues/{vhost}/{queue}/redrive`` move dead letters back to their original queue
``POST /api/reload``                        re-read the configuration (like SIGHUP)
``GET  /metrics``                           Prometheus text format
==========================================  ================================================

Vhost names in paths are URL-encoded (``/`` is ``%2F``), as in RabbitMQ's management API.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import broker as _pkg
from broker.codec import properties as props_codec
from broker.domain import fate

if TYPE_CHECKING:
    from broker.app import Broker
    from broker.domain.queue import Queue
    from broker.runner import Running

log = logging.getLogger("broker.admin")


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------------ views (on the loop)


def queue_info(q: Queue, now: float) -> dict[str, Any]:
    oldest = q.oldest_arrival
    pol = q.policy
    return {
        "vhost": q.vhost.name,
        "name": q.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner is not None,
        "subscription_type": q.subscription_type,
        "messages": len(q.held),
        "ready": len(q.ready),
        "unacked": q.unacked_count,
        "delayed": q.delayed,
        "bytes": q.bytes,
        "oldest_age_s": round(now - oldest, 3) if oldest is not None else 0.0,
        "consumers": len(q.consumers),
        "acks_total": q.acks_total,
        "delivery_limit": q.delivery_limit,
        "retry_target": q.retry_target,
        "arguments": _jsonable(q.arguments),
        "bindings": [{"exchange": e, "type": t, "key": k} for e, t, k in q.bindings()],
        "policy": {name: getattr(pol, "source", {}).get(name, "") for name in pol} if pol else {},
    }


def consumer_info(q: Queue, c: Any, now: float) -> dict[str, Any]:
    since = c.last_ack if c.last_ack is not None else c.first_delivery
    return {
        "vhost": q.vhost.name,
        "queue": q.name,
        "tag": c.tag,
        "connection": c.channel.connection_id,
        "channel": c.channel.id,
        "unacked": c.unacked,
        "prefetch": c.prefetch,
        "no_ack": c.no_ack,
        "isolated": c.isolated,
        "delivered": c.delivered_total,
        "last_ack_age_s": round(now - since, 3) if since is not None else None,
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
    """The operations behind the HTTP API; each runs on the broker's loop."""

    def __init__(self, running: Running) -> None:
        self.running = running

    @property
    def broker(self) -> Broker:
        return self.running.broker

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        return self.broker.call_on_loop(fn)

    def _queue(self, vhost: str, name: str) -> Queue:
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if q is None:
            raise AdminError(404, f"no queue '{name}' in vhost '{vhost}'")
        return q

    def overview(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            b = self.broker
            queues = [q for vh in b.vhosts.values() for q in vh.queues.values()]
            return {
                "product": "plugbroker",
                "version": _pkg.__version__,
                "connections": len(b.connections),
                "vhosts": sorted(b.vhosts),
                "queues": len(queues),
                "messages": sum(len(q.held) for q in queues),
                "consumers": sum(len(q.consumers) for q in queues),
                "isolated": sum(c.isolated for q in queues for c in q.consumers),
                "delayed_pending": sum(vh.delayed_pending for vh in b.vhosts.values()),
                "alarm": b.alarm,
                "plugins": list(getattr(b.hooks, "names", lambda: ())()),
            }

        return self.on_loop(read)

    def queues(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            now = self.broker.clock.monotonic()
            return [
                queue_info(q, now) for vh in self.broker.vhosts.values() for q in vh.queues.values()
            ]

        return self.on_loop(read)

    def consumers(self, isolated_only: bool = False) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            now = self.broker.clock.monotonic()
            return [
                consumer_info(q, c, now)
                for vh in self.broker.vhosts.values()
                for q in vh.queues.values()
                for c in q.consumers
                if c.isolated or not isolated_only
            ]

        return self.on_loop(read)

    def connections(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [
                {
                    "id": c.id,
                    "peer": c.peer,
                    "user": c.user,
                    "vhost": c.vhost.name if c.vhost is not None else None,
                    "channels": len(c.channels),
                    "heartbeat": c.heartbeat,
                    "blocked": c.blocked,
                }
                for c in self.broker.connections.values()
            ]

        return self.on_loop(read)

    def dead_letters(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            out = []
            for vh in self.broker.vhosts.values():
                for name, reasons in sorted(vh.dead_letter_queues.items()):
                    q = vh.queues.get(name)
                    out.append(
                        {
                            "vhost": vh.name,
                            "queue": name,
                            "messages": len(q.held) if q is not None else 0,
                            "received_by_reason": dict(reasons),
                        }
                    )
            return out

        return self.on_loop(read)

    def messages(self, vhost: str, name: str, limit: int = 20) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            q = self._queue(vhost, name)
            out = []
            for i, m in enumerate(q.ready):
                if i >= limit:
                    break
                try:
                    props = props_codec.decode_lenient(m.properties)
                except Exception:
                    props = {}
                out.append(
                    {
                        "id": m.id,
                        "exchange": m.exchange,
                        "routing_key": m.routing_key,
                        "size": m.body_size,
                        "delivery_count": m.delivery_count,
                        "redelivered": m.redelivered,
                        "properties": _jsonable(props),
                    }
                )
            return out

        return self.on_loop(read)

    def redrive(self, vhost: str, name: str, limit: int | None = None) -> dict[str, Any]:
        """Move the ready messages of a dead-letter queue back to the queue each came from
        (``REAL_TOPIC``, else the last ``x-death`` queue). Messages whose origin is unknown or
        gone stay where they are."""

        def run() -> dict[str, Any]:
            moved, kept = fate.redrive(self._queue(vhost, name), limit)
            log.info(
                "redrive of '%s' in vhost '%s': %s moved back, %d kept",
                name,
                vhost,
                moved or "nothing",
                kept,
            )
            return {"moved": moved, "kept": kept}

        return self.on_loop(run)

    def reload(self) -> dict[str, Any]:
        cfg = self.running.prepare_reload()  # file I/O and parsing here, off the loop
        if cfg is None:
            raise AdminError(
                400,
                "reload refused: the configuration did not validate (see the "
                "broker's log); the running configuration stays",
            )
        self.on_loop(lambda: self.running.apply_reload(cfg))
        return {"reloaded": True}

    def metrics(self) -> str:
        return self.on_loop(lambda: prometheus_text(self.broker))


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(b: Broker) -> str:
    """Metrics in the Prometheus text exposition format (0.0.4)."""
    now = b.clock.monotonic()
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{{{labels}}} {value:g}" if labels else f"{name} {value:g}")

    queues = [q for vh in b.vhosts.values() for q in vh.queues.values()]

    def ql(q: Queue) -> str:
        return f'vhost="{_label(q.vhost.name)}",queue="{_label(q.name)}"'

    family(
        "plugbroker_connections", "gauge", "Open client connections.", [("", len(b.connections))]
    )
    family(
        "plugbroker_queue_messages",
        "gauge",
        "Messages held: ready, unacked and delayed.",
        [(ql(q), len(q.held)) for q in queues],
    )
    family(
        "plugbroker_queue_messages_ready",
        "gauge",
        "Messages ready for delivery.",
        [(ql(q), len(q.ready)) for q in queues],
    )
    family(
        "plugbroker_queue_messages_unacked",
        "gauge",
        "Messages delivered, not yet acked.",
        [(ql(q), q.unacked_count) for q in queues],
    )
    family(
        "plugbroker_queue_bytes", "gauge", "Body bytes held.", [(ql(q), q.bytes) for q in queues]
    )
    family(
        "plugbroker_queue_oldest_message_age_seconds",
        "gauge",
        "Age of the oldest message held (0 when empty).",
        [
            (ql(q), (now - q.oldest_arrival) if q.oldest_arrival is not None else 0.0)
            for q in queues
        ],
    )
    family(
        "plugbroker_queue_consumers",
        "gauge",
        "Consumers of the queue.",
        [(ql(q), len(q.consumers)) for q in queues],
    )
    family(
        "plugbroker_queue_acks_total",
        "counter",
        "Messages settled since the queue was declared.",
        [(ql(q), q.acks_total) for q in queues],
    )
    consumers = [(q, c) for q in queues for c in q.consumers]
    family(
        "plugbroker_consumer_unacked",
        "gauge",
        "Unacked messages a consumer holds.",
        [(f'{ql(q)},consumer="{_label(c.tag)}"', c.unacked) for q, c in consumers],
    )
    family(
        "plugbroker_consumer_isolated",
        "gauge",
        "1 while the consumer is on the blocklist.",
        [(f'{ql(q)},consumer="{_label(c.tag)}"', int(c.isolated)) for q, c in consumers],
    )
    family(
        "plugbroker_delayed_messages",
        "gauge",
        "Messages held by delayed exchanges.",
        [(f'vhost="{_label(vh.name)}"', vh.delayed_pending) for vh in b.vhosts.values()],
    )
    family(
        "plugbroker_policy_actions_total",
        "counter",
        "Policy actions by policy and outcome.",
        [
            (f'policy="{_label(p)}",outcome="{_label(o)}"', n)
            for (p, o), n in sorted(b.action_counts.items())
        ],
    )
    family(
        "plugbroker_resource_alarm",
        "gauge",
        "1 while a resource alarm blocks publishers.",
        [("", int(b.alarm is not None))],
    )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ HTTP


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except Exception:
            return False
        return self.server.admin.broker.authenticate(user, password)

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body, indent=1)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="plugbroker"')
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        if not self._authorized():
            self._send(401, {"error": "authentication required (HTTP Basic, a broker user)"})
            return
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path != "/" else []
        query = parse_qs(url.query)
        admin = self.server.admin
        try:
            if method == "GET" and parts == ["metrics"]:
                self._send(200, admin.metrics(), "text/plain; version=0.0.4")
                return
            result = self._dispatch(method, parts, query)
        except AdminError as exc:
            self._send(exc.status, {"error": exc.message})
            return
        except Exception as exc:
            log.exception("admin request %s %s failed", method, self.path)
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._send(200, result)

    def _dispatch(self, method: str, parts: list[str], query: dict[str, list[str]]) -> Any:
        admin = self.server.admin
        if method == "GET":
            simple = {
                ("api", "overview"): admin.overview,
                ("api", "queues"): admin.queues,
                ("api", "consumers"): admin.consumers,
                ("api", "connections"): admin.connections,
                ("api", "dead-letters"): admin.dead_letters,
                ("api", "blocklist"): lambda: admin.consumers(isolated_only=True),
            }
            fn = simple.get((parts[0], parts[1])) if len(parts) == 2 else None
            if fn is not None:
                return fn()
            if len(parts) == 5 and parts[:2] == ["api", "queues"] and parts[4] == "messages":
                limit = int(query.get("limit", ["20"])[0])
                return admin.messages(parts[2], parts[3], limit)
        if method == "POST":
            if parts == ["api", "reload"]:
                return admin.reload()
            if len(parts) == 5 and parts[:2] == ["api", "queues"] and parts[4] == "redrive":
                most = query.get("limit")
                return admin.redrive(parts[2], parts[3], int(most[0]) if most else None)
        raise AdminError(404, f"no such endpoint: {method} /{'/'.join(parts)}")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        self._route("POST")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    admin: Admin


class AdminServer:
    """Serves :class:`Admin` over HTTP on ``host:port`` from a thread of its own."""

    def __init__(self, running: Running, host: str, port: int) -> None:
        self.admin = Admin(running)
        self._httpd = _Server((host, port), _Handler)
        self._httpd.admin = self.admin
        self.host = host
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="admin", daemon=True)

    def start(self) -> AdminServer:
        self._thread.start()
        log.info("admin interface on http://%s:%d", self.host, self.port)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

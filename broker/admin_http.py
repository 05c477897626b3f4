"""The admin interface over HTTP(S): aiohttp's server on the broker's own event loop.

:class:`AdminServer` listens on ``<admin host port>`` (HTTPS when ``<admin>`` has a ``<tls>``
child) and answers the paths listed in :mod:`plugbroker.admin` with :class:`plugbroker.admin.Admin`'s
operations, which run on the loop directly: a request never waits for another thread, and a
reload reads its file in the loop's executor so the loop never blocks on disk.

What keeps one client from hurting the others (:class:`HttpLimits`):

* the request line and headers must arrive within ``header_timeout`` of the connection opening
  or of the previous response (aiohttp's keep-alive timer, armed from the first byte), so an
  idle or trickling socket is closed;
* a body must arrive within ``body_timeout`` (408) and be at most ``max_body`` bytes (413);
* at most ``max_connections`` sockets are served, ``max_connections_per_address`` from one
  address (:mod:`plugbroker.admin_gate`); a socket that does not log in within
  ``login_timeout`` is closed;
* a request line, a header or a parameter the server cannot parse is a 400, as JSON;
* a failed login goes through the broker's login throttle (the AMQP one), answered 401 after
  its delay, or 429 at once while too many refusals to that address wait;
* purge, delete and redrive of a big queue go a bounded step per loop turn
  (:mod:`plugbroker.core.api`'s ``*_in_steps``);
* a failure inside the broker is a 500 with a reference id, the log has the rest.

Every answer the API gives is JSON (``{"error": ...}`` for errors), except ``/metrics``.

Who may do what is decided as in RabbitMQ's management API (:mod:`plugbroker.admin_access`):
the user's management tags open an endpoint, and an endpoint that acts on a queue checks the
user's configure/write/read patterns on it as an AMQP channel would (:mod:`plugbroker.authz`).
A refusal is RabbitMQ's ``401 {"error": "not_authorized", "reason": ...}``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import ipaddress
import json
import logging
import math
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_protocol import RequestHandler

from plugbroker import authz
from plugbroker.admin import Admin, AdminError, Reloader
from plugbroker.admin_access import ENDPOINTS, Principal
from plugbroker.admin_gate import Busy, Gate, peer_of
from plugbroker.admin_params import bool_param, float_param, int_param, queue_spec
from plugbroker.admin_serve import LISTINGS, serve_listing, serve_metrics
from plugbroker.admin_steps import Steps
from plugbroker.admin_walk import sample_in_steps
from plugbroker.core.api import BrokerAPI
from plugbroker.guard import ACCEPT, TURN_AWAY, throttled_text, under_attack_text
from plugbroker.tls import TLSAcceptor

log = logging.getLogger("plugbroker.admin")

__all__ = ["ENDPOINTS", "AdminServer", "HttpLimits", "Principal"]  # (re-exported)

#: the web UI's files (package data in broker/admin_ui), served without a login: the page asks
#: for one and sends it with every API request
UI_FILES: dict[str, str] = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
#: what the browser may load for the UI: its own files only, nothing inline, no frames; it
#: may keep a copy but asks each time whether it is still current (``no-cache``: a 304 against
#: the ETag), so a new version of the broker is picked up at the next load
UI_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class UiFile:
    """One of the UI's files as served: its bytes, its content type, its strong ETag."""

    data: bytes
    ctype: str
    etag: str


def load_ui_files() -> dict[str, UiFile]:
    """The UI's files (:data:`UI_FILES`) read from the package data once: the server never
    reads them from disk again (a request is a dict lookup)."""
    out = {}
    for name, ctype in UI_FILES.items():
        data = (resources.files("plugbroker") / "admin_ui" / name).read_bytes()
        out[name] = UiFile(data, ctype, '"' + hashlib.sha256(data).hexdigest()[:32] + '"')
    return out


def _etag_matches(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (RFC 9110: ``*``, a list, weak
    comparison so ``W/"x"`` matches ``"x"``)."""
    if not header:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds on what one admin client may hold (seconds, bytes, sockets)."""

    header_timeout: float = 10.0
    body_timeout: float = 10.0
    max_body: int = 1 << 20
    max_connections: int = 256
    #: sockets one client address may hold: above the login throttle's 32 refusals waiting
    #: per address, so that the throttle answers those 429 itself
    max_connections_per_address: int = 40
    #: a socket must carry a request that logs in within this long of its opening
    login_timeout: float = 5.0
    #: how long a stop waits for requests in progress
    shutdown_timeout: float = 5.0


def _json(status: int, body: Any, *, close: bool = False, challenge: bool = True) -> web.Response:
    resp = web.Response(
        status=status,
        text=json.dumps(body, indent=1),
        content_type="application/json",
    )
    if status == 401 and challenge:
        resp.headers["WWW-Authenticate"] = 'Basic realm="plugbroker"'
    if close:
        resp.force_close()
    return resp


def _internal_error(request: web.BaseRequest, exc: BaseException | None) -> web.Response:
    """A 500 that tells the client nothing of the failure (no exception text, no path, no
    name): the broker's log has it, under a reference id the answer carries so an operator can
    find it."""
    ref = secrets.token_hex(6)
    log.error(
        "admin: request %s %s from %s failed (reference %s)",
        request.method,
        request.raw_path,
        request.remote,
        ref,
        exc_info=exc,
    )
    return _json(
        500,
        {"error": f"internal error; the broker's log has it under reference {ref}", "ref": ref},
        close=True,
    )


class _Handler(RequestHandler):
    """aiohttp's per-connection protocol, with errors it raises itself answered as JSON,
    admitted by the server's :class:`Gate` and closed unless it logs in in time."""

    def __init__(self, *args: Any, gate: Gate, login_timeout: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate = gate
        self.login_timeout = login_timeout
        self.peer = "?"
        self.authenticated = False
        self.busy = 0
        self._timer: asyncio.TimerHandle | None = None
        self._raw: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = peer_of(transport)
        if not self.gate.admit(self):
            busy = Busy()
            transport.set_protocol(busy)
            busy.connection_made(transport)
            return
        self._raw = transport
        super().connection_made(transport)
        self._timer = self._loop.call_later(self.login_timeout, self._login_due)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.gate.leave(self)
        super().connection_lost(exc)

    def logged_in(self) -> None:
        self.authenticated = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _login_due(self) -> None:
        if self.authenticated or self._raw is None:
            return
        if self.busy:  # answering it (a throttled login waits): look again later
            self._timer = self._loop.call_later(self.login_timeout, self._login_due)
            return
        log.info(
            "admin: connection from %s closed: no login within %gs", self.peer, self.login_timeout
        )
        self.evict()

    def evict(self) -> None:
        if self._raw is not None:
            self._raw.close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            answer = _internal_error(request, exc)
        else:
            reason = str(getattr(exc, "message", None) or exc or message or "bad request")
            log.warning("admin: bad request from %s: %d %s", request.remote, status, reason)
            answer = _json(status, {"error": f"bad request: {reason}"}, close=True)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        return answer


class _AccessLog(AbstractAccessLogger):
    """One debug line per request (the admin API is not a web site to keep access logs of)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.debug(
            "%s %s %s -> %d in %.1f ms",
            request.remote,
            request.method,
            request.path_qs,
            response.status,
            time * 1000,
        )


#: the name the policy-action timeline registers under with the broker's plugin host
TIMELINE_PLUGIN = "admin-timeline"


#: the share of the loop's time the UI's sampler may take
SAMPLE_SHARE = 0.01


def next_sample_delay(took: float, every: float) -> float:
    """Seconds until the next sample: ``every``, or longer when a sample took more than
    :data:`SAMPLE_SHARE` of that (with many queues, samples space out)."""
    return max(every, took / SAMPLE_SHARE)


def _same_origin(request: web.BaseRequest) -> bool:
    """A POST without an ``Origin`` (the CLI, curl) or from a page of this server: a browser
    sends ``Origin`` with a cross-site POST, which a page elsewhere could make with the Basic
    credentials the browser remembers."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("Host", "")


def _rebound(request: web.BaseRequest, allowed: frozenset[str] = frozenset()) -> bool:
    """A request from this host naming the server by a name other than ``localhost``, an
    address or one of ``allowed`` (``<admin allowedHosts>``, lower case): what a page elsewhere
    makes after pointing its own name at 127.0.0.1 (DNS rebinding). Its ``Origin`` then matches
    its ``Host``, and loopback-only users such as the default guest would log in from the
    victim's browser, so it is refused."""
    try:
        if not ipaddress.ip_address((request.remote or "").partition("%")[0]).is_loopback:
            return False
    except ValueError:
        return False
    host = urlsplit("//" + request.headers.get("Host", "")).hostname or ""
    if host == "localhost" or host.endswith(".localhost") or host.rstrip(".") in allowed:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


Route = Callable[[web.BaseRequest, list[str], dict[str, list[str]]], Awaitable[web.Response]]


class AdminServer:
    """Serves :class:`Admin` over HTTP, or HTTPS with ``ssl_context``, on the running loop."""

    def __init__(
        self,
        api: BrokerAPI,
        reloader: Reloader,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        limits: HttpLimits | None = None,
        ui: bool = True,
        sample_every: float = 5.0,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.admin = Admin(api, reloader)
        #: host names a request from this machine may name besides localhost and addresses
        #: (``<admin allowedHosts>``; a reload replaces them)
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.ui = ui
        self.sample_every = sample_every
        self._sampler: asyncio.Future[None] | None = None
        self.api = api
        self.reloader = reloader
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.limits = limits or HttpLimits()
        self.scheme = "https" if ssl_context is not None else "http"
        self._web: web.Server | None = None
        self._listener: asyncio.base_events.Server | None = None
        self.gate = Gate(self.limits.max_connections, self.limits.max_connections_per_address)
        self._handshakes: set[asyncio.Future[None]] = set()
        #: the UI's files, read once from the package
        self._ui_files = load_ui_files() if ui else {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AdminServer:
        loop = asyncio.get_running_loop()
        self._web = web.Server(self._handle, handler_cancellation=True)
        ctx = self.ssl_context
        factory: Callable[[], asyncio.BaseProtocol] = self._protocol
        if ctx is not None:

            def factory() -> asyncio.BaseProtocol:
                return TLSAcceptor(
                    ctx,
                    timeout=self.limits.header_timeout,
                    on_ready=lambda _t: self._protocol(),
                    what="admin https",
                    log=log,
                    track=self._track,
                )

        self._listener = await loop.create_server(factory, self.host, self.port, reuse_address=True)
        self.port = self._listener.sockets[0].getsockname()[1]
        self.api.register_plugin(self.admin.timeline, TIMELINE_PLUGIN)
        self._sampler = asyncio.ensure_future(self._sampling())
        log.info(
            "admin interface on %s://%s:%d%s",
            self.scheme,
            self.host,
            self.port,
            " (web UI at /)" if self.ui else "",
        )
        return self

    async def _sampling(self) -> None:
        """A sample of every queue for the UI's sparklines and the per-vhost figures of
        ``/api/overview`` and ``/metrics``, a bounded step per loop turn, then the next one
        later (with many queues, samples space out)."""
        while True:
            steps = Steps()
            started = time.perf_counter()
            try:
                await sample_in_steps(self.admin, steps)
            except Exception:  # a sample is not worth stopping the admin for
                log.exception("admin: sampling the queues failed")
            # the loop's time the sample took: its steps, not the turns others had between
            took = max(0.0, time.perf_counter() - started - steps.waited)
            await asyncio.sleep(next_sample_delay(took, self.sample_every))

    def _static(self, request: web.BaseRequest) -> web.Response:
        path = request.path
        name = "index.html" if path == "/" else path[len("/ui/") :]
        ui = self._ui_files.get(name)
        if ui is None:
            return _json(404, {"error": f"no such file: {path}"})
        headers = {**UI_HEADERS, "ETag": ui.etag}
        if _etag_matches(request.headers.get("If-None-Match"), ui.etag):
            return web.Response(status=304, headers=headers)
        return web.Response(body=ui.data, content_type=ui.ctype, charset="utf-8", headers=headers)

    def _track(self, fut: asyncio.Future[None]) -> None:
        self._handshakes.add(fut)
        fut.add_done_callback(self._handshakes.discard)

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None
            try:
                self.api.unregister_plugin(TIMELINE_PLUGIN)
            except Exception:  # the broker's plugin host is gone already
                log.debug("admin: timeline plugin already unregistered", exc_info=True)
        if self._listener is not None:
            self._listener.close()
        for fut in list(self._handshakes):
            fut.cancel()
        if self._web is not None:
            self._web.pre_shutdown()
            await self._web.shutdown(self.limits.shutdown_timeout)
        if self._listener is not None:
            await self._listener.wait_closed()
        self._listener = self._web = None

    @property
    def connections(self) -> int:
        """Admin sockets being served now."""
        return len(self._web.connections) if self._web is not None else 0

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._web
        assert server is not None
        lim = self.limits
        return _Handler(
            server,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=lim.header_timeout,
            access_log=log,
            access_log_class=_AccessLog,
            max_line_size=8190,
            max_field_size=8190,
            max_headers=64,
            gate=self.gate,
            login_timeout=lim.login_timeout,
        )

    # ------------------------------------------------------------------ requests

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "POST", "PUT"):
            return _json(405, {"error": f"method {request.method} is not allowed"})
        if (
            request.method == "GET"
            and self.ui
            and (request.path == "/" or request.path.startswith("/ui/"))
        ):
            return self._static(request)
        if _rebound(request, self.allowed_hosts):
            log.warning(
                "admin: %s %s from %s refused: Host %r is not localhost, an address or one of "
                "<admin allowedHosts>",
                request.method,
                request.raw_path,
                request.remote,
                request.headers.get("Host"),
            )
            return _json(403, {"error": "request for another host name refused"})
        if request.method != "GET" and not _same_origin(request):
            log.warning(
                "admin: %s %s from %s refused: sent from the page of another site (%s)",
                request.method,
                request.raw_path,
                request.remote,
                request.headers.get("Origin"),
            )
            return _json(403, {"error": "cross-site request refused"})
        # the web UI logs in with its own form: no browser login dialog over it
        challenge = "X-Plugbroker-UI" not in request.headers
        proto = request.protocol
        handler = proto if isinstance(proto, _Handler) else None
        if handler is not None:
            handler.busy += 1
        try:
            who = await self._login(request)
        finally:
            if handler is not None:
                handler.busy -= 1
        if not isinstance(who, Principal):
            if who is not None:
                return who  # 429: too many refusals to this address are waiting
            # the body of a request that did not log in is never read: the socket closes
            return _json(
                401,
                {
                    "error": "not_authorized",
                    "reason": "Login failed (authentication required: HTTP Basic, a broker user)",
                },
                challenge=challenge,
                close=request.can_read_body,
            )
        if handler is not None:
            handler.logged_in()
        try:
            sent = await asyncio.wait_for(self._read_body(request), self.limits.body_timeout)
        except TimeoutError:
            log.warning("admin: request body from %s did not arrive in time", request.remote)
            return _json(408, {"error": "request body did not arrive in time"}, close=True)
        except web.HTTPRequestEntityTooLarge:
            return _json(
                413, {"error": f"request body over {self.limits.max_body} bytes"}, close=True
            )
        url = urlsplit(request.raw_path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path != "/" else []
        try:
            query = parse_qs(url.query, strict_parsing=False)
            return await self._dispatch(request, who, parts, query, sent)
        except AdminError as exc:
            body: dict[str, Any] = {"error": exc.message}
            if exc.reason is not None:
                body["reason"] = exc.reason
                log.warning(
                    "admin: %s %s refused for user '%s' (%s): %s",
                    request.method,
                    url.path,
                    who.name,
                    exc.message,
                    exc.reason,
                )
            return _json(exc.status, body, challenge=challenge)
        except Exception as exc:
            return _internal_error(request, exc)

    async def _read_body(self, request: web.BaseRequest) -> bytes:
        if not request.can_read_body:
            return b""
        n = 0
        chunks = []
        async for chunk in request.content.iter_chunked(65536):
            n += len(chunk)
            if n > self.limits.max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self.limits.max_body, actual_size=n)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _login(self, request: web.BaseRequest) -> Principal | web.Response | None:
        """The user a request authenticates as (HTTP Basic; the loopback-only rule applies to
        the peer's address as for AMQP), or None: no credentials, or refused.

        The broker's login throttle judges it, by the rule AMQP logins follow
        (:meth:`plugbroker.guard.LoginThrottle.judge`): a correct password is let in at once
        unless that user is under attack from this address; a refusal is answered (None, then
        a 401) after the throttle's delay, a timer on the broker's clock that the loop serves
        everything else during; one that would wait while the most refusals one address may
        have are waiting is answered 429 at once with ``Retry-After``."""
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None  # no login tried: the 401 asks for one (the browser's first request)
        api = self.api
        peer = (request.remote or "").partition("%")[0]
        refusal: str | None
        try:
            raw = base64.b64decode(header[6:], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            name, refusal = "?", "the Authorization header is not base64 of user:password"
        else:
            name, _, password = raw.partition(":")
            refusal = api.login_refusal(name, password, request.remote)
        verdict, delay = api.login_judge(name, peer, refusal is None)
        if verdict == ACCEPT:
            user = api.user(name) if refusal is None else None
            return Principal.of(user, api) if user is not None else None
        if verdict == TURN_AWAY:
            return self._turned_away(request, peer, name)
        log.warning(
            "admin: %s %s from %s: login refused: %s%s",
            request.method,
            request.path,
            request.remote,
            refusal or under_attack_text(name, peer),
            throttled_text(verdict, delay, peer, 0),
            extra={"user": name, "peer": request.remote},
        )
        if delay:
            await api.login_refusal_delay(peer, delay)
        return None

    def _turned_away(self, request: web.BaseRequest, peer: str, user: str) -> web.Response:
        n = self.api.limits().login_turned_away
        if n == 1 or n % 1000 == 0:
            log.warning(
                "admin: %s %s from %s answered 429 at once: failed logins from %s are waiting "
                "for their answer (%d attempts turned away so far)",
                request.method,
                request.path,
                request.remote,
                peer,
                n,
            )
        retry = max(1, math.ceil(self.api.login_next_delay(peer, user)))
        resp = _json(
            429,
            {
                "error": "too_many_requests",
                "reason": "too many failed logins from this address are waiting for their "
                f"answer; try again in {retry} s",
            },
            close=True,
        )
        resp.headers["Retry-After"] = str(retry)
        return resp

    async def _dispatch(
        self,
        request: web.BaseRequest,
        who: Principal,
        parts: list[str],
        query: dict[str, list[str]],
        body: bytes = b"",
    ) -> web.StreamResponse:
        admin = self.admin
        method = request.method
        if method == "PUT" and len(parts) == 4 and parts[:2] == ["api", "queues"]:
            vhost, queue = parts[2], parts[3]
            who.require(ENDPOINTS["PUT", "/api/queues/{vhost}/{queue}"], vhost)
            spec = queue_spec(body)
            who.authorize(vhost, authz.queue_declare(queue, spec.get("arguments")))
            created, view = admin.declare_queue(vhost, queue, by=who.name, **spec)
            return _json(201 if created else 200, {"created": created, "queue": view})
        if method == "GET":
            if parts and parts[0] == "metrics" and parts[1:] in ([], ["per-object"]):
                who.require(ENDPOINTS["GET", "/metrics"])
                return await serve_metrics(request, admin, per_object=len(parts) == 2)
            if parts == ["api", "overview"]:
                who.require(ENDPOINTS["GET", "/api/overview"])
                return _json(200, admin.overview(who.visible()))
            if parts == ["api", "whoami"]:
                who.require(ENDPOINTS["GET", "/api/whoami"])
                return _json(
                    200,
                    {
                        "name": who.name,
                        "tags": sorted(who.tags),
                        "vhosts": sorted(who.vhosts),
                        "administrator": who.administrator,
                        "sees_all": who.sees_all,
                    },
                )
            if parts == ["api", "history"]:
                who.require(ENDPOINTS["GET", "/api/history"])
                return _json(200, admin.queue_history(who.visible()))
            if parts == ["api", "policy-actions"]:
                who.require(ENDPOINTS["GET", "/api/policy-actions"])
                return _json(200, admin.policy_actions(who.visible()))
            if parts == ["api", "config"]:
                who.require(ENDPOINTS["GET", "/api/config"])
                loop = asyncio.get_running_loop()
                return _json(200, await loop.run_in_executor(None, admin.running_config))
            if len(parts) == 2 and parts[0] == "api" and parts[1] in LISTINGS:
                who.require(ENDPOINTS["GET", "/" + "/".join(parts)])
                return await serve_listing(request, admin, who, parts[1], query)
            if len(parts) == 5 and parts[:2] == ["api", "queues"] and parts[4] == "messages":
                who.require(ENDPOINTS["GET", "/api/queues/{vhost}/{queue}/messages"], parts[2])
                who.authorize(parts[2], authz.consume(parts[3]))
                limit = int_param(query, "limit", 20, minimum=0, maximum=10_000)
                assert limit is not None
                return _json(200, admin.messages(parts[2], parts[3], limit))
        if method == "POST":
            if parts == ["api", "reload"]:
                who.require(ENDPOINTS["POST", "/api/reload"])
                loop = asyncio.get_running_loop()
                # the file is read and validated in the executor, put in effect on the loop
                cfg = await loop.run_in_executor(None, self.reloader.prepare_reload)
                return _json(200, admin.reload(cfg))
            if (
                len(parts) == 5
                and parts[:2] == ["api", "queues"]
                and parts[4] in ("purge", "delete")
            ):
                vhost, queue, verb = parts[2], parts[3], parts[4]
                who.require(ENDPOINTS["POST", f"/api/queues/{{vhost}}/{{queue}}/{verb}"], vhost)
                if verb == "purge":
                    who.authorize(vhost, authz.queue_purge(queue))
                    return _json(200, await admin.purge_queue(vhost, queue, by=who.name))
                who.authorize(vhost, authz.queue_delete(queue))
                return _json(200, await admin.delete_queue(vhost, queue, by=who.name))
            if len(parts) == 4 and parts[:2] == ["api", "connections"] and parts[3] == "close":
                row = admin.connection(parts[2])
                if row is None:
                    raise AdminError(404, f"no connection '{parts[2]}'")
                who.require_owner(row["user"], row["vhost"])
                reason = query.get("reason", [""])[0]
                return _json(200, admin.close_connection(parts[2], by=who.name, reason=reason))
            if (
                len(parts) == 6
                and parts[:2] == ["api", "consumers"]
                and parts[5] in ("cancel", "release")
            ):
                vhost, queue, tag, verb = parts[2], parts[3], parts[4], parts[5]
                who.require(
                    ENDPOINTS["POST", f"/api/consumers/{{vhost}}/{{queue}}/{{tag}}/{verb}"], vhost
                )
                conn = query.get("connection", [""])[0]
                who.authorize(vhost, authz.cancel(queue))
                found = admin.consumer(vhost, queue, tag, conn)
                owner = admin.connection(found.connection_id)
                who.require_owner(owner["user"] if owner else None, vhost)
                if verb == "cancel":
                    return _json(200, admin.cancel_consumer(vhost, queue, tag, conn, by=who.name))
                return _json(200, admin.release_consumer(vhost, queue, tag, conn, by=who.name))
            if len(parts) == 5 and parts[:2] == ["api", "queues"] and parts[4] == "redrive":
                who.require(ENDPOINTS["POST", "/api/queues/{vhost}/{queue}/redrive"], parts[2])
                who.authorize(parts[2], authz.redrive_source(parts[3]))
                most = int_param(query, "limit", None, minimum=0)
                reasons = [r for v in query.get("reason", []) for r in v.split(",") if r]
                rate = float_param(query, "rate")
                return _json(
                    200,
                    await admin.redrive(
                        parts[2],
                        parts[3],
                        most,
                        reasons=reasons or None,
                        reset=bool_param(query, "reset", True),
                        dry_run=bool_param(query, "dry_run", False),
                        rate=rate,
                        by=who.name,
                        allowed=lambda target: who.may(parts[2], authz.redrive_target(target)),
                    ),
                )
        raise AdminError(404, f"no such endpoint: {method} /{'/'.join(parts)}")

"""Putting the parts together: config -> plugins -> broker -> server -> housekeeping.

:func:`start_broker` is what ``plugbroker run`` calls and what the end-to-end tests call (in a
thread of their own, on a free loopback port). Plugins are loaded before the full parse of the
configuration, because a plugin may add its own XML elements: the ``<plugins>`` list is read
first with a plain XML parse, then the whole file is validated with every plugin's elements
known.

:func:`loop_factory` picks the event loop ``plugbroker run`` runs on: uvloop's when it is
installed (the optional extra ``plugbroker[uvloop]``), asyncio's otherwise, or the one named by
``--loop`` / ``PLUGBROKER_LOOP``. The broker uses only the asyncio API, so both behave alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from plugbroker.app import Broker
from plugbroker.clock import Clock
from plugbroker.config import (
    BrokerConfig,
    ConfigElementRegistry,
    ConfigError,
    load_config,
    load_default,
    users,
)
from plugbroker.core.recovery import recover
from plugbroker.server import Server, TLSListener
from plugbroker.store import Store

log = logging.getLogger("broker")

#: environment variable naming the event loop (``auto``, ``asyncio`` or ``uvloop``)
LOOP_ENV = "PLUGBROKER_LOOP"
LOOP_CHOICES = ("auto", "asyncio", "uvloop")


class LoopError(ValueError):
    """The event loop asked for is unknown or not installed."""


def loop_factory(
    choice: str | None = None, *, tls: bool = False
) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """``(factory, description)`` of the event loop to run the broker on, for
    ``asyncio.Runner(loop_factory=...)``; the factory is None for asyncio's own loop (what
    ``asyncio.run`` uses).

    :param choice: ``auto`` (uvloop when importable, else asyncio), ``asyncio`` or ``uvloop``;
        None reads :data:`LOOP_ENV` and falls back to ``auto``.
    :param tls: the configuration has a TLS listener (``<tls>`` or ``<admin><tls>``). The TLS
        acceptor (:mod:`plugbroker.tls`) hands a socket to ``loop.start_tls`` after accepting it;
        on uvloop that handshake stalls now and then (a client's first bytes can be read
        before the handshake starts), so ``auto`` stays on asyncio and ``uvloop`` is refused.
    :raises LoopError: an unknown name, or ``uvloop`` when it is not installed or with TLS.
    """
    name = (choice or os.environ.get(LOOP_ENV) or "auto").strip().lower()
    if name not in LOOP_CHOICES:
        raise LoopError(f"unknown event loop {name!r}; choose one of {', '.join(LOOP_CHOICES)}")
    if tls:
        if name == "uvloop":
            raise LoopError(
                "uvloop does not serve the TLS listeners (<tls>, <admin><tls>) reliably; "
                "run them on asyncio (--loop asyncio or auto)"
            )
        return None, "asyncio (TLS listeners configured: uvloop is not used with them)"
    if name != "asyncio":
        try:
            import uvloop
        except ImportError:
            if name == "uvloop":
                raise LoopError(
                    "uvloop is not installed (pip install 'plugbroker[uvloop]')"
                ) from None
        else:
            return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"
    return None, "asyncio"


def uses_tls(path: Path | None) -> bool:
    """Whether a configuration file has a TLS listener, before full validation (the event
    loop is chosen before the configuration is loaded on it)."""
    if path is None:
        return False
    try:
        root = etree.parse(str(path)).getroot()
    except (OSError, etree.XMLSyntaxError):
        return False  # the full load reports it with file and line
    return root.find("tls") is not None or root.find("admin/tls") is not None


def plugin_list(path: Path | None) -> tuple[list[str], list[str]]:
    """``(modules, blocked)`` from a config's ``<plugins>`` element, before full validation."""
    if path is None:
        return [], []
    try:
        root = etree.parse(str(path)).getroot()
    except (OSError, etree.XMLSyntaxError):
        return [], []  # the full load reports it with file and line
    modules: list[str] = []
    blocked: list[str] = []
    for el in root.iterfind("plugins/plugin"):
        name = (el.text or "").strip()
        if not name:
            continue
        if (el.get("enabled") or "true").strip().lower() in ("false", "0", "no"):
            blocked.append(name)
        else:
            modules.append(name)
    return modules, blocked


@dataclass
class Running:
    """A started broker: what the CLI waits on and what tests stop."""

    broker: Broker
    server: Server
    config: BrokerConfig
    plugins: Any
    housekeeping: Any = None
    admin: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    #: why the last reload was refused (the configuration error, with file and line)
    reload_error: str | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def tls_port(self) -> int | None:
        """The amqps port (None without ``<tls>``)."""
        return self.server.tls_port

    async def stop(self) -> None:
        if self.admin is not None:
            await self.admin.stop()
        if self.housekeeping is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.housekeeping.stop)
        await self.server.stop()
        h = getattr(self.plugins, "shutdown", None)
        if h is not None:
            h(broker=self.broker.api)
        watch = getattr(self.plugins, "watch", None)
        if watch is not None:
            watch.stop()
        self.broker.store.close()

    def reload(self, path: Path | None = None) -> bool:
        """Re-read the configuration; a file that fails validation leaves the running one."""
        cfg = self.prepare_reload(path)
        if cfg is None:
            return False
        self.apply_reload(cfg)
        return True

    def prepare_reload(self, path: Path | None = None) -> BrokerConfig | None:
        """Read and validate the configuration (any thread: it touches no broker state);
        None, with a log line, when it fails."""
        src = path or self.config.source
        if src is None:
            self.reload_error = "the broker runs on built-in defaults: there is no file to re-read"
            return None
        try:
            cfg = load_config(src, registry=self.extras.get("config_registry"))
            if self.plugins is not None and hasattr(self.plugins, "verify_policies"):
                self.plugins.verify_policies(cfg)
        except Exception as exc:
            self.reload_error = str(exc)
            log.error("reload refused, the running configuration stays: %s", exc)
            return None
        self.reload_error = None
        return cfg

    def apply_reload(self, cfg: BrokerConfig) -> None:
        """Put a validated configuration in effect (on the loop)."""
        self.config = cfg
        warn_plain_passwords(cfg)
        watch = getattr(self.plugins, "watch", None)
        if watch is not None:
            watch.budget = cfg.limits.hook_budget
        self.broker.reload(cfg)
        if self.admin is not None:
            self.admin.allowed_hosts = frozenset(cfg.admin_allowed_hosts)
        log.info("configuration reloaded from %s", cfg.source)


def load_plugins(
    config_path: Path | None, *, origin: str | None = None
) -> tuple[Any, ConfigElementRegistry]:
    """Load built-in, configured and entry-point plugins; collect their XML elements.

    :param origin: how errors name the configuration (default: ``config_path``).
    """
    from plugbroker.pluginhost import PluginHost

    modules, blocked = plugin_list(config_path)
    host = PluginHost(blocked=blocked)
    where = origin or (str(config_path) if config_path else "the configuration")
    host.load(modules, origin=where)
    return host, host.config_registry()


async def start_broker(
    config_path: str | Path | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
    clock: Clock | None = None,
    config: BrokerConfig | None = None,
    housekeeping: bool = True,
    accept_store_loss: bool = False,
) -> Running:
    """Load config and plugins, open the store, listen, start housekeeping.

    :param accept_store_loss: start even if the store lost data (``--accept-store-loss``).
    """
    path = Path(config_path) if config_path is not None else None
    plugins, registry = load_plugins(path)
    if config is None:
        config = (
            load_config(path, registry=registry)
            if path is not None
            else load_default(registry=registry)
        )
    if plugins.configure is not None:
        plugins.configure(config=config)
    plugins.verify_policies(config)
    plugins.watch.budget = config.limits.hook_budget
    warn_plain_passwords(config)
    # certificates load before the store opens: a file that does not load stops the start here
    tls = tls_listener(config)
    admin_ctx = admin_ssl_context(config)
    store = open_store(config, accept_loss=accept_store_loss)
    b = Broker(config, clock=clock, hooks=plugins, store=store)
    store.attach(b.clock, b.set_alarm)
    recover(store, b.vhosts, clock=b.clock, ids=b.ids)
    server = Server(
        b,
        host or config.listen_host,
        port if port is not None else config.listen_port,
        plain=config.listen_plain,
        tls=tls,
    )
    await server.start()
    running = Running(b, server, config, plugins, extras={"config_registry": registry})
    plugins.watch.start()
    if plugins.startup is not None:
        plugins.startup(broker=b.api)
    b.resolve_all()  # plugins' policy decisions (e.g. delivery limits) for existing queues
    if housekeeping and plugins.registry.jobs():
        from plugbroker.housekeeping import Housekeeping

        hk = Housekeeping(
            plugins.registry,
            b.api,
            threads=config.housekeeping_threads,
            default_period=config.housekeeping_period,
            period_for=lambda key: period_for(b.config, key),
        )
        hk.start()
        running.housekeeping = hk
    if config.admin is not None:
        running.admin = await start_admin(b, running, config, admin_ctx)
    return running


def warn_plain_passwords(config: BrokerConfig) -> None:
    """One warning per user (in the process' life) whose password is plain text."""
    users.warn_plain_passwords(
        ((u.name, u.password is not None) for u in config.users.values()),
        config.source or "the configuration",
    )


def admin_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The context of ``<admin><tls>`` (None: plain HTTP, or no admin interface)."""
    if config.admin is None or config.admin_tls is None:
        return None
    from plugbroker.tls import server_context

    return server_context(config.admin_tls, where="admin/tls")


async def start_admin(
    b: Broker, running: Running, config: BrokerConfig, ctx: ssl.SSLContext | None
) -> Any:
    """The admin server ``<admin>`` asks for (HTTPS with ``ctx``), on this loop."""
    from plugbroker.admin_http import AdminServer

    assert config.admin is not None
    host, port = config.admin
    tls = config.admin_tls
    if tls is not None:
        host, port = tls.host or host, tls.port
    try:
        return await AdminServer(
            b.api,
            running,
            host,
            port,
            ssl_context=ctx,
            allowed_hosts=config.admin_allowed_hosts,
        ).start()
    except OSError as exc:
        await running.stop()  # the AMQP listeners are up: close them before giving up
        raise OSError(
            exc.errno,
            f"the admin interface (<admin> in {config.source or 'the configuration'}) cannot "
            f"listen on {host}:{port}: {exc.strerror or exc}; give <admin> another port, or "
            "remove it to run without the admin interface",
        ) from exc
    except BaseException:
        await running.stop()  # the AMQP listeners are up: close them before giving up
        raise


def tls_listener(config: BrokerConfig) -> TLSListener | None:
    """The amqps listener ``<tls>`` asks for (its certificate files loaded now: a file that
    does not load stops the start with a :class:`ConfigError`)."""
    tls = config.tls
    if tls is None:
        return None
    from plugbroker.tls import server_context

    return TLSListener(
        server_context(tls),
        tls.host or config.listen_host,
        tls.port,
        external=tls.verify_peer,
    )


def period_for(config: BrokerConfig, key: str) -> float | None:
    """Resolve a job's ``period_key`` such as ``"isolation.checkPeriod"``: the shortest such
    period configured anywhere (a check must run at least as often as the strictest queue
    asks), or None when no section configures it."""
    section, _, attr = key.partition(".")
    py_attr = {"checkPeriod": "check_period"}.get(attr, attr)
    found: list[float] = []
    for vc in config.vhosts.values():
        holders = [
            vc.defaults,
            *(q.sections for q in vc.queues.values()),
            *(t.sections for t in vc.topics),
        ]
        for sections in holders:
            sec = sections.get(section) if hasattr(sections, "get") else None
            value = getattr(sec, py_attr, None)
            if isinstance(value, (int, float)) and value > 0:
                found.append(float(value))
    return min(found) if found else None


def open_store(config: BrokerConfig, *, accept_loss: bool = False) -> Store:
    """The durable store named by ``<store path>`` (nothing durable without one).

    :param accept_loss: start even if the store lost data (as ``<store acceptLoss="true">``).
    """
    from plugbroker.store import MemoryStore

    if config.store_path is None:
        return MemoryStore()
    try:
        from plugbroker.store.sqlite import SQLiteStore
    except ImportError:
        log.warning("no durable store available; persistent messages are kept in memory only")
        return MemoryStore()
    import os

    from plugbroker.store.sqlite import SYNC_ENV

    # the environment variable wins, so a soak or benchmark can switch without editing the file
    return SQLiteStore(
        config.store_path,
        synchronous=os.environ.get(SYNC_ENV) or config.store_sync.upper(),
        accept_loss=accept_loss or config.store_accept_loss,
    )


__all__ = [
    "LOOP_CHOICES",
    "LOOP_ENV",
    "ConfigError",
    "LoopError",
    "Running",
    "load_plugins",
    "loop_factory",
    "plugin_list",
    "start_broker",
    "uses_tls",
]

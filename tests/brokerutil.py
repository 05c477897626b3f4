"""Start a real broker for a test: its own event loop thread, a free loopback port.

Tests talk to it with real clients over TCP; they never reach into it except through
:meth:`BrokerThread.call`, which runs a function on the broker's loop (to read a figure or
trigger a housekeeping check without waiting for the scheduler).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugbroker.alarms import ResourceMonitor
from plugbroker.runner import Running, loop_factory, start_broker, uses_tls

# a broker started here shares the test process: the memory alarm must not count pytest's
# own size as the broker's (a broker process counts its size at start; see plugbroker.alarms)
ResourceMonitor.watch_rss = False

#: the users of every test broker unless a test gives its own ``users=``
GUEST = '<user name="guest" password="guest" vhosts="/ other"/>'
#: guest as RabbitMQ ships it, an administrator (the admin API wants a management tag)
ADMIN_GUEST = '<user name="guest" password="guest" vhosts="/ other" tags="administrator"/>'

CONFIG_TEMPLATE = """<?xml version="1.0"?>
<broker>
  <listen host="{listen_host}" port="0"/>
  {store}
  <users>{users}</users>
  <housekeeping><threads>2</threads><period>{period}</period></housekeeping>
  {plugins}
  {limits}
  <virtualhost name="/">
{vhost}
  </virtualhost>
  <virtualhost name="other"/>
</broker>
"""


def write_config(
    directory: Path,
    vhost: str = "",
    *,
    store: bool = False,
    plugins: str = "",
    limits: str = "",
    period: str = "30s",
    name: str = "broker.xml",
    journal: bool = False,
    admin: bool = False,
    users: str = GUEST,
    listen_host: str = "127.0.0.1",
) -> Path:
    store_el = f'<store path="{directory / "store"}"/>' if store else ""
    if journal:
        store_el += f'\n  <journal path="{directory / "journal"}"/>'
    if admin:
        store_el += '\n  <admin host="127.0.0.1" port="0"/>'
    text = CONFIG_TEMPLATE.format(
        store=store_el,
        plugins=plugins,
        limits=limits,
        vhost=vhost,
        period=period,
        users=users,
        listen_host=listen_host,
    )
    path = directory / name
    path.write_text(text)
    return path


def drain_until(conn: Any, pred: Callable[[], bool], timeout: float = 3.0) -> None:
    """Handle a client connection's events until ``pred()`` holds (AssertionError after
    ``timeout`` seconds). Works for py-amqp and kombu connections."""
    deadline = time.monotonic() + timeout
    while not pred():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"condition not met within {timeout:.1f} s")
        try:
            conn.drain_events(timeout=min(left, 0.1))
        except TimeoutError:
            pass


def drain_for(conn: Any, seconds: float) -> None:
    """Handle a client connection's events for ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            conn.drain_events(timeout=min(left, 0.1))
        except TimeoutError:
            pass


def close_all(*conns: Any, broker: Any = None) -> None:
    """Close client connections, ignoring errors; with ``broker``, clear its alarms first (a
    failed test must not leave an alarm up: a close would wait on it)."""
    if broker is not None:
        for name in list(broker.call(lambda: list(broker.broker.alarms))):
            broker.call(lambda n=name: broker.broker.clear_alarm(n))
    for c in conns:
        try:
            c.close()
        except Exception:
            pass


class BrokerThread:
    def __init__(self, config_path: Path | None = None, **kw: Any) -> None:
        self.config_path = config_path
        self.kw = kw
        # PLUGBROKER_LOOP=uvloop runs the end-to-end tests on uvloop (those without TLS
        # listeners: the runner keeps those on asyncio)
        choice = os.environ.get("PLUGBROKER_LOOP") or "asyncio"
        factory, _ = loop_factory("asyncio" if uses_tls(config_path) else choice)
        self.loop = (factory or asyncio.new_event_loop)()
        self.running: Running | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.running = self.loop.run_until_complete(
                start_broker(self.config_path, **{"host": "127.0.0.1", "port": 0, **self.kw})
            )
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def start(self) -> BrokerThread:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("broker did not start within 15 s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        assert self.running is not None
        return self.running.port

    @property
    def broker(self) -> Any:
        assert self.running is not None
        return self.running.broker

    def url(self, vhost: str = "/") -> str:
        v = "" if vhost == "/" else vhost
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{v}"

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result."""

        async def run() -> Any:
            try:
                return fn(*args)
            finally:
                self.broker.end_of_turn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        if self.running is not None and self.loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self.running.stop(), self.loop)
            try:
                fut.result(15)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

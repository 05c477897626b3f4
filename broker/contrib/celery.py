"""Touch a Celery worker's running and scheduled tasks, so that the broker never takes a long or
scheduled task for a stuck worker. One line, where the Celery app is created::

    from celery import Celery
    from plugbroker.contrib.celery import install

    app = Celery("proj", broker="amqp://...")
    install(app)                    # touches at half the queue's ackTimeout

:func:`install` adds a worker consumer bootstep (:class:`TouchStep`). For every task message the
worker receives (Celery's ``task_received`` signal: tasks about to run and tasks with an ETA or
countdown that the worker holds until they are due) that carries ``x-ack-timeout`` (the broker
puts it on deliveries from queues under isolation), a background thread touches the delivery
(:func:`plugbroker.contrib.touch.touch`) every ``fraction`` of that timeout, until the worker acks
it. Messages without the header (another broker, a queue without isolation) are left alone,
so the step changes nothing there.

A worker that is really stuck (stopped, deadlocked in the interpreter, its process frozen)
stops touching too, and is isolated after the ack timeout as before. A task that hangs in a
call that releases the interpreter lock keeps being touched: bound it with Celery's
``task_time_limit``. See docs/celery.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import bootsteps
from celery.signals import task_received

from plugbroker.contrib.touch import ack_timeout, serialise_writes, touch

log = logging.getLogger("plugbroker.contrib.celery")

#: the setting :func:`install` writes: the fraction of the ack timeout between two touches
FRACTION_SETTING = "plugbroker_touch_fraction"
DEFAULT_FRACTION = 0.5


class Toucher:
    """The messages a worker holds, touched every ``fraction`` of their ack timeout by one
    daemon thread until they are acked."""

    def __init__(self, fraction: float = DEFAULT_FRACTION) -> None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"the touch fraction must be between 0 and 1, not {fraction!r}")
        self.fraction = fraction
        self._held: dict[int, list[Any]] = {}  # id(message) -> [message, every, last touch]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: touches written (for tests and logs)
        self.touches = 0

    def add(self, message: Any) -> None:
        timeout = ack_timeout(message)
        if timeout is None:
            return
        with self._lock:
            self._held[id(message)] = [message, timeout * self.fraction, time.monotonic()]

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="plugbroker-touch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        self._thread = None
        with self._lock:
            self._held.clear()

    def tick(self, now: float) -> float:
        """Touch what is due at ``now``; returns how long to wait before the next tick."""
        wait = 1.0
        with self._lock:
            entries = list(self._held.items())
        for key, entry in entries:
            message, every, last = entry
            if getattr(message, "acknowledged", False):
                with self._lock:
                    self._held.pop(key, None)
                continue
            if now - last >= every:
                try:
                    if touch(message):
                        self.touches += 1
                    entry[2] = now
                except Exception as exc:  # the connection went away: the worker reconnects
                    log.debug("touch failed: %r", exc)
                    with self._lock:
                        self._held.pop(key, None)
                    continue
            wait = min(wait, max(every - (now - entry[2]), 0.0))
        return max(wait, 0.01)

    def _run(self) -> None:
        wait = 0.05
        while not self._stop.wait(wait):
            wait = min(self.tick(time.monotonic()), 0.25)


class TouchStep(bootsteps.StartStopStep):
    """The worker consumer step :func:`install` adds: a :class:`Toucher` fed by
    ``task_received`` for this worker's consumer."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        fraction = parent.app.conf.get(FRACTION_SETTING) or DEFAULT_FRACTION
        self.toucher = Toucher(float(fraction))
        self._consumer: Any = None

    def _received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        if sender is self._consumer and request is not None:
            message = getattr(request, "message", None)
            if message is not None:
                self.toucher.add(message)

    def start(self, parent: Any) -> None:
        self._consumer = parent
        conn = getattr(parent.connection, "connection", None)  # the py-amqp connection
        if conn is not None and hasattr(conn, "frame_writer"):
            serialise_writes(conn)  # from the consumer's own thread, before any touch
        task_received.connect(self._received, weak=False, dispatch_uid=f"plugbroker-{id(self)}")
        self.toucher.start()

    def stop(self, parent: Any) -> None:
        task_received.disconnect(dispatch_uid=f"plugbroker-{id(self)}")
        self.toucher.stop()

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)


def install(app: Any, fraction: float = DEFAULT_FRACTION) -> Any:
    """Touch the worker's running and scheduled tasks every ``fraction`` (0.5 by default) of
    the ack timeout the broker sends; returns ``app``."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the touch fraction must be between 0 and 1, not {fraction!r}")
    app.conf[FRACTION_SETTING] = fraction
    if TouchStep not in app.steps["consumer"]:
        app.steps["consumer"].add(TouchStep)
    return app


__all__ = ["DEFAULT_FRACTION", "FRACTION_SETTING", "TouchStep", "Toucher", "install"]

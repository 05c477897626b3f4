"""Retry and dead letter (Pulsar PIP-22 and PIP-106, TDMQ's retry queue), as a built-in plugin.

For every queue a ``<deadLetter>`` element applies to:

* **Redelivery limit** (PIP-22's redelivery tracker, kept by the broker): every requeue raises
  the message's delivery count (a nack or reject with requeue, a channel or connection closing,
  ``basic.recover``, isolation) and consumers see it as ``x-delivery-count``. The requeue that
  would pass ``maxRedeliveries`` dead-letters the message instead (reason ``delivery_limit``).
  This plugin answers ``broker_delivery_limit``; the core does the counting on every path.
* **Dead-letter queue**: ``<queue>`` or the ``<queueTemplate>`` (``{queue}-DLQ`` by default),
  created durable on first use, for delivery-limit, ``requeue=false`` rejects, TTL expiry and
  overflow drops. Dead letters carry ``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``RECONSUMETIMES``
  (TDMQ's properties) besides RabbitMQ's ``x-death`` record that the core adds.
* **Negative-ack backoff** (PIP-106): with ``<backoff>``, a nacked message stays invisible for
  ``next(redelivery_count)`` seconds: ``fixed``, ``exponential``, ``levels`` or a custom class a
  plugin registered with ``registry.register_backoff(name, factory)``.
* **Retry queue** (TDMQ's reconsumeLater): with ``<retry>``, the broker declares
  ``{queue}-RETRY`` next to the queue. A retry that :func:`plugbroker.retry.reconsume_later` asks
  for (the broker does it: :func:`plugbroker.domain.fate.reconsume`) waits its delay there, then
  goes back to the queue, where the same consumers get it; past ``maxRedeliveries`` it is
  dead-lettered. Dead letters of a queue with a retry queue carry ``RETRY_TOPIC``.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from plugbroker.config import ConfigElementRegistry
from plugbroker.decisions import DeadLetterTarget
from plugbroker.hookimpl import hookimpl
from plugbroker.plugins import dead_letter_config

if TYPE_CHECKING:
    from plugbroker.core.api import BrokerAPI

log = logging.getLogger("plugbroker.plugins.dead_letter")


class DeadLetterPlugin:
    """Holds the core API (hooks name queues; the policy is the queue's resolved policy)."""

    def __init__(self) -> None:
        self.broker: BrokerAPI | None = None
        self._pending: list[tuple[str, str, bool]] = []
        self._backoffs: dict[int, Any] = {}
        #: queues this plugin made (retry and dead-letter queues): they get no retry queue and
        #: no dead-letter queue of their own
        self._made: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ helpers

    def config(self, vhost: str, queue: str) -> Any:
        b = self.broker
        if b is None or (vhost, queue) in self._made:
            return None
        pol = b.queue_policy(vhost, queue)
        return pol.get("deadLetter") if pol else None

    def _retry_queue_for(self, vhost: str, queue: str, durable: bool) -> None:
        cfg = self.config(vhost, queue)
        if cfg is None or cfg.retry is None:
            return
        name = cfg.retry.queue_name(queue)
        api = self.broker
        if api is None or name == queue or api.has_queue(vhost, name):
            return
        self._made.add((vhost, name))
        api.declare_queue(
            vhost,
            name,
            durable=durable,
            arguments={
                "x-retry-target": queue,
                "x-retry-levels": [round(s * 1000) for s in cfg.retry.levels],
            },
        )
        log.info("retry queue '%s' in vhost '%s' declared for queue '%s'", name, vhost, queue)

    # ------------------------------------------------------------------ hooks

    @hookimpl(trylast=True)
    def broker_add_config_elements(self, registry: ConfigElementRegistry) -> None:
        """``<deadLetter>`` is this plugin's section (see :mod:`plugbroker.plugins.dead_letter_config`)."""
        dead_letter_config.add_config_elements(registry)

    def _mark_if_target(self, vhost: str, queue: str) -> None:
        """Have the core know ``queue`` as a dead-letter or retry target if this plugin's
        configuration names it one (before its first dead letter, and across restarts)."""
        api = self.broker
        if api is None:
            return
        vc = api.config.vhosts.get(vhost)
        why = dead_letter_config.target_role(vc, queue) if vc is not None else None
        if why is None and (vhost, queue) in self._made:
            why = "declared by the dead-letter plugin"
        if why is not None:
            api.mark_dead_letter_target(vhost, queue, why)

    @hookimpl(trylast=True)
    def broker_startup(self, broker: BrokerAPI) -> None:
        self.broker = broker
        pending, self._pending = self._pending, []
        for vhost, queue, durable in pending:
            self._retry_queue_for(vhost, queue, durable)
        self._mark_all(broker)

    @hookimpl(trylast=True)
    def broker_config_reloaded(self, broker: BrokerAPI, config: Any) -> None:
        self._mark_all(broker)

    def _mark_all(self, broker: BrokerAPI) -> None:
        """Mark every queue the configuration names as a target (at start and after a reload:
        names only, no view of each queue is built)."""
        for vhost in broker.vhosts():
            for name in broker.queue_names(vhost):
                self._mark_if_target(vhost, name)

    @hookimpl(trylast=True)
    def broker_queue_declared(
        self, vhost: str, queue: str, durable: bool, arguments: dict[str, Any]
    ) -> None:
        if "x-retry-target" in arguments:
            self._made.add((vhost, queue))
            return
        if self.broker is None:  # configured queues are declared before startup
            self._pending.append((vhost, queue, durable))
            return
        self._mark_if_target(vhost, queue)
        self._retry_queue_for(vhost, queue, durable)

    @hookimpl(trylast=True)
    def broker_queue_deleted(self, vhost: str, queue: str, reason: str) -> None:
        self._made.discard((vhost, queue))

    @hookimpl(trylast=True)
    def broker_delivery_limit(self, vhost: str, queue: str) -> int | None:
        cfg = self.config(vhost, queue)
        return cfg.max_redeliveries if cfg is not None else None

    @hookimpl(trylast=True)
    def broker_redelivery_delay(
        self, vhost: str, queue: str, message: Any, delivery_count: int
    ) -> float | None:
        cfg = self.config(vhost, queue)
        if cfg is None or cfg.backoff is None:
            return None
        backoff = cfg.backoff
        redeliveries = max(0, delivery_count - 1)  # PIP-106: next(0) on the first nack
        if backoff.builtin:
            return backoff.next_delay(redeliveries)
        impl = self._backoffs.get(id(backoff))
        if impl is None:
            factory = self._backoff_factory(backoff.type)
            impl = self._backoffs[id(backoff)] = factory(dict(backoff.params))
        return float(impl.next(redeliveries))

    def _backoff_factory(self, name: str) -> Any:
        if self.broker is None:
            raise LookupError(f"backoff {name!r}: the broker has not started")
        return self.broker.backoff_factory(name)

    @hookimpl(trylast=True)
    def broker_dead_letter_target(
        self, vhost: str, queue: str, message: Any, reason: str
    ) -> DeadLetterTarget | None:
        cfg = self.config(vhost, queue)
        if cfg is None:
            return None
        dlq = cfg.dlq_name(queue, message.exchange, vhost)
        if dlq == queue:
            return None
        self._made.add((vhost, dlq))
        retry = cfg.retry.queue_name(queue) if cfg.retry is not None else None
        return DeadLetterTarget(
            exchange="",
            routing_key=dlq,
            headers=dead_letter_headers(message, queue, retry),
            declare_queue=dlq,
        )


def dead_letter_headers(message: Any, queue: str, retry_queue: str | None) -> dict[str, Any]:
    """TDMQ's properties for a dead letter; values already set by a retry are kept.

    ``ORIGIN_MESSAGE_ID`` is the one a retry set, else the publisher's ``message_id``, else a
    new unique id. ``RETRY_TOPIC`` names the queue's retry queue when it has one (or the one
    an earlier retry named).
    """
    headers = message.headers
    origin = headers.get("ORIGIN_MESSAGE_ID") or message.message_id or uuid.uuid4().hex
    out = {
        "REAL_TOPIC": headers.get("REAL_TOPIC", queue),
        "ORIGIN_MESSAGE_ID": origin,
        "RECONSUMETIMES": headers.get("RECONSUMETIMES", 0),
    }
    retry = headers.get("RETRY_TOPIC") or retry_queue
    if retry:
        out["RETRY_TOPIC"] = retry
    return out


def make_plugin() -> DeadLetterPlugin:
    """One plugin object per broker (see plugbroker.pluginhost.FACTORY_NAME)."""
    return DeadLetterPlugin()

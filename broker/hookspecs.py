"""Every hook plugbroker calls, in one place.

A plugin implements any subset of these with ``@hookimpl`` (:mod:`plugbroker.hookimpl`); the core
calls them only through :class:`plugbroker.pluginhost.PluginHost`. Three kinds of hook:

- **notifications** (plain hooks): every implementation is called, results are ignored. They say
  what happened; they cannot change it.
- **decisions** (``firstresult=True``): implementations are called until one returns something
  other than ``None``; that value is the decision, ``None`` from all of them means "the core's
  default". Built-in plugins implement these with ``trylast=True`` so a user's plugin is asked
  first.
- **configuration** hooks run once at start (and on reload) before any traffic.

Threads: every hook below runs on the broker's asyncio loop, so an implementation must neither
block nor take long: the per-message hooks in particular run once per message. Work that takes
time belongs in a housekeeping job (``broker_register`` → ``registry.register_policy_job`` or
``registry.register_job``), which runs on the housekeeping pool.

The reference with examples is ``docs/hooks.md``; ``tests/test_docs_hooks.py`` keeps the two in
step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from plugbroker.hookimpl import PROJECT_NAME

if TYPE_CHECKING:
    from plugbroker.config import BrokerConfig, ConfigElementRegistry
    from plugbroker.core.api import BrokerAPI
    from plugbroker.decisions import DeadLetterTarget, RejectDecision
    from plugbroker.policy import Action
    from plugbroker.registry import Registrar

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


class MessageView(Protocol):
    """The core's message object as hooks see it. Read-only: a hook must not change it.

    ``properties`` is decoded from the content header only when first read, so a hook that
    never reads it costs no decoding.
    """

    #: broker-unique id, stable across redeliveries and (for persistent messages) restarts
    id: int
    exchange: str
    routing_key: str
    body_size: int
    persistent: bool
    priority: int
    delivery_count: int
    #: hand-outs of it whose ack clock ran out (``x-ack-timeout-count``)
    timeouts: int
    properties: Mapping[str, Any]
    headers: Mapping[str, Any]


# -------------------------------------------------------------------------------------------------
# Configuration and lifecycle hooks
# -------------------------------------------------------------------------------------------------


@hookspec
def broker_add_config_elements(registry: ConfigElementRegistry) -> None:
    """Register parsers for the plugin's own XML elements.

    Call ``registry.register(element_name, parser)`` for each element the plugin adds to the
    configuration: by default a section that may appear under ``<virtualhost>``, ``<queue>`` and
    ``<topic>`` and resolves per queue (its value reaches policies as
    ``QueueView.policy[element_name]``); with ``level="broker"`` an element directly under
    ``<broker>`` (its value lands in ``BrokerConfig.extensions``). ``parser(element, ctx)``
    returns the parsed value (``ctx`` is a ``plugbroker.config.ParseContext``). Policy names need no
    declaring here: the host declares every policy registered in ``broker_register``. The
    built-in plugins register ``<consumer>``, ``<isolation>`` and ``<deadLetter>`` here too.

    :param registry: the configuration element registry (``plugbroker.config.ConfigElementRegistry``).

    Called once per configuration load (at start and on every reload), after the plugins are
    registered and before the XML file is parsed. Not firstresult.
    """


@hookspec
def broker_configure(config: BrokerConfig) -> None:
    """Validate the plugin's sections of a freshly parsed configuration.

    Raise ``plugbroker.config.ConfigError`` naming the file, the element and what is wrong to refuse
    the configuration: at start the broker does not start, on reload the running configuration is
    kept.

    :param config: the parsed configuration (``plugbroker.config.BrokerConfig``); read-only.

    Called after parsing and schema validation, at start and on every reload, before the
    configuration is put into effect. Not firstresult.
    """


@hookspec
def broker_register(registry: Registrar) -> None:
    """Register the plugin's named policies, policy jobs and housekeeping jobs.

    ``registry.register_policy(name, policy)`` makes ``<policy name="...">`` usable in the XML;
    ``registry.register_policy_job(name, evaluate, section=..., period=..., period_key=...)``
    adds a policy job (:class:`plugbroker.policy.Policy`), which the housekeeping pool runs and the
    backtest replays; ``registry.register_job(name, func, period=..., period_key=...)`` adds a
    plain job for periodic work that is not a policy. A name that another plugin already
    registered is refused with an error naming both plugins.

    :param registry: a :class:`plugbroker.registry.Registrar` bound to this plugin, so everything
        registered is attributed to it (error messages, logs, ``unregister``).

    Called by the plugin host once per plugin, right after the plugin is registered. Not
    firstresult.
    """


@hookspec
def broker_startup(broker: BrokerAPI) -> None:
    """The broker has started: listeners are open and the housekeeping pool is running.

    :param broker: the core API of the running broker (:class:`plugbroker.core.api.BrokerAPI`):
        views of its queues, consumers and connections, and the commands a plugin may give.
        Keep it to use from later hooks; it stays valid until ``broker_shutdown``.

    Called once, on the loop, before the first connection is accepted. Not firstresult.
    """


@hookspec
def broker_shutdown(broker: BrokerAPI) -> None:
    """The broker is stopping: connections are closed, the store is still open.

    :param broker: the core API of the stopping broker (:class:`plugbroker.core.api.BrokerAPI`).

    Called once, on the loop, during a graceful shutdown (not after a kill). Not firstresult.
    """


@hookspec
def broker_config_reloaded(broker: BrokerAPI, config: BrokerConfig) -> None:
    """A new configuration passed validation and is now in effect.

    :param broker: the core API of the running broker (:class:`plugbroker.core.api.BrokerAPI`).
    :param config: the configuration now in effect (``plugbroker.config.BrokerConfig``).

    Called on the loop after a reload (SIGHUP or the admin command) succeeded; a reload that
    failed validation does not call it. Not firstresult.
    """


@hookspec
def broker_alarm_changed(name: str, raised: bool, detail: str) -> None:
    """A resource alarm was raised or cleared.

    :param name: the alarm: ``"memory"``, ``"disk"`` or ``"store"``.
    :param raised: True when it was raised (publishers are blocked while any alarm is raised),
        False when it cleared.
    :param detail: what was measured against which limit (raised), or why it cleared (may be
        empty).

    Called on the loop once per change, after the connections were blocked or unblocked; a
    raised alarm whose detail changes does not call it again. An exception in an
    implementation is contained (logged once, counted). Not firstresult.
    """


# -------------------------------------------------------------------------------------------------
# Connection, queue and consumer notifications
# -------------------------------------------------------------------------------------------------


@hookspec
def broker_connection_opened(connection_id: str, peer: str, user: str, vhost: str) -> None:
    """A client finished the handshake (connection.open-ok was sent).

    :param connection_id: broker-unique id of the connection, as used by the other hooks.
    :param peer: the client's address, ``host:port``.
    :param user: the authenticated user name.
    :param vhost: the virtual host the connection opened.

    Called once per connection. Not firstresult.
    """


@hookspec
def broker_connection_closed(connection_id: str, code: int, text: str) -> None:
    """A connection ended, cleanly or not.

    :param connection_id: the id passed to ``broker_connection_opened``.
    :param code: the AMQP reply code (200 for a clean close, 320 when the broker forced it, the
        error code for a protocol error; 0 when the socket was lost without a close).
    :param text: the reply text, or why the socket was lost.

    Called once per opened connection, after its consumers were removed. Not firstresult.
    """


@hookspec
def broker_queue_declared(vhost: str, queue: str, durable: bool, arguments: dict[str, Any]) -> None:
    """A queue was created (a declare of an existing queue does not call it).

    :param vhost: the virtual host.
    :param queue: the queue name (server-generated names included).
    :param durable: whether the queue survives a restart.
    :param arguments: the ``x-`` arguments it was declared with; read-only.

    Called after the queue exists and before declare-ok is sent; also for durable queues
    restored at start. Not firstresult.
    """


@hookspec
def broker_queue_deleted(vhost: str, queue: str, reason: str, messages: int) -> None:
    """A queue was deleted.

    :param vhost: the virtual host.
    :param queue: the queue name.
    :param reason: ``"client"`` (queue.delete), ``"auto-delete"``, ``"expired"`` (x-expires),
        ``"exclusive-owner-closed"``, ``"admin"`` (the admin API or web UI), or
        ``"policy:<name>"`` when a policy deleted it.
    :param messages: how many messages it held (ready, unacked and held for a retry) when it
        went; they went with it.

    Called after its consumers were cancelled and its messages released. Not firstresult.
    """


@hookspec
def broker_queue_bound(vhost: str, queue: str, exchange: str, routing_key: str) -> None:
    """A binding from an exchange to a queue was added.

    :param vhost: the virtual host.
    :param queue: the bound queue.
    :param exchange: the source exchange.
    :param routing_key: the binding key.

    Called after the binding is in effect (a repeated identical bind does not call it). Not
    firstresult.
    """


@hookspec
def broker_queue_unbound(vhost: str, queue: str, exchange: str, routing_key: str) -> None:
    """A binding from an exchange to a queue was removed.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param exchange: the source exchange.
    :param routing_key: the binding key.

    Called after queue.unbind, and for each binding of a queue or exchange being deleted. Not
    firstresult.
    """


@hookspec
def broker_consumer_added(
    vhost: str, queue: str, consumer_tag: str, connection_id: str, channel_id: int
) -> None:
    """A consumer subscribed to a queue (basic.consume succeeded).

    :param vhost: the virtual host.
    :param queue: the queue consumed from.
    :param consumer_tag: the consumer tag (client-chosen or server-generated).
    :param connection_id: the consumer's connection.
    :param channel_id: the consumer's channel number on that connection.

    Called before the first delivery to the consumer. Not firstresult.
    """


@hookspec
def broker_consumer_removed(
    vhost: str, queue: str, consumer_tag: str, connection_id: str, channel_id: int, reason: str
) -> None:
    """A consumer went away.

    :param vhost: the virtual host.
    :param queue: the queue it consumed from.
    :param consumer_tag: the consumer tag.
    :param connection_id: the consumer's connection.
    :param channel_id: the consumer's channel number.
    :param reason: ``"cancel"`` (basic.cancel), ``"channel-closed"``, ``"connection-closed"``,
        ``"queue-deleted"`` or ``"policy:<name>"``.

    Called after its unacked messages were requeued. Not firstresult.
    """


@hookspec
def broker_consumer_isolated(
    vhost: str,
    queue: str,
    consumer_tag: str,
    connection_id: str,
    last_ack_age: float,
    moved: int,
) -> None:
    """A consumer was put on its queue's blocklist for not acking in time.

    :param vhost: the virtual host.
    :param queue: the (shared) queue.
    :param consumer_tag: the isolated consumer.
    :param connection_id: its connection.
    :param last_ack_age: seconds on its ack clock: since its last ack, nack or reject, or since
        it went from nothing unacked to something unacked when that came later (SPEC 6).
    :param moved: how many of its unacked messages were requeued to the other consumers.

    Called after the isolation was applied. Not firstresult.
    """


@hookspec
def broker_consumer_released(
    vhost: str, queue: str, consumer_tag: str, connection_id: str, reason: str
) -> None:
    """A consumer left its queue's blocklist.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param consumer_tag: the released consumer.
    :param connection_id: its connection.
    :param reason: ``"acked"`` (it acked, nacked or rejected something), ``"disconnected"`` or
        ``"policy:<name>"``.

    Called after the consumer is eligible for deliveries again (or gone). Not firstresult.
    """


# -------------------------------------------------------------------------------------------------
# Per-message notifications (hot path: called once per message, keep them cheap)
# -------------------------------------------------------------------------------------------------


@hookspec
def broker_message_published(
    vhost: str, exchange: str, routing_key: str, message: MessageView, queues: tuple[str, ...]
) -> None:
    """A message was accepted from a publisher and routed.

    :param vhost: the virtual host.
    :param exchange: the exchange it was published to (``""`` for the default exchange).
    :param routing_key: the routing key it was published with.
    :param message: the message; read-only.
    :param queues: the queues it was enqueued on, empty when it was unroutable.

    Called after routing, before the publisher confirm is sent. Not firstresult.
    """


@hookspec
def broker_message_delivered(
    vhost: str,
    queue: str,
    consumer_tag: str | None,
    connection_id: str,
    channel_id: int,
    delivery_tag: int,
    message: MessageView,
    redelivered: bool,
    no_ack: bool,
    due: float | None,
) -> None:
    """A message was handed to a consumer (basic.deliver) or a poller (basic.get-ok).

    :param vhost: the virtual host.
    :param queue: the queue it came from.
    :param consumer_tag: the consumer's tag, ``None`` for basic.get.
    :param connection_id: the receiving connection.
    :param channel_id: the receiving channel.
    :param delivery_tag: the delivery tag on that channel.
    :param message: the message; read-only.
    :param redelivered: the redelivered flag sent with it.
    :param no_ack: delivered with no-ack: it is settled as it is sent and no ack will follow.
    :param due: when the message says it is due, in seconds since the epoch, if that was later
        than the delivery (its ETA header, ``<isolation><etaHeaders>``): the delivery is off
        the consumer's ack clock until then. ``None`` otherwise (always for basic.get).

    Called when the frames are written to the connection's buffer. Not firstresult.
    """


@hookspec
def broker_delivery_touched(
    vhost: str,
    queue: str,
    consumer_tag: str,
    connection_id: str,
    channel_id: int,
    delivery_tag: int,
    message: MessageView,
) -> None:
    """A consumer said it still works on one of its deliveries: its ack clock restarted.

    The consumer published to ``amq.touch`` naming the delivery tag (docs/isolation.md).

    :param vhost: the virtual host.
    :param queue: the queue the delivery came from.
    :param consumer_tag: the consumer holding it.
    :param connection_id: its connection.
    :param channel_id: its channel.
    :param delivery_tag: the delivery tag touched.
    :param message: the message; read-only.

    Called after the clock restarted; not for a touch that named no delivery. Not firstresult.
    """


@hookspec
def broker_message_acked(
    vhost: str,
    queue: str,
    consumer_tag: str | None,
    connection_id: str,
    channel_id: int,
    message: MessageView,
) -> None:
    """A delivered message was acknowledged and removed from its queue.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param consumer_tag: the consumer it was delivered to, ``None`` for basic.get.
    :param connection_id: the acking connection.
    :param channel_id: the acking channel.
    :param message: the message; read-only.

    Called once per message (a ``multiple`` ack calls it for each message it covers). A message
    delivered with no-ack is settled on delivery and not reported here: its
    ``broker_message_delivered`` call (with ``no_ack=True``) is the last. A late ack from an
    isolated consumer for a message nobody has received since is reported here too. Not
    firstresult.
    """


@hookspec
def broker_message_rejected(
    vhost: str,
    queue: str,
    consumer_tag: str | None,
    connection_id: str,
    channel_id: int,
    message: MessageView,
    requeue: bool,
) -> None:
    """A delivered message was nacked or rejected by its consumer.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param consumer_tag: the consumer it was delivered to, ``None`` for basic.get.
    :param connection_id: the rejecting connection.
    :param channel_id: the rejecting channel.
    :param message: the message; read-only.
    :param requeue: the requeue flag the client sent.

    Called once per message, after ``broker_reject_decision`` decided its fate (the outcome
    follows as ``broker_message_redelivered``, ``broker_message_dead_lettered`` or
    ``broker_message_dropped``). Not firstresult.
    """


@hookspec
def broker_message_redelivered(
    vhost: str, queue: str, message: MessageView, delivery_count: int, reason: str
) -> None:
    """A message was put back on its queue to be delivered again.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param message: the message; read-only.
    :param delivery_count: its delivery count after this requeue.
    :param reason: ``"rejected"`` (nack/reject with requeue), ``"recover"``, ``"channel-closed"``,
        ``"consumer-isolated"``, ``"retry"`` (a retry-queue delay ran out: ``queue`` is the queue
        it went back to) or ``"redrive"`` (moved back from a dead-letter queue by an operator).

    Called when the message is requeued, before any redelivery delay starts. Not firstresult.
    """


@hookspec
def broker_message_timed_out(
    vhost: str,
    queue: str,
    consumer_tag: str,
    connection_id: str,
    message: MessageView,
    timeouts: int,
) -> None:
    """A hand-out of ``message`` timed out while its consumer worked on it.

    One more timed-out hand-out counts on the message, whether the consumer is then isolated,
    spared by the cap, or its channel closed.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param consumer_tag: the consumer that held it.
    :param connection_id: that consumer's connection.
    :param message: the message; read-only.
    :param timeouts: its count of timed-out hand-outs, this one included. When it reaches the
        queue's ``<poisonDeliveries>`` the message is dead-lettered with reason ``"poison"``
        (``broker_message_dead_lettered`` follows).

    Called when an isolation check finds the consumer over its ack timeout (once per timeout
    that runs out for one hand-out), or when the consumer's channel closes past it. Not
    firstresult.
    """


@hookspec
def broker_message_dead_lettered(
    vhost: str, queue: str, message: MessageView, reason: str, exchange: str, routing_key: str
) -> None:
    """A message left its queue for a dead-letter target.

    :param vhost: the virtual host.
    :param queue: the queue it left.
    :param message: the message as it was on that queue; read-only.
    :param reason: the ``x-death`` reason: ``"rejected"``, ``"expired"``, ``"maxlen"`` or
        ``"delivery_limit"``.
    :param exchange: the dead-letter exchange it was republished to (``""`` for a dead-letter
        queue reached through the default exchange).
    :param routing_key: the routing key it was republished with.

    Called after the dead-lettered copy was routed. Not firstresult.
    """


@hookspec
def broker_message_enqueued(vhost: str, queue: str, message: MessageView, reason: str) -> None:
    """A message arrived on a queue by the broker's own doing, not a client's publish.

    :param vhost: the virtual host.
    :param queue: the queue it arrived on.
    :param message: the message as that queue holds it; read-only.
    :param reason: ``"dead-letter"`` (a dead letter reached its dead-letter queue: one call per
        queue it was routed to, after ``broker_message_dead_lettered`` on the queue it left) or
        ``"delayed"`` (an ``x-delayed-message`` exchange released it when its delay ran out).

    A retry copy back on its queue and a redriven dead letter are announced by
    ``broker_message_redelivered`` (reasons ``"retry"`` and ``"redrive"``). Called after the
    queue took the message, before it is delivered. Not firstresult.
    """


@hookspec
def broker_message_removed(vhost: str, queue: str, message: MessageView, reason: str) -> None:
    """A message left its queue without being settled, expired, dead-lettered or dropped.

    :param vhost: the virtual host.
    :param queue: the queue it left.
    :param message: the message as that queue held it; read-only.
    :param reason: ``"retry"`` (a retry queue's delay ran out and a copy went back to the
        queue it came from), ``"redrive"`` (a dead letter was moved back to its queue) or
        ``"purged"`` (queue.purge, or the admin's purge; one call per message purged).

    Called after the message left. Not firstresult.
    """


@hookspec
def broker_message_expired(vhost: str, queue: str, message: MessageView) -> None:
    """A message's TTL ran out while it waited on its queue.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param message: the message; read-only.

    Called when the expiry is noticed, before it is dead-lettered (then
    ``broker_message_dead_lettered`` follows) or dropped. Not firstresult.
    """


@hookspec
def broker_message_dropped(vhost: str, queue: str, message: MessageView, reason: str) -> None:
    """A message was discarded with no dead-letter target to receive it.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param message: the message; read-only.
    :param reason: ``"maxlen"`` (overflow drop-head), ``"expired"``, ``"rejected"`` or
        ``"delivery_limit"``.

    Called after the message was removed. Not firstresult.
    """


# -------------------------------------------------------------------------------------------------
# Decisions (firstresult: the first implementation returning something other than None wins)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def broker_reject_decision(
    vhost: str, queue: str, message: MessageView, requeue: bool, delivery_count: int
) -> RejectDecision | None:
    """Decide what happens to a nacked or rejected message.

    :param vhost: the virtual host.
    :param queue: the queue the message was delivered from.
    :param message: the message; read-only.
    :param requeue: the requeue flag the client sent.
    :param delivery_count: how many times it was delivered so far.
    :return: a :class:`plugbroker.decisions.RejectDecision`, or ``None`` for the AMQP default
        (requeue at once when ``requeue`` is true, otherwise dead-letter if the queue has a
        target, else drop).

    Called on the loop once per nacked or rejected message. firstresult: the first
    non-``None`` result is used.
    """


@hookspec(firstresult=True)
def broker_select_consumer(
    vhost: str, queue: str, message: MessageView, consumers: Sequence[Any]
) -> Any | None:
    """Choose which consumer receives the next message of a queue.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param message: the message about to be delivered; read-only.
    :param consumers: the core's consumer objects able to take it now (prefetch credit left,
        not isolated), in the core's round-robin order; read-only.
    :return: one object of ``consumers``, or ``None`` for the core's default (round-robin for
        ``shared``, the active consumer for ``failover``, the key's consumer for
        ``key_shared``).

    Called on the loop once per delivery, so it must be O(1) or O(consumers). firstresult:
    the first non-``None`` result is used.
    """


@hookspec(firstresult=True)
def broker_redelivery_delay(
    vhost: str, queue: str, message: MessageView, delivery_count: int
) -> float | None:
    """Choose how long a requeued message stays invisible before it is delivered again.

    :param vhost: the virtual host.
    :param queue: the queue.
    :param message: the requeued message; read-only.
    :param delivery_count: how many times it was delivered so far.
    :return: seconds (``0`` for at once), or ``None`` for the configured backoff (or at once
        when none is configured).

    Called on the loop once per requeue. firstresult: the first non-``None`` result is used.
    """


@hookspec(firstresult=True)
def broker_delivery_limit(vhost: str, queue: str) -> int | None:
    """Choose how many redeliveries a queue's messages get before they are dead-lettered.

    :param vhost: the virtual host.
    :param queue: the queue.
    :return: the largest delivery count a message may reach by being requeued (by a nack or
        reject with requeue, a channel or connection closing, basic.recover or isolation);
        the requeue that would pass it dead-letters the message with reason
        ``delivery_limit`` instead. ``None`` for no limit (or the ``x-delivery-limit`` queue
        argument when the client gave one).

    Called on the loop when a queue's policy is resolved (its declaration, a reload, a bind or
    unbind that changes which sections reach it), not per message. firstresult: the first
    non-``None`` result is used; one that raises counts as no answer.
    """


@hookspec(firstresult=True)
def broker_dead_letter_target(
    vhost: str, queue: str, message: MessageView, reason: str
) -> DeadLetterTarget | None:
    """Choose where a dead-lettered message goes, and what it carries.

    :param vhost: the virtual host.
    :param queue: the queue the message dies in.
    :param message: the message; read-only.
    :param reason: ``"rejected"``, ``"expired"``, ``"maxlen"`` or ``"delivery_limit"``.
    :return: a :class:`plugbroker.decisions.DeadLetterTarget` (exchange, routing key, extra headers,
        and a durable queue to declare first if missing), or ``None`` for the queue's
        ``x-dead-letter-exchange`` argument (or a drop when it has none).

    Called on the loop once per dead-lettered message. The core adds RabbitMQ's ``x-death``
    record either way. firstresult: the first non-``None`` result is used.
    """


# -------------------------------------------------------------------------------------------------
# Policy actions
# -------------------------------------------------------------------------------------------------


@hookspec
def broker_policy_action(action: Action, outcome: str) -> None:
    """The core dealt with an action a policy asked for.

    :param action: the :class:`plugbroker.policy.Action` (its ``policy``, ``reason``, ``threshold``,
        ``configured`` and ``measured`` say who asked and why).
    :param outcome: ``"applied"``; ``"spared"`` (not applied by rule, e.g. a durable queue
        without ``delete-persistent``); or ``"stale"`` (the queue or consumer it named no longer
        exists or the condition no longer holds).

    Called on the loop once per action, after it was applied or set aside. Not firstresult.
    """

"""Who may do what, for every door: AMQP sessions, the admin HTTP API and its CLI.

One table says which permission each operation needs on which resource, the same one
RabbitMQ's access control documents; the session (:mod:`plugbroker.session`) and the admin
interface (:mod:`plugbroker.admin_http`) both ask it, so the two cannot drift apart.

==========================  ===============================================================
operation                   needs
==========================  ===============================================================
exchange.declare            configure on the exchange (with ``alternate-exchange``: also read
                            on it and write on the alternate exchange)
exchange.delete             configure on the exchange
exchange.bind / unbind      write on the destination, read on the source
queue.declare               configure on the queue (with ``x-dead-letter-exchange``: also
                            read on the queue and write on that exchange)
queue.delete                configure on the queue
queue.purge                 read on the queue
queue.bind / unbind         write on the queue, read on the exchange
basic.consume, basic.get,   read on the queue
peek, basic.cancel
basic.publish               write on the exchange (the default exchange is ``amq.default``)
redrive                     read on the dead-letter queue it takes from, write on each queue
                            it puts a message back on
retry (``amq.retry``)       write on the retry queue the copy goes to
==========================  ===============================================================

A pattern is matched by :class:`plugbroker.config.users.Permission` (a bounded engine: a
pattern that backtracks too long refuses, it never stalls the broker).

Listing follows the tags of RabbitMQ's management plugin (:class:`Tags`): ``management`` and
``policymaker`` see the objects of the vhosts they have permissions on, and of connections,
channels and consumers only their own; ``monitoring`` and ``administrator`` see everything.
Only an ``administrator`` acts on another user's connection or consumer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugbroker.codec import properties as props_codec
from plugbroker.config.users import Permission

__all__ = [
    "CONFIGURE",
    "DEFAULT_EXCHANGE_RESOURCE",
    "MANAGEMENT_TAGS",
    "READ",
    "WRITE",
    "Need",
    "Tags",
    "cancel",
    "consume",
    "exchange_bind",
    "exchange_declare",
    "exchange_delete",
    "first_refused",
    "publish",
    "queue_bind",
    "queue_declare",
    "queue_delete",
    "queue_purge",
    "redrive_source",
    "redrive_target",
    "refusal",
    "retry_target",
    "user_id_refusal",
]

CONFIGURE = "configure"
WRITE = "write"
READ = "read"

#: the name RabbitMQ checks permissions on for the default exchange ""
DEFAULT_EXCHANGE_RESOURCE = "amq.default"

#: tags that open the admin API at all (RabbitMQ: administrator and monitoring include
#: management; policymaker too)
MANAGEMENT_TAGS: frozenset[str] = frozenset(
    {"administrator", "monitoring", "policymaker", "management"}
)


@dataclass(frozen=True, slots=True)
class Need:
    """One permission an operation needs: ``kind`` (configure, write, read) on the
    ``resource`` (queue, exchange) named ``name``."""

    kind: str
    resource: str
    name: str


def _exchange(name: str) -> str:
    return name if name else DEFAULT_EXCHANGE_RESOURCE


def exchange_declare(name: str, arguments: Mapping[str, Any] | None = None) -> tuple[Need, ...]:
    needs: tuple[Need, ...] = (Need(CONFIGURE, "exchange", name),)
    ae = arguments.get("alternate-exchange") if arguments else None
    if isinstance(ae, str):
        needs += (Need(READ, "exchange", name), Need(WRITE, "exchange", _exchange(ae)))
    return needs


def exchange_delete(name: str) -> tuple[Need, ...]:
    return (Need(CONFIGURE, "exchange", name),)


def exchange_bind(source: str, destination: str) -> tuple[Need, ...]:
    return (
        Need(WRITE, "exchange", _exchange(destination)),
        Need(READ, "exchange", _exchange(source)),
    )


def queue_declare(name: str, arguments: Mapping[str, Any] | None = None) -> tuple[Need, ...]:
    needs: tuple[Need, ...] = (Need(CONFIGURE, "queue", name),)
    dlx = arguments.get("x-dead-letter-exchange") if arguments else None
    if isinstance(dlx, str):
        needs += (Need(READ, "queue", name), Need(WRITE, "exchange", _exchange(dlx)))
    return needs


def queue_delete(name: str) -> tuple[Need, ...]:
    return (Need(CONFIGURE, "queue", name),)


def queue_purge(name: str) -> tuple[Need, ...]:
    return (Need(READ, "queue", name),)


def queue_bind(queue: str, exchange: str) -> tuple[Need, ...]:
    return (Need(WRITE, "queue", queue), Need(READ, "exchange", _exchange(exchange)))


def consume(queue: str) -> tuple[Need, ...]:
    """basic.consume, basic.get and a peek at a queue's messages."""
    return (Need(READ, "queue", queue),)


def cancel(queue: str) -> tuple[Need, ...]:
    return (Need(READ, "queue", queue),)


def publish(exchange: str) -> tuple[Need, ...]:
    return (Need(WRITE, "exchange", _exchange(exchange)),)


def redrive_source(queue: str) -> tuple[Need, ...]:
    """Taking messages out of a dead-letter queue is a read of it."""
    return (Need(READ, "queue", queue),)


def redrive_target(queue: str) -> tuple[Need, ...]:
    """Putting a dead letter back on the queue it came from is a write of that queue: the
    message's headers name it, but only the asker's write pattern grants it."""
    return (Need(WRITE, "queue", queue),)


def retry_target(queue: str) -> tuple[Need, ...]:
    """A retry copy goes to the queue's retry queue: a write of the retry queue."""
    return (Need(WRITE, "queue", queue),)


def user_id_refusal(properties: bytes, user: str) -> str | None:
    """Why a publish with these raw properties may not go out as ``user`` (RabbitMQ's text,
    406 PRECONDITION_FAILED): its ``user_id`` names someone else. None: no ``user_id``, or the
    user's own. The ``impersonator`` tag (:attr:`Tags.impersonator`) skips this check."""
    try:
        uid = props_codec.user_id(properties)
    except props_codec.PropertiesError as exc:
        return str(exc)
    if uid is None or uid == user:
        return None
    return f"user_id property set to '{uid}' but authenticated user was '{user}'"


def first_refused(permission: Permission | None, needs: tuple[Need, ...]) -> Need | None:
    """The first of ``needs`` that ``permission`` (None: no access to the vhost) does not
    grant, or None when it grants them all."""
    for need in needs:
        if permission is None or not permission.allows(need.kind, need.name):
            return need
    return None


def refusal(need: Need, vhost: str, user: str) -> str:
    """RabbitMQ's text for a refused check, without the ``ACCESS_REFUSED - `` prefix."""
    return (
        f"{need.kind} access to {need.resource} '{need.name}' in vhost '{vhost}' refused for "
        f"user '{user}'"
    )


@dataclass(frozen=True, slots=True)
class Tags:
    """A user's management tags, read as RabbitMQ's management plugin reads them."""

    tags: frozenset[str]

    @property
    def administrator(self) -> bool:
        return "administrator" in self.tags

    @property
    def monitoring(self) -> bool:
        """Reads everything, changes nothing it has no permissions for."""
        return self.administrator or "monitoring" in self.tags

    @property
    def management(self) -> bool:
        return bool(self.tags & MANAGEMENT_TAGS)

    @property
    def impersonator(self) -> bool:
        """May publish with a ``user_id`` that is not its own."""
        return "impersonator" in self.tags

    def sees_owner(self, me: str, owner: str | None) -> bool:
        """Whether a listing shows a connection, channel or consumer owned by ``owner``:
        its own always, another's to monitoring and administrator only."""
        return owner == me or self.monitoring

    def acts_on_owner(self, me: str, owner: str | None) -> bool:
        """Whether the user may close, cancel or release what ``owner`` holds: its own, or
        anyone's for an administrator."""
        return owner == me or self.administrator

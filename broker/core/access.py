"""Revocation: after a reload, what a user lost is closed, through the core API's commands.

A reload that removes a user, takes a vhost away from it, or makes it loopback-only while it is
connected from elsewhere closes that user's connections (320 ``CONNECTION_FORCED`` with the
reason). A reload that narrows a user's patterns gives each of its connections the new ones (so
the next operation is checked against them) and closes, with RabbitMQ's 403 text, each channel
that consumes from a queue the user may no longer read. Nothing else is touched: a changed
password does not close anything (RabbitMQ checks a password at login only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugbroker.config.users import is_loopback

if TYPE_CHECKING:
    from plugbroker.config import BrokerConfig
    from plugbroker.core.api import BrokerAPI, ConnectionInfo

__all__ = ["revoke_lost_access"]


def peer_host(conn: ConnectionInfo) -> str:
    """The address part of a connection's ``host:port`` peer."""
    return conn.peer.rsplit(":", 1)[0].strip("[]") if ":" in conn.peer else conn.peer


def revoke_lost_access(api: BrokerAPI, old: BrokerConfig, new: BrokerConfig) -> list[str]:
    """Close what the users lost between ``old`` and ``new`` (``new`` is in effect already).

    Returns one line per connection or channel closed (also logged by the commands)."""
    done: list[str] = []
    for conn in api.connections():
        if conn.vhost is None:  # still logging in: connection.open checks the new config
            continue
        before, after = old.users.get(conn.user), new.users.get(conn.user)
        if before == after:
            continue
        reason: str | None = None
        if after is None:
            reason = f"user '{conn.user}' was removed by a configuration reload"
        elif not after.can_access(conn.vhost):
            reason = (
                f"user '{conn.user}' lost access to vhost '{conn.vhost}' in a configuration reload"
            )
        elif after.loopback_only and not is_loopback(peer_host(conn)):
            reason = f"user '{conn.user}' can now connect only via localhost"
        if reason is not None:
            if api.close_connection(conn.id, reason):
                done.append(f"connection {conn.id}: {reason}")
            continue
        assert after is not None
        perm = after.permission(conn.vhost)
        api.reauthorize(conn.id)  # new patterns, new tags (impersonator)
        if before is not None and before.permission(conn.vhost) == perm:
            continue
        if perm is None:  # unreachable: can_access held
            continue
        closed: set[int] = set()
        for c in api.consumers(conn.vhost):
            if c.connection_id != conn.id or c.channel_id in closed:
                continue
            if not perm.allows("read", c.queue):
                text = (
                    f"ACCESS_REFUSED - read access to queue '{c.queue}' in vhost "
                    f"'{conn.vhost}' refused for user '{conn.user}'"
                )
                if api.close_channel(conn.id, c.channel_id, 403, text):
                    closed.add(c.channel_id)
                    done.append(f"connection {conn.id} channel {c.channel_id}: {text}")
    return done

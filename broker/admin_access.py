"""Who may use which admin endpoint on what: the admin interface's side of
:mod:`plugbroker.authz`.

Two checks, both RabbitMQ's management plugin's:

* the user's tags open an endpoint at all (:data:`ENDPOINTS`, :meth:`Principal.require`):
  ``administrator`` everything; ``monitoring`` reads everything; ``management`` and
  ``policymaker`` read and act in the vhosts they have permissions on; no tag, no admin API;
* an endpoint that acts on a named queue checks the user's configure/write/read patterns on it
  exactly as the AMQP session does (:meth:`Principal.authorize`, the table in
  :mod:`plugbroker.authz`), an administrator included; a connection or consumer of another
  user is closed, cancelled or released by an administrator only, and listed to monitoring
  and administrator only.

A refusal is RabbitMQ's ``401 {"error": "not_authorized", "reason": ...}``; a refused
permission check gives the AMQP reply text as the reason
(``ACCESS_REFUSED - read access to queue 'alice-q' in vhost '/' refused for user 'bob'``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plugbroker import authz
from plugbroker.admin import AdminError
from plugbroker.config.users import Permission
from plugbroker.core.api import BrokerAPI, UserInfo

__all__ = ["ENDPOINTS", "Principal"]

#: what each endpoint needs (documented in docs/admin.md, checked by the tag matrix test):
#: ``management``: any management tag, answers filtered to what the user may see (the vhosts
#: it has permissions on; of connections and consumers, its own) unless it is administrator
#: or monitoring; ``vhost``: any management tag and permissions on the vhost in the path
#: (administrator: any vhost), then the patterns on the named queue; ``connection``: the
#: user's own connection, any for an administrator; ``monitoring``: monitoring or
#: administrator; ``administrator``: administrator only
ENDPOINTS: dict[tuple[str, str], str] = {
    ("GET", "/api/overview"): "management",
    ("GET", "/api/queues"): "management",
    ("GET", "/api/consumers"): "management",
    ("GET", "/api/blocklist"): "management",
    ("GET", "/api/connections"): "management",
    ("GET", "/api/dead-letters"): "management",
    ("GET", "/api/queues/{vhost}/{queue}/messages"): "vhost",
    ("PUT", "/api/queues/{vhost}/{queue}"): "vhost",
    ("POST", "/api/queues/{vhost}/{queue}/redrive"): "vhost",
    ("POST", "/api/queues/{vhost}/{queue}/purge"): "vhost",
    ("POST", "/api/queues/{vhost}/{queue}/delete"): "vhost",
    ("POST", "/api/connections/{id}/close"): "connection",
    ("POST", "/api/consumers/{vhost}/{queue}/{tag}/cancel"): "vhost",
    ("POST", "/api/consumers/{vhost}/{queue}/{tag}/release"): "vhost",
    ("GET", "/api/whoami"): "management",
    ("GET", "/api/history"): "management",
    ("GET", "/api/policy-actions"): "management",
    ("GET", "/api/config"): "administrator",
    ("POST", "/api/reload"): "administrator",
    ("GET", "/metrics"): "monitoring",
}


def refused(reason: str) -> AdminError:
    return AdminError(401, "not_authorized", reason=reason)


@dataclass(frozen=True, slots=True)
class Principal:
    """The user behind a request: its tags, the vhosts it has permissions on, and a way to
    its compiled patterns (the configuration's, the ones AMQP connections check)."""

    name: str
    tags: frozenset[str]
    vhosts: frozenset[str]
    permission: Callable[[str], Permission | None] = lambda _vhost: None
    vhost_exists: Callable[[str], bool] = lambda _vhost: True

    @classmethod
    def of(cls, user: UserInfo, api: BrokerAPI | None = None) -> Principal:
        def permission(vhost: str) -> Permission | None:
            return api.user_permission(user.name, vhost) if api is not None else None

        def exists(vhost: str) -> bool:
            return api is None or vhost in api.vhosts()

        return cls(user.name, frozenset(user.tags), frozenset(user.permissions), permission, exists)

    @property
    def rules(self) -> authz.Tags:
        return authz.Tags(self.tags)

    @property
    def administrator(self) -> bool:
        return self.rules.administrator

    @property
    def sees_all(self) -> bool:
        """Reads every vhost and every user's connections (administrator, monitoring)."""
        return self.rules.monitoring

    @property
    def management(self) -> bool:
        return self.rules.management

    def visible(self) -> frozenset[str] | None:
        """The vhosts whose objects the user may read; None: all of them."""
        return None if self.sees_all else self.vhosts

    def sees(self, owner: str | None) -> bool:
        """Whether a listing shows a connection or consumer of ``owner`` to this user."""
        return self.rules.sees_owner(self.name, owner)

    def require(self, need: str, vhost: str | None = None) -> None:
        """Refuse (401, RabbitMQ's reasons) unless the user may use an endpoint needing
        ``need`` (a value of :data:`ENDPOINTS`)."""
        if not self.management:
            raise refused("Not management user")
        if need == "administrator" and not self.administrator:
            raise refused("Not administrator user")
        if need == "monitoring" and not self.sees_all:
            raise refused("Not monitor user")
        if need == "vhost" and not self.administrator and vhost not in self.vhosts:
            raise refused("User not authorised to access virtual host")

    def require_owner(self, owner: str | None, vhost: str | None) -> None:
        """Closing a connection, cancelling or releasing a consumer: an administrator acts on
        anyone's; a management user only on its own (RabbitMQ's rule), in a vhost it has
        permissions on."""
        self.require("management")
        if self.administrator:
            return
        if not self.rules.acts_on_owner(self.name, owner) or vhost not in self.vhosts:
            raise refused("Not administrator user")

    def may(self, vhost: str, needs: tuple[authz.Need, ...]) -> bool:
        """Whether the user's patterns on ``vhost`` grant each of ``needs``."""
        return authz.first_refused(self.permission(vhost), needs) is None

    def authorize(self, vhost: str, needs: tuple[authz.Need, ...]) -> None:
        """Refuse (401, the AMQP reply text as the reason) unless the user's patterns on
        ``vhost`` grant each of ``needs``: the check an AMQP channel makes for the same
        operation."""
        perm = self.permission(vhost)
        need = authz.first_refused(perm, needs)
        if need is None:
            return
        if perm is None and not self.vhost_exists(vhost):  # (an administrator's request)
            raise AdminError(404, f"no vhost '{vhost}'")
        if perm is None:
            raise refused(
                f"ACCESS_REFUSED - access to vhost '{vhost}' refused for user '{self.name}'"
            )
        raise refused("ACCESS_REFUSED - " + authz.refusal(need, vhost, self.name))

"""Pass 3 of loading a configuration: the core's own elements, and the plugins' by their parsers.

Loading happens in three passes, and each reports a problem the same way, as a
:class:`ConfigError` that names the file, the line and the element
(``config/bad.xml:12: <messageAge>: '10 minutes' is not a duration ...``):

1. XML syntax and 2. the XML Schema ``config/plugbroker.xsd`` (:mod:`plugbroker.config.schema`);
3. this module's walk, which checks what a schema cannot say well: ranges, cross-field rules,
   placement and "at most once" in the open containers, and *plugin elements*.

Plugin elements: ``<broker>``, ``<virtualhost>``, ``<queue>`` and ``<topic>`` accept elements
the schema does not require, because plugins configure themselves in the same file. Such an
element is parsed only by the parser a plugin registered for its name in a
:class:`ConfigElementRegistry` (the plugin host fills one from the ``broker_add_config_elements``
hook); the parser turns it into whatever object the plugin wants, and that object then resolves
per queue (:meth:`VhostConfig.resolve`). The built-in plugins' sections (``<consumer>``,
``<isolation>``, ``<deadLetter>``) come in the same way: this module parses none of them.

An element nobody registered is an error, so a typo never silently disables a policy, with one
exception that keeps a file valid when a plugin is switched off: an element the schema itself
declares (the built-in sections' shapes are kept there for their line-and-field errors) is
accepted as an :class:`UnparsedSection` when no loaded plugin parses it. It has no effect, and
its ``<policy name>`` is still checked against the registered policies by the plugin host.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import regex

from plugbroker.config.context import ParseContext, children, local_name, quote
from plugbroker.config.errors import ConfigError
from plugbroker.config.model import (
    DEFAULT_TOPIC_EXCHANGE,
    TENANT_LIMITS,
    XML_TRUE,
    BlastRadiusConfig,
    BrokerConfig,
    ExchangeDecl,
    Limits,
    QueueConfig,
    Sections,
    TlsConfig,
    TopicConfig,
    UnparsedSection,
    User,
    VhostConfig,
    default_users,
    frozen_map,
)
from plugbroker.config.registry import ConfigElementRegistry, ElementParser, RegistryLike
from plugbroker.config.schema import (
    BROKER_CHILDREN,
    BROKER_SINGLETONS,
    CORE_ELEMENTS,
    VHOST_CHILDREN,
    declared_elements,
    default_config_path,
    parse_xml,
    suggest,
    validate,
)
from plugbroker.config.units import format_duration
from plugbroker.config.users import (
    DEFAULT_HASHING_ALGORITHM,
    KNOWN_TAGS,
    Permission,
    check_pattern_cost,
    decode_password_hash,
)
from plugbroker.routing import STANDARD_EXCHANGES

__all__ = ["builtin_registry", "load_config", "load_default", "parse_config"]

log = logging.getLogger("plugbroker.config")

#: a host name: labels of letters, digits, '_' and '-' (not first or last), 1-63 each (the
#: underscore is not DNS's, but container names such as ``plug_admin`` have it)
_HOST_NAME = re.compile(
    r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*"
)


class _Loader:
    """Walks a schema-valid document and builds the model, checking what the schema cannot."""

    def __init__(self, source: str, registry: RegistryLike | None) -> None:
        self.ctx = ParseContext(source, registry)
        self.registry = registry
        #: sections the schema declares (their plugins may be switched off)
        self.schema_sections = declared_elements() - CORE_ELEMENTS

    # -- helpers ------------------------------------------------------------------------------

    def err(self, el: Any, msg: str) -> ConfigError:
        return self.ctx.error(el, msg)

    def _lookup(self, method: str, name: str) -> Any:
        if self.registry is None:
            return None
        fn = getattr(self.registry, method, None)
        return fn(name) if callable(fn) else None

    def _unknown(self, el: Any, where: str, here: Iterable[str]) -> ConfigError:
        name = local_name(el)
        container = where[1:].split()[0].rstrip(">")
        if name in BROKER_CHILDREN:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; it belongs directly under <broker>",
            )
        if name in VHOST_CHILDREN:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; it belongs directly under <virtualhost>",
            )
        if name in self.schema_sections or self._lookup("config_element", el.tag) is not None:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; put it under <virtualhost>, <queue> or "
                "<topic>",
            )
        if self._lookup("broker_element", el.tag) is not None:
            return self.err(
                el,
                f"<{name}> is not allowed under {where}; it belongs directly under <broker>",
            )
        known = list(here)
        for attr in ("section_names", "broker_names"):
            known.extend(getattr(self.registry, attr, ()) or ())
        return self.err(
            el,
            f"unknown element <{name}> under <{container}>: no plugin registered it"
            + suggest(name, known),
        )

    # -- broker -------------------------------------------------------------------------------

    def broker(self, root: Any, source: Path | None) -> BrokerConfig:
        if root.tag != "broker":
            raise self.err(root, "the root element must be <broker>")
        seen: dict[str, Any] = {}
        values: dict[str, Any] = {}
        vhost_els: list[Any] = []
        extensions: dict[str, object] = {}
        for el in children(root):
            name = local_name(el)
            if el.tag in BROKER_SINGLETONS:
                self.ctx.once(seen, el, "<broker>")
                getattr(self, f"_{name}")(el, values)
            elif el.tag == "virtualhost":
                vhost_els.append(el)
            else:
                parser = self._lookup("broker_element", el.tag)
                if parser is None:
                    raise self._unknown(el, "<broker>", BROKER_CHILDREN)
                self.ctx.once(seen, el, "<broker>")
                extensions[el.tag] = self._run_plugin_parser(parser, el)

        vhosts: dict[str, VhostConfig] = {}
        vhost_lines: dict[str, int] = {}
        for el in vhost_els:
            vh = self.vhost(el)
            if vh.name in vhosts:
                raise self.err(
                    el,
                    f"virtualhost {vh.name!r} is declared twice (first on line "
                    f"{vhost_lines[vh.name]})",
                )
            vhosts[vh.name] = vh
            vhost_lines[vh.name] = el.sourceline
        if not vhosts:
            vhosts["/"] = VhostConfig("/")

        # no <users> at all: RabbitMQ's guest/guest on "/" (listen defaults to loopback);
        # an empty <users/> means nobody may connect
        users: Mapping[str, User] = default_users()
        if "users" in seen:
            users = values.pop("_users_parsed")
            user_els = values.pop("_user_els")
            for user in users.values():
                for vh_name in user.vhosts:
                    if vh_name not in vhosts:
                        where = user_els[user.name]
                        for p in children(where):
                            if p.get("vhost") == vh_name:
                                where = p
                        raise self.err(
                            where,
                            f"user {user.name!r} names virtualhost {vh_name!r}, which is "
                            f"not declared (declared: {', '.join(vhosts)})",
                        )
        if "tls" in seen and "listen" not in seen:
            values["listen_plain"] = False  # amqps only
        return BrokerConfig(
            source=source,
            users=frozen_map(users),
            vhosts=frozen_map(vhosts),
            extensions=frozen_map(extensions),
            **values,
        )

    def _listen(self, el: Any, values: dict[str, Any]) -> None:
        host = (el.get("host") or "127.0.0.1").strip()
        if not host:
            raise self.err(el, "attribute host: must not be empty")
        values["listen_host"] = host
        values["listen_port"] = int(el.get("port", "5672"))

    def _store(self, el: Any, values: dict[str, Any]) -> None:
        values["store_path"] = Path(el.get("path"))
        values["store_sync"] = (el.get("sync") or "normal").strip().lower()
        values["store_accept_loss"] = (el.get("acceptLoss") or "false").strip() in XML_TRUE

    def _journal(self, el: Any, values: dict[str, Any]) -> None:
        values["journal_path"] = Path(el.get("path"))

    def _admin(self, el: Any, values: dict[str, Any]) -> None:
        host = (el.get("host") or "127.0.0.1").strip()
        if not host:
            raise self.err(el, "attribute host: must not be empty")
        port = int(el.get("port", "15672"))
        values["admin"] = (host, port)
        values["admin_allowed_hosts"] = self._host_names(el, "allowedHosts")
        for child in children(el):  # the schema allows one <tls> and nothing else
            values["admin_tls"] = self._tls_config(child, default_port=port)

    def _host_names(self, el: Any, attr: str) -> tuple[str, ...]:
        """A list of DNS host names (separated by spaces or commas), lower case, each once."""
        names: dict[str, None] = {}
        for raw in re.split(r"[\s,]+", el.get(attr) or ""):
            if not raw:
                continue
            name = raw.lower().rstrip(".")
            if "://" in name or "/" in name:
                raise self.err(
                    el,
                    f"attribute {attr}: {raw!r} is a URL; give the host name alone "
                    "(e.g. admin.example.com)",
                )
            try:
                ipaddress.ip_address(name.strip("[]"))
            except ValueError:
                pass
            else:
                raise self.err(
                    el,
                    f"attribute {attr}: {raw!r} is an address; addresses (and localhost) are "
                    "always allowed, list host names only",
                )
            if ":" in name:
                raise self.err(
                    el,
                    f"attribute {attr}: {raw!r} has a port; give the host name alone (any "
                    "port is allowed)",
                )
            if len(name) > 253 or not _HOST_NAME.fullmatch(name):
                raise self.err(
                    el,
                    f"attribute {attr}: {raw!r} is not a host name (labels of letters, digits, "
                    "'_' and '-' separated by '.', at most 253 characters)",
                )
            names[name] = None
        return tuple(names)

    def _tls(self, el: Any, values: dict[str, Any]) -> None:
        values["tls"] = self._tls_config(el, default_port=5671)

    def _tls_config(self, el: Any, *, default_port: int) -> TlsConfig:
        verify = (el.get("verify") or "none").strip()
        fail = (el.get("failIfNoPeerCert") or "false").strip() in XML_TRUE
        ca = el.get("ca")
        if verify == "peer" and not ca:
            raise self.err(
                el,
                'attribute ca: verify="peer" checks client certificates against a CA; name '
                "its certificate file",
            )
        if fail and verify != "peer":
            raise self.err(
                el,
                'attribute failIfNoPeerCert: "true" needs verify="peer" (with verify="none" '
                "no client certificate is asked for)",
            )
        host = el.get("host")
        if host is not None and not host.strip():
            raise self.err(el, "attribute host: must not be empty")
        return TlsConfig(
            port=int(el.get("port", str(default_port))),
            cert=Path(el.get("cert")),
            key=Path(el.get("key")),
            ca=Path(ca) if ca else None,
            verify=verify,
            fail_if_no_peer_cert=fail,
            host=host.strip() if host is not None else None,
        )

    def _users(self, el: Any, values: dict[str, Any]) -> None:
        users: dict[str, User] = {}
        els: dict[str, Any] = {}
        for u in children(el):
            name = u.get("name")
            if name in users:
                raise self.err(
                    u,
                    f"user {name!r} is declared twice (first on line {els[name].sourceline})",
                )
            users[name] = self._user(u, name)
            els[name] = u
        values["_users_parsed"] = users
        values["_user_els"] = els

    def _user(self, u: Any, name: str) -> User:
        """One ``<user>``: its password or hash, tags, loopback rule and permissions."""
        plain = u.get("password")
        hashed = u.get("passwordHash")
        algorithm = (u.get("hashingAlgorithm") or DEFAULT_HASHING_ALGORITHM).strip()
        if (plain is None) == (hashed is None):
            raise self.err(u, f"user {name!r} needs exactly one of password= and passwordHash=")
        password_hash: bytes | None = None
        if hashed is not None:
            try:
                password_hash = decode_password_hash(hashed, algorithm)
            except ValueError as exc:
                raise self.err(
                    u,
                    f"attribute passwordHash: user {name!r}: {exc}; expected RabbitMQ's format, "
                    "base64 of a 4-byte salt and the digest (plugbroker hash-password prints one)",
                ) from None
        tags = frozenset((u.get("tags") or "").replace(",", " ").split())
        unknown = sorted(tags - KNOWN_TAGS)
        if unknown:
            raise self.err(
                u,
                f"attribute tags: user {name!r}: unknown tag {unknown[0]!r}; known tags: "
                f"{', '.join(sorted(KNOWN_TAGS))}" + suggest(unknown[0], KNOWN_TAGS),
            )
        raw_loopback = u.get("loopbackOnly")
        # RabbitMQ's loopback_users default: guest may log in from loopback only
        loopback = name == "guest" if raw_loopback is None else raw_loopback.strip() in XML_TRUE

        permissions: dict[str, Permission] = {}
        lines: dict[str, int] = {}
        raw = u.get("vhosts")
        perm_els = [c for c in children(u) if local_name(c) == "permission"]
        if raw is not None or not perm_els:
            vhosts = ("/",) if raw is None else tuple(raw.split())
            if not vhosts and not perm_els:
                raise self.err(
                    u,
                    f"attribute vhosts: user {name!r} must be allowed at least one virtualhost",
                )
            for vh in vhosts:
                permissions[vh] = Permission()
                lines[vh] = u.sourceline
        for p in perm_els:
            vh = p.get("vhost")
            if vh in permissions:
                raise self.err(
                    p,
                    f"user {name!r} has two permissions for virtualhost {vh!r} (first on line "
                    f"{lines[vh]})",
                )
            patterns: dict[str, str] = {}
            for kind in ("configure", "write", "read"):
                pattern = p.get(kind)
                pattern = "" if pattern is None else pattern
                try:
                    why = check_pattern_cost(pattern)
                except regex.error as exc:
                    raise self.err(
                        p,
                        f"attribute {kind}: {pattern!r} is not a valid regular expression: {exc}",
                    ) from None
                if why is not None:
                    raise self.err(p, f"attribute {kind}: {pattern!r} is refused: {why}")
                patterns[kind] = pattern
            permissions[vh] = Permission(**patterns)
            lines[vh] = p.sourceline
        return User(
            name,
            plain,
            frozen_map(permissions),
            password_hash=password_hash,
            hashing_algorithm=algorithm,
            tags=tags,
            loopback_only=loopback,
        )

    def _housekeeping(self, el: Any, values: dict[str, Any]) -> None:
        values["housekeeping_threads"] = self.ctx.integer(el, "threads", 4, minimum=1, maximum=1024)
        values["housekeeping_period"] = self.ctx.duration(el, "period", 30.0)

    def _plugins(self, el: Any, values: dict[str, Any]) -> None:
        enabled: list[str] = []
        blocked: set[str] = set()
        lines: dict[str, int] = {}
        for p in children(el):
            name = (p.text or "").strip()
            if name in lines:
                raise self.err(p, f"plugin {name!r} is listed twice (first on line {lines[name]})")
            lines[name] = p.sourceline
            if (p.get("enabled") or "true").strip() in XML_TRUE:
                enabled.append(name)
            else:
                blocked.add(name)
        values["plugins"] = tuple(enabled)
        values["blocked_plugins"] = frozenset(blocked)

    def _limits(self, el: Any, values: dict[str, Any]) -> None:
        c = self.ctx
        heartbeat = c.duration(el, "heartbeat", 60.0, allow_zero=True, maximum=65535.0)
        if heartbeat is not None and heartbeat != int(heartbeat):
            raise self.err(
                el.find("heartbeat"),
                f"{format_duration(heartbeat)} is not whole seconds; AMQP negotiates heartbeats "
                "in seconds",
            )
        delay = c.duration(el, "loginFailureDelay", 0.5, allow_zero=True, maximum=3600.0)
        delay_max = c.duration(el, "loginFailureDelayMax", 10.0, allow_zero=True, maximum=3600.0)
        if delay_max < delay:
            raise self.err(
                el.find("loginFailureDelayMax"),
                f"loginFailureDelayMax {format_duration(delay_max)} is below loginFailureDelay "
                f"{format_duration(delay)}",
            )
        values["limits"] = Limits(
            heartbeat=float(heartbeat or 0.0),
            frame_max=c.size(el, "frameMax", 131072, minimum=4096, maximum=2**32 - 1),
            channel_max=c.integer(el, "channelMax", 2047, minimum=0, maximum=65535),
            handshake_timeout=c.duration(el, "handshakeTimeout", 10.0),
            max_message_size=c.size(el, "maxMessageSize", 128 * 1024 * 1024, minimum=1),
            max_connections=c.integer(el, "maxConnections", 0, minimum=0),
            **{
                field: c.integer(el, name, default, minimum=0)
                for field, name, default in TENANT_LIMITS
            },
            login_failure_delay=delay,
            login_failure_delay_max=delay_max,
            **self._watermark(el),
            disk_free_limit=c.size(el, "diskFreeLimit", 50 * 1024 * 1024),
            partial_body_budget=c.size(el, "partialBodyBudget", 256 * 1024 * 1024, minimum=1),
            body_stall_timeout=c.duration(el, "bodyStallTimeout", 30.0),
            hook_budget=c.duration(el, "hookBudget", 0.1, allow_zero=True),
        )

    def _watermark(self, el: Any) -> dict[str, Any]:
        """``<memoryHighWatermark>``: a fraction of physical memory (``0.4``: a number with a
        decimal point and no unit) or a size (``400MB``, or bytes)."""
        c = self.ctx
        text = c.text(el, "memoryHighWatermark")
        if text is None:
            return {}
        if "." in text and text[-1:].isdigit():
            try:
                fraction = float(text)
            except ValueError:
                fraction = -1.0
            if not 0.0 < fraction <= 1.0:
                raise self.err(
                    el.find("memoryHighWatermark"),
                    f"{text} is not a fraction of physical memory above 0 and at most 1 "
                    "(or give a size such as 400MB)",
                )
            return {"memory_high_watermark": fraction, "memory_high_watermark_bytes": None}
        size = c.size(el, "memoryHighWatermark", None, minimum=1)
        return {"memory_high_watermark": None, "memory_high_watermark_bytes": size}

    # -- virtual hosts ------------------------------------------------------------------------

    def vhost(self, el: Any) -> VhostConfig:
        name = el.get("name")
        where = f"<virtualhost name={quote(name)}>"
        exchanges: list[ExchangeDecl] = []
        exchange_els: dict[str, Any] = {}
        queues: dict[str, QueueConfig] = {}
        topics: list[TopicConfig] = []
        topic_els: list[Any] = []
        sections: dict[str, object] = {}
        seen: dict[str, Any] = {}
        blast: BlastRadiusConfig | None = None
        for child in children(el):
            tag = child.tag
            if tag == "blastRadius":
                self.ctx.once(seen, child, where)
                blast = self.blast_radius(child)
            elif tag == "exchange":
                ex = self.exchange(child)
                if ex.name in exchange_els:
                    raise self.err(
                        child,
                        f"exchange {ex.name!r} is declared twice in {where} (first on line "
                        f"{exchange_els[ex.name].sourceline})",
                    )
                exchanges.append(ex)
                exchange_els[ex.name] = child
            elif tag == "queue":
                qc = self.queue(child)
                if qc.name in queues:
                    raise self.err(
                        child,
                        f"queue {qc.name!r} is configured twice in {where} (first on line "
                        f"{queues[qc.name].line})",
                    )
                queues[qc.name] = qc
            elif tag == "topic":
                tc = self.topic(child)
                for other in topics:
                    if (other.key, other.exchange) == (tc.key, tc.exchange):
                        raise self.err(
                            child,
                            f"<topic key={tc.key!r} exchange={tc.exchange!r}> is configured twice "
                            f"(first on line {other.line}); merge them",
                        )
                topics.append(tc)
                topic_els.append(child)
            else:
                self._section_into(child, sections, seen, where, VHOST_CHILDREN)

        # a <topic> only ever matches topic exchanges: catch one aimed at a declared non-topic one
        types = dict(STANDARD_EXCHANGES)
        types.update((ex.name, ex.arguments.get("x-delayed-type", ex.type)) for ex in exchanges)
        for tc, tel in zip(topics, topic_els):
            ex_type = types.get(tc.exchange)
            if ex_type is not None and ex_type != "topic":
                raise self.err(
                    tel,
                    f"attribute exchange: {tc.exchange!r} is a {ex_type} exchange; "
                    "<topic> policies only match bindings to topic exchanges",
                )
        return VhostConfig(
            name=name,
            exchanges=tuple(exchanges),
            queues=frozen_map(queues),
            topics=tuple(topics),
            defaults=Sections(sections),
            topic_only=frozenset(getattr(self.registry, "topic_only_sections", ()) or ()),
            blast_radius=blast,
        )

    def blast_radius(self, el: Any) -> BlastRadiusConfig:
        """``<blastRadius maxActionsPerMinute maxConsumersAffected/>``: at least one, each >= 1."""
        values: list[int | None] = []
        for attr in ("maxActionsPerMinute", "maxConsumersAffected"):
            raw = el.get(attr)
            if raw is None:
                values.append(None)
                continue
            n = int(raw)
            if n < 1:
                raise self.err(el, f"attribute {attr}: must be at least 1, not {n}")
            values.append(n)
        if values == [None, None]:
            raise self.err(
                el, "sets no limit: give maxActionsPerMinute, maxConsumersAffected or both"
            )
        return BlastRadiusConfig(values[0], values[1])

    def exchange(self, el: Any) -> ExchangeDecl:
        name = el.get("name")
        if name.startswith("amq."):
            raise self.err(
                el,
                f"attribute name: {name!r}: exchange names starting with 'amq.' are reserved for "
                "the broker",
            )
        ex_type = el.get("type")
        delayed = el.get("delayedType")
        args: dict[str, str] = {}
        if ex_type == "x-delayed-message":
            if delayed is None:
                raise self.err(
                    el,
                    "attribute delayedType is required for an x-delayed-message exchange (direct, "
                    "fanout, topic or headers)",
                )
            args["x-delayed-type"] = delayed
        elif delayed is not None:
            raise self.err(
                el,
                f"attribute delayedType only applies to type x-delayed-message, not {ex_type}",
            )
        return ExchangeDecl(
            name=name,
            type=ex_type,
            durable=(el.get("durable") or "false") in XML_TRUE,
            auto_delete=(el.get("autoDelete") or "false") in XML_TRUE,
            arguments=frozen_map(args),
        )

    def queue(self, el: Any) -> QueueConfig:
        name = el.get("name")
        durable_attr = el.get("durable")
        subscription = el.get("subscription")
        where = f"<queue name={quote(name)}>"
        sections: dict[str, object] = {}
        seen: dict[str, Any] = {}
        for child in children(el):
            self._section_into(child, sections, seen, where, ())
        return QueueConfig(
            name=name,
            durable=None if durable_attr is None else durable_attr in XML_TRUE,
            subscription=subscription,
            sections=Sections(sections),
            line=el.sourceline,
        )

    def topic(self, el: Any) -> TopicConfig:
        key = el.get("key")
        exchange = el.get("exchange") or DEFAULT_TOPIC_EXCHANGE
        for word in key.split(".") if key else ():
            if ("*" in word or "#" in word) and word not in ("*", "#"):
                raise self.err(
                    el,
                    f"attribute key: {key!r}: '*' and '#' must be whole words between dots "
                    f"(the word {word!r} would only match itself literally)",
                )
        sections: dict[str, object] = {}
        seen: dict[str, Any] = {}
        for child in children(el):
            self._section_into(child, sections, seen, f"<topic key={quote(key)}>", ())
        return TopicConfig(
            key=key, exchange=exchange, sections=Sections(sections), line=el.sourceline
        )

    # -- sections -----------------------------------------------------------------------------

    def _section_into(
        self,
        el: Any,
        into: dict[str, object],
        seen: dict[str, Any],
        where: str,
        also: Iterable[str],
    ) -> None:
        tag = el.tag
        parser = self._lookup("config_element", tag)
        if parser is not None:
            self.ctx.once(seen, el, where)
            into[tag] = self._run_plugin_parser(parser, el)
        elif tag in self.schema_sections:
            self.ctx.once(seen, el, where)
            into[tag] = self._unparsed(el)
        else:
            raise self._unknown(el, where, (*also, *self.schema_sections))

    def _unparsed(self, el: Any) -> UnparsedSection:
        policy_el = el.find("policy")
        policy = self.ctx.policy(policy_el) if policy_el is not None else None
        name = local_name(el)
        log.warning(
            "%s:%s: <%s> has no effect: no loaded plugin parses it (is its plugin disabled?)",
            self.ctx.source,
            el.sourceline,
            name,
        )
        return UnparsedSection(name, el.sourceline, policy)

    def _run_plugin_parser(self, parser: ElementParser, el: Any) -> object:
        try:
            return parser(el, self.ctx)
        except ConfigError:
            raise
        except ValueError as exc:
            raise self.err(el, str(exc)) from None
        except Exception as exc:  # a plugin bug must still come out located
            raise self.err(el, f"the plugin parser for <{local_name(el)}> failed: {exc!r}") from exc


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def builtin_registry() -> ConfigElementRegistry:
    """The elements, policies and backoffs of the built-in plugins, as the plugin host collects
    them (what ``parse_config`` uses when it is given no registry)."""
    from plugbroker.pluginhost import builtin_config_registry

    return builtin_config_registry()


def parse_config(
    text: bytes | str,
    source_name: str = "<string>",
    *,
    registry: RegistryLike | None = None,
    source: Path | None = None,
) -> BrokerConfig:
    """Parse and validate configuration XML held in memory.

    :param source_name: how errors name the file (``file:line: ...``).
    :param registry: the elements, policies and backoffs plugins registered (what the plugin host
        collected through ``broker_add_config_elements``). ``None`` means those of the built-in
        plugins (:func:`builtin_registry`); an empty :class:`ConfigElementRegistry` means none.
    :param source: stored as :attr:`BrokerConfig.source`.
    :raises ConfigError: for malformed XML, a schema violation or a semantic error.
    """
    root = parse_xml(text, source_name)
    validate(root, source_name)
    return _Loader(source_name, registry if registry is not None else builtin_registry()).broker(
        root, source
    )


def load_config(path: str | Path, *, registry: RegistryLike | None = None) -> BrokerConfig:
    """Load, validate and parse the configuration file at ``path`` (``registry``: as for
    :func:`parse_config`).

    :raises ConfigError: located at ``path`` (and a line and element where there is one).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the configuration: {exc.strerror or exc}", file=str(p)
        ) from None
    return parse_config(data, str(p), registry=registry, source=p)


def load_default(*, registry: RegistryLike | None = None) -> BrokerConfig:
    """Load ``config/default.xml``."""
    return load_config(default_config_path(), registry=registry)

"""Exchanges: one class per type, each answering ``route(message) -> destinations``.

A destination is a :class:`~plugbroker.domain.queue.Queue` or another :class:`Exchange`
(exchange-to-exchange bindings); the virtual host follows exchange destinations and removes
duplicates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Union, cast

from plugbroker.routing import TopicTrie
from plugbroker.routing import match_words as _match_words

if TYPE_CHECKING:
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Queue

Destination = Union["Queue", "Exchange"]


class Binding:
    __slots__ = ("arguments", "destination", "routing_key", "source")

    def __init__(
        self,
        source: Exchange,
        destination: Destination,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        self.source = source
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments

    @property
    def key(self) -> tuple[int, str, tuple[tuple[str, Any], ...]]:
        return (id(self.destination), self.routing_key, _freeze(self.arguments))


def _freeze(args: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, repr(v)) for k, v in args.items()))


class Exchange:
    """Base class: bookkeeping of bindings; subclasses implement :meth:`route`."""

    type = ""
    __slots__ = (
        "__weakref__",
        "_by_key",
        "alternate",
        "arguments",
        "auto_delete",
        "bindings",
        "durable",
        "internal",
        "name",
    )

    def __init__(
        self,
        name: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict[tuple[int, str, tuple[tuple[str, Any], ...]], Binding] = {}
        ae = self.arguments.get("alternate-exchange")
        self.alternate: str | None = ae if isinstance(ae, str) and ae else None
        self._init_index()

    def _init_index(self) -> None:
        """Set up the type's routing index (called at the end of ``__init__``)."""

    def bind(self, b: Binding) -> bool:
        """Add a binding; False when an identical one exists (binding is idempotent)."""
        if b.key in self.bindings:
            return False
        self.bindings[b.key] = b
        self._added(b)
        return True

    def unbind(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> Binding | None:
        b = self.bindings.pop((id(destination), routing_key, _freeze(arguments)), None)
        if b is not None:
            self._removed(b)
        return b

    def unbind_destination(self, destination: Destination) -> list[Binding]:
        gone = [b for b in self.bindings.values() if b.destination is destination]
        for b in gone:
            del self.bindings[b.key]
            self._removed(b)
        return gone

    def _added(self, b: Binding) -> None:
        pass

    def _removed(self, b: Binding) -> None:
        pass

    def route(self, msg: Message) -> Iterable[Destination]:
        raise NotImplementedError

    def equivalent(
        self,
        type_: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> str | None:
        """None if a redeclare matches; otherwise the name of the first field that differs."""
        if type_ != self.type:
            return "type"
        if durable != self.durable:
            return "durable"
        if auto_delete != self.auto_delete:
            return "auto_delete"
        if internal != self.internal:
            return "internal"
        if _freeze(arguments) != _freeze(self.arguments):
            return "arguments"
        return None

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__} {self.name!r}>"


class DirectExchange(Exchange):
    type = "direct"
    __slots__ = ()

    def _init_index(self) -> None:
        self._by_key: dict[str, dict[Destination, int]] = {}

    def _added(self, b: Binding) -> None:
        _hold(self._by_key.setdefault(b.routing_key, {}), b.destination)

    def _removed(self, b: Binding) -> None:
        dests = self._by_key.get(b.routing_key)
        if dests is not None and not _release(dests, b.destination):
            del self._by_key[b.routing_key]

    def route(self, msg: Message) -> Iterable[Destination]:
        return self._by_key.get(msg.routing_key, ())


class FanoutExchange(Exchange):
    type = "fanout"
    __slots__ = ()

    def _init_index(self) -> None:
        self._by_key: dict[str, dict[Destination, int]] = {"": {}}

    def _added(self, b: Binding) -> None:
        _hold(self._by_key[""], b.destination)

    def _removed(self, b: Binding) -> None:
        _release(self._by_key[""], b.destination)

    def route(self, msg: Message) -> Iterable[Destination]:
        return self._by_key[""]


def _hold(dests: dict[Destination, int], d: Destination) -> None:
    """Count one more binding to ``d`` (a destination is routed to once, however many of its
    bindings match; the count says when the last one goes)."""
    dests[d] = dests.get(d, 0) + 1


def _release(dests: dict[Destination, int], d: Destination) -> bool:
    """Count one binding to ``d`` less; False when ``dests`` is left empty."""
    n = dests.get(d, 0)
    if n > 1:
        dests[d] = n - 1
    else:
        dests.pop(d, None)
    return bool(dests)


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: words split on '.', ``*`` is one word, ``#`` zero or more."""
    return _match_words(pattern.split("."), 0, routing_key.split("."), 0)


class TopicExchange(Exchange):
    """Topic routing through a :class:`~plugbroker.routing.TopicTrie` of the binding keys (time
    bounded by the routing key, not the number of bindings), with a per-routing-key result cache
    cleared when bindings change."""

    type = "topic"
    __slots__ = ("_trie",)
    CACHE_MAX = 4096

    def _init_index(self) -> None:
        self._by_key: dict[str, tuple[Destination, ...]] = {}
        self._trie = TopicTrie()

    def _added(self, b: Binding) -> None:
        self._trie.add(b.routing_key, b.destination)
        if self._by_key:
            self._by_key = {}

    def _removed(self, b: Binding) -> None:
        self._trie.remove(b.routing_key, b.destination)
        if self._by_key:
            self._by_key = {}

    @property
    def last_steps(self) -> int:
        """Trie nodes visited by the last uncached route (tests and benchmarks)."""
        return self._trie.steps

    def route(self, msg: Message) -> Iterable[Destination]:
        key = msg.routing_key
        hit = self._by_key.get(key)
        if hit is not None:
            return hit
        result = tuple(cast("list[Destination]", self._trie.match(key)))
        if len(self._by_key) >= self.CACHE_MAX:
            self._by_key = {}
        self._by_key[key] = result
        return result


#: the anchor of a headers binding that names a field without a value (any value matches)
_ANY = object()


class HeadersExchange(Exchange):
    """Routes on message headers; binding argument ``x-match`` is all (default), any,
    all-with-x or any-with-x, as in RabbitMQ.

    Bindings are indexed by the fields they test, so a message is checked only against the
    bindings that share a field (and, where the binding gives one, its value) with its headers:
    an ``all`` binding under one of its fields, an ``any`` binding under each. An ``all``
    binding that tests no field matches every message and is kept apart."""

    type = "headers"
    __slots__ = ("_always", "_anchored")

    def _init_index(self) -> None:
        #: (field, value or _ANY) -> bindings anchored there (by id)
        self._anchored: dict[tuple[str, object], dict[int, Binding]] = {}
        #: ``all`` bindings that test no field
        self._always: dict[int, Binding] = {}

    def _added(self, b: Binding) -> None:
        anchors = _anchors(b.arguments)
        if anchors is None:
            self._always[id(b)] = b
        for a in anchors or ():
            self._anchored.setdefault(a, {})[id(b)] = b

    def _removed(self, b: Binding) -> None:
        self._always.pop(id(b), None)
        for a in _anchors(b.arguments) or ():
            held = self._anchored.get(a)
            if held is not None:
                held.pop(id(b), None)
                if not held:
                    del self._anchored[a]

    def route(self, msg: Message) -> Iterable[Destination]:
        headers = msg.headers
        out: list[Destination] = [b.destination for b in self._always.values()]
        if not self._anchored:
            return list(dict.fromkeys(out))
        seen: set[int] = set()
        anchored = self._anchored
        for k, v in headers.items():
            for a in ((k, _ANY), (k, _hashable(v))):
                held = anchored.get(a)
                if held is None:
                    continue
                for bid, b in held.items():
                    if bid not in seen:
                        seen.add(bid)
                        if headers_match(b.arguments, headers):
                            out.append(b.destination)
        return list(dict.fromkeys(out))


def _hashable(v: Any) -> object:
    """``v`` as an index key: itself when hashable, else a marker no anchor uses."""
    try:
        hash(v)
    except TypeError:
        return _ANY_UNHASHABLE
    return cast(object, v)


_ANY_UNHASHABLE = object()


def _anchors(args: dict[str, Any]) -> list[tuple[str, object]] | None:
    """Where a headers binding is indexed: ``[]`` never matches, None always matches.

    A field the binding tests with a value is anchored under (field, value) when the value is
    hashable, else under (field, _ANY); a field tested for presence under (field, _ANY). An
    ``all`` binding needs one of its fields (any will do: a message lacking it cannot match);
    an ``any`` binding needs every one."""
    mode = args.get("x-match", "all")
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode in ("all", "all-with-x")
    anchors: list[tuple[str, object]] = []
    for k, v in args.items():
        if k == "x-match" or (k.startswith("x-") and not with_x):
            continue
        if v is None or v == "":
            anchors.append((k, _ANY))
        else:
            h = _hashable(v)
            anchors.append((k, _ANY if h is _ANY_UNHASHABLE else h))
        if want_all:
            return anchors
    if not anchors:
        return None if want_all else []
    return anchors


def headers_match(binding_args: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = binding_args.get("x-match", "all")
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode in ("all", "all-with-x")
    for k, v in binding_args.items():
        if k.startswith("x-") and not with_x:
            continue
        if k == "x-match":
            continue
        present = k in headers
        ok = present and (v is None or v == "" or headers[k] == v)
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    # no key to check: 'all' matches (vacuously), 'any' does not
    return want_all


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}

DELAYED_TYPE = "x-delayed-message"

#: the reserved exchange through which a consumer asks the broker to retry one of its
#: deliveries (``plugbroker.retry.reconsume_later``); every virtual host has it
RETRY_EXCHANGE = "amq.retry"
RETRY_TYPE = "x-retry"


class RetryExchange(Exchange):
    """``amq.retry``: routes nothing by itself. A publish to it names an unacked delivery of
    the same connection (headers ``x-reconsume-channel`` and ``x-reconsume-tag``); the session
    hands it to :func:`plugbroker.domain.fate.reconsume`, which copies that delivery into its
    queue's retry queue (or the dead-letter queue) on the broker's side."""

    type = RETRY_TYPE
    __slots__ = ()

    def route(self, msg: Message) -> Iterable[Destination]:
        return ()


#: the reserved exchange through which a consumer says it still works on one of its deliveries
#: (``plugbroker.contrib.touch.touch``); every virtual host has it
TOUCH_EXCHANGE = "amq.touch"
TOUCH_TYPE = "x-touch"
#: the header of a publish to ``amq.touch`` naming the delivery tag (on the same channel)
TOUCH_TAG_HEADER = "x-touch-tag"
#: the header on every delivery from a queue under isolation: its ``ackTimeout`` in ms
ACK_TIMEOUT_HEADER = "x-ack-timeout"


class TouchExchange(Exchange):
    """``amq.touch``: routes nothing. A publish to it names an unacked delivery of the same
    channel (header ``x-touch-tag``); the session restarts that consumer's ack clock
    (:func:`plugbroker.domain.fate.touch`)."""

    type = TOUCH_TYPE
    __slots__ = ()

    def route(self, msg: Message) -> Iterable[Destination]:
        return ()


class DelayedExchange(Exchange):
    """``x-delayed-message``: holds a message for its ``x-delay`` header (ms), then routes it
    like its ``x-delayed-type``. The holding is done by the virtual host's timer heap."""

    type = DELAYED_TYPE
    __slots__ = ("inner",)

    def _init_index(self) -> None:
        inner_type = self.arguments.get("x-delayed-type")
        cls = EXCHANGE_TYPES[inner_type] if isinstance(inner_type, str) else DirectExchange
        self.inner: Exchange = cls(self.name)

    def _added(self, b: Binding) -> None:
        self.inner.bindings[b.key] = b
        self.inner._added(b)

    def _removed(self, b: Binding) -> None:
        self.inner.bindings.pop(b.key, None)
        self.inner._removed(b)

    def route(self, msg: Message) -> Iterable[Destination]:
        return self.inner.route(msg)

    @staticmethod
    def delay_of(msg: Message) -> float:
        """Seconds to hold the message; 0 when it has no (or a non-positive) x-delay."""
        d = msg.headers.get("x-delay") if msg._hoff >= 0 else None
        if isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0:
            return d / 1000.0
        return 0.0

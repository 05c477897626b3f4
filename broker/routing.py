"""Routing facts the domain and the configuration share: the standard exchanges every virtual
host has, and topic-pattern matching.

Plain definitions with no import from the broker (like :mod:`plugbroker.subscription`), so the
configuration, and the policy plugins that import it, can use them without loading the domain.
The topic exchange routes through a :class:`TopicTrie` of its binding keys; a ``<topic key>``
policy in the configuration matches binding keys with :func:`topic_words_match`. Both follow the
same rules, and the tests hold them to the textbook recursive definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = [
    "STANDARD_EXCHANGES",
    "TopicTrie",
    "match_words",
    "normalize_pattern",
    "topic_words_match",
]

#: the exchanges every virtual host has, with their types (AMQP 0-9-1 section 3.1.3)
STANDARD_EXCHANGES: Final[tuple[tuple[str, str], ...]] = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


def topic_words_match(pattern: Sequence[str], key: Sequence[str]) -> bool:
    """AMQP topic matching on words already split: ``*`` is one word, ``#`` zero or more.

    The caller splits: the router splits a routing key on ``.`` (an empty key is one empty word),
    the configuration treats an empty binding key as no words at all.
    """
    return match_words(pattern, 0, key, 0)


def match_words(p: Sequence[str], i: int, k: Sequence[str], j: int) -> bool:
    """Whether pattern words ``p[i:]`` match key words ``k[j:]`` (the router's inner loop).

    Words before the first ``#`` are matched one for one; from there on the key positions the
    pattern can have reached are tracked as a set (an NFA run), so the cost is at most
    O(len(p) * len(k)) whatever the number of ``#`` words: a binding key such as
    ``#.#.#.#.a`` against a long routing key cannot stall the loop.
    """
    n = len(k)
    while i < len(p):
        w = p[i]
        if w == "#":
            if i == len(p) - 1:
                return True
            return _match_from_hash(p, i, k, j)
        if j >= n:
            return False
        if w != "*" and w != k[j]:
            return False
        i += 1
        j += 1
    return j == n


def _match_from_hash(p: Sequence[str], i: int, k: Sequence[str], j: int) -> bool:
    """:func:`match_words` from ``p[i] == "#"`` on: the set of reachable key positions."""
    n = len(k)
    reach: set[int] = {j}
    for w in p[i:]:
        if w == "#":
            # zero or more words: every position from the lowest reachable one to the end
            reach = set(range(min(reach), n + 1))
        elif w == "*":
            reach = {x + 1 for x in reach if x < n}
        else:
            reach = {x + 1 for x in reach if x < n and k[x] == w}
        if not reach:
            return False
    return n in reach


def normalize_pattern(words: Sequence[str]) -> list[str]:
    """The same pattern with each run of wildcards rewritten as its ``*`` words then at most one
    ``#``: ``#.#`` is ``#``, ``#.*.#`` is ``*.#``. Both forms match exactly the same keys (a run
    of wildcards with k ``*`` matches k or more words when it has a ``#``, exactly k otherwise),
    so a trie of normalized patterns never holds a ``#`` followed by another wildcard."""
    out: list[str] = []
    stars = 0
    hashed = False
    for w in words:
        if w == "*":
            stars += 1
        elif w == "#":
            hashed = True
        else:
            if stars or hashed:
                out.extend(["*"] * stars)
                if hashed:
                    out.append("#")
                stars = 0
                hashed = False
            out.append(w)
    out.extend(["*"] * stars)
    if hashed:
        out.append("#")
    return out


class _Node:
    """One word position of the trie. ``values`` counts, per destination, the patterns that end
    here (two binding keys may normalize to the same path)."""

    __slots__ = ("children", "hash", "star", "values")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.values: dict[object, int] = {}

    def empty(self) -> bool:
        return not self.values and not self.children and self.star is None and self.hash is None


class TopicTrie:
    """Topic binding keys as a trie of words, ``*`` and ``#`` as edges of their own (RabbitMQ's
    topic trie).

    Adding or removing a pattern costs O(its words). :meth:`match` walks the trie along the
    routing key: a literal or ``*`` edge moves one word on, a ``#`` edge stays at the word and
    its node may then swallow any number of words. Patterns are normalized on the way in
    (:func:`normalize_pattern`), so a ``#`` node has only literal children, and each ``#`` node
    is visited at most once per key position (it remembers the lowest position it was entered
    at: every later one is already taken). Every other node has one parent, so it is visited at
    most once per position as well. The walk's cost is at most (nodes on paths the key can
    follow) x (key words + 1), whatever the number of bindings: 2,000 bindings
    ``#.#.(... 120 times).xNNNNN`` are one ``#`` node with 2,000 children, and a 120-word key
    costs about 240 steps. :attr:`steps` holds the count of the last walk (tests, benchmarks).
    """

    __slots__ = ("patterns", "root", "steps")

    def __init__(self) -> None:
        self.root = _Node()
        #: patterns held (a pattern added twice for one destination counts twice)
        self.patterns = 0
        #: nodes visited by the last :meth:`match`
        self.steps = 0

    def add(self, pattern: str, value: object) -> None:
        """Hold ``pattern`` (a binding key, words split on ``.``) for ``value``."""
        node = self.root
        for w in normalize_pattern(pattern.split(".")):
            node = _child(node, w)
        node.values[value] = node.values.get(value, 0) + 1
        self.patterns += 1

    def remove(self, pattern: str, value: object) -> bool:
        """Drop one hold of ``pattern`` for ``value`` (False when it was not held); nodes left
        empty are pruned."""
        path: list[tuple[_Node, str]] = []
        node: _Node | None = self.root
        for w in normalize_pattern(pattern.split(".")):
            assert node is not None
            path.append((node, w))
            node = node.hash if w == "#" else node.star if w == "*" else node.children.get(w)
            if node is None:
                return False
        assert node is not None
        n = node.values.get(value, 0)
        if n == 0:
            return False
        if n > 1:
            node.values[value] = n - 1
        else:
            del node.values[value]
        self.patterns -= 1
        for parent, w in reversed(path):
            if not node.empty():
                break
            if w == "#":
                parent.hash = None
            elif w == "*":
                parent.star = None
            else:
                del parent.children[w]
            node = parent
        return True

    def match(self, key: str) -> list[object]:
        """The values of every pattern that matches routing key ``key``, each once, in no
        particular order."""
        words = key.split(".")
        n = len(words)
        found: dict[object, None] = {}
        # lowest key position each # node was entered at, by id: it covers every later one
        entered: dict[int, int] = {}
        stack: list[tuple[_Node, int]] = [(self.root, 0)]
        steps = 0
        while stack:
            node, p = stack.pop()
            steps += 1
            if p == n:
                if node.values:
                    for v in node.values:
                        found[v] = None
            else:
                child = node.children.get(words[p])
                if child is not None:
                    stack.append((child, p + 1))
                if node.star is not None:
                    stack.append((node.star, p + 1))
            h = node.hash
            if h is not None:
                # "#" takes words p.. q-1 for every q from p to n: positions from the one it
                # was entered at before are already on their way
                top = entered.get(id(h), n + 1)
                if p < top:
                    entered[id(h)] = p
                    for q in range(p, top):
                        stack.append((h, q))
        self.steps = steps
        return list(found)


def _child(node: _Node, w: str) -> _Node:
    """``node``'s edge for word ``w``, made when missing."""
    if w == "#":
        if node.hash is None:
            node.hash = _Node()
        return node.hash
    if w == "*":
        if node.star is None:
            node.star = _Node()
        return node.star
    nxt = node.children.get(w)
    if nxt is None:
        nxt = node.children[w] = _Node()
    return nxt

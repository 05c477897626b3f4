"""Routing facts the domain and the configuration share: the standard exchanges every virtual
host has, and topic-pattern matching.

Plain definitions with no import from the broker (like :mod:`plugbroker.subscription`), so the
configuration, and the policy plugins that import it, can use them without loading the domain.
The topic exchange routes with :func:`match_words`; a ``<topic key>`` policy in the
configuration matches binding keys with :func:`topic_words_match`, the same algorithm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["STANDARD_EXCHANGES", "match_words", "topic_words_match"]

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

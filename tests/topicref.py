"""The textbook recursive definition of AMQP topic matching, the reference the router's
matchers are tested against (exponential with several ``#``: small inputs only)."""

from __future__ import annotations


def reference_match(p: list[str], k: list[str]) -> bool:
    """Whether pattern words ``p`` match key words ``k``: ``*`` one word, ``#`` zero or more."""
    if not p:
        return not k
    if p[0] == "#":
        return any(reference_match(p[1:], k[j:]) for j in range(len(k) + 1))
    if not k:
        return False
    return (p[0] == "*" or p[0] == k[0]) and reference_match(p[1:], k[1:])

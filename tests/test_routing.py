"""Topic matching (plugbroker.routing): same answers as the plain recursive definition, and no
blow-up on binding keys with many ``#`` words."""

from __future__ import annotations

import random

from topicref import reference_match

from plugbroker.routing import match_words, topic_words_match

_reference = reference_match


def test_topic_matching_agrees_with_the_definition() -> None:
    rnd = random.Random(12)
    words = ["a", "b", "*", "#"]
    for _ in range(4000):
        p = [rnd.choice(words) for _ in range(rnd.randint(0, 6))]
        k = [rnd.choice("ab") for _ in range(rnd.randint(0, 7))]
        assert topic_words_match(p, k) is _reference(p, k), (p, k)
        assert match_words(p, 0, k, 0) is _reference(p, k), (p, k)


def test_hostile_binding_key_is_linear() -> None:
    # 40 "#" words and a last word that never matches: the recursive version never finishes
    pattern = ["#"] * 40 + ["nomatch"]
    key = ["w"] * 200
    for _ in range(10):
        assert not match_words(pattern, 0, key, 0)
    assert match_words(["#"] * 40 + ["w"], 0, key, 0)
    assert match_words(["#", "*", "#", "w", "#"], 0, key, 0)

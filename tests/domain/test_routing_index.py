"""The routing indexes: the topic trie against the textbook definition of topic matching, the
headers index against a check of every binding, and the cost of a hostile set of bindings."""

from __future__ import annotations

import random

import pytest
from topicref import reference_match

from plugbroker.clock import ManualClock
from plugbroker.codec import properties as P
from plugbroker.domain.exchange import TopicExchange, headers_match
from plugbroker.domain.message import Message
from plugbroker.domain.timers import Timers
from plugbroker.domain.vhost import VirtualHost
from plugbroker.routing import TopicTrie, normalize_pattern

_reference = reference_match


def _expected(patterns: dict[str, set[int]], key: str) -> set[int]:
    return {
        v
        for pat, vals in patterns.items()
        if _reference(pat.split("."), key.split("."))
        for v in vals
    }


@pytest.mark.parametrize(
    "pattern,key,ok",
    [
        ("#", "", True),  # "" is one empty word, and # takes it
        ("#", "a.b", True),
        ("a.#", "a", True),  # # matches zero words
        ("#.a", "a", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("#.#", "", True),
        ("#.#", "a.b.c", True),
        ("#.*", "", True),  # one empty word is a word
        ("*.#", "a", True),
        ("#.*.#", "a.b", True),
        ("*.*", "a", False),
        ("", "", True),
        ("", "a", False),
        ("a..b", "a..b", True),  # empty words are words
        ("a.*.b", "a..b", True),
        ("a.#.b", "a..b", True),
        (".", "..", False),
        ("#.", "a.b.", True),
    ],
)
def test_trie_edge_cases(pattern: str, key: str, ok: bool) -> None:
    assert _reference(pattern.split("."), key.split(".")) is ok  # the table itself
    trie = TopicTrie()
    trie.add(pattern, "q")
    assert (trie.match(key) == ["q"]) is ok


def test_normalization_keeps_the_meaning() -> None:
    assert normalize_pattern("#.#.#.a".split(".")) == ["#", "a"]
    assert normalize_pattern("#.*.#.*".split(".")) == ["*", "*", "#"]
    assert normalize_pattern("a.#.*.b.*".split(".")) == ["a", "*", "#", "b", "*"]
    rnd = random.Random(7)
    for _ in range(3000):
        p = [rnd.choice(["a", "b", "*", "#", ""]) for _ in range(rnd.randint(0, 6))]
        k = [rnd.choice(["a", "b", ""]) for _ in range(rnd.randint(0, 6))]
        assert _reference(normalize_pattern(p), k) is _reference(p, k), (p, k)


def test_trie_agrees_with_the_definition_over_random_bindings() -> None:
    rnd = random.Random(31)
    words = ["a", "b", "", "*", "#"]
    for _round in range(150):
        trie = TopicTrie()
        held: dict[str, set[int]] = {}
        counts: dict[tuple[str, int], int] = {}
        for _ in range(rnd.randint(1, 25)):
            pat = ".".join(rnd.choice(words) for _ in range(rnd.randint(1, 6)))
            v = rnd.randrange(6)
            trie.add(pat, v)
            held.setdefault(pat, set()).add(v)
            counts[(pat, v)] = counts.get((pat, v), 0) + 1
        # take some away again (one hold at a time; a pattern held twice stays once)
        for pat, v in rnd.sample(sorted(counts), k=len(counts) // 3):
            assert trie.remove(pat, v)
            counts[(pat, v)] -= 1
            if not counts[(pat, v)]:
                del counts[(pat, v)]
                held[pat].discard(v)
        assert not trie.remove("never.held", 0)
        assert trie.patterns == sum(counts.values())
        for _ in range(40):
            key = ".".join(rnd.choice(["a", "b", ""]) for _ in range(rnd.randint(1, 7)))
            got = trie.match(key)
            assert len(got) == len(set(got)), (key, got)
            assert set(got) == _expected(held, key), (key, sorted(held))


def test_removing_everything_leaves_an_empty_trie() -> None:
    trie = TopicTrie()
    pats = ["a.#.b", "#", "*.*", "a.*.#", "#.#.c", "a"]
    for p in pats:
        trie.add(p, 1)
    for p in pats:
        assert trie.remove(p, 1)
    assert trie.root.empty()
    assert trie.match("a.b") == []


def test_pathological_bindings_cost_steps_bounded_by_the_key() -> None:
    """2,000 bindings ``#.#.(120 times).xNNNNN`` and 120-word keys: the walk visits a number of
    nodes that depends on the key, not on the number of bindings."""
    key = ".".join(f"w{i}" for i in range(119)) + ".x00007"
    steps = []
    for n in (20, 2000):
        trie = TopicTrie()
        for i in range(n):
            trie.add(".".join(["#"] * 120 + [f"x{i:05d}"]), i)
        assert trie.match(key) == [7]
        steps.append(trie.steps)
        assert trie.match(key.replace("x00007", "nothing")) == []
    assert steps[0] == steps[1]
    assert steps[1] <= 3 * (120 + 1)


def test_interleaved_hashes_stay_bounded() -> None:
    # "#.a.#.a.#.a..." cannot be normalized away: each # node is still entered once per position
    trie = TopicTrie()
    for i in range(200):
        trie.add(".".join(["#", "a"] * 30 + [f"x{i}"]), i)
    key = ".".join(["a"] * 127 + ["x5"])
    assert trie.match(key) == [5]
    nodes = 2 * 30 + 1  # the # and a nodes of the shared path, then one leaf
    assert trie.steps <= (nodes + 1) * (128 + 1)


def _msg(vh: VirtualHost, rk: str, headers: dict | None = None) -> Message:
    raw = P.encode({"application_headers": headers} if headers else {})
    return Message.from_publish(vh.ids.next(), "", rk, raw, b"", 0, 0.0, 0.0)


def _vhost() -> VirtualHost:
    clock = ManualClock()
    return VirtualHost("/", clock=clock, timers=Timers(clock))


def test_topic_exchange_routes_through_the_trie() -> None:
    vh = _vhost()
    t = vh.declare_exchange("t", "topic")
    assert isinstance(t, TopicExchange)
    q1, _ = vh.declare_queue("q1")
    q2, _ = vh.declare_queue("q2")
    vh.bind(t, q1, "a.#", {})
    vh.bind(t, q1, "#.b", {})  # two matching bindings: one copy
    vh.bind(t, q2, "a.*", {})
    assert sorted(q.name for q in vh.route(t, _msg(vh, "a.b"))) == ["q1", "q2"]
    vh.unbind(t, q1, "a.#", {})
    assert sorted(q.name for q in vh.route(t, _msg(vh, "a.b"))) == ["q1", "q2"]
    vh.unbind(t, q1, "#.b", {})
    assert [q.name for q in vh.route(t, _msg(vh, "a.b"))] == ["q2"]
    # a delayed exchange of topic type routes through the same index
    d = vh.declare_exchange("d", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    vh.bind(d, q1, "#.z", {})
    assert vh.route(d, _msg(vh, "y.z")) == [q1]


def test_headers_index_agrees_with_checking_every_binding() -> None:
    rnd = random.Random(5)
    modes = ["all", "any", "all-with-x", "any-with-x", None]
    fields = ["a", "b", "c", "x-k"]
    values: list = [1, 2, "s", None, "", [1], True]
    for _round in range(60):
        vh = _vhost()
        h = vh.exchanges["amq.headers"]
        args_of: dict[str, dict] = {}
        for i in range(rnd.randint(1, 12)):
            args: dict = {}
            mode = rnd.choice(modes)
            if mode is not None:
                args["x-match"] = mode
            for f in rnd.sample(fields, rnd.randint(0, 3)):
                args[f] = rnd.choice(values)
            q, _ = vh.declare_queue(f"q{i}")
            vh.bind(h, q, "", args)
            args_of[q.name] = args
        for _ in range(30):
            headers = {
                f: rnd.choice(values[:3] + [[1]]) for f in rnd.sample(fields, rnd.randint(0, 4))
            }
            got = sorted(q.name for q in vh.route(h, _msg(vh, "", headers)))
            want = sorted(n for n, a in args_of.items() if headers_match(a, headers))
            assert got == want, (headers, args_of)
        for name in rnd.sample(sorted(args_of), k=len(args_of) // 2):
            vh.unbind(h, vh.queues[name], "", args_of.pop(name))
        got = sorted(q.name for q in vh.route(h, _msg(vh, "", {"a": 1, "b": 2})))
        assert got == sorted(n for n, a in args_of.items() if headers_match(a, {"a": 1, "b": 2}))

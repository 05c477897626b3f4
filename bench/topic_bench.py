"""Topic matching cost: ordinary binding keys and a hostile one with many ``#`` words.

    python3 bench/topic_bench.py

Prints microseconds per match. The hostile case (``#`` x N then a word that never matches,
against a 64-word routing key) grew exponentially with N before the matcher tracked reachable
key positions; now it grows with N * key length.
"""

from __future__ import annotations

import time

from plugbroker.routing import match_words


def _per_match(pattern: list[str], key: list[str], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        match_words(pattern, 0, key, 0)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    key = "orders.eu.de.berlin.created".split(".")
    for pat in ("orders.eu.de.berlin.created", "orders.*.de.#", "#.created", "orders.#.x"):
        us = _per_match(pat.split("."), key, 200_000)
        print(f"{pat:32} {us:8.3f} us/match")
    long_key = ["w"] * 64
    for hashes in (2, 4, 8, 16, 32):
        pat = ["#"] * hashes + ["nomatch"]
        us = _per_match(pat, long_key, 200)
        print(f"{'#.' * hashes + 'nomatch':32} {us:8.1f} us/match (64-word key)")


if __name__ == "__main__":
    main()

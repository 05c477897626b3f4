"""What a queue's bindings contribute to its policy, kept up to date binding by binding.

A ``<topic key>`` section reaches a queue when one of its bindings matches it, and the
topic-only sections need the queue to be a topic subscription (a binding to a topic exchange,
and not a dead-letter target). Recomputing that from every binding of the queue on each bind
makes declaring n bindings cost O(n²); the index counts instead, per ``<topic>`` of the vhost's
configuration, how many of the queue's bindings it matches, and how many bindings are to topic
exchanges. A bind or unbind updates the counts in O(topics) and says whether the answer
changed (a count went from or to zero); only then is the policy resolved again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from plugbroker.config.model import TopicConfig, VhostConfig
    from plugbroker.domain.queue import Queue

__all__ = ["BindingPolicyIndex"]


class BindingPolicyIndex:
    """The binding counts of one queue under one vhost configuration."""

    __slots__ = ("config", "dead_letter_target", "hits", "queue", "topic_bindings")

    def __init__(
        self,
        queue: Queue,
        config: VhostConfig,
        bindings: Iterable[tuple[str, str, str]],
        dead_letter_target: bool,
    ) -> None:
        self.queue = queue
        self.config = config
        #: per ``<topic>`` (document order), how many of the queue's bindings it matches
        self.hits = [0] * len(config.topics)
        #: bindings to topic exchanges (effective type)
        self.topic_bindings = 0
        #: the dead-letter-target answer the policy was resolved with
        self.dead_letter_target = dead_letter_target
        for exchange, etype, key in bindings:
            self.count(exchange, etype, key, 1)

    def holds(self, queue: Queue, config: VhostConfig | None) -> bool:
        """Whether this index is the one of ``queue`` under ``config`` (not a stale one)."""
        return self.queue is queue and self.config is config

    def count(self, exchange: str, etype: str, key: str, delta: int) -> bool:
        """Count one binding in (``delta`` 1) or out (-1); True when the set of matching
        topics or whether the queue has a topic binding changed."""
        if etype != "topic":
            return False
        before = self.topic_bindings
        self.topic_bindings += delta
        changed = (before == 0) != (self.topic_bindings == 0)
        hits = self.hits
        for i, topic in enumerate(self.config.topics):
            if topic.matches(exchange, etype, key):
                was = hits[i]
                hits[i] = was + delta
                changed = changed or (was == 0) != (hits[i] == 0)
        return changed

    def matching(self) -> list[TopicConfig]:
        """The ``<topic>`` elements some binding matches, in document order."""
        return [t for t, n in zip(self.config.topics, self.hits, strict=True) if n > 0]

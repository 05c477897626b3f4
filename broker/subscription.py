"""Subscription types (the TDMQ for Pulsar modes): how a queue hands its messages to consumers.

Plain names, shared by the domain, the configuration and the policies, so a policy can test
``queue.subscription_type == SHARED`` on a :class:`plugbroker.policy.QueueView` without importing
the broker's internals (and so run unchanged over a snapshot from another source).
"""

from __future__ import annotations

from typing import Final

#: round-robin among the consumers (the default)
SHARED: Final = "shared"
#: one consumer only; a second one is refused with 403
EXCLUSIVE: Final = "exclusive"
#: one active consumer, the next takes over on cancel or disconnect
FAILOVER: Final = "failover"
#: messages with the same key always go to the same consumer while the consumer set is unchanged
KEY_SHARED: Final = "key_shared"
#: every subscription type, in the order the documentation lists them
SUBSCRIPTION_TYPES: Final[tuple[str, ...]] = (SHARED, EXCLUSIVE, FAILOVER, KEY_SHARED)

__all__ = ["EXCLUSIVE", "FAILOVER", "KEY_SHARED", "SHARED", "SUBSCRIPTION_TYPES"]

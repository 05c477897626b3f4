"""The policy contract stays free of the broker's internals, so another snapshot source and
action sink (a RabbitMQ cluster's management API) can run the same policies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERNALS = (
    "plugbroker.domain",
    "plugbroker.session",
    "plugbroker.app",
    "plugbroker.server",
    "plugbroker.store",
)


def test_the_policy_types_and_the_builtin_policies_load_no_broker_internals() -> None:
    """Importing the contract and the two built-in policy plugins pulls in none of the domain,
    session, application, server or store (checked in a fresh interpreter)."""
    code = (
        "import sys, plugbroker.policy, plugbroker.plugins.isolation, plugbroker.plugins.slow_consumer\n"
        f"print('\\n'.join(m for m in sys.modules if m.startswith({INTERNALS!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.split() == []


def test_the_subscription_types_have_one_definition() -> None:
    from plugbroker import config, subscription
    from plugbroker.domain import queue

    assert queue.SUBSCRIPTION_TYPES is subscription.SUBSCRIPTION_TYPES
    assert config.SUBSCRIPTION_TYPES is subscription.SUBSCRIPTION_TYPES
    assert (queue.SHARED, queue.EXCLUSIVE, queue.FAILOVER, queue.KEY_SHARED) == (
        subscription.SUBSCRIPTION_TYPES
    )

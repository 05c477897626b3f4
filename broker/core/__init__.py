"""The core's narrow door: :class:`~plugbroker.core.api.BrokerAPI` (views and commands over a running
broker) and :mod:`plugbroker.core.actions` (how policy actions are applied through it)."""

from plugbroker.core.api import BrokerAPI, NotFound

__all__ = ["BrokerAPI", "NotFound"]

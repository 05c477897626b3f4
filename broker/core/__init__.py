"""The core's narrow door: :class:`~broker.core.api.BrokerAPI` (views and commands over a running
broker) and :mod:`broker.core.actions` (how policy actions are applied through it)."""

from broker.core.api import BrokerAPI, NotFound

__all__ = ["BrokerAPI", "NotFound"]

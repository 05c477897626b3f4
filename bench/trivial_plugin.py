"""A plugin that listens to every per-message hook and does nothing: what attaching one costs.

python3 bench/throughput.py --plugin bench.trivial_plugin --size 1024 --mode pubsub
"""

from __future__ import annotations

from typing import Any

from plugbroker.hookimpl import hookimpl


@hookimpl
def broker_message_published(
    vhost: str, exchange: str, routing_key: str, message: Any, queues: tuple[str, ...]
) -> None:
    pass


@hookimpl
def broker_message_delivered(
    vhost: str,
    queue: str,
    consumer_tag: str | None,
    connection_id: str,
    channel_id: int,
    delivery_tag: int,
    message: Any,
    redelivered: bool,
) -> None:
    pass


@hookimpl
def broker_message_acked(
    vhost: str,
    queue: str,
    consumer_tag: str | None,
    connection_id: str,
    channel_id: int,
    message: Any,
) -> None:
    pass

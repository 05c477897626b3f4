"""The ``x-`` arguments of queue.declare: validated and turned into :class:`Queue` options
(406 ``PRECONDITION_FAILED`` with RabbitMQ's wording for a bad one)."""

from __future__ import annotations

from typing import Any

from plugbroker.codec.ids import QUEUE_DECLARE
from plugbroker.domain.queue import FAILOVER, SUBSCRIPTION_TYPES
from plugbroker.errors import PRECONDITION_FAILED, ChannelError

__all__ = ["queue_options"]


def _int_arg(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid arg '{name}' for queue: {value!r} is not an integer",
            QUEUE_DECLARE,
        )
    if value < minimum or (maximum is not None and value > maximum):
        hi = f" and {maximum}" if maximum is not None else ""
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid arg '{name}' for queue: {value} is not between {minimum}{hi}"
            if maximum is not None
            else f"invalid arg '{name}' for queue: {value} is below {minimum}",
            QUEUE_DECLARE,
        )
    return value


def queue_options(args: dict[str, Any]) -> dict[str, Any]:
    """Validate the ``x-`` queue arguments and turn them into :class:`Queue` keyword options.

    Unknown arguments are kept (and compared on redeclare) but ignored, as in RabbitMQ.
    """
    opts: dict[str, Any] = {}
    if "x-message-ttl" in args:
        opts["message_ttl"] = _int_arg("x-message-ttl", args["x-message-ttl"])
    if "x-expires" in args:
        opts["expires"] = _int_arg("x-expires", args["x-expires"], minimum=1)
    if "x-max-length" in args:
        opts["max_length"] = _int_arg("x-max-length", args["x-max-length"])
    if "x-max-length-bytes" in args:
        opts["max_length_bytes"] = _int_arg("x-max-length-bytes", args["x-max-length-bytes"])
    if "x-overflow" in args:
        ov = args["x-overflow"]
        if ov not in ("drop-head", "reject-publish", "reject-publish-dlx"):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-overflow' for queue: {ov!r} is not drop-head, "
                "reject-publish or reject-publish-dlx",
                QUEUE_DECLARE,
            )
        opts["overflow"] = ov
    if "x-max-priority" in args:
        opts["max_priority"] = _int_arg("x-max-priority", args["x-max-priority"], maximum=255)
    if "x-dead-letter-exchange" in args:
        dlx = args["x-dead-letter-exchange"]
        if not isinstance(dlx, str):
            raise ChannelError(
                PRECONDITION_FAILED,
                "invalid arg 'x-dead-letter-exchange' for queue: not a string",
                QUEUE_DECLARE,
            )
        opts["dlx"] = dlx
    if "x-dead-letter-routing-key" in args:
        rk = args["x-dead-letter-routing-key"]
        if not isinstance(rk, str):
            raise ChannelError(
                PRECONDITION_FAILED,
                "invalid arg 'x-dead-letter-routing-key' for queue: not a string",
                QUEUE_DECLARE,
            )
        if "x-dead-letter-exchange" not in args:
            raise ChannelError(
                PRECONDITION_FAILED,
                "invalid arg 'x-dead-letter-routing-key' for queue: it needs "
                "x-dead-letter-exchange",
                QUEUE_DECLARE,
            )
        opts["dlx_routing_key"] = rk
    stype = args.get("x-subscription-type")
    if stype is not None:
        if stype not in SUBSCRIPTION_TYPES:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-subscription-type' for queue: {stype!r} is not "
                f"one of {', '.join(SUBSCRIPTION_TYPES)}",
                QUEUE_DECLARE,
            )
        opts["subscription_type"] = stype
    sac = args.get("x-single-active-consumer")
    if sac is not None:
        if not isinstance(sac, bool):
            raise ChannelError(
                PRECONDITION_FAILED,
                "invalid arg 'x-single-active-consumer' for queue: not a boolean",
                QUEUE_DECLARE,
            )
        if sac:
            if stype not in (None, FAILOVER):
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"x-single-active-consumer conflicts with x-subscription-type {stype!r}",
                    QUEUE_DECLARE,
                )
            opts["subscription_type"] = FAILOVER
    if "x-delivery-limit" in args:
        opts["delivery_limit"] = _int_arg("x-delivery-limit", args["x-delivery-limit"])
    if "x-retry-target" in args:
        target = args["x-retry-target"]
        if not isinstance(target, str) or not target:
            raise ChannelError(
                PRECONDITION_FAILED,
                "invalid arg 'x-retry-target' for queue: not a queue name",
                QUEUE_DECLARE,
            )
        opts["retry_target"] = target
    if "x-retry-levels" in args:
        levels = args["x-retry-levels"]
        if (
            not isinstance(levels, list)
            or not levels
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in levels)
        ):
            raise ChannelError(
                PRECONDITION_FAILED,
                "invalid arg 'x-retry-levels' for queue: a list of delays in ms",
                QUEUE_DECLARE,
            )
        opts["retry_levels"] = tuple(x / 1000.0 for x in levels)
    qtype = args.get("x-queue-type")
    if qtype is not None and qtype not in ("classic", "quorum"):
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid arg 'x-queue-type' for queue: {qtype!r} is not classic or quorum",
            QUEUE_DECLARE,
        )
    return opts

"""The admin interface's ``/metrics``: the broker's figures in the Prometheus text format.

Every family is built from the core API's views in O(queues + consumers), on the loop.
"""

from __future__ import annotations

from plugbroker.core.api import BrokerAPI

__all__ = ["prometheus_text"]


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(api: BrokerAPI) -> str:
    """Metrics in the Prometheus text exposition format (0.0.4)."""
    now = api.clock.monotonic()
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{{{labels}}} {value:g}" if labels else f"{name} {value:g}")

    queues = api.queues()

    def ql(vhost: str, queue: str) -> str:
        return f'vhost="{_label(vhost)}",queue="{_label(queue)}"'

    family(
        "plugbroker_connections",
        "gauge",
        "Open client connections.",
        [("", len(api.connections()))],
    )
    family(
        "plugbroker_queue_messages",
        "gauge",
        "Messages held: ready, unacked and delayed.",
        [(ql(q.vhost, q.name), q.messages) for q in queues],
    )
    family(
        "plugbroker_queue_messages_ready",
        "gauge",
        "Messages ready for delivery.",
        [(ql(q.vhost, q.name), q.ready) for q in queues],
    )
    family(
        "plugbroker_queue_messages_unacked",
        "gauge",
        "Messages delivered, not yet acked.",
        [(ql(q.vhost, q.name), q.unacked) for q in queues],
    )
    family(
        "plugbroker_queue_bytes",
        "gauge",
        "Body bytes held.",
        [(ql(q.vhost, q.name), q.bytes) for q in queues],
    )
    family(
        "plugbroker_queue_oldest_message_age_seconds",
        "gauge",
        "Age of the oldest message held (0 when empty).",
        [
            (ql(q.vhost, q.name), (now - q.oldest_arrival) if q.oldest_arrival is not None else 0.0)
            for q in queues
        ],
    )
    family(
        "plugbroker_queue_consumers",
        "gauge",
        "Consumers of the queue.",
        [(ql(q.vhost, q.name), q.consumers) for q in queues],
    )
    family(
        "plugbroker_queue_acks_total",
        "counter",
        "Messages settled since the queue was declared.",
        [(ql(q.vhost, q.name), q.acks_total) for q in queues],
    )
    for field, help_ in _QUEUE_COUNTERS:
        family(
            f"plugbroker_queue_{field}_total",
            "counter",
            help_,
            [(ql(q.vhost, q.name), getattr(q, f"{field}_total")) for q in queues],
        )
    consumers = api.consumers()
    family(
        "plugbroker_consumer_unacked",
        "gauge",
        "Unacked messages a consumer holds.",
        [(f'{ql(c.vhost, c.queue)},consumer="{_label(c.tag)}"', c.unacked) for c in consumers],
    )
    family(
        "plugbroker_consumer_isolated",
        "gauge",
        "1 while the consumer is on the blocklist.",
        [
            (f'{ql(c.vhost, c.queue)},consumer="{_label(c.tag)}"', int(c.isolated))
            for c in consumers
        ],
    )
    family(
        "plugbroker_delayed_messages",
        "gauge",
        "Messages held by delayed exchanges.",
        [(f'vhost="{_label(vh)}"', api.delayed_pending(vh)) for vh in api.vhosts()],
    )
    family(
        "plugbroker_policy_actions_total",
        "counter",
        "Policy actions by policy and outcome.",
        [
            (f'policy="{_label(p)}",outcome="{_label(o)}"', n)
            for (p, o), n in sorted(api.policy_action_counts().items())
        ],
    )
    li = api.limits()
    family(
        "plugbroker_limit_refusals_total",
        "counter",
        "Connections, channels, queues and bindings refused by a limit, by limit.",
        [(f'limit="{_label(k)}"', n) for k, n in sorted(li.refusals.items())],
    )
    family(
        "plugbroker_login_failures_total",
        "counter",
        "Failed logins.",
        [("", li.login_failures)],
    )
    family(
        "plugbroker_login_throttled_total",
        "counter",
        "Failed logins whose answer was delayed (login throttling).",
        [("", li.login_throttled)],
    )
    family(
        "plugbroker_login_turned_away_total",
        "counter",
        "Connections closed at once: their address had too many failed logins waiting.",
        [("", li.login_turned_away)],
    )
    family(
        "plugbroker_accept_failures_total",
        "counter",
        "accept() calls that failed for want of a resource (EMFILE, ENFILE ...).",
        [("", li.accept_failures)],
    )
    family(
        "plugbroker_accept_backing_off",
        "gauge",
        "1 while a listener waits before accepting again after such a failure.",
        [("", int(li.accept_backing_off))],
    )
    family(
        "plugbroker_resource_alarm",
        "gauge",
        "1 while a resource alarm blocks publishers.",
        [("", int(api.alarm is not None))],
    )
    raised = {a.name: a for a in api.alarms()}
    family(
        "plugbroker_alarm",
        "gauge",
        "1 while the named resource alarm (memory, disk, store) is raised.",
        [(f'alarm="{n}"', int(n in raised)) for n in ("memory", "disk", "store")],
    )
    family(
        "plugbroker_alarm_since_seconds",
        "gauge",
        "Unix time the named resource alarm was raised (present while it is).",
        [(f'alarm="{n}"', a.since) for n, a in raised.items()],
    )
    conns = api.connections()
    family(
        "plugbroker_connections_blocked",
        "gauge",
        "Connections not read from because a resource alarm blocks their publishing.",
        [("", sum(c.blocked for c in conns))],
    )
    family(
        "plugbroker_connections_output_paused",
        "gauge",
        "Connections whose client does not read its socket (output past the water mark).",
        [("", sum(c.output_paused for c in conns))],
    )
    r = api.resources()
    family(
        "plugbroker_memory_used_bytes",
        "gauge",
        "What the memory alarm compares with its watermark: the resident size, or the account.",
        [("", r.memory_used)],
    )
    if r.memory_high_watermark is not None:
        family(
            "plugbroker_memory_high_watermark_bytes",
            "gauge",
            "The memory alarm goes on above this.",
            [("", r.memory_high_watermark)],
        )
    if r.rss is not None:
        family(
            "plugbroker_process_rss_bytes",
            "gauge",
            "The process' resident set size.",
            [("", r.rss)],
        )
    if r.disk_free is not None:
        family(
            "plugbroker_disk_free_bytes",
            "gauge",
            "Free space on the store's filesystem at the last check.",
            [("", r.disk_free)],
        )
    family(
        "plugbroker_disk_free_limit_bytes",
        "gauge",
        "The disk alarm goes on below this much free space.",
        [("", r.disk_free_limit)],
    )
    f = api.failures()
    family(
        "plugbroker_store_records_failed_total",
        "counter",
        "Store operations that could not be written and were left out.",
        [("", f.store_records_failed)],
    )
    for name, text, counts in (
        ("hook_failures", "Hook calls that raised and were contained", f.hook_failures),
        ("hook_slow_calls", "Hook calls over <limits><hookBudget> on the loop", f.hook_slow_calls),
    ):
        rows = [(f'plugin="{_label(p)}",hook="{_label(h)}"', n) for (p, h), n in counts.items()]
        family(f"plugbroker_{name}_total", "counter", f"{text}, by plugin and hook.", sorted(rows))
    family(
        "plugbroker_dispatch_failures_total",
        "counter",
        "Queue dispatches that raised and were contained, by queue.",
        [(ql(vhost, queue), n) for (vhost, queue), n in sorted(f.dispatch_failures.items())],
    )
    gcs = api.collector()
    gens = range(len(gcs.collections))
    family(
        "plugbroker_gc_collections_total",
        "counter",
        "CPython cycle collections by generation (2 is a full collection).",
        [(f'generation="{g}"', gcs.collections[g]) for g in gens],
    )
    if gcs.timed:  # by plugbroker run's collector watch (plugbroker.heap)
        family(
            "plugbroker_gc_pause_seconds_total",
            "counter",
            "Time the event loop stood still in cycle collections, by generation.",
            [(f'generation="{g}"', gcs.pause_total[g]) for g in gens],
        )
        family(
            "plugbroker_gc_pause_seconds_max",
            "gauge",
            "The longest cycle collection since the start, by generation.",
            [(f'generation="{g}"', gcs.pause_max[g]) for g in gens],
        )
    family(
        "plugbroker_gc_frozen_objects",
        "gauge",
        "Objects frozen out of the cycle collector's reach (gc.freeze; see docs/operations.md).",
        [("", gcs.frozen)],
    )
    return "\n".join(lines) + "\n"


#: per-queue counters (``QueueInfo.<field>_total``), kept incrementally by the domain
_QUEUE_COUNTERS = (
    ("published", "Messages that entered the queue since it was declared."),
    ("delivered", "Deliveries to consumers and basic.get since the queue was declared."),
    ("acked", "Deliveries acked (basic.ack) since the queue was declared."),
    (
        "redelivered",
        "Messages put back for redelivery (reject or nack with requeue, channel close, recover, "
        "isolation, nack backoff) since the queue was declared.",
    ),
    ("dead_lettered", "Messages dead-lettered from the queue since it was declared."),
)

"""The admin interface's ``/metrics``: the broker's figures in the Prometheus text format.

``/metrics`` serves the per-queue and per-consumer families summed over every queue and
consumer (no ``vhost``/``queue`` labels), ``/metrics/per-object`` one sample per queue and per
consumer, as RabbitMQ's Prometheus plugin splits them: a scrape of ``/metrics`` costs
O(vhosts + connections), whatever the number of queues.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from plugbroker.core.api import BrokerAPI, ConsumerInfo, QueueInfo

__all__ = ["VhostSample", "broker_lines", "prometheus_text"]


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


#: the per-queue gauges and counters: (family, kind, help, index in a :func:`queue_figures` row)
QUEUE_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("plugbroker_queue_messages", "gauge", "Messages held: ready, unacked and delayed."),
    ("plugbroker_queue_messages_ready", "gauge", "Messages ready for delivery."),
    ("plugbroker_queue_messages_unacked", "gauge", "Messages delivered, not yet acked."),
    ("plugbroker_queue_bytes", "gauge", "Body bytes held."),
    (
        "plugbroker_queue_oldest_message_age_seconds",
        "gauge",
        "Age of the oldest message held (0 when empty).",
    ),
    ("plugbroker_queue_consumers", "gauge", "Consumers of the queue."),
    ("plugbroker_queue_acks_total", "counter", "Messages settled since the queue was declared."),
    (
        "plugbroker_queue_published_total",
        "counter",
        "Messages that entered the queue since it was declared.",
    ),
    (
        "plugbroker_queue_delivered_total",
        "counter",
        "Deliveries to consumers and basic.get since the queue was declared.",
    ),
    (
        "plugbroker_queue_acked_total",
        "counter",
        "Deliveries acked (basic.ack) since the queue was declared.",
    ),
    (
        "plugbroker_queue_redelivered_total",
        "counter",
        "Messages put back for redelivery (reject or nack with requeue, channel close, recover, "
        "isolation, nack backoff) since the queue was declared.",
    ),
    (
        "plugbroker_queue_dead_lettered_total",
        "counter",
        "Messages dead-lettered from the queue since the queue was declared.",
    ),
)
#: the per-consumer gauges: (family, kind, help)
CONSUMER_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("plugbroker_consumer_unacked", "gauge", "Unacked messages a consumer holds."),
    ("plugbroker_consumer_isolated", "gauge", "1 while the consumer is on the blocklist."),
)

#: one queue's figures in :data:`QUEUE_FAMILIES` order
Figures = tuple[float, ...]


def queue_figures(q: QueueInfo, now: float) -> Figures:
    """A queue's figures, in the order of :data:`QUEUE_FAMILIES`."""
    age = (now - q.oldest_arrival) if q.oldest_arrival is not None else 0.0
    return (
        q.messages,
        q.ready,
        q.unacked,
        q.bytes,
        age,
        q.consumers,
        q.acks_total,
        q.published_total,
        q.delivered_total,
        q.acked_total,
        q.redelivered_total,
        q.dead_lettered_total,
    )


def queue_labels(vhost: str, queue: str) -> str:
    return f'vhost="{_label(vhost)}",queue="{_label(queue)}"'


def consumer_rows(consumers: Iterable[ConsumerInfo]) -> list[tuple[str, Figures]]:
    """Each consumer's labels and figures, in the order of :data:`CONSUMER_FAMILIES`."""
    return [
        (f'{queue_labels(c.vhost, c.queue)},consumer="{_label(c.tag)}"', (c.unacked, c.isolated))
        for c in consumers
    ]


def family_lines(
    name: str, kind: str, help_: str, samples: Iterable[tuple[str, float]]
) -> Iterator[str]:
    """One family in the text format: its HELP and TYPE lines, then a line per sample."""
    yield f"# HELP {name} {help_}"
    yield f"# TYPE {name} {kind}"
    for labels, value in samples:
        yield f"{name}{{{labels}}} {value:g}" if labels else f"{name} {value:g}"


def object_families(
    queues: Sequence[tuple[str, Figures]], consumers: Sequence[tuple[str, Figures]]
) -> Iterator[tuple[str, str, str, Iterable[tuple[str, float]]]]:
    """The per-queue and per-consumer families over ``(labels, figures)`` rows."""
    for i, (name, kind, help_) in enumerate(QUEUE_FAMILIES):
        yield name, kind, help_, ((labels, f[i]) for labels, f in queues)
    for i, (name, kind, help_) in enumerate(CONSUMER_FAMILIES):
        yield name, kind, help_, ((labels, f[i]) for labels, f in consumers)


#: the figure of :data:`QUEUE_FAMILIES` that is a maximum over queues, not a sum
AGE = 4


@dataclass(slots=True)
class VhostSample:
    """A vhost's queue and consumer figures summed over its queues (the oldest message's
    age: the greatest), as the admin's sampler last counted them."""

    queues: list[float] = field(default_factory=lambda: [0] * len(QUEUE_FAMILIES))
    #: unacked and isolated, summed over its consumers
    consumers: list[float] = field(default_factory=lambda: [0, 0])
    queue_count: int = 0
    consumer_count: int = 0
    connections: int = 0

    def add_queue(self, figures: Sequence[float]) -> None:
        sums = self.queues
        for i, value in enumerate(figures):
            sums[i] = max(sums[i], value) if i == AGE else sums[i] + value
        self.queue_count += 1

    def add_consumer(self, figures: Figures) -> None:
        self.consumers[0] += figures[0]
        self.consumers[1] += figures[1]
        self.consumer_count += 1

    def merge(self, other: VhostSample) -> None:
        """Add ``other``'s figures to these."""
        self.add_queue(other.queues)
        self.queue_count += other.queue_count - 1  # add_queue counted one
        self.consumers[0] += other.consumers[0]
        self.consumers[1] += other.consumers[1]
        self.consumer_count += other.consumer_count
        self.connections += other.connections


def aggregated_families(
    total: VhostSample,
) -> Iterator[tuple[str, str, str, Iterable[tuple[str, float]]]]:
    """The per-object families over every queue and consumer, without their labels (what
    ``/metrics`` serves by default, as RabbitMQ's aggregated ``/metrics``)."""
    for i, ((name, kind, help_), value) in enumerate(
        zip(QUEUE_FAMILIES, total.queues, strict=True)
    ):
        how = "The greatest over every queue." if i == AGE else "Summed over every queue."
        yield name, kind, f"{help_} {how}", [("", value)]
    for (name, kind, help_), value in zip(CONSUMER_FAMILIES, total.consumers, strict=True):
        yield name, kind, help_ + " Summed over every consumer.", [("", value)]


def prometheus_text(api: BrokerAPI) -> str:
    """Every family, per queue and per consumer included, in the Prometheus text exposition
    format (0.0.4), built at once: O(queues + consumers). The admin server serves the same
    text a bounded step at a time (:mod:`plugbroker.admin_metrics_steps`)."""
    now = api.clock.monotonic()
    queues = [(queue_labels(q.vhost, q.name), queue_figures(q, now)) for q in api.queues()]
    lines: list[str] = []
    for fam in object_families(queues, consumer_rows(api.consumers())):
        lines.extend(family_lines(*fam))
    lines.extend(broker_lines(api))
    return "\n".join(lines) + "\n"


def broker_lines(api: BrokerAPI) -> list[str]:
    """The families that do not grow with queues or consumers: connections, delayed
    messages per vhost, policy actions, limits, alarms, resources, failures, the collector."""
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend(family_lines(name, kind, help_, samples))

    def ql(vhost: str, queue: str) -> str:
        return queue_labels(vhost, queue)

    family(
        "plugbroker_connections",
        "gauge",
        "Open client connections.",
        [("", len(api.connections()))],
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
    return lines

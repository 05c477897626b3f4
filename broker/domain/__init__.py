"""The broker's domain: virtual hosts, exchanges, queues, bindings, consumers, deliveries.

Nothing here does I/O or reads the real clock. Deliveries leave through the small
:class:`broker.domain.channel.Outbox` interface that the session layer implements, time comes
from an injected :class:`broker.clock.Clock`, and deferred work goes through
:class:`broker.domain.timers.Timers`.
"""

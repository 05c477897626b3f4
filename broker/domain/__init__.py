"""The broker's domain: virtual hosts, exchanges, queues, bindings, consumers, deliveries.

Nothing here does I/O or reads the real clock. Deliveries leave through the small
:class:`plugbroker.domain.channel.Outbox` interface that the session layer implements, time comes
from an injected :class:`plugbroker.clock.Clock`, and deferred work goes through
:class:`plugbroker.domain.timers.Timers`.
"""

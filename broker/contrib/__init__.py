"""Client-side helpers for plugbroker's AMQP 0-9-1 extensions (they run in the client's process).

:mod:`plugbroker.contrib.touch` asks the broker for more time on a delivery (``touch(message)``) and
reads the ack timeout the broker sends; :mod:`plugbroker.contrib.celery` touches a Celery worker's
running and scheduled tasks, switched on in one line. Nothing in the broker imports this package
(an import-linter contract says so), and it imports nothing from the broker: a worker needs only
kombu (and Celery for :mod:`plugbroker.contrib.celery`).
"""

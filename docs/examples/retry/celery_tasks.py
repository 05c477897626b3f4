"""Sample 5: reconsume_later from a Celery task. The task raises ReconsumeLater; a Request class
asks the broker for the retry and acks the task's message once the broker has confirmed it
(late acks: the message is still unacked when the task ends). The queue is `celery-work` in
broker.xml; run the worker with the prefork or solo pool (the request's callbacks run in the
worker's main process, where its broker connection lives)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task
from celery.exceptions import Ignore
from celery.worker.request import Request

from plugbroker.retry import reconsume_later


class ReconsumeLater(Ignore):
    """Raise from a task to have the broker deliver its message again later (an Ignore: Celery
    stores no result for this run)."""

    def __init__(self, delay: float | None = None, level: int | None = None) -> None:
        super().__init__(delay, level)
        self.delay = delay
        self.level = level


class BrokerRetryRequest(Request):
    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False):
        exc = getattr(exc_info.exception, "exc", exc_info.exception)
        if isinstance(exc, ReconsumeLater) and not self.acknowledged:
            # the broker copies the message to the queue's retry queue (or, past
            # <maxRedeliveries>, to its dead-letter queue); then the message is acked
            reconsume_later(self.message, delay=exc.delay, level=exc.level)
            self.acknowledged = True
            return None
        return super().on_failure(exc_info, send_failed_event, return_ok)


class BrokerRetryTask(Task):
    Request = BrokerRetryRequest
    acks_late = True


app = Celery("celery_tasks", broker=os.environ.get("BROKER_URL"), backend="rpc://")
app.conf.update(
    task_default_queue="celery-work",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(base=BrokerRetryTask, bind=True)
def charge(self: Task, order: int) -> dict:
    retries = int(getattr(self.request, "RECONSUMETIMES", None) or 0)  # a message header
    if retries == 0:
        raise ReconsumeLater(delay=1)  # the payment service is down: try again in 1 s
    return {"order": order, "retries": retries}

"""Named class and method ids of AMQP 0-9-1.

A :class:`MethodId` is a ``(class_id, method_id)`` pair. It is a tuple, so it compares equal to
the plain pair, and it is what errors carry (:attr:`plugbroker.errors.AMQPError.method`) and what a
``connection.close`` / ``channel.close`` reports back to the client. Code outside this module
names a method by its constant (``QUEUE_BIND``), never by its numbers.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class MethodId(NamedTuple):
    class_id: int
    method_id: int


#: the ids errors carry when no method caused them
NO_METHOD: Final = MethodId(0, 0)

# class ids
CONNECTION_CLASS: Final = 10
CHANNEL_CLASS: Final = 20
EXCHANGE_CLASS: Final = 40
QUEUE_CLASS: Final = 50
BASIC_CLASS: Final = 60
CONFIRM_CLASS: Final = 85
TX_CLASS: Final = 90

# connection
CONNECTION_START: Final = MethodId(10, 10)
CONNECTION_START_OK: Final = MethodId(10, 11)
CONNECTION_SECURE: Final = MethodId(10, 20)
CONNECTION_SECURE_OK: Final = MethodId(10, 21)
CONNECTION_TUNE: Final = MethodId(10, 30)
CONNECTION_TUNE_OK: Final = MethodId(10, 31)
CONNECTION_OPEN: Final = MethodId(10, 40)
CONNECTION_OPEN_OK: Final = MethodId(10, 41)
CONNECTION_CLOSE: Final = MethodId(10, 50)
CONNECTION_CLOSE_OK: Final = MethodId(10, 51)
CONNECTION_BLOCKED: Final = MethodId(10, 60)
CONNECTION_UNBLOCKED: Final = MethodId(10, 61)
CONNECTION_UPDATE_SECRET: Final = MethodId(10, 70)
CONNECTION_UPDATE_SECRET_OK: Final = MethodId(10, 71)

# channel
CHANNEL_OPEN: Final = MethodId(20, 10)
CHANNEL_OPEN_OK: Final = MethodId(20, 11)
CHANNEL_FLOW: Final = MethodId(20, 20)
CHANNEL_FLOW_OK: Final = MethodId(20, 21)
CHANNEL_CLOSE: Final = MethodId(20, 40)
CHANNEL_CLOSE_OK: Final = MethodId(20, 41)

# exchange
EXCHANGE_DECLARE: Final = MethodId(40, 10)
EXCHANGE_DECLARE_OK: Final = MethodId(40, 11)
EXCHANGE_DELETE: Final = MethodId(40, 20)
EXCHANGE_DELETE_OK: Final = MethodId(40, 21)
EXCHANGE_BIND: Final = MethodId(40, 30)
EXCHANGE_BIND_OK: Final = MethodId(40, 31)
EXCHANGE_UNBIND: Final = MethodId(40, 40)
EXCHANGE_UNBIND_OK: Final = MethodId(40, 51)  # 51, not 41: as RabbitMQ numbers it

# queue
QUEUE_DECLARE: Final = MethodId(50, 10)
QUEUE_DECLARE_OK: Final = MethodId(50, 11)
QUEUE_BIND: Final = MethodId(50, 20)
QUEUE_BIND_OK: Final = MethodId(50, 21)
QUEUE_PURGE: Final = MethodId(50, 30)
QUEUE_PURGE_OK: Final = MethodId(50, 31)
QUEUE_DELETE: Final = MethodId(50, 40)
QUEUE_DELETE_OK: Final = MethodId(50, 41)
QUEUE_UNBIND: Final = MethodId(50, 50)
QUEUE_UNBIND_OK: Final = MethodId(50, 51)

# basic
BASIC_QOS: Final = MethodId(60, 10)
BASIC_QOS_OK: Final = MethodId(60, 11)
BASIC_CONSUME: Final = MethodId(60, 20)
BASIC_CONSUME_OK: Final = MethodId(60, 21)
BASIC_CANCEL: Final = MethodId(60, 30)
BASIC_CANCEL_OK: Final = MethodId(60, 31)
BASIC_PUBLISH: Final = MethodId(60, 40)
BASIC_RETURN: Final = MethodId(60, 50)
BASIC_DELIVER: Final = MethodId(60, 60)
BASIC_GET: Final = MethodId(60, 70)
BASIC_GET_OK: Final = MethodId(60, 71)
BASIC_GET_EMPTY: Final = MethodId(60, 72)
BASIC_ACK: Final = MethodId(60, 80)
BASIC_REJECT: Final = MethodId(60, 90)
BASIC_RECOVER_ASYNC: Final = MethodId(60, 100)
BASIC_RECOVER: Final = MethodId(60, 110)
BASIC_RECOVER_OK: Final = MethodId(60, 111)
BASIC_NACK: Final = MethodId(60, 120)

# confirm
CONFIRM_SELECT: Final = MethodId(85, 10)
CONFIRM_SELECT_OK: Final = MethodId(85, 11)

# tx
TX_SELECT: Final = MethodId(90, 10)
TX_SELECT_OK: Final = MethodId(90, 11)
TX_COMMIT: Final = MethodId(90, 20)
TX_COMMIT_OK: Final = MethodId(90, 21)
TX_ROLLBACK: Final = MethodId(90, 30)
TX_ROLLBACK_OK: Final = MethodId(90, 31)

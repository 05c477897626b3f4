"""A stored message whose body came back damaged: reported, taken out of its queue and
dead-lettered with reason ``corrupt``, never delivered as if it were whole.

The store checks each body it reads back against the checksum stored with it (at recovery and
when a paged body is read back ahead of dispatch) and calls :func:`expel_corrupt` for one that
fails. The message goes to its queue's dead-letter target, or is parked in ``{queue}-DLQ``
when the queue has none, as a poison message is: an operator can look at what is left of it
(its ``x-death`` says ``corrupt``) instead of a consumer acting on it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from plugbroker.domain.fate import dead_letter_or_park

if TYPE_CHECKING:
    from plugbroker.domain.message import Message
    from plugbroker.domain.queue import Queue

log = logging.getLogger("plugbroker.store")

#: the reason of a message dead-lettered because its stored body is damaged
CORRUPT = "corrupt"


def expel_corrupt(q: Queue, msg: Message, body: bytes) -> list[str]:
    """``body``, read back for ``msg`` (a ready message of ``q``), fails its checksum: one
    line says so, and the message leaves ``q`` for its dead-letter target (or ``{queue}-DLQ``)
    with reason ``corrupt``. Returns the names of the queues that took it (none when ``q`` no
    longer holds the message)."""
    msg.body = body
    if not q.drop_unreadable(msg):
        return []
    went = dead_letter_or_park(q, msg, CORRUPT)
    log.error(
        "queue '%s' in vhost '%s': message %d (%d bytes) read back from the store fails its "
        "checksum; not delivered, dead-lettered as corrupt to %s",
        q.name,
        q.vhost.name,
        msg.id,
        len(body),
        ", ".join(repr(n) for n in went) or "nowhere (no queue took it)",
    )
    return went


__all__ = ["CORRUPT", "expel_corrupt"]

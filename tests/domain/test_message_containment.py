"""A message whose properties cannot be re-encoded is still delivered (as published)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from rawclient import deep_header_properties

from plugbroker.codec.properties import decode
from plugbroker.domain.message import Message


def test_redelivery_of_headers_too_deep_to_re_encode_keeps_the_published_properties() -> None:
    # 700 levels: let in by brokers before the codec bounded depth (a store written then)
    raw = deep_header_properties(700)
    m = Message.from_publish(1, "", "q", raw, b"body", 4, 0.0, 0.0)
    m.delivery_count = 1
    # Python's default limit (another test in the same process may have raised it): py-amqp
    # decodes 700 levels within it, re-encoding them with x-delivery-count does not
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        assert m.delivery_properties() == raw
    finally:
        sys.setrecursionlimit(limit)
    shallow = deep_header_properties(3)
    m2 = Message.from_publish(2, "", "q", shallow, b"body", 4, 0.0, 0.0)
    m2.delivery_count = 2
    again = m2.delivery_properties()  # re-encoded with x-delivery-count
    assert decode(again)["application_headers"]["x-delivery-count"] == 2

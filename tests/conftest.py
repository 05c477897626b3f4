from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from brokerutil import BrokerThread, write_config

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerThread]]:
    """Start brokers with a config built from keyword arguments (see brokerutil.write_config)."""
    started: list[BrokerThread] = []

    def start(vhost: str = "", *, config_path: Path | None = None, **kw: Any) -> BrokerThread:
        broker_kw = {k: kw.pop(k) for k in ("clock", "host") if k in kw}
        path = config_path or write_config(tmp_path, vhost, name=f"broker{len(started)}.xml", **kw)
        b = BrokerThread(path, **broker_kw).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerThread]) -> BrokerThread:
    """A broker with the default policies (none) on a free loopback port."""
    return broker_factory()

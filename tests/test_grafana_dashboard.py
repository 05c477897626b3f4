"""docs/grafana/plugbroker.json is built on metrics /metrics/per-object really serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from plugbroker.admin_metrics import prometheus_text
from plugbroker.app import Broker
from plugbroker.clock import ManualClock
from plugbroker.config import parse_config

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "plugbroker.json"
CONFIG = """<broker><users><user name="guest" password="guest" vhosts="/"/></users>
<virtualhost name="/"/></broker>"""


def test_every_metric_the_dashboard_queries_is_served() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bplugbroker_[a-z_]+", e)}
    broker = Broker(parse_config(CONFIG), clock=ManualClock())
    broker.vhosts["/"].declare_queue("q")
    broker.set_alarm("disk")
    served = set(re.findall(r"^# TYPE (\w+) ", prometheus_text(broker.api), re.M))
    assert used and used <= served, used - served
    for name in (
        "published",
        "delivered",
        "acked",
        "redelivered",
        "dead_lettered",
    ):
        assert f"plugbroker_queue_{name}_total" in used
    assert "plugbroker_alarm" in used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))

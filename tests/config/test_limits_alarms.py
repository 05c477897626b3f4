"""``<limits>``: memoryHighWatermark (size or fraction), diskFreeLimit, partialBodyBudget,
bodyStallTimeout."""

from __future__ import annotations

import pytest
from configutil import assert_located, fails

from plugbroker.alarms import blocked_reason
from plugbroker.config import parse_config


def _limits(body: str) -> str:
    return f'<broker>\n<limits>\n{body}\n</limits>\n<virtualhost name="/"/>\n</broker>\n'


def test_defaults() -> None:
    lim = parse_config(_limits(""), "x.xml").limits
    assert lim.memory_high_watermark == 0.4 and lim.memory_high_watermark_bytes is None
    assert lim.disk_free_limit == 50 * 1024 * 1024
    assert lim.partial_body_budget == 256 * 1024 * 1024 and lim.body_stall_timeout == 30.0


@pytest.mark.parametrize(
    ("text", "fraction", "size"),
    [
        ("0.25", 0.25, None),
        (".5", 0.5, None),
        ("1.0", 1.0, None),
        ("400MB", None, 400 << 20),
        ("2000000", None, 2000000),
        ("1.5GB", None, int(1.5 * (1 << 30))),
    ],
)
def test_watermark_is_a_fraction_or_a_size(
    text: str, fraction: float | None, size: int | None
) -> None:
    cfg = parse_config(_limits(f"<memoryHighWatermark>{text}</memoryHighWatermark>"), "x.xml")
    assert cfg.limits.memory_high_watermark == fraction
    assert cfg.limits.memory_high_watermark_bytes == size
    assert "memoryHighWatermark" in cfg.limits.describe()


@pytest.mark.parametrize("text", ["1.5", "0.0", "0", "lots"])
def test_a_bad_watermark_is_refused_with_its_line(text: str) -> None:
    err = fails(_limits(f"<memoryHighWatermark>{text}</memoryHighWatermark>"))
    assert_located(err, 3, "memoryHighWatermark")


def test_the_other_elements() -> None:
    cfg = parse_config(
        _limits(
            "<diskFreeLimit>1GB</diskFreeLimit><partialBodyBudget>8MB</partialBodyBudget>"
            "<bodyStallTimeout>250ms</bodyStallTimeout>"
        ),
        "x.xml",
    )
    assert cfg.limits.disk_free_limit == 1 << 30 and cfg.limits.partial_body_budget == 8 << 20
    assert cfg.limits.body_stall_timeout == 0.25
    assert_located(fails(_limits("<bodyStallTimeout>0</bodyStallTimeout>")), 3, "bodyStallTimeout")


def test_blocked_reason_names_resources_as_rabbitmq_does() -> None:
    from plugbroker.alarms import Alarm

    def of(*names: str) -> dict[str, Alarm]:
        return {n: Alarm(n, "", 0.0) for n in names}

    assert blocked_reason(of()) is None
    assert blocked_reason(of("memory")) == "low on memory"
    assert blocked_reason(of("disk")) == "low on disk"
    assert blocked_reason(of("store")) == "low on disk"
    assert blocked_reason(of("disk", "store", "memory")) == "low on memory & disk"

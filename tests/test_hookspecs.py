"""The hook specs are the contract between the core and every plugin: names, arguments, kinds."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from plugbroker import hookspecs
from plugbroker.decisions import RejectDecision
from plugbroker.hookimpl import PROJECT_NAME, hookimpl
from plugbroker.pluginhost import hookspec_names

# What the core calls, exactly: hook name -> keyword arguments, in order. Renaming or reordering
# any of these breaks the core or third-party plugins, so it must be a deliberate change here.
CONTRACT: dict[str, tuple[str, ...]] = {
    "broker_add_config_elements": ("registry",),
    "broker_configure": ("config",),
    "broker_register": ("registry",),
    "broker_startup": ("broker",),
    "broker_shutdown": ("broker",),
    "broker_config_reloaded": ("broker", "config"),
    "broker_alarm_changed": ("name", "raised", "detail"),
    "broker_connection_opened": ("connection_id", "peer", "user", "vhost"),
    "broker_connection_closed": ("connection_id", "code", "text"),
    "broker_queue_declared": ("vhost", "queue", "durable", "arguments"),
    "broker_queue_deleted": ("vhost", "queue", "reason", "messages"),
    "broker_queue_bound": ("vhost", "queue", "exchange", "routing_key"),
    "broker_queue_unbound": ("vhost", "queue", "exchange", "routing_key"),
    "broker_consumer_added": ("vhost", "queue", "consumer_tag", "connection_id", "channel_id"),
    "broker_consumer_removed": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "channel_id",
        "reason",
    ),
    "broker_consumer_isolated": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "last_ack_age",
        "moved",
    ),
    "broker_consumer_released": ("vhost", "queue", "consumer_tag", "connection_id", "reason"),
    "broker_message_published": ("vhost", "exchange", "routing_key", "message", "queues"),
    "broker_message_delivered": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "channel_id",
        "delivery_tag",
        "message",
        "redelivered",
        "no_ack",
        "due",
    ),
    "broker_delivery_touched": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "channel_id",
        "delivery_tag",
        "message",
    ),
    "broker_message_acked": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "channel_id",
        "message",
    ),
    "broker_message_rejected": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "channel_id",
        "message",
        "requeue",
    ),
    "broker_message_redelivered": ("vhost", "queue", "message", "delivery_count", "reason"),
    "broker_message_enqueued": ("vhost", "queue", "message", "reason"),
    "broker_message_removed": ("vhost", "queue", "message", "reason"),
    "broker_message_dead_lettered": (
        "vhost",
        "queue",
        "message",
        "reason",
        "exchange",
        "routing_key",
    ),
    "broker_message_timed_out": (
        "vhost",
        "queue",
        "consumer_tag",
        "connection_id",
        "message",
        "timeouts",
    ),
    "broker_message_expired": ("vhost", "queue", "message"),
    "broker_message_dropped": ("vhost", "queue", "message", "reason"),
    "broker_reject_decision": ("vhost", "queue", "message", "requeue", "delivery_count"),
    "broker_select_consumer": ("vhost", "queue", "message", "consumers"),
    "broker_redelivery_delay": ("vhost", "queue", "message", "delivery_count"),
    "broker_delivery_limit": ("vhost", "queue"),
    "broker_dead_letter_target": ("vhost", "queue", "message", "reason"),
    "broker_policy_action": ("action", "outcome"),
}
FIRSTRESULT = {
    "broker_reject_decision",
    "broker_select_consumer",
    "broker_redelivery_delay",
    "broker_delivery_limit",
    "broker_dead_letter_target",
}


def _spec(name: str) -> object:
    return getattr(hookspecs, name)


def _opts(name: str) -> dict[str, object]:
    return getattr(_spec(name), f"{PROJECT_NAME}_spec")


def test_the_specs_are_exactly_the_contract() -> None:
    assert set(hookspec_names()) == set(CONTRACT)
    for name, args in CONTRACT.items():
        params = tuple(inspect.signature(_spec(name)).parameters)  # type: ignore[arg-type]
        assert params == args, name


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_decisions_are_firstresult_and_nothing_is_historic(name: str) -> None:
    opts = _opts(name)
    assert opts["firstresult"] is (name in FIRSTRESULT)
    assert opts["historic"] is False


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_every_spec_is_typed(name: str) -> None:
    sig = inspect.signature(_spec(name))  # type: ignore[arg-type]
    missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not missing, f"{name}: untyped {missing}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return type"
    if name in FIRSTRESULT:
        assert "None" in sig.return_annotation, f"{name}: a decision may return None"
    else:
        assert sig.return_annotation == "None", f"{name}: a notification returns nothing"


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_every_docstring_has_summary_params_and_kind(name: str) -> None:
    doc = inspect.getdoc(_spec(name)) or ""
    summary, _, rest = doc.partition("\n")
    assert summary.strip().endswith("."), f"{name}: summary line"
    documented = re.findall(r":param (\w+):", doc)
    assert documented == list(CONTRACT[name]), f"{name}: :param: per argument, in order"
    flat = " ".join(doc.split())
    if name in FIRSTRESULT:
        assert "firstresult: the first non-``None`` result is used" in flat
        assert ":return:" in doc
    else:
        assert "Not firstresult." in flat
    assert "Called" in rest, f"{name}: say when it is called"


def test_specs_are_grouped_under_lifecycle_banners() -> None:
    source = inspect.getsource(hookspecs)
    banners = [
        m.start() for m in re.finditer(r"^# -{20,}\n# (.+)\n# -{20,}$", source, re.MULTILINE)
    ]
    titles = re.findall(r"^# -{20,}\n# (.+)\n# -{20,}$", source, re.MULTILINE)
    assert [t.split()[0] for t in titles] == [
        "Configuration",
        "Connection,",
        "Per-message",
        "Decisions",
        "Policy",
    ]
    # each message hook sits in the per-message group, each decision in the decision group
    per_message = (banners[2], banners[3])
    decisions = (banners[3], banners[4])
    for name in CONTRACT:
        at = source.index(f"def {name}(")
        if name.startswith("broker_message_"):
            assert per_message[0] < at < per_message[1], name
        if name in FIRSTRESULT:
            assert decisions[0] < at < decisions[1], name


def test_hookimpl_marker_belongs_to_the_same_project() -> None:
    @hookimpl(trylast=True)
    def broker_startup(broker: object) -> None: ...

    assert getattr(broker_startup, f"{PROJECT_NAME}_impl")["trylast"] is True
    assert hookspecs.hookspec.project_name == hookimpl.project_name == "plugbroker"


def test_reject_decision_is_a_frozen_value_with_defaults() -> None:
    d = RejectDecision("requeue")
    assert (d.kind, d.delay, d.reason) == ("requeue", 0.0, "rejected")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.delay = 1.0  # type: ignore[misc]
    assert RejectDecision("dead-letter", reason="delivery_limit") == RejectDecision(
        "dead-letter", 0.0, "delivery_limit"
    )


@pytest.mark.parametrize(
    ("kind", "delay", "match"),
    [("requeu", 0.0, "kind must be one of"), ("requeue", -1.0, "delay must be >= 0")],
)
def test_reject_decision_refuses_bad_values(kind: str, delay: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RejectDecision(kind, delay)  # type: ignore[arg-type]


def test_decisions_module_does_not_need_pluggy() -> None:
    import ast

    from plugbroker import decisions

    tree = ast.parse(inspect.getsource(decisions))
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported == {"__future__", "collections.abc", "dataclasses", "typing"}

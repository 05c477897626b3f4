"""The web UI's sampler keeps to a bounded share of the loop's time."""

from __future__ import annotations

from plugbroker.admin_http import SAMPLE_SHARE, next_sample_delay


def test_samples_space_out_when_a_sample_is_costly() -> None:
    assert next_sample_delay(0.001, 5.0) == 5.0  # a few queues: every 5 s
    assert next_sample_delay(0.2, 5.0) == 0.2 / SAMPLE_SHARE == 20.0  # 1% of the loop at most
    assert next_sample_delay(0.0, 5.0) == 5.0


def test_history_forgets_deleted_queues_and_keeps_a_bounded_ring() -> None:
    from types import SimpleNamespace

    from plugbroker.admin import History
    from plugbroker.clock import ManualClock

    clock = ManualClock()

    def q(name: str, messages: int) -> SimpleNamespace:
        return SimpleNamespace(
            vhost="/", name=name, messages=messages, oldest_arrival=None, acks_total=0
        )

    queues = [q("a", 1), q("b", 2)]
    api = SimpleNamespace(clock=clock, queues=lambda: queues, connections=lambda: [])
    h = History(size=3)
    for i in range(5):
        queues[0].messages = i
        clock.advance(5)
        h.sample(api)  # type: ignore[arg-type]
    out = h.json()
    [a] = [r for r in out["queues"] if r["name"] == "a"]
    assert a["messages"] == [2, 3, 4] and len(out["broker"]["messages"]) == 3
    queues.pop()  # b deleted
    h.sample(api)  # type: ignore[arg-type]
    assert [r["name"] for r in h.json()["queues"]] == ["a"]

"""The requests SeaLLM's live search replays: the window's arrivals, not only its completed requests.

An overloaded service completes few of its requests; replaying only those made it look idle, so the
search gave it fewer GPUs the more it needed (seen on 16 emulated GPUs: the 13B service with half the
traffic got one GPU of sixteen)."""

from __future__ import annotations

from llmfleet.monitor.records import RequestSample
from llmfleet.monitor.stats import LengthStats, ServiceStats, WindowStats
from llmfleet_placement.workload import recent_requests


def stats(service: str, arrivals: int, completed: int, samples: list[tuple[float, int, int]]) -> ServiceStats:
    w = WindowStats(60.0, span_s=60.0, arrivals=arrivals, rate_rps=arrivals / 60, completed=completed)
    return ServiceStats(service, "m", (w,), tuple(RequestSample(t, p, o) for t, p, o in samples))


def test_unfinished_arrivals_are_replayed_with_the_services_mean_lengths() -> None:
    busy = stats("code", arrivals=10, completed=2, samples=[(45.0, 100, 10), (50.0, 300, 30)])
    calm = stats("chat", arrivals=2, completed=2, samples=[(41.0, 50, 5), (42.0, 70, 7)])
    rows = recent_requests([busy, calm], now=100.0, window_s=60.0)
    code = [r for r in rows if r[1] == "code"]
    assert len(code) == 10 and len([r for r in rows if r[1] == "chat"]) == 2
    extra = [r for r in code if r[0] not in (45.0, 50.0)]
    assert len(extra) == 8 and {(p, o) for _, _, p, o in extra} == {(200, 20)}
    assert all(40.0 <= t <= 100.0 for t, *_ in extra)  # evenly over the window's span
    assert rows == sorted(rows, key=lambda r: (r[0], r[1]))


def test_a_service_with_nothing_completed_uses_the_windows_means_or_is_skipped() -> None:
    w = WindowStats(
        60.0, span_s=30.0, arrivals=4, completed=1,
        prompt_tokens=LengthStats(1, 80.0), output_tokens=LengthStats(1, 9.0),
    )  # fmt: skip
    rows = recent_requests([ServiceStats("a", "m", (w,))], now=30.0, window_s=60.0)
    assert [(p, o) for _, _, p, o in rows] == [(80, 9)] * 3
    unknown = ServiceStats("b", "m", (WindowStats(60.0, span_s=30.0, arrivals=5),))
    assert recent_requests([unknown], now=30.0, window_s=60.0) == []

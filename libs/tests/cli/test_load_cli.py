"""``llmfleet load``: phases, Poisson arrivals, the summary (the live run is in integration_tests/test_up.py)."""

from __future__ import annotations

import argparse

import pytest
from llmfleet.cli.load import Outcome, Phase, arrival_times, interval_line, phases_of, summarize


def test_phase_parses_and_names_what_is_wrong() -> None:
    assert Phase.parse("chat:4:60") == Phase("chat", 4.0, 60.0)
    for bad, why in [
        ("chat:4", "SERVICE:RATE:SECONDS"),
        ("chat:x:60", "must be numbers"),
        ("chat:-1:5", "RATE >= 0"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            Phase.parse(bad)


def test_arrivals_are_poisson_per_phase_in_order_and_seeded() -> None:
    phases = [Phase("chat", 20.0, 50.0), Phase("summarize", 0.0, 10.0), Phase("summarize", 5.0, 40.0)]
    a = arrival_times(phases, seed=1)
    assert a == arrival_times(phases, seed=1) and a != arrival_times(phases, seed=2)
    chat = [t for t, s in a if s == "chat"]
    summ = [t for t, s in a if s == "summarize"]
    assert all(0 <= t < 50 for t in chat) and all(60 <= t < 100 for t in summ)
    assert 900 <= len(chat) <= 1100 and 150 <= len(summ) <= 250  # ±5 sd of Poisson(1000), (200)
    assert [t for t, _ in a] == sorted(t for t, _ in a)


def test_summary_counts_errors_engines_and_percentiles() -> None:
    outcomes = [Outcome("chat", True, 0.1 * i, 1.0 * i, f"engine-{i % 2}") for i in range(1, 11)]
    outcomes.append(Outcome("chat", False, error="UNAVAILABLE: no engine"))
    s = summarize(outcomes, sent=12)
    assert (s.sent, s.completed, s.errors) == (12, 10, 1)
    assert s.engines == {"engine-0": 5, "engine-1": 5}
    assert s.services["chat"]["latency_p50_s"] == pytest.approx(5.5)
    assert s.error_messages == {"UNAVAILABLE: no engine": 1}
    line = interval_line(5.0, outcomes, in_flight=3)
    assert "done   10" in line and "errors 1" in line and "engine-1" in line


def test_phases_from_flags() -> None:
    ns = argparse.Namespace(phase=None, service="chat", rate=2.0, duration=5.0)
    assert phases_of(ns) == [Phase("chat", 2.0, 5.0)]
    with pytest.raises(SystemExit, match="not both"):
        phases_of(argparse.Namespace(phase=[Phase("a", 1, 1)], service="chat", rate=1, duration=1))

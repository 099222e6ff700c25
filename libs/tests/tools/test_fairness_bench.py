"""The fairness bench's model (the shipped hold queues): a light key flooded by a 10x heavier one is
served its share and waits about one slot's turnover with vtc, where arrival order queues it behind
the whole backlog; a high priority is never refused under a low-priority flood."""

from __future__ import annotations

from tools.bench.fairness_bench import Setup, Stream, run, simulate

SETUP = Setup(duration_s=200.0)


def test_vtc_serves_a_light_key_ahead_of_a_heavy_backlog():
    light, heavy = Stream("light", 0.4), Stream("heavy", 4.0)
    alone = simulate([light], "vtc", SETUP)
    fair = simulate([light, heavy], "vtc", SETUP)
    fifo = simulate([light, heavy], "none", SETUP)
    assert len(fair.served["light"]) == len(alone.served["light"])  # none of its requests refused
    assert "light" not in fair.refused and fifo.refused["light"] > 0
    assert fair.p("light", 0.99) < fifo.p("light", 0.99) / 5
    assert fair.p("light", 0.99) < 2 * SETUP.output_tokens * SETUP.tpot_s  # about a slot's turnover


def test_a_low_priority_flood_refuses_only_the_low_priority():
    o = simulate([Stream("high", 0.4, priority=1), Stream("low", 4.0)], "vtc", SETUP)
    assert "high" not in o.refused and o.refused["low"] > 0


def test_the_report_names_its_goals():
    r = run(Setup(duration_s=50.0))
    assert set(r["goals"]) >= {"light_p99_ratio_vtc", "high_p99_ratio"}
    assert r["arms"][0]["arm"] == "light alone"

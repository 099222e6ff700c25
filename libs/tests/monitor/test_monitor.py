"""The service monitor: windows, rates, lengths, percentiles, SLO attainment, normalized latency,
bounded samples, services without traffic, and the fleet merge of several schedulers' reports."""

from __future__ import annotations

import math

import numpy as np
import pytest
from llmfleet.monitor import (
    Completion,
    FleetMonitor,
    FloorSolo,
    LengthStats,
    ServiceMonitor,
    merge_services,
)
from llmfleet.types import Slo

SLO = Slo(ttft_s=1.0, tpot_s=0.1)


def done(t: float, *, prompt=10, out=5, ttft=0.2, tpot=0.05, ok=True, service="a", model="m") -> Completion:
    """A request arriving at ``t`` that finished with these timings."""
    lat = ttft + max(out - 1, 0) * tpot
    return Completion(service, model, t, prompt, out, ttft, tpot, lat, ok)


def feed(m: ServiceMonitor, cs: list[Completion]) -> None:
    for c in sorted(cs, key=lambda c: c.arrival_s):
        m.arrive(c.service, c.model, c.arrival_s)
    for c in sorted(cs, key=lambda c: c.finish_s):
        m.complete(c)


def test_rates_per_window_and_observed_span():
    m = ServiceMonitor(windows_s=(10, 60, 300), start_s=0.0)
    for i in range(120):  # 2 rps for 60 s
        m.arrive("a", "m", i * 0.5)
    (s,) = m.stats(60.0)
    w10, w60, w300 = s.windows
    assert w10.window_s == 10 and w10.rate_rps == pytest.approx(2.0, rel=0.06)
    assert w60.arrivals == 120 and w60.rate_rps == pytest.approx(2.0)
    assert w300.span_s == 60 and w300.rate_rps == pytest.approx(2.0)  # observed 60 s of the 300
    # later: the burst leaves the short window first
    (s,) = m.stats(100.0)
    assert s.windows[0].arrivals == 0 and s.windows[0].rate_rps == 0
    assert s.windows[1].arrivals == pytest.approx(40, abs=1)  # (40, 60] of (0, 60)
    assert s.windows[2].rate_rps == pytest.approx(120 / 100)


def test_lengths_and_percentiles_match_numpy():
    rng = np.random.default_rng(1)
    prompts, outs = rng.integers(1, 500, 400), rng.integers(2, 200, 400)
    ttfts = rng.uniform(0.01, 2.0, 400)
    m = ServiceMonitor(windows_s=(10, 60, 300), start_s=0.0)
    cs = [done(i * 0.1, prompt=int(p), out=int(o), ttft=float(t)) for i, (p, o, t) in
          enumerate(zip(prompts, outs, ttfts, strict=True))]  # fmt: skip
    feed(m, cs)
    now = max(c.finish_s for c in cs)
    w = m.stats(now)[0].windows[-1]
    assert w.completed == 400 and w.failed == 0
    assert w.prompt_tokens.mean == pytest.approx(prompts.mean())
    assert w.prompt_tokens.std == pytest.approx(prompts.std())
    assert w.output_tokens.std == pytest.approx(outs.std())
    assert (w.ttft_s.p50, w.ttft_s.p90, w.ttft_s.p99) == pytest.approx(
        tuple(np.percentile(ttfts, [50, 90, 99]))
    )
    lat = [c.latency_s for c in cs]
    assert w.latency_s.p99 == pytest.approx(np.percentile(lat, 99)) and w.latency_s.mean == pytest.approx(
        np.mean(lat)
    )
    # the 10 s window holds only the completions of its last 10 s
    short = m.stats(now)[0].windows[0]
    assert short.completed == sum(1 for c in cs if c.finish_s > now - 10)


def test_attainment_ttft_tpot_deadline_and_failures():
    slo = Slo(ttft_s=1.0, tpot_s=0.1, deadline_s=3.0)
    cs = [
        done(0.0),  # meets everything
        done(0.1, ttft=1.5),  # ttft miss
        done(0.2, tpot=0.2),  # tpot miss
        done(0.3, out=40, tpot=0.09),  # latency 0.2 + 39 * 0.09 = 3.71 > deadline 3
        done(0.4, ok=False),  # failed: misses every objective, not in the distributions
    ]
    m = ServiceMonitor(solo=lambda c: 0.0)  # no solo estimate: the latency rule does not apply
    feed(m, cs)
    w = m.stats(10.0, {"a": slo})[0].windows[0]
    assert (w.completed, w.failed, w.finished) == (4, 1, 5)
    assert w.slo_met == 1 and w.attainment == pytest.approx(0.2)
    assert w.ttft_tpot_met == 2  # the first and the deadline miss
    assert w.latency_met == 4 and w.normalized_latency is None
    assert w.ttft_s.count == 4


def test_latency_rule_with_a_given_solo_time_and_normalized_latency():
    solo = {0.0: 1.0, 1.0: 1.0, 2.0: 2.0}  # by arrival
    cs = [done(0.0, ttft=0.5, out=1), done(1.0, ttft=6.0, out=1), done(2.0, ttft=4.0, out=1)]
    m = ServiceMonitor(solo=lambda c: solo[c.arrival_s])
    feed(m, cs)
    w = m.stats(9.0, {"a": Slo(ttft_s=10.0, tpot_s=1.0, latency_scale=5.0)})[0].windows[0]
    # 0.5 <= 5x1, 6.0 > 5x1, 4.0 <= 5x2
    assert w.latency_met == 2 and w.slo_met == 2 and w.ttft_tpot_met == 3
    # L̂ = mean solo = 4/3; normalized = mean(latency) / L̂
    assert w.normalized_latency == pytest.approx((0.5 + 6.0 + 4.0) / 3 / (4 / 3))


def test_floor_solo_model():
    cs = [
        done(0.0, ttft=0.3, out=11, tpot=0.05),
        done(1.0, ttft=0.9, out=3, tpot=0.02),
        done(2.0, ttft=0.1, out=1),
    ]
    floor = FloorSolo.fit(
        np.array([c.ttft_s for c in cs]),
        np.array([c.tpot_s for c in cs]),
        np.array([c.output_tokens for c in cs]),
    )
    assert (floor.ttft_s, floor.tpot_s) == (0.1, 0.02)  # one-token requests have no decode step
    assert floor(cs[0]) == pytest.approx(0.1 + 10 * 0.02)
    m = ServiceMonitor()
    feed(m, cs)
    w = m.stats(10.0, {"a": SLO})[0].windows[0]
    solos = [0.1 + 10 * 0.02, 0.1 + 2 * 0.02, 0.1]
    lats = [c.latency_s for c in cs]
    assert w.latency_met == sum(lat <= 5 * s for lat, s in zip(lats, solos, strict=True))
    assert w.normalized_latency == pytest.approx(np.mean(lats) / np.mean(solos))


def test_service_without_traffic_never_crashes():
    m = ServiceMonitor()
    assert m.stats(0.0) == []
    (s,) = m.stats(5.0, {"idle": SLO})
    assert s.service == "idle" and all(w.rate_rps == 0 and w.attainment is None for w in s.windows)
    (load,) = m.loads(5.0, {"idle": SLO}, models={"idle": "llama-7b"})
    assert (load.name, load.model, load.rate_rps, load.attainment, load.normalized_latency) == (
        "idle", "llama-7b", 0.0, None, None,
    )  # fmt: skip
    assert load.mean_prompt_tokens == load.std_output_tokens == 0.0 and load.slo == SLO
    # only arrivals (nothing finished yet): a rate, no attainment
    m.arrive("busy", "m", 1.0)
    (load,) = m.loads(2.0, {"busy": SLO})
    assert load.rate_rps > 0 and load.attainment is None and load.model == "m"
    assert FleetMonitor().loads(1.0, {"x": SLO})[0].rate_rps == 0.0


def test_loads_take_lengths_from_a_longer_window_when_the_window_is_empty():
    m = ServiceMonitor(windows_s=(10, 60, 300), start_s=0.0)
    feed(m, [done(0.0, prompt=100, out=20), done(1.0, prompt=300, out=40)])
    (load,) = m.loads(100.0, {"a": SLO}, window_s=60)  # nothing in the last 60 s
    assert load.rate_rps == 0 and load.attainment is None
    assert load.mean_prompt_tokens == 200 and load.std_prompt_tokens == 100 and load.mean_output_tokens == 30
    (load,) = m.loads(30.0, {"a": SLO}, window_s=60)
    assert load.rate_rps == pytest.approx(2 / 30) and load.attainment == 1.0


def test_samples_are_bounded_and_most_recent():
    m = ServiceMonitor(max_samples=50, windows_s=(10, 60, 300), start_s=0.0)
    cs = [done(i * 0.1, prompt=i) for i in range(200)]
    feed(m, cs)
    (s,) = m.stats(30.0)
    assert len(s.samples) == 50 and not s.samples_complete
    assert [x.prompt_tokens for x in s.samples] == list(range(150, 200))  # ascending arrival
    m2 = ServiceMonitor(max_samples=512)
    feed(m2, cs)
    (s2,) = m2.stats(30.0)
    assert len(s2.samples) == 200 and s2.samples_complete
    # failed requests are no samples; old ones leave with the longest window
    m2.complete(done(25.0, ok=False))
    assert len(m2.stats(30.0)[0].samples) == 200
    assert m2.stats(30.0 + 300.0) == []  # idle for longer than the longest window: forgotten


def test_events_are_bounded():
    m = ServiceMonitor(max_events=100, start_s=0.0)
    feed(m, [done(i * 0.01) for i in range(1000)])
    assert m.stats(11.0)[0].windows[-1].completed == 100


def test_merge_of_disjoint_reporters_equals_one_monitor():
    rng = np.random.default_rng(7)
    cs = [done(i * 0.05, prompt=int(rng.integers(1, 300)), out=int(rng.integers(1, 60)),
               ttft=float(rng.uniform(0.05, 1.5)), ok=bool(rng.random() > 0.05)) for i in range(600)]  # fmt: skip
    whole, a, b = (ServiceMonitor(start_s=0.0, solo=lambda c: 0.5) for _ in range(3))
    feed(whole, cs)
    feed(a, cs[0::3])
    feed(b, [c for i, c in enumerate(cs) if i % 3])
    now = 40.0
    merged = merge_services([a.stats(now)[0], b.stats(now)[0]])
    ref = whole.stats(now)[0]
    for mw, rw in zip(merged.windows, ref.windows, strict=True):
        assert mw.window_s == rw.window_s
        assert (mw.arrivals, mw.completed, mw.failed, mw.slo_met) == (
            rw.arrivals,
            rw.completed,
            rw.failed,
            rw.slo_met,
        )
        assert mw.rate_rps == pytest.approx(rw.rate_rps)
        assert mw.prompt_tokens.mean == pytest.approx(rw.prompt_tokens.mean)
        assert mw.prompt_tokens.std == pytest.approx(rw.prompt_tokens.std)
        assert mw.output_tokens.std == pytest.approx(rw.output_tokens.std)
        assert mw.latency_s.mean == pytest.approx(rw.latency_s.mean)
        assert mw.normalized_latency == pytest.approx(rw.normalized_latency)
        if rw.completed:  # percentiles: those of the reporter with the most completions (b, 2/3)
            assert mw.ttft_s.p90 == b.stats(now)[0].window(mw.window_s).ttft_s.p90
    # 570 completed, bound 512: the merged samples are the whole monitor's (the most recent arrivals)
    assert merged.samples == ref.samples and len(ref.samples) == 512 and not merged.samples_complete


def test_merge_cuts_samples_to_the_common_span():
    a, b = ServiceMonitor(max_samples=10, start_s=0.0), ServiceMonitor(max_samples=10, start_s=0.0)
    feed(a, [done(i * 0.1) for i in range(100)])  # busy: its 10 samples cover the last second
    feed(b, [done(i * 1.0) for i in range(10)])  # quiet: all of its requests
    merged = merge_services([a.stats(20.0)[0], b.stats(20.0)[0]], max_samples=10)
    assert min(x.arrival_s for x in merged.samples) >= 9.0 and not merged.samples_complete
    assert len(merged.samples) == 10


def test_length_stats_merge_is_exact():
    x, y = [1.0, 2.0, 9.0], [4.0, 4.0]
    merged = LengthStats.merge([LengthStats.of(x), LengthStats(), LengthStats.of(y)])
    assert merged.count == 5 and merged.mean == pytest.approx(np.mean(x + y))
    assert merged.std == pytest.approx(np.std(x + y))


def test_fleet_monitor_merges_fresh_reports_and_forgets_stale_ones():
    a, b = ServiceMonitor(start_s=0.0), ServiceMonitor(start_s=0.0)
    feed(a, [done(i * 0.5) for i in range(20)])
    feed(b, [done(i * 0.5, service="b") for i in range(10)] + [done(i * 0.5) for i in range(20)])
    fleet = FleetMonitor(stale_after_s=5.0)
    fleet.update("s1", a.stats(10.0), now=100.0)
    fleet.update("s2", b.stats(10.0), now=102.0)
    (la, lb) = fleet.loads(103.0, {"a": SLO, "b": SLO})
    assert la.rate_rps == pytest.approx(2 * a.stats(10.0)[0].window().rate_rps)
    assert lb.rate_rps == pytest.approx(b.stats(10.0)[1].window().rate_rps) and lb.attainment == 1.0
    assert [r.source for r in fleet.sources(103.0)] == ["s1", "s2"]
    (la, _) = fleet.loads(106.0, {"a": SLO, "b": SLO})  # s1 is stale now
    assert [r.source for r in fleet.sources(106.0)] == ["s2"]
    assert la.rate_rps == pytest.approx(a.stats(10.0)[0].window().rate_rps)
    assert fleet.age_s(106.0) == pytest.approx(4.0) and math.isinf(FleetMonitor().age_s(0.0))
    fleet.update("slow", a.stats(10.0), now=100.0, interval_s=4.0)  # stale after 3 x 4 s, not 5 s
    assert [r.source for r in fleet.sources(111.0)] == ["slow"]
    with pytest.raises(ValueError, match="source"):
        fleet.update("", [], 0.0)


@pytest.mark.parametrize("windows", [(), (0,), (10, 10), (-1, 5), (math.inf,)])
def test_bad_windows_are_refused(windows):
    with pytest.raises(ValueError, match="windows"):
        ServiceMonitor(windows_s=windows)

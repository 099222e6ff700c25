"""Aladdin in the simulator: measured per-request progress on the candidates (constraint (d)) and the
rebalancing loop (Algorithm 2) carried out with ``Simulator.move_request``."""

from __future__ import annotations

import pytest
from llmfleet.policies.dispatch import DispatchNeeds, EngineCandidate, Rebalancer
from llmfleet.sim.candidates import progress_of
from llmfleet.sim.migration import RebalanceLoop
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload import WorkloadRequest as W


class ProgressProbe:
    """Round robin over the candidates that records the progress each dispatch sees."""

    name = "probe"
    needs = DispatchNeeds(reads_progress=True)

    def __init__(self) -> None:
        self.seen: list[tuple[float, str, tuple]] = []
        self.k = 0

    def choose(self, model, candidates: list[EngineCandidate], exclude=frozenset(), request=None) -> str:
        for c in candidates:
            assert c.requests is not None
            rows = tuple(
                sorted((q.request_id, q.generated_tokens, round(q.first_token_s, 9)) for q in c.requests)
            )
            self.seen.append((request.arrival_s, c.engine_id, rows))
        self.k += 1
        return sorted(c.engine_id for c in candidates)[self.k % len(candidates)]


def _workload() -> list[W]:
    return [W(f"r{i}", 0.37 * i, 50 + 13 * i, 120 + 7 * (i % 5), "s") for i in range(12)]


def test_progress_seen_mid_chunk_equals_the_step_by_step_run(tiny):
    """With fast-forward, decode iterations run as chunks; the tokens a dispatch sees are those of the
    chunk's iterations ended by the dispatch time, exactly what iterating one by one gives."""
    runs = []
    for ff in (True, False):
        probe = ProgressProbe()
        res = tiny.sim(instances=2, dispatch=probe, fast_forward=ff).run(_workload())
        runs.append((probe.seen, res))
    (seen_ff, res_ff), (seen_step, res_step) = runs
    assert seen_ff == seen_step
    assert [r.finish_s for r in res_ff.records] == [r.finish_s for r in res_step.records]
    tokens = [g for _, _, rows in seen_ff for _, g, _ in rows]
    assert tokens and max(tokens) > 2  # requests were seen mid-decode
    first = {r.request_id: r.first_token_s for r in res_ff.records}
    out = {r.request_id: r.output_tokens for r in res_ff.records}
    for t, _, rows in seen_ff:
        for rid, g, f in rows:
            assert f == round(first[rid], 9) and f <= t and 1 <= g < out[rid]


class FreshnessProbe(ProgressProbe):
    """Checks that every candidate a dispatch sees is what the instance looks like now, built afresh."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = None
        self.checked = 0

    def choose(self, model, candidates: list[EngineCandidate], exclude=frozenset(), request=None) -> str:
        for c in candidates:
            inst = self.sim.instances[c.engine_id]
            assert c.requests == progress_of(inst, self.sim.now)
            assert (c.running, c.waiting, c.kv_used_bytes) == (
                len(inst.running), len(inst.waiting), inst.kv_used_bytes
            )  # fmt: skip
            self.checked += 1
        return super().choose(model, candidates, exclude, request)


def test_each_dispatch_sees_every_instance_as_it_is_now(tiny):
    probe = FreshnessProbe()
    sim = probe.sim = tiny.sim(instances=2, dispatch=probe)
    res = sim.run(_workload())  # arrivals far apart: chunks end iterations between dispatches
    assert probe.checked >= len(res.records) and all(r.done for r in res.records)
    assert max(g for _, _, rows in probe.seen for _, g, _ in rows) > 2  # seen mid-decode


class FixedMoves:
    """Sends everything to i0; its rebalance asks to move ``moves`` once."""

    name = "fixed"
    needs = DispatchNeeds()

    def __init__(self, moves) -> None:
        self.moves = list(moves)
        self.applied: list[tuple[str, str, float]] = []

    def choose(self, model, candidates, exclude=frozenset(), request=None) -> str:
        return "i0"

    def rebalance(self, now: float):
        out, self.moves = self.moves, []
        return out

    def apply_move(self, request_id: str, to_engine: str, now: float) -> None:
        self.applied.append((request_id, to_engine, now))


def test_rebalance_loop_moves_queued_requests_only(tiny):
    """i0 runs one request at a time: b and c queue behind a. At the first epoch (t = 1) the policy
    moves b (queued: moved at once, prompt only) and a (decoding: Aladdin never moves a started
    request, skipped) to i1."""
    policy = FixedMoves([("b", "i0", "i1"), ("a", "i0", "i1"), ("gone", "i0", "i1")])
    assert isinstance(policy, Rebalancer)
    sim = tiny.sim(engine=EngineSettings(max_running=1, max_batch_requests=1), instances=2, dispatch=policy)
    loop = RebalanceLoop(policy, 1.0)
    loop.install(sim)
    res = sim.run([W("a", 0.0, 100, 200, "s"), W("b", 0.1, 100, 20, "s"), W("c", 0.2, 100, 20, "s")])
    rec = {r.request_id: r for r in res.records}
    assert policy.applied == [("b", "i1", 1.0)]
    assert rec["b"].instance == "i1" and rec["b"].moves == 1 and rec["b"].done
    assert rec["a"].instance == "i0" and rec["a"].moves == 0
    assert rec["b"].first_token_s < rec["c"].first_token_s  # b no longer waits for a on i0
    st = loop.stats
    assert (st.planned, st.executed, st.skipped) == (3, 1, 2) and st.epochs >= 1


def test_attainment_at_p100_and_p99():
    """The percentile of max(TTFT/T_pre, ATGT/T_dec): met at P_q iff ≥ q % of the requests attain."""
    from llmfleet.sim.metrics import aladdin_ratio, attainment_at, request_metrics
    from llmfleet.sim.records import RequestRecord
    from llmfleet.sim.spec import SimService
    from llmfleet.types import Slo

    slo = Slo(ttft_s=1.0, tpot_s=0.1)
    recs = []
    for i in range(200):
        r = RequestRecord(f"r{i}", "s", "m", 0.0, 10, 11)
        r.first_token_s, r.finish_s = 0.5, 0.5 + 10 * 0.05  # TTFT 0.5 s, ATGT 50 ms: ratio 0.5
        recs.append(r)
    recs[0].finish_s = 0.5 + 10 * 0.12  # ATGT 120 ms: ratio 1.2
    assert aladdin_ratio(recs[0], slo) == pytest.approx(1.2) and aladdin_ratio(recs[1], slo) == pytest.approx(
        0.5
    )
    slos = {"s": slo}
    p100, p99 = attainment_at(recs, slos, 100), attainment_at(recs, slos, 99)
    assert not p100["met"] and p100["ratio"] == pytest.approx(1.2)
    assert p99["met"] and p99["ratio"] == pytest.approx(0.5)  # 199 of 200 attain
    recs[1].first_token_s, recs[1].finish_s = 1.6, 2.1  # a 2nd miss (TTFT 1.6 s): 198/200 = 99 % meet P99
    assert attainment_at(recs, slos, 99)["met"]
    recs[2].failed = "boom"  # a third: 197/200 < 99 %
    assert attainment_at(recs, slos, 99) == {
        "pct": 99,
        "ratio": pytest.approx(1.2),
        "met": False,
    }  # 198th of 200
    m = request_metrics(recs, [SimService("s", "m", slo)])
    assert m["aladdin_at"]["p99"]["met"] is False and m["aladdin_at"]["p100"]["ratio"] == float("inf")
    assert attainment_at(recs, {"s": Slo()}, 99) is None


class BeatProbe:
    """Round robin that records when each request is dispatched, with a scheduling heartbeat."""

    name = "beat"
    needs = DispatchNeeds()

    def __init__(self, heartbeat_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.at: list[tuple[str, float]] = []

    def choose(self, model, candidates, exclude=frozenset(), request=None) -> str:
        self.at.append((request.request_id, request.arrival_s))
        return sorted(c.engine_id for c in candidates)[len(self.at) % len(candidates)]


def test_heartbeat_places_arrivals_at_the_next_beat_and_ttft_counts_from_arrival(tiny):
    wl = [
        W("a", 0.01, 50, 5, "s"),
        W("b", 0.04, 50, 5, "s"),
        W("c", 0.05, 50, 5, "s"),
        W("d", 0.07, 50, 5, "s"),
    ]
    base = tiny.sim(instances=2, dispatch=BeatProbe(0.0)).run(wl)
    probe = BeatProbe(0.05)
    res = tiny.sim(instances=2, dispatch=probe, fast_forward=False).run(wl)
    # a, b wait for the beat at 0.05 (c arrives on it), d for 0.10; in arrival order
    assert [rid for rid, _ in probe.at] == ["a", "b", "c", "d"]
    assert [t for _, t in probe.at] == pytest.approx([0.05, 0.05, 0.05, 0.10])
    rec = {r.request_id: r for r in res.records}
    before = {r.request_id: r for r in base.records}
    assert {r: rec[r].arrival_s for r in rec} == {r: before[r].arrival_s for r in before}  # TTFT from arrival
    assert rec["a"].ttft_s >= 0.04 - 1e-9 and rec["d"].ttft_s >= 0.03 - 1e-9
    assert rec["a"].ttft_s > before["a"].ttft_s

"""A pure iteration-level loop (fake costs, paged KV accounting, preemption by recompute) that drives each
request policy through the full calling contract, as the engine and the simulator will."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from llmfleet.policies.request import (
    BatchLimits,
    DoublingBudget,
    DoublingBudgetOptions,
    Fcfs,
    PoolView,
    RequestPolicy,
    SchedRequest,
    stuck_requests,
)

TPB = 16
PREFILL_BASE_S, PREFILL_TOKEN_S, DECODE_S = 0.010, 0.001, 0.005


@dataclass(frozen=True)
class Job:
    rid: str
    service: str
    model: str
    arrival: float
    prompt: int
    output: int

    @property
    def exec_s(self) -> float:
        """Execution time alone: one prefill (which yields the first token), then output - 1 decodes."""
        return PREFILL_BASE_S + PREFILL_TOKEN_S * self.prompt + DECODE_S * (self.output - 1)


@dataclass
class Result:
    finish: dict[str, float] = field(default_factory=dict)
    batches: list[tuple[str, str, tuple[str, ...], frozenset[str]]] = field(default_factory=list)
    preemptions: int = 0


def blocks(tokens: int) -> int:
    return -(-tokens // TPB)


def simulate(policy: RequestPolicy, jobs: list[Job], total_blocks: int, limits: BatchLimits) -> Result:
    watermark = 2
    pending = sorted(jobs, key=lambda j: (j.arrival, j.rid))
    waiting: list[SchedRequest] = []
    running: list[SchedRequest] = []
    held: dict[str, int] = {}
    out = Result()
    now = 0.0

    def free() -> int:
        return total_blocks - sum(held.values())

    def preempt(v: SchedRequest) -> None:
        held.pop(v.request_id)
        running.remove(v)
        v.prompt_tokens += v.generated  # recompute: re-prefill everything it had
        v.max_new_tokens -= v.generated
        v.generated, v.phase = 0, "prefill"
        waiting.append(v)
        out.preemptions += 1

    for _ in range(100_000):
        while pending and pending[0].arrival <= now:
            j = pending.pop(0)
            r = SchedRequest(j.rid, j.service, j.model, j.arrival, j.prompt, j.output)
            policy.on_arrival(r, now)
            waiting.append(r)
        if not (pending or waiting or running):
            return out
        pool = PoolView(free(), watermark, {"m-short": TPB, "m-long": TPB})
        snapshot = (tuple(waiting), tuple(running))
        batch = policy.next_batch(snapshot[0], snapshot[1], pool, limits, now)
        assert snapshot == (tuple(waiting), tuple(running))  # queues untouched
        if batch is None:
            assert not stuck_requests(waiting, running, pool)
            assert pending, "nothing can run and nothing will arrive"
            now = pending[0].arrival
            continue
        by_id = {r.request_id: r for r in (*waiting, *running)}
        members = [by_id[i] for i in batch.request_ids]
        prefills = [r for r in members if r in waiting]
        decodes = [r for r in members if r in running]
        assert len(members) == len(set(batch.request_ids)) <= limits.max_requests
        assert {r.model for r in members} == {batch.model}
        want = {"prefill": (True, False), "decode": (False, True), "mixed": (True, True)}[batch.phase]
        assert (bool(prefills), bool(decodes)) == want
        need = sum(blocks(r.prompt_tokens + 1) for r in prefills)
        assert need <= pool.available_blocks  # never over-admitted
        assert len(prefills) <= 1 or sum(r.prompt_tokens for r in prefills) <= limits.max_prefill_tokens
        out.batches.append(
            (batch.model, batch.phase, batch.request_ids, frozenset(r.service for r in members))
        )
        for r in prefills:
            waiting.remove(r)
            running.append(r)
            held[r.request_id] = blocks(r.prompt_tokens + 1)
        ran_decodes = []
        for r in decodes:  # each decode appends one token; preempt when the pool is exhausted
            if r.request_id not in held:
                continue  # preempted by an earlier append of this iteration
            extra = blocks(r.context_tokens + 1) - held[r.request_id]
            while extra > free():
                victim = policy.preemption_victim(tuple(running), now)
                preempt(victim)
                if victim in ran_decodes:
                    ran_decodes.remove(victim)
                if victim is r:
                    break
            if r.request_id in held:
                held[r.request_id] += extra
                ran_decodes.append(r)
        ran = [*prefills, *ran_decodes]
        duration = (PREFILL_BASE_S + PREFILL_TOKEN_S * sum(r.prompt_tokens for r in prefills)) * bool(
            prefills
        )
        duration += DECODE_S * bool(ran_decodes)
        if not ran:
            continue
        now += duration
        for r in prefills:
            r.phase, r.generated = "decode", 1
        for r in ran_decodes:
            r.generated += 1
        ran_batch = type(batch)(batch.model, batch.phase, tuple(r.request_id for r in ran))
        policy.on_iteration(ran_batch, duration, now, ran)
        for r in ran:
            if r.generated >= r.max_new_tokens:
                running.remove(r)
                held.pop(r.request_id)
                policy.on_finish(r, now)
                out.finish[r.request_id] = now
    raise AssertionError("simulation did not finish")


def burst_then_short() -> list[Job]:
    """SeaLLM's motivating case: a burst of long requests, then a stream of short ones."""
    longs = [Job(f"L{i:02d}", "long", "m-long", 0.001 * i, 300, 120) for i in range(12)]
    shorts = [Job(f"S{i:02d}", "short", "m-short", 0.05 + 0.04 * i, 24, 6) for i in range(40)]
    return longs + shorts


def mean_service_exec(jobs: list[Job]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for j in jobs:
        out.setdefault(j.service, []).append(j.exec_s)
    return {s: sum(v) / len(v) for s, v in out.items()}


def normalized_latency(jobs: list[Job], res: Result) -> float:
    ref = mean_service_exec(jobs)
    return sum((res.finish[j.rid] - j.arrival) / ref[j.service] for j in jobs) / len(jobs)


def seeded_db(admission: str = "mixed") -> DoublingBudget:
    """DB with service statistics seeded from profiling, as the engine does via observe()."""
    db = DoublingBudget(DoublingBudgetOptions(admission=admission))
    for svc, mean in mean_service_exec(burst_then_short()).items():
        db.observe(svc, 0.9 * mean)
        db.observe(svc, 1.1 * mean)
    return db


LIMITS = BatchLimits(max_requests=32, max_prefill_tokens=512)


@pytest.mark.parametrize("admission", ["mixed", "prefill_first", "literal"])
def test_db_beats_fcfs_on_a_long_burst_before_short_requests(admission):
    jobs = burst_then_short()
    fcfs = simulate(Fcfs(), jobs, total_blocks=4000, limits=LIMITS)
    db = simulate(seeded_db(admission), jobs, total_blocks=4000, limits=LIMITS)
    assert set(fcfs.finish) == set(db.finish) == {j.rid for j in jobs}
    for _, phase, _, services in db.batches:  # one service per batch; one phase unless mixed
        assert len(services) == 1 and (admission == "mixed" or phase in ("prefill", "decode"))
    assert any(phase == "mixed" for _, phase, _, _ in fcfs.batches)  # fcfs mixes models' phases
    nl_fcfs, nl_db = normalized_latency(jobs, fcfs), normalized_latency(jobs, db)
    assert nl_db < 0.5 * nl_fcfs, (nl_db, nl_fcfs)


@pytest.mark.parametrize("make", [Fcfs, seeded_db, DoublingBudget], ids=["fcfs", "db", "db-unseeded"])
def test_everything_finishes_under_kv_pressure(make):
    jobs = burst_then_short()
    # the whole burst is admitted as the pool allows (19 blocks each), then grows to 27 blocks each
    res = simulate(make(), jobs, total_blocks=120, limits=BatchLimits(max_prefill_tokens=4096))
    assert set(res.finish) == {j.rid for j in jobs}
    assert res.preemptions > 0


def test_db_simulation_is_deterministic():
    jobs = burst_then_short()
    a = simulate(seeded_db(), jobs, total_blocks=120, limits=BatchLimits())
    b = simulate(seeded_db(), jobs, total_blocks=120, limits=BatchLimits())
    assert a.batches == b.batches and a.finish == b.finish

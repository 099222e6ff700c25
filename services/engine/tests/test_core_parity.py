"""Parity: the live executor and the simulator drive the same engine core to the same decisions.

One arrival sequence (mixed lengths, two models, a pool small enough to force preemption) runs
through (a) the live ``Executor`` — its real worker thread, core calls, KV slots and streaming — with a
deterministic fake forward that advances a fake clock by the cost model's iteration time, and (b) a
``SimInstance`` with the same pool, limits and cost model (fast-forward on, so chunks and their
truncation by arrivals are exercised). A spy around each side's policy records every decision: each
iteration's batch (model, phase, members, end time), each preemption victim, each finish, each static
batch. The two records must be identical. Any change to either loop alone — the executor's or the
simulator's — shows up here as a difference.

The prompts of a service share its system prompt (workload content, the same token ids on both sides),
so prefix caching hits: both sides' steps prefill only the uncached tokens, and the fake forward
prices the tokens the live executor actually feeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from llmfleet.costmodel import hardware, model_arch
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement import InstancePlan
from llmfleet.policies.request import DoublingBudget, Fcfs, LongestPrefix
from llmfleet.sim.cost import CostBook
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import ModelSpec
from llmfleet.workload import WorkloadRequest
from llmfleet.workload.prompts import prompt_token_ids
from llmfleet_engine import executor as executor_module
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.validation import build_request

MODELS = ("tiny-llama", "tiny-qwen2")
SERVICES = {"tiny-llama": "chat", "tiny-qwen2": "code"}
BLOCK_BYTES = 16 * 1152  # 16 tokens of tiny-qwen2 (the larger KV per token), as the simulator lays it out
KV_BLOCKS = 8
LIMITS = {"max_running": 6, "max_batch_requests": 5, "max_prefill_tokens": 96, "watermark": 0.0}
TOKEN = 7  # the fake forward always picks this (never EOS): requests end at max_tokens
SYSTEM_TOKENS = 40  # each service's system prompt: one full block of tiny-llama (36), two of tiny-qwen2 (16)

# (id, arrival in decode-step units, model, prompt tokens, output tokens): r0 keeps the engine busy
# until every arrival (the live side submits arrivals from inside a running forward)
OFFSETS = [
    ("r0", 0.0, "tiny-llama", 20, 160),
    ("r1", 3.5, "tiny-qwen2", 40, 30),
    ("r2", 7.25, "tiny-llama", 70, 45),
    ("r3", 9.0, "tiny-qwen2", 12, 60),
    ("r4", 15.5, "tiny-llama", 33, 25),
    ("r5", 22.0, "tiny-qwen2", 55, 40),
    ("r6", 31.75, "tiny-llama", 9, 70),
    ("r7", 40.0, "tiny-qwen2", 25, 20),
    ("r8", 40.5, "tiny-llama", 48, 35),
    ("r9", 52.0, "tiny-qwen2", 30, 50),
]


def arrivals(unit: float) -> list[tuple[str, float, str, int, int]]:
    return [(rid, off * unit, m, p, o) for rid, off, m, p, o in OFFSETS]


def workload_request(rid: str, t: float, service: str, prompt: int, output: int) -> WorkloadRequest:
    """A request whose prompt is its service's system prompt, then (when longer) a part of its own."""
    system = min(prompt, SYSTEM_TOKENS)
    parts = ((int(rid[1:]) + 1, prompt - system),) if prompt > system else ()
    return WorkloadRequest(rid, t, prompt, output, service, system_tokens=system, parts=parts)


def decode_step_s() -> float:
    cost = CostBook.build(hardware("cpu"), {m: model_arch(m) for m in MODELS})
    return cost.model("tiny-llama", 1).iteration(0, 0, 1, 30)


class Spy:
    """Delegates to ``inner`` and records its decisions (the same on both sides, or the test fails)."""

    def __init__(self, inner: Any, log: list) -> None:
        self._inner, self._log = inner, log
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:  # everything not recorded (next_batch, stable_until, ...)
        return getattr(self._inner, name)

    def on_iteration(self, batch, duration_s, now, requests) -> None:
        self._log.append(("iter", batch.model, batch.phase, tuple(sorted(batch.request_ids)), now))
        self._inner.on_iteration(batch, duration_s, now, requests)

    def on_iterations(self, batch, durations_s, now, requests) -> None:
        for i in range(len(durations_s)):  # one record per iteration, as the live engine runs them
            phase = batch.phase if i == 0 else "decode"
            self._log.append(("iter", batch.model, phase, tuple(sorted(batch.request_ids)), None))
        self._log[-1] = (*self._log[-1][:4], now)
        if hasattr(self._inner, "on_iterations"):
            self._inner.on_iterations(batch, durations_s, now, requests)
        else:
            self._inner.on_iteration(batch, float(sum(durations_s)), now, requests)

    def preemption_victim(self, running, now):
        victim = self._inner.preemption_victim(running, now)
        self._log.append(("preempt", victim.request_id, now))
        return victim

    def on_finish(self, req, now) -> None:
        self._log.append(("finish", req.request_id, now))
        self._inner.on_finish(req, now)

    def form_batch(self, waiting, pool, limits, now):
        sb = self._inner.form_batch(waiting, pool, limits, now)
        if sb is not None:
            self._log.append(("static", sb.model, tuple(sb.request_ids), sb.max_iterations))
        return sb

    def on_batch_done(self, batch, duration_s, now, requests) -> None:
        self._log.append(("static_done", tuple(sorted(batch.request_ids))))
        self._inner.on_batch_done(batch, duration_s, now, requests)


def normalise(log: list) -> list:
    """Chunked iterations carry their end time only on the last record: drop the times of iteration
    records (the finish, preemption and last-iteration times still pin the timeline) when comparing a
    chunked run; exact times are compared on the unchunked run."""
    return [(*e[:4], None) if e[0] == "iter" else e for e in log]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def perf_counter(self) -> float:
        return self.t

    def time(self) -> float:
        return time.time()


class FakeRunner:
    """The forward: the cost model's iteration time on the fake clock, logits picking ``TOKEN``; at
    the iteration's end it submits the requests that arrived meanwhile (arrival order, each at its time).
    ``plans`` holds the plans the executor scheduled (the latest one is the step being run): it tells
    a prefill's step from a decode's, whose tokens are priced as fed."""

    def __init__(
        self, clock: FakeClock, cost, vocab: int, on_tick: Callable[[float, float], None], plans: list
    ) -> None:
        self.clock, self.cost, self.vocab, self.on_tick, self.plans = clock, cost, vocab, on_tick, plans

    def forward(self, steps) -> torch.Tensor:
        plan = self.plans[-1]
        prefills = {id(r) for r in plan.prefills}
        prefill = prefill_sq = decodes = ctx = 0
        for r, s in zip(plan.members, steps, strict=True):
            if id(r) in prefills:
                n, cached = len(s.token_ids), s.start_pos  # the tokens after the cached prefix
                assert n + cached == r.sched.prompt_tokens
                prefill += n
                prefill_sq += n * (n + 2 * cached)
            else:
                decodes += 1
                ctx += s.start_pos + 1
        start = self.clock.t
        end = start + self.cost.iteration(prefill, prefill_sq, decodes, ctx)
        self.on_tick(start, end)
        self.clock.t = end
        logits = torch.zeros(len(steps), self.vocab)
        logits[:, TOKEN] = 1.0
        return logits


def run_sim(
    make_policy: Callable[[], Any], arrive: list, kv_bytes: int, fast_forward: bool
) -> tuple[list, Any]:
    log: list = []
    spec = SimSpec(
        ClusterSpec.parse("1xcpu"),
        tuple(SimService(SERVICES[m], m, max_tokens=1) for m in MODELS),
        EngineSettings(block_tokens=16, kv_bytes=kv_bytes, static_release="eos", **LIMITS),
    )
    cost = CostBook.build(spec.cluster.hw, spec.archs())
    sim = Simulator(
        spec,
        [InstancePlan("e0", MODELS, 1)],
        lambda: Spy(make_policy(), log),
        RoundRobin(),
        cost,
        fast_forward=fast_forward,
    )
    reqs = [workload_request(rid, t, SERVICES[m], p, o) for rid, t, m, p, o in arrive]
    res = sim.run(reqs, strict_services=True)
    assert [r.failed for r in res.records if r.failed] == []
    return log, sim.instances["e0"]


async def run_live(policy: str, options: dict, arrive: list, tmp_path, monkeypatch) -> tuple[list, Executor]:
    log: list = []
    clock = FakeClock()
    monkeypatch.setattr(executor_module, "time", clock)
    hw = hardware("cpu")
    cost = CostBook.build(hw, {m: model_arch(m) for m in MODELS})
    loop = asyncio.get_running_loop()
    pending = list(arrive[1:])
    streams: list = []

    def budget_probe() -> int:
        probe = Executor(
            ExecutorConfig(cache_dir=tmp_path, block_bytes=BLOCK_BYTES, allow_download=False, **LIMITS)
        )
        try:
            for m in MODELS:
                probe.host.load(ModelSpec(m, f"tiny://{m.removeprefix('tiny-')}"))
            return probe.plan.num_blocks - probe.host.kv_capacity_bytes // BLOCK_BYTES
        finally:
            probe.close()

    reserved = await asyncio.to_thread(budget_probe)
    ex = Executor(
        ExecutorConfig(
            cache_dir=tmp_path,
            block_bytes=BLOCK_BYTES,
            memory_budget_bytes=(reserved + KV_BLOCKS) * BLOCK_BYTES,
            allow_download=False,
            num_threads=1,
            policy=policy,
            options=options,
            **LIMITS,
        )
    )
    ex.policy = ex.core.policy = Spy(ex.core.policy, log)  # record what the core asks of its policy
    plans: list = []
    schedule = ex.core.schedule

    def record_plan(now):
        plan = schedule(now)
        if plan is not None:
            plans.append(plan)
        return plan

    ex.core.schedule = record_plan
    for m in MODELS:
        await asyncio.to_thread(ex.host.load, ModelSpec(m, f"tiny://{m.removeprefix('tiny-')}"))
    assert ex.host.kv_capacity_bytes == KV_BLOCKS * BLOCK_BYTES

    def submit(rid: str, t: float, model: str, prompt: int, output: int) -> None:
        loaded = ex.host.models[model]
        req = build_request(loaded, "x", request_id=rid, max_tokens=output)
        ids = tuple(prompt_token_ids(workload_request(rid, t, SERVICES[model], prompt, output)).tolist())
        req = dataclasses.replace(req, prompt_token_ids=ids, arrival_s=t, service=SERVICES[model])
        streams.append(ex.submit(req))

    def on_tick(start: float, end: float) -> None:
        """Called in the worker during a forward: submit (on the event loop) what arrived by ``end``."""
        due = [a for a in pending if a[1] <= end]
        del pending[: len(due)]

        async def submit_due() -> None:
            for a in due:
                clock.t = a[1]  # the core sees each arrival at its own time, as the simulator does
                submit(*a)
            clock.t = start

        if due:
            asyncio.run_coroutine_threadsafe(submit_due(), loop).result(10)

    for m in MODELS:
        ex.host.hosted[m].runner = FakeRunner(
            clock, cost.model(m, 1), ex.host.models[m].vocab_size, on_tick, plans
        )
    submit(*arrive[0])
    done = 0
    while done < len(streams) or pending:  # streams grow as arrivals are submitted
        await asyncio.wait_for(streams[done].collect(), 60)
        done += 1
    assert done == len(arrive)
    return log, ex


STATIC_OPTIONS = {"batch_size": 3, "max_iterations": 8}
POLICIES: dict[str, tuple[dict, Callable[[], Any]]] = {
    "fcfs": ({}, Fcfs),
    "doubling_budget": ({}, DoublingBudget),
    "longest_prefix": ({}, LongestPrefix),
    # the core's static mode (padded rows, recompute at a slice end)
    "static_sls": (
        {**STATIC_OPTIONS, "slice_end": "recompute"},
        lambda: StaticSls(StaticSlsOptions(**STATIC_OPTIONS)),
    ),
}


@pytest.mark.parametrize("name", list(POLICIES))
async def test_live_core_and_simulator_make_identical_decisions(name, tmp_path, monkeypatch):
    options, make = POLICIES[name]
    # a static batch is priced padded by the simulator and unpadded by the live forward: its arrivals
    # all fall inside the first iteration, so batch formation does not depend on those prices
    arrive = arrivals(decode_step_s() * (1e-6 if name == "static_sls" else 1.0))
    live_log, ex = await run_live(name, options, arrive, tmp_path, monkeypatch)
    try:
        kv_bytes = KV_BLOCKS * BLOCK_BYTES
        exact, inst = run_sim(make, arrive, kv_bytes, fast_forward=False)
        chunked, _ = run_sim(make, arrive, kv_bytes, fast_forward=True)
        assert live_log == exact  # every decision and every time, iteration by iteration
        assert normalise(live_log) == normalise(chunked)
        assert ex.core.preemptions == inst.preemptions and ex.core.requeues == inst.core.requeues
        hits = (ex.core.prefix_queries, ex.core.prefix_hits)
        assert hits == (inst.core.prefix_queries, inst.core.prefix_hits)
        if name != "static_sls":  # (static batches prefill whole padded rows: no prefix caching)
            assert 0 < hits[1] < hits[0], "the services' system prompts are cached and hit"
        if name == "fcfs":  # (DB runs its seed request nearly alone: it needs no more KV than this)
            assert ex.core.preemptions > 0, "the pool was sized to force preemption"
        if name != "static_sls":
            assert [e[1] for e in live_log if e[0] == "finish"] != [a[0] for a in arrive]
        else:
            assert ex.core.requeues > 0, "slices of 8 iterations leave unfinished rows"
        assert ex.load_snapshot().kv_blocks_used == 0
    finally:
        ex.close()

"""Parity of the emulated backend: the same arrivals give the same decisions as ``SimInstance``.

The emulated executor (its real worker thread, engine core, block allocator and streaming) runs on a
simulated clock: each step "sleeps" exactly the cost model's iteration time, and the requests that
arrive during a step are submitted at their own times. A ``SimInstance`` of the same catalog GPU,
models, pool and limits runs the same arrivals. A spy around each side's policy records every batch
(model, phase, members, end time), preemption and finish: the records must be identical. Unlike
``test_core_parity`` nothing here is faked in the executor: the emulated backend prices its own steps.
As there, a service's prompts share its system prompt, so both sides hit the prefix cache alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.memory import activation_bytes
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement import InstancePlan
from llmfleet.policies.request import DoublingBudget, Fcfs
from llmfleet.sim.cost import CostBook
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import ModelSpec
from llmfleet.workload.prompts import prompt_token_ids
from llmfleet_engine import executor as executor_module
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.emulated.clock import Lag
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.validation import build_request
from test_core_parity import OFFSETS as CORE_OFFSETS
from test_core_parity import Spy, normalise, workload_request

HW = "a100-80gb"
MODELS = ("llama2-7b", "llama2-13b")
SERVICES = {"llama2-7b": "chat", "llama2-13b": "code"}
BLOCK_TOKENS = 16
KV_BLOCKS = 12
LIMITS = {"max_running": 6, "max_batch_requests": 5, "max_prefill_tokens": 96, "watermark": 0.0}
# test_core_parity's arrivals, its two tiny models played by two catalog ones
AS_CATALOG = {"tiny-llama": "llama2-7b", "tiny-qwen2": "llama2-13b"}
OFFSETS = [(rid, off, AS_CATALOG[m], p, o) for rid, off, m, p, o in CORE_OFFSETS]
POLICIES: dict[str, Callable[[], Any]] = {"fcfs": Fcfs, "doubling_budget": DoublingBudget}


def block_bytes() -> int:
    return BLOCK_TOKENS * max(model_arch(m).kv_bytes_per_token for m in MODELS)


def unit_s() -> float:
    cost = CostBook.build(hardware(HW), {m: model_arch(m) for m in MODELS})
    return cost.model("llama2-7b", 1).iteration(0, 0, 1, 30)


class SimulatedClock:
    """The emulated engine's clock on simulated time: ``sleep_until`` jumps to the due time, first
    letting ``on_tick`` submit what arrived meanwhile."""

    def __init__(self) -> None:
        self.t = 0.0
        self.lag = Lag()
        self.on_tick: Callable[[float, float], None] = lambda start, end: None

    def monotonic(self) -> float:
        return self.t

    perf_counter = monotonic

    def sleep_until(self, due: float) -> None:
        start = self.t
        self.on_tick(start, due)
        self.t = max(self.t, due)


def prompt_words(rid: str, t: float, model: str, prompt: int, output: int) -> str:
    """The request's prompt as the emulated tokenizer's words (``t<k>``: one token each)."""
    ids = prompt_token_ids(workload_request(rid, t, SERVICES[model], prompt, output))
    return " ".join(f"t{k}" for k in ids)


def run_sim(make_policy: Callable[[], Any], arrive: list) -> tuple[list, Any]:
    log: list = []
    spec = SimSpec(
        ClusterSpec.parse(f"1x{HW}"),
        tuple(SimService(SERVICES[m], m, max_tokens=1) for m in MODELS),
        EngineSettings(block_tokens=BLOCK_TOKENS, kv_bytes=KV_BLOCKS * block_bytes(), **LIMITS),
    )
    return log, simulate_one(spec, MODELS, lambda: Spy(make_policy(), log), arrive, SERVICES)


def simulate_one(
    spec: SimSpec, models: tuple[str, ...], make_policy: Callable[[], Any], arrive: list, services: dict
) -> Any:
    """``arrive`` (``(rid, t, model, prompt, output)``, a model's requests to its service in ``services``)
    on one simulated instance ``e0`` hosting ``models``, step by step (no fast-forward); every request
    done, and the instance returned."""
    sim = Simulator(
        spec,
        [InstancePlan("e0", models, 1)],
        make_policy,
        RoundRobin(),
        CostBook.build(spec.cluster.hw, spec.archs()),
        fast_forward=False,
    )
    reqs = [workload_request(rid, t, services[m], p, o) for rid, t, m, p, o in arrive]
    res = sim.run(reqs, strict_services=True)
    assert all(r.done and not r.failed for r in res.records)
    return sim.instances["e0"]


async def replay_on_clock(
    clock: SimulatedClock, arrive: list, submit: Callable[[str, float, str, int, int], RequestStream]
) -> None:
    """Submits each arrival ``(rid, t, model, prompt, output)`` when the engine's clock passes ``t`` (the
    first at once, the clock at 0), as the simulator's arrivals come between its steps, and waits for
    every stream to end at its output length."""
    loop = asyncio.get_running_loop()
    pending, streams = list(arrive[1:]), []

    def on_tick(start: float, end: float) -> None:
        due = [a for a in pending if a[1] <= end]
        del pending[: len(due)]

        async def submit_due() -> None:
            for a in due:
                clock.t = a[1]
                streams.append(submit(*a))
            clock.t = start

        if due:
            asyncio.run_coroutine_threadsafe(submit_due(), loop).result(10)

    clock.t = 0.0  # loading the models moved the clock on
    clock.on_tick = on_tick
    streams.append(submit(*arrive[0]))
    done = 0
    while done < len(streams) or pending:
        chunks = await asyncio.wait_for(streams[done].collect(), 60)
        assert chunks[-1].finish_reason.name == "LENGTH"
        assert chunks[-1].usage.completion_tokens == arrive[done][4]
        done += 1


async def run_emulated(policy: str, arrive: list, monkeypatch) -> tuple[list, EmulatedExecutor]:
    log: list = []
    clock = SimulatedClock()
    monkeypatch.setattr(executor_module, "time", clock)
    bb = block_bytes()
    reserved = sum(
        -(-(model_arch(m).weight_bytes + activation_bytes(model_arch(m), 96, 5)) // bb) for m in MODELS
    )
    ex = EmulatedExecutor(
        EmulatedConfig(
            hardware=HW,
            sim_models={m: m for m in MODELS},
            memory_budget_bytes=(reserved + KV_BLOCKS) * bb,
            policy=policy,
            **LIMITS,
        ),
        clock=clock,
    )
    ex.policy = ex.core.policy = Spy(ex.core.policy, log)
    for m in MODELS:
        await asyncio.to_thread(ex.host.load, ModelSpec(m, f"emulated://{m}"))
    assert ex.host.kv_capacity_bytes == KV_BLOCKS * bb and ex.plan.block_bytes == bb

    def submit(rid: str, t: float, model: str, prompt: int, output: int) -> RequestStream:
        text = prompt_words(rid, t, model, prompt, output)
        req = build_request(ex.host.models[model], text, request_id=rid, max_tokens=output)
        assert req.prompt_tokens == prompt  # one token per word
        return ex.submit(dataclasses.replace(req, arrival_s=t, service=SERVICES[model]))

    await replay_on_clock(clock, arrive, submit)
    return log, ex


@pytest.mark.parametrize("name", list(POLICIES))
async def test_emulated_engine_and_simulator_make_identical_decisions(name, monkeypatch):
    u = unit_s()
    arrive = [(rid, off * u, m, p, o) for rid, off, m, p, o in OFFSETS]
    live, ex = await run_emulated(name, arrive, monkeypatch)
    try:
        sim, inst = run_sim(POLICIES[name], arrive)
        assert live == sim  # every batch, preemption and finish, at the same times
        assert normalise(live) == normalise(sim)
        assert ex.core.preemptions == inst.preemptions
        hits = (ex.core.prefix_queries, ex.core.prefix_hits)
        assert hits == (inst.core.prefix_queries, inst.core.prefix_hits) and 0 < hits[1] < hits[0]
        if name == "fcfs":
            assert ex.core.preemptions > 0, "the pool was sized to force preemption"
        assert ex.load_snapshot().kv_blocks_used == 0
    finally:
        ex.close()

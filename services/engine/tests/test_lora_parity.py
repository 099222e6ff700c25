"""Parity of LoRA adapter admission: the emulated engine and ``SimInstance`` hold adapters by the same
engine-core rule, so one arrival sequence with more adapters in flight than slots gives both the same
decisions: every batch (its members: who was admitted when), finish and adapter load, at the same
times. Requests whose adapter finds every slot held by other adapters' running requests wait (none is
refused) while later requests of a resident adapter or of the base go ahead. Set up as
``test_emulated_parity`` (its simulated clock, its policy spy)."""

from __future__ import annotations

import asyncio
import dataclasses

from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.lora import adapter_pool_bytes
from llmfleet.costmodel.memory import activation_bytes
from llmfleet.policies.request import Fcfs
from llmfleet.sim.cost import CostBook
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import ModelSpec
from llmfleet.workload.prompts import prompt_token_ids
from llmfleet_engine import executor as executor_module
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.validation import build_request
from test_core_parity import Spy, workload_request
from test_emulated_parity import SimulatedClock, replay_on_clock, simulate_one

HW = "a100-80gb"
BASE = "llama2-7b"
MAX_LORAS = 2
RANKS = {"a0": 8, "a1": 16, "a2": 8}  # three adapters, two slots
SERVICES = {BASE: "plain", **{a: f"s-{a}" for a in RANKS}}
BLOCK_TOKENS = 16
KV_BLOCKS = 48
LIMITS = {"max_running": 8, "max_batch_requests": 8, "max_prefill_tokens": 256, "watermark": 0.0}
# (id, arrival in decode-step units, adapter or base, prompt tokens, output tokens); r0 keeps the engine
# busy until every arrival (the emulated side submits arrivals from inside a running step)
OFFSETS = [
    ("r0", 0.0, "a0", 20, 90),
    ("r1", 1.5, "a1", 30, 30),
    ("r2", 3.0, "a2", 25, 20),  # a0 and a1 hold both slots: waits
    ("r3", 4.0, BASE, 12, 20),  # goes ahead of r2
    ("r4", 5.5, "a0", 18, 25),  # resident: goes ahead of r2
    ("r5", 9.0, "a2", 22, 15),  # waits with r2
    ("r6", 45.0, "a1", 16, 20),
    ("r7", 60.0, "a0", 30, 10),
]


def unit_s() -> float:
    return CostBook.build(hardware(HW), {BASE: model_arch(BASE)}).model(BASE, 1).iteration(0, 0, 1, 30)


def block_bytes() -> int:
    return BLOCK_TOKENS * model_arch(BASE).kv_bytes_per_token


def run_sim(arrive: list) -> tuple[list, object]:
    log: list = []
    services = tuple(
        SimService(svc, BASE, max_tokens=1, adapter="" if m == BASE else m, lora_rank=RANKS.get(m, 16))
        for m, svc in SERVICES.items()
    )
    spec = SimSpec(
        ClusterSpec.parse(f"1x{HW}"),
        services,
        EngineSettings(
            block_tokens=BLOCK_TOKENS, kv_bytes=KV_BLOCKS * block_bytes(), max_loras=MAX_LORAS, **LIMITS
        ),
    )
    return log, simulate_one(spec, (BASE,), lambda: Spy(Fcfs(), log), arrive, SERVICES)


async def run_emulated(arrive: list, monkeypatch) -> tuple[list, EmulatedExecutor]:
    log: list = []
    clock = SimulatedClock()
    monkeypatch.setattr(executor_module, "time", clock)
    bb, arch = block_bytes(), model_arch(BASE)
    footprint = arch.weight_bytes + activation_bytes(arch, 256, 8) + adapter_pool_bytes(arch, MAX_LORAS, 16)
    ex = EmulatedExecutor(
        EmulatedConfig(
            hardware=HW,
            sim_models={BASE: BASE},
            memory_budget_bytes=(-(-footprint // bb) + KV_BLOCKS) * bb,
            policy="fcfs",
            max_loras=MAX_LORAS,
            max_lora_rank=16,
            **LIMITS,
        ),
        clock=clock,
    )
    ex.policy = ex.core.policy = Spy(ex.core.policy, log)
    await asyncio.to_thread(ex.host.load, ModelSpec(BASE, f"emulated://{BASE}"))
    for name, rank in RANKS.items():
        ex.adapters.add(name, BASE, f"emulated://r{rank}")
    assert ex.host.kv_capacity_bytes == KV_BLOCKS * bb and ex.plan.block_bytes == bb

    def submit(rid: str, t: float, model: str, prompt: int, output: int) -> RequestStream:
        ids = prompt_token_ids(workload_request(rid, t, SERVICES[model], prompt, output))
        req = build_request(ex.host.models[BASE], " ".join(f"t{k}" for k in ids), request_id=rid)
        req = dataclasses.replace(
            req, model=model, arrival_s=t, service=SERVICES[model],
            sampling=dataclasses.replace(req.sampling, max_tokens=output),
        )  # fmt: skip
        return ex.submit(req)  # never refused for want of a slot

    await replay_on_clock(clock, arrive, submit)
    return log, ex


def admission_order(log: list) -> list[str]:
    """Requests in the order they first ran (their admission into a step)."""
    seen: list[str] = []
    for e in log:
        if e[0] == "iter":
            seen += [rid for rid in e[3] if rid not in seen]
    return seen


async def test_emulated_engine_and_simulator_admit_adapters_alike(monkeypatch):
    u = unit_s()
    arrive = [(rid, off * u, m, p, o) for rid, off, m, p, o in OFFSETS]
    live, ex = await run_emulated(arrive, monkeypatch)
    try:
        sim, inst = run_sim(arrive)
        assert live == sim  # every batch and finish, at the same times
        order = admission_order(live)
        assert order.index("r3") < order.index("r2") and order.index("r4") < order.index("r2")
        assert order.index("r2") < order.index("r5")  # waiting ones keep their order
        pool = ex.host.runner(BASE).lora
        assert pool is not None
        assert (pool.slots.loads, pool.slots.evictions) == (inst.adapter_loads, inst.adapter_evictions)
        assert pool.slots.resident == inst.adapter_slots[BASE].resident
        assert pool.slots.evictions > 0  # more adapters than slots went through
        assert ex.load_snapshot().kv_blocks_used == 0
    finally:
        ex.close()

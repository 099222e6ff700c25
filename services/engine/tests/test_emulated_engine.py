"""The emulated backend's own facts: its pool is the simulator's, loading takes the simulator's load
time, its lag is exported, and a KV chunk describes a block-table range."""

from __future__ import annotations

import asyncio

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.memory import load_seconds
from llmfleet.metrics.engine import engine_metrics
from llmfleet.metrics.server import samples
from llmfleet.replay.requests import synthetic_prompt
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.spec import EngineSettings
from llmfleet.types import ModelSpec
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.emulated.clock import Lag
from llmfleet_engine.emulated.tokenizer import UNK_ID
from llmfleet_engine.validation import build_request
from prometheus_client import CollectorRegistry


class SteppedClock:
    """Records every wait instead of sleeping."""

    def __init__(self) -> None:
        self.t, self.waits, self.lag = 0.0, [], Lag()

    def monotonic(self) -> float:
        return self.t

    def sleep_until(self, due: float) -> None:
        self.waits.append(due - self.t)
        self.t = max(self.t, due)


@pytest.mark.parametrize(("hw", "models", "tp"), [("a100-80gb", ["llama2-7b"], 1), ("a100-40gb", ["llama2-7b", "opt-6.7b"], 1),
                                                 ("h100", ["llama2-70b"], 2)])  # fmt: skip
def test_the_pool_is_the_simulators(hw, models, tp):
    ex = EmulatedExecutor(
        EmulatedConfig(hardware=hw, tp=tp, sim_models={m: m for m in models}), clock=SteppedClock()
    )
    try:
        for m in models:
            ex.host.load(ModelSpec(m, f"emulated://{m}"))
        sim = pool_layout(hardware(hw), tp, [model_arch(m) for m in models], EngineSettings())
        assert ex.plan.block_bytes == sim.block_bytes
        # the live pool holds each reservation as whole blocks: at most one block per model fewer
        assert (
            sim.num_blocks - len(models) <= ex.host.kv_capacity_bytes // ex.plan.block_bytes <= sim.num_blocks
        )
    finally:
        ex.close()


def test_loading_waits_the_simulators_load_time_and_unloading_frees_the_pool():
    clock = SteppedClock()
    ex = EmulatedExecutor(EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-13b"}), clock=clock)
    try:
        empty = ex.host.kv_capacity_bytes
        ex.host.load(ModelSpec("m", "emulated://llama2-13b"))
        assert clock.waits == [
            pytest.approx(load_seconds([model_arch("llama2-13b")], hardware("a100-80gb"), 1))
        ]
        assert ex.host.kv_capacity_bytes < empty
        ex.host.unload("m")
        assert ex.host.kv_capacity_bytes == empty
    finally:
        ex.close()


def test_a_model_that_does_not_fit_is_refused():
    ex = EmulatedExecutor(
        EmulatedConfig(hardware="a100-40gb", sim_models={"big": "llama2-70b"}), clock=SteppedClock()
    )
    try:
        with pytest.raises(Exception, match="do not fit"):
            ex.host.load(ModelSpec("big", "emulated://llama2-70b"))
    finally:
        ex.close()


async def test_lag_is_exported_next_to_the_vllm_metrics():
    registry = CollectorRegistry(auto_describe=True)
    ex = EmulatedExecutor(EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-7b"}))
    try:
        ex.attach_metrics(engine_metrics(registry))
        await asyncio.to_thread(ex.host.load, ModelSpec("m", "emulated://llama2-7b"))
        req = build_request(ex.host.models["m"], "a b c", request_id="r", max_tokens=5)
        await asyncio.wait_for(ex.submit(req).collect(), 30)
        got = samples(registry)
        assert got["llmfleet_emulated_waits_total"] >= 6  # the load and five steps
        assert "llmfleet_emulated_lag_seconds_total" in got
        assert any(k.startswith("vllm:generation_tokens_total") for k in got)
    finally:
        await ex.aclose()


async def test_a_replayed_trace_s_prompts_share_no_cached_block():
    """``llmfleet load --trace`` sends a length-only request as seeded words: one known token each, and
    no two prompts share a cached block, as in the simulator (which knows their lengths only). Text of
    words the tokenizer does not know shares blocks only where it shares leading words."""
    ex = EmulatedExecutor(
        EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-7b"}), clock=SteppedClock()
    )
    try:
        await asyncio.to_thread(ex.host.load, ModelSpec("m", "emulated://llama2-7b"))
        model = ex.host.models["m"]

        async def serve(prompts: list[str]) -> tuple[int, int]:
            before = (ex.core.prefix_queries, ex.core.prefix_hits)
            for i, text in enumerate(prompts):
                req = build_request(model, text, request_id=f"r{before[0]}-{i}", max_tokens=2)
                assert len(req.prompt_token_ids) == len(text.split())
                await asyncio.wait_for(ex.submit(req).collect(), 30)
            return ex.core.prefix_queries - before[0], ex.core.prefix_hits - before[1]

        replayed = [synthetic_prompt(200, 0, i) for i in range(4)]
        assert not any(UNK_ID in build_request(model, p, request_id="x").prompt_token_ids for p in replayed)
        assert await serve(replayed) == (800, 0)
        unknown = [" ".join(f"w{(7 * i + k) % 100}" for k in range(200)) for i in range(2)]
        assert await serve(unknown) == (400, 0)  # distinct texts, distinct ids
        shared = " ".join(f"word{k}" for k in range(100))  # 6 full blocks of 16, then 4 words
        assert await serve([f"{shared} and then {i}" for i in range(2)]) == (206, 96)
        again = build_request(model, f"{shared} and then 0", request_id="again", max_tokens=2)
        usage = (await asyncio.wait_for(ex.submit(again).collect(), 30))[-1].usage
        assert usage is not None and usage.cached_tokens == 96  # the final usage counts them too
    finally:
        await ex.aclose()


class HostClock:
    """Simulated time where the host spends ``host_s`` after every wait (waking up, completing the
    step, scheduling the next) before it can do anything else."""

    def __init__(self, host_s: float) -> None:
        self.t, self.host_s, self.dues, self.lag = 0.0, host_s, [], Lag()

    def monotonic(self) -> float:
        return self.t

    perf_counter = monotonic

    def sleep_until(self, due: float) -> None:
        self.dues.append(due)
        self.t = max(self.t, due) + self.host_s


@pytest.mark.parametrize("host_s", [0.0, 0.004])
async def test_steps_keep_the_modelled_clock_whatever_the_host_spends_between_them(host_s, monkeypatch):
    from llmfleet_engine import executor as executor_module

    clock = HostClock(host_s)
    monkeypatch.setattr(executor_module, "time", clock)
    ex = EmulatedExecutor(EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-7b"}), clock=clock)
    try:
        await asyncio.to_thread(ex.host.load, ModelSpec("m", "emulated://llama2-7b"))
        start = clock.t
        req = build_request(ex.host.models["m"], "a b c", request_id="r", max_tokens=12, arrival_s=start)
        await asyncio.wait_for(ex.submit(req).collect(), 30)
        cost = ex.host.runner("m").cost
        # a prefill of 3 tokens, then 11 decodes of one sequence whose context grows from 4
        modelled = cost.iteration(3, 9, 0, 0) + sum(cost.iteration(0, 0, 1, 3 + i) for i in range(1, 12))
        assert clock.dues[-1] - start == pytest.approx(modelled)  # the host's time is not added
        assert ex.clock.lag.host_steps == 11  # every decode's work was waiting at the previous due
        assert ex.clock.lag.host_s == pytest.approx(11 * host_s)
        assert ex.clock.lag.host_max_s == pytest.approx(host_s)
    finally:
        await ex.aclose()


async def test_the_modelled_clock_restarts_when_no_step_could_run(monkeypatch):
    from llmfleet_engine import executor as executor_module

    clock = HostClock(0.0)
    monkeypatch.setattr(executor_module, "time", clock)
    ex = EmulatedExecutor(EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-7b"}), clock=clock)
    try:
        await asyncio.to_thread(ex.host.load, ModelSpec("m", "emulated://llama2-7b"))
        req = build_request(ex.host.models["m"], "a b c", request_id="r", max_tokens=2, arrival_s=clock.t)
        await asyncio.wait_for(ex.submit(req).collect(), 30)
        assert ex.modelled_due_s == clock.dues[-1]  # the last step's end
        assert ex.schedule(clock.t + 1.0) is None  # nothing to run
        assert ex.modelled_due_s is None
    finally:
        await ex.aclose()


async def test_after_idling_a_step_starts_now_whatever_arrival_its_request_brings(monkeypatch):
    """A request migrated in carries its age as an older arrival: on an idle engine its first step
    starts at the wall clock's now, not at the stale due time of the last step before the idle."""
    from llmfleet_engine import executor as executor_module

    clock = HostClock(0.0)
    monkeypatch.setattr(executor_module, "time", clock)
    ex = EmulatedExecutor(EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-7b"}), clock=clock)
    try:
        await asyncio.to_thread(ex.host.load, ModelSpec("m", "emulated://llama2-7b"))
        first = build_request(ex.host.models["m"], "a b c", request_id="a", max_tokens=2, arrival_s=clock.t)
        await asyncio.wait_for(ex.submit(first).collect(), 30)
        await asyncio.to_thread(ex.run_in_worker, lambda: None, 30)  # the worker saw itself idle
        clock.t += 100.0  # the engine idles
        now = clock.t
        old = build_request(ex.host.models["m"], "a b c", request_id="b", max_tokens=2, arrival_s=now - 50.0)
        await asyncio.wait_for(ex.submit(old).collect(), 30)
        prefill = ex.host.runner("m").cost.iteration(3, 9, 0, 0)
        assert clock.dues[-2] == pytest.approx(now + prefill)  # its prefill started at now
        assert ex.clock.lag.slips == 0
    finally:
        await ex.aclose()

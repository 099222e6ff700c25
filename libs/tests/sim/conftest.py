"""Shared builders for the simulator tests: a tiny cluster with hand-computable linear costs.

Costs (injected into ``CostBook._cache`` so no profile or roofline is involved):

- prefill of prompts l_i (T = Σ l_i, Q = Σ l_i²): 0.1 + 0.001·T + 1e-6·Q seconds
- decode of b sequences holding S context tokens: 0.01 + 0.001·b + 1e-4·S seconds

llama2-7b holds 524,288 KV bytes per token; with the default 16 tokens per block a block is 8 MiB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.cost import CostBook, LinearCost
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo

MODEL = "llama2-7b"
BLOCK_TOKENS = 16
BLOCK_BYTES = BLOCK_TOKENS * 524_288  # one merged block of llama2-7b


def pre(tokens: float, sq: float | None = None) -> float:
    """Hand formula of the prefill cost (see the module docstring)."""
    return 0.1 + 0.001 * tokens + 1e-6 * (tokens * tokens if sq is None else sq)


def dec(batch: int, context: float) -> float:
    """Hand formula of one decode iteration."""
    return 0.01 + 0.001 * batch + 1e-4 * context


LINEAR = LinearCost(((0.1, 0.001, 1e-6),), ((0.01, 0.001, 1e-4),), "hand")


class Tiny:
    """Factory of tiny simulations (a fixture, so tests need no sibling-module imports)."""

    model = MODEL
    block_bytes = BLOCK_BYTES
    block_tokens = BLOCK_TOKENS
    linear = LINEAR

    @staticmethod
    def pre(tokens: float, sq: float | None = None) -> float:
        return pre(tokens, sq)

    @staticmethod
    def dec(batch: int, context: float) -> float:
        return dec(batch, context)

    @staticmethod
    def kv_mismatches(sim: Simulator) -> list[tuple[str, str, int, int]]:
        """Requests whose KV length breaks the engine's bookkeeping (continuous instances): a request in
        the batch in flight holds ``context_tokens`` tokens (its decode slot appended, or its prefill),
        another running request ``context_tokens − 1`` (the newest token is sampled, not yet in the KV);
        the waiting queue's sum of prompt blocks is the sum over its requests.
        Returns (instance, request, tokens held, tokens expected) for each mismatch."""
        out = []
        for iid, inst in sim.instances.items():
            if inst.static:
                continue
            flying = {r.sched.request_id for r in inst.work.members} if inst.work else set()
            for rid, r in inst.running.items():
                want = r.sched.context_tokens - (0 if rid in flying else 1)
                have = inst.alloc.num_tokens(rid)
                if have != want:
                    out.append((iid, rid, have, want))
            out.extend((iid, rid, -1, 0) for rid in inst.waiting if rid in inst.alloc)
            tpb = inst.tpb
            want = sum(-(-r.sched.prompt_tokens // tpb[r.sched.model]) for r in inst.waiting.values())
            if inst.waiting.prompt_blocks != want:  # the waiting queue's running sum of prompt blocks
                out.append((iid, "<waiting prompt blocks>", inst.waiting.prompt_blocks, want))
        return out

    def spec(
        self,
        engine: EngineSettings | None = None,
        services: Sequence[SimService] | None = None,
        cluster: str = "2xA100-80GB",
    ) -> SimSpec:
        svcs = (
            tuple(services)
            if services
            else (SimService("s", MODEL, Slo(ttft_s=1.0, tpot_s=0.1, deadline_s=5.0)),)
        )
        return SimSpec(ClusterSpec.parse(cluster), svcs, engine or EngineSettings())

    def book(self, spec: SimSpec, tps: Sequence[int] = (1, 2), cost: LinearCost = LINEAR) -> CostBook:
        book = CostBook(spec.cluster.hw, spec.archs())
        for m in spec.models:
            for tp in tps:
                book.pin(m, tp, cost)
        return book

    def sim(
        self,
        *,
        engine: EngineSettings | None = None,
        instances: int = 1,
        tp: int = 1,
        plan: Sequence[InstancePlan] | None = None,
        make_policy: Callable[[], object] = Fcfs,
        dispatch: object | None = None,
        fast_forward: bool = True,
        sample_period_s: float | None = None,
        services: Sequence[SimService] | None = None,
        cost: LinearCost | None = LINEAR,
    ) -> Simulator:
        spec = self.spec(engine, services)
        book = self.book(spec, cost=cost) if cost is not None else CostBook(spec.cluster.hw, spec.archs())
        plan = plan or [InstancePlan(f"i{i}", (MODEL,), tp) for i in range(instances)]
        return Simulator(
            spec,
            plan,
            make_policy=make_policy,
            dispatch=dispatch or RoundRobin(),
            cost=book,
            fast_forward=fast_forward,
            sample_period_s=sample_period_s,
        )


@pytest.fixture
def tiny() -> Tiny:
    return Tiny()

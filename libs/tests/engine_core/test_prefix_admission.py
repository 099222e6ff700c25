"""The engine core with a prefix-aware request policy: it looks up the cached prompt tokens of at most
``prefix_lookahead`` waiting requests per step, and the policy admits the cached ones first."""

from __future__ import annotations

from collections.abc import Mapping

from llmfleet.engine_core import CoreRequest, EngineCore, EngineLimits
from llmfleet.kvblocks import BlockAllocator, KvShape
from llmfleet.policies.request import Fcfs, LongestPrefix, LongestPrefixOptions, SchedRequest

SHAPE = KvShape(num_layers=1, num_kv_heads=1, head_dim=4)  # 32 B/token
T = 4  # tokens per block
PREFIX = list(range(100, 112))  # three full blocks


class Recording(LongestPrefix):
    """Keeps every lookup the core hands over."""

    def __init__(self, options: LongestPrefixOptions) -> None:
        super().__init__(options)
        self.seen: list[dict[str, int]] = []

    def on_cached(self, cached: Mapping[str, int]) -> None:
        self.seen.append(dict(cached))
        super().on_cached(cached)


def make_core(policy, **limits) -> EngineCore:
    alloc = BlockAllocator(64, 32 * T, watermark=0.0)
    alloc.register_model("m", SHAPE)
    core = EngineCore(policy, alloc, EngineLimits(**limits))
    core.add_model("m")
    return core


def req(rid: str, ids: list[int], arrival: float, out: int = 2) -> CoreRequest:
    return CoreRequest(SchedRequest(rid, "s", "m", arrival, len(ids), out), len(ids), out, prompt_ids=ids)


def drain(core: EngineCore, now: float) -> list[list[str]]:
    """Run until idle; each step's prefilled request ids."""
    prefills = []
    while core.has_work():
        plan = core.schedule(now)
        assert plan is not None
        prefills.append([r.request_id for r in plan.prefills])
        done = [x for x in plan.members if x.produced + 1 >= x.max_tokens]
        core.complete(plan, now, 0.01, finished=done)
    return prefills


def test_cached_requests_are_admitted_first_and_lookups_are_bounded():
    policy = Recording(LongestPrefixOptions(lookahead=2, max_wait_s=100.0))
    core = make_core(policy, max_batch_requests=1)
    assert core.prefix_aware and not make_core(Fcfs()).prefix_aware
    core.add(req("warm", [*PREFIX, 1], 0.0), 0.0)
    drain(core, 0.0)  # PREFIX's three blocks are cached now
    core.add(req("cold1", [9] * 13, 1.0), 1.0)
    core.add(req("hit", [*PREFIX, 2], 1.1), 1.1)
    core.add(req("cold2", [8] * 13, 1.2), 1.2)
    policy.seen.clear()
    steps = drain(core, 2.0)
    assert policy.seen[0] == {"cold1": 0, "hit": 12}  # the two oldest only (lookahead 2)
    assert [s for s in steps if s] == [["hit"], ["cold1"], ["cold2"]]


def test_greedy_work_is_the_same_as_fcfs_only_the_order_differs():
    """Each request computes the same tokens after the same cached prefix under both policies."""

    def serve(policy) -> dict[str, tuple[int, int]]:
        core = make_core(policy, max_batch_requests=1)
        core.add(req("warm", [*PREFIX, 1], 0.0), 0.0)
        drain(core, 0.0)
        for i, ids in enumerate(([7] * 9, [*PREFIX, 3, 4], [*PREFIX[:8], 5], [6] * 5)):
            core.add(req(f"r{i}", ids, 1.0 + i), 1.0 + i)
        out = {}
        while core.has_work():
            plan = core.schedule(5.0)
            assert plan is not None
            out |= {r.request_id: (r.cached, r.sched.prompt_tokens - r.cached) for r in plan.prefills}
            done = [x for x in plan.members if x.produced + 1 >= x.max_tokens]
            core.complete(plan, 5.0, 0.01, finished=done)
        return out

    assert serve(LongestPrefix()) == serve(Fcfs())


def test_a_refreshing_lookup_keeps_a_waiting_request_s_prefix_past_older_idle_ones():
    def survivors(refresh: bool) -> tuple[int, int]:
        alloc = BlockAllocator(8, 32 * T, watermark=0.0)
        alloc.register_model("m", SHAPE)
        core = EngineCore(LongestPrefix(), alloc, EngineLimits())
        core.add_model("m")
        older, newer = [*PREFIX, 1], [200 + i for i in range(13)]
        core.add(req("a", older, 0.0), 0.0)
        drain(core, 0.0)
        core.add(req("b", newer, 0.5), 0.5)
        drain(core, 0.5)  # six idle cached blocks: a's (older), then b's
        waiter = req("next-turn-of-a", [*PREFIX, 5], 1.0)
        assert core.cached_tokens(waiter, refresh) == 12
        alloc.reserve("other", "m", 4 * T)  # two never-used blocks and the two oldest idle ones
        return core.cached_tokens(waiter), core.cached_tokens(req("b2", [*newer[:12], 6], 1.0))

    assert survivors(refresh=False) == (4, 12)  # a's tail went first
    assert survivors(refresh=True) == (12, 4)  # a's prefix is needed: b's tail goes instead

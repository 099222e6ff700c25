"""The engine core preempts for priority and fairness (``PreemptionRule``) through its KV-shortage
path: the victim's KV is freed, its output so far folded into its prompt, and it resumes later to its
full length."""

from __future__ import annotations

from llmfleet.engine_core import CoreRequest, EngineCore, EngineLimits
from llmfleet.kvblocks import BlockAllocator, KvShape
from llmfleet.policies.request import Fcfs, SchedRequest
from llmfleet.policies.request.preemption import PreemptionRule

SHAPE = KvShape(num_layers=1, num_kv_heads=1, head_dim=4)
BLOCK = 32 * 4  # 4 tokens per block


def make_core(blocks: int = 64, preemption: bool = True, **limits) -> EngineCore:
    alloc = BlockAllocator(blocks, BLOCK, watermark=0.0)
    alloc.register_model("m", SHAPE)
    core = (
        EngineCore(Fcfs(), alloc, EngineLimits(**limits))
        if preemption
        else EngineCore(Fcfs(), alloc, EngineLimits(**limits), preemption=None)
    )
    core.add_model("m")
    return core


def req(rid: str, t: float, priority: int = 0, tenant: str = "", out: int = 6) -> CoreRequest:
    s = SchedRequest(rid, "s", "m", t, 5, out, request_priority=priority, tenant=tenant)
    return CoreRequest(s, 5, out)


def run(core: EngineCore, now: float, log: dict[str, int], preempted: list[str]) -> float:
    """One step: members produce a token each; those at their cap finish."""
    plan = core.schedule(now)
    assert plan is not None
    preempted += [r.request_id for r in plan.preempted]
    for r in plan.members:
        log[r.request_id] = log.get(r.request_id, 0) + 1
    done = [r for r in plan.members if r.produced + 1 >= r.max_tokens]
    core.complete(plan, now + 0.01, 0.01, finished=done)
    return now + 0.01


def test_a_higher_priority_arrival_preempts_the_lowest_latest_running_request() -> None:
    core = make_core(max_running=2)
    core.add(req("old", 0.0), 0.0)
    core.add(req("new", 0.1), 0.1)
    log: dict[str, int] = {}
    preempted: list[str] = []
    now = run(core, 0.2, log, preempted)
    now = run(core, now, log, preempted)
    assert set(core.running) == {"old", "new"}
    core.add(req("high", now, priority=1), now)
    plan = core.schedule(now)
    assert plan is not None
    assert [r.request_id for r in plan.preempted] == ["new"]  # the latest of the lowest priority
    assert "high" in [r.request_id for r in plan.prefills]
    assert core.requests["new"].preemptions == 1 and "new" in core.waiting
    core.complete(plan, now + 0.01, 0.01)
    now += 0.01
    while core.has_work():  # everyone runs to its end; the preempted one resumes where it was
        now = run(core, now, log, preempted)
    assert core.preemptions == 1 and not preempted  # never again (it was the only one)


def test_preempted_request_resumes_with_its_full_output() -> None:
    core = make_core(max_running=1)
    low = req("low", 0.0, out=6)
    core.add(low, 0.0)
    log: dict[str, int] = {}
    now = run(core, 0.0, log, [])
    now = run(core, now, log, [])
    assert low.produced == 2
    core.add(req("high", now, priority=1, out=3), now)
    finished: list[str] = []
    while core.has_work():
        plan = core.schedule(now)
        assert plan is not None
        done = [r for r in plan.members if r.produced + 1 >= r.max_tokens]
        res = core.complete(plan, now + 0.01, 0.01, finished=done)
        finished += [r.request_id for r in res.finished]
        now += 0.01
    assert finished == ["high", "low"]
    assert low.produced == 6 and low.preemptions == 1  # 2 before, re-prefilled with them, 4 after
    assert low.sched.prompt_tokens == 5 + 2  # its prompt plus the two tokens it had made


def test_equal_priorities_and_untagged_requests_never_preempt() -> None:
    core = make_core(max_running=1)
    core.add(req("a", 0.0), 0.0)
    log: dict[str, int] = {}
    now = run(core, 0.0, log, [])
    core.add(req("b", now), now)
    preempted: list[str] = []
    while core.has_work():
        now = run(core, now, log, preempted)
    assert preempted == [] and core.preemptions == 0


def test_a_tenant_under_its_share_preempts_the_heaviest_tenant() -> None:
    core = make_core(max_running=4)
    for i in range(4):
        core.add(req(f"h{i}", 0.01 * i, tenant="heavy", out=20), 0.01 * i)
    core.add(req("h4", 0.05, tenant="heavy", out=20), 0.05)  # waits: the heavy key's backlog
    log: dict[str, int] = {}
    now = run(core, 0.1, log, [])
    core.add(req("light", now, tenant="light"), now)
    plan = core.schedule(now)
    assert plan is not None
    assert [r.request_id for r in plan.preempted] == ["h3"]
    assert "light" in [r.request_id for r in plan.prefills]  # before the heavy key's older backlog
    core.complete(plan, now + 0.01, 0.01)
    # the light key now holds its share (1 of 4): the heavy backlog waits, nothing more is preempted
    plan = core.schedule(now + 0.01)
    assert plan is not None and not plan.preempted and "h4" in core.waiting


def test_a_light_key_with_credit_bursts_past_its_share() -> None:
    """The light key held one slot of its entitled two for 2 s (credit window 1 s): its third request
    preempts a heavy one, which a core without credit leaves waiting."""

    def burst(window_s: float) -> tuple[list[str], EngineCore]:
        alloc = BlockAllocator(4096, BLOCK, watermark=0.0)
        alloc.register_model("m", SHAPE)
        core = EngineCore(
            Fcfs(), alloc, EngineLimits(max_running=4), preemption=PreemptionRule(credit_window_s=window_s)
        )
        core.add_model("m")
        core.add(req("l0", 0.0, tenant="light", out=400), 0.0)
        for i in range(5):  # three run beside l0, two wait: the heavy key's backlog
            core.add(req(f"h{i}", 0.001 * (i + 1), tenant="heavy", out=400), 0.001 * (i + 1))
        now = 0.01
        while now < 2.0:
            now = run(core, now, {}, [])
        core.add(req("l1", now, tenant="light", out=400), now)  # below its share: the plain rule
        now = run(core, now, {}, preempted := [])
        assert preempted == ["h2"]
        core.add(req("l2", now, tenant="light", out=400), now)  # at its share of 2: credit decides
        for _ in range(20):
            now = run(core, now, {}, preempted)
        return preempted, core

    preempted, core = burst(1.0)
    assert preempted == ["h2", "h1"]  # never taken back: heavy stays above its share plus credit
    assert sorted(core.running) == ["h0", "l0", "l1", "l2"] and len(core.credit or []) == 2
    preempted, core = burst(0.0)  # no credit: instantaneous shares
    assert preempted == ["h2"] and "l2" in core.waiting and core.credit is None


def test_the_cap_bounds_preemptions_per_request() -> None:
    core = make_core(max_running=1)
    low = req("low", 0.0, out=50)
    core.add(low, 0.0)
    now = run(core, 0.0, {}, [])
    preempted: list[str] = []
    for i in range(2):  # two high-priority arrivals, each while low runs: each preempts it
        core.add(req(f"hi{i}", now, priority=1, out=2), now)
        while f"hi{i}" in core.requests:
            now = run(core, now, {}, preempted)
        now = run(core, now, {}, preempted)  # low runs again
    assert preempted == ["low", "low"] and "low" in core.running
    core.add(req("hi2", now, priority=1, out=2), now)  # low is at the cap: hi2 waits for it to end
    while "low" in core.requests:
        now = run(core, now, {}, preempted)
    assert "hi2" in core.waiting and low.preemptions == 2 and low.produced == 50


def test_preemption_off_keeps_the_policy_order() -> None:
    core = make_core(max_running=1, preemption=False)
    core.add(req("low", 0.0), 0.0)
    now = run(core, 0.0, {}, [])
    core.add(req("high", now, priority=1), now)
    plan = core.schedule(now)
    assert plan is not None and not plan.preempted and plan.request_ids == ["low"]


def test_claims_differ_once_a_request_with_a_priority_or_a_tenant_entered():
    """What late binding's holds read to skip an engine whose claims are all alike (priority 0, no
    tenant), where a claimant alike them can preempt nothing: set by an arrival or a landing."""
    core = make_core()
    core.add(req("a", 0.0), 0.0)
    assert not core.claims_differ
    landed = req("b", 0.1, tenant="t")
    landed.sched.generated, landed.sched.phase = 1, "decode"
    assert core.land(landed, 0.1, kv_tokens=landed.kv_tokens) and core.claims_differ
    other = make_core()
    other.add(req("c", 0.0, priority=-1), 0.0)
    assert other.claims_differ

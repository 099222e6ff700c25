"""Instances that come and go (llmfleet.sim.fleet): loads, moves, drains, GPU-seconds, hand-computed.

Costs are the conftest's linear ones: a 100-token prefill alone takes 0.21 s. Loading weights takes
weight bytes / (tp × 32 GB/s) on A100 (PCIe Gen4 x16 per GPU); KV moves within one node at 300 GB/s.
"""

from __future__ import annotations

import pytest
from llmfleet.policies.dispatch import DispatchNeeds, EngineCandidate, NoCandidate, RoundRobin
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.metrics import summarize
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import SimService
from llmfleet.workload import WorkloadRequest as W

approx = pytest.approx
S7, S8 = SimService("s", "llama2-7b"), SimService("t", "llama3-8b")
H2D, NVLINK = 32e9, 300e9


class Prefer:
    """Dispatch to the first instance of ``order`` that is a candidate and not excluded."""

    name = "prefer"
    needs = DispatchNeeds()

    def __init__(self, *order: str) -> None:
        self.order = order

    def choose(self, model, candidates: list[EngineCandidate], exclude=frozenset(), request=None) -> str:
        ids = {c.engine_id for c in candidates} - set(exclude)
        for iid in self.order:
            if iid in ids:
                return iid
        raise NoCandidate(f"no engine for {model}")


def make(tiny, plan, services=(S7, S8), cluster="2xA100-80GB", dispatch=None) -> Simulator:
    spec = tiny.spec(services=services, cluster=cluster)
    return Simulator(spec, plan, Fcfs, dispatch or RoundRobin(), tiny.book(spec))


def load_s(sim: Simulator, model: str, tp: int = 1) -> float:
    return sim.spec.archs()[model].weight_bytes / (tp * H2D)


def test_an_added_model_serves_only_after_its_load_time(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)])
    load = load_s(sim, "llama3-8b")
    assert sim.fleet.load_time_s(["llama3-8b"], 1) == approx(load, rel=1e-12) and 0.4 < load < 0.6
    sim.at(1.0, lambda s, now: s.fleet.set_models("i0", ("llama2-7b", "llama3-8b"), now))
    work = [
        W("a", 0.0, 100, 5, "s"),  # done by ~0.3: i0 is idle when the change comes
        W("early", 0.5, 100, 5, "t"),  # no instance has or loads llama3-8b: fails at once
        W("b", 1.1, 100, 5, "t"),  # the model is loading: b waits for it
        W("c", 2.0, 100, 5, "t"),
    ]
    res = sim.run(work, strict_services=True)
    rec = {r.request_id: r for r in res.records}
    assert "no engine" in rec["early"].failed and not rec["early"].done
    ready = 1.0 + load
    assert rec["b"].first_token_s == approx(ready + 0.21, abs=1e-9)  # dispatched when the weights are in
    assert rec["c"].first_token_s == approx(2.0 + 0.21, abs=1e-9)
    assert all(rec[k].done and rec[k].produced == 5 for k in "abc")
    assert res.gpu_log == [(0.0, 1)]


def test_a_removed_model_moves_its_running_requests_with_kv_transfer_time(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama2-7b",), 1)],
               services=(S7,), dispatch=Prefer("i0", "i1"))  # fmt: skip
    moved, landed = {}, {}
    move_out, land = sim.fleet.moves.move_out, sim.fleet.moves.land

    def spy_move(src, r, now):
        moved[r.sched.request_id] = (now, r.kv_tokens)
        move_out(src, r, now)

    def spy_land(r, dst, now):
        landed[r.sched.request_id] = now
        land(r, dst, now)

    sim.fleet.moves.move_out, sim.fleet.moves.land = spy_move, spy_land
    sim.at(0.5, lambda s, now: s.fleet.retire_instance("i0", now))
    res = sim.run([W("a", 0.0, 100, 50, "s"), W("b", 0.0, 100, 30, "s")], strict_services=True)
    assert set(moved) == {"a", "b"}
    boundary = {t for t, _ in moved.values()}
    assert len(boundary) == 1 and (tau := boundary.pop()) >= 0.5
    for rid, (t, kv) in moved.items():
        assert kv > 100  # prompt + a few outputs of KV travelled
        assert landed[rid] - t == approx(kv * 524_288 / NVLINK, rel=1e-9)
    for r in res.records:
        assert (r.done, r.produced, r.moves, r.instance, r.failed) == (True, r.output_tokens, 1, "i1", "")
    i0, i1 = res.instances
    assert i0["released_s"] == tau and i1["released_s"] is None
    assert res.gpu_log == [(0.0, 2), (tau, 1)]
    assert tiny.kv_mismatches(sim) == [] and sim.instances["i1"].alloc.used_blocks == 0


def test_retire_in_drain_mode_finishes_requests_in_place(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama2-7b",), 1)],
               services=(S7,), dispatch=Prefer("i0", "i1"))  # fmt: skip
    sim.at(0.5, lambda s, now: s.fleet.retire_instance("i0", now, "drain"))
    res = sim.run([W("a", 0.0, 100, 50, "s"), W("b", 0.0, 100, 30, "s"), W("c", 1.0, 100, 5, "s")],
                  strict_services=True)  # fmt: skip
    a, b, c = res.records
    assert (a.instance, a.moves, a.produced, b.instance, b.moves, b.produced) == ("i0", 0, 50, "i0", 0, 30)
    assert c.instance == "i1"  # i0 takes no new request once retired
    assert res.instances[0]["released_s"] == a.finish_s  # gives its GPU back when the last one is done


def test_a_model_no_one_else_hosts_drains_then_unloads_and_the_pool_grows(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b", "llama3-8b"), 1), InstancePlan("i1", ("llama2-7b",), 1)],
               dispatch=Prefer("i0", "i1"))  # fmt: skip
    i0 = sim.instances["i0"]
    blocks_before = i0.alloc.num_blocks
    seen = {}

    def remove(s, now):
        s.fleet.set_models("i0", ("llama2-7b",), now)
        seen["serving"] = i0.serving

    sim.at(0.5, remove)
    res = sim.run([W("c", 0.0, 100, 100, "t"), W("d", 1.0, 100, 5, "t"), W("e", 1.0, 100, 5, "s")],
                  strict_services=True)  # fmt: skip
    c, d, e = res.records
    assert seen["serving"] == ("llama2-7b",)
    assert (c.done, c.produced, c.moves, c.instance) == (True, 100, 0, "i0")  # drained where it was
    assert "no engine" in d.failed  # llama3-8b takes no new request anywhere
    assert e.done and e.instance == "i0"
    assert i0.models == ("llama2-7b",) and "llama3-8b" not in i0.tpb
    alone = pool_layout(sim.spec.cluster.hw, 1, [sim.spec.archs()["llama2-7b"]], sim.spec.engine)
    assert i0.alloc.num_blocks == alone.num_blocks > blocks_before  # 8b's weights gave their memory back


def test_gpu_seconds_count_active_instances_only(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], services=(S7,), cluster="4xA100-80GB",
               dispatch=Prefer("i0", "i1"))  # fmt: skip
    sim.at(
        1.0,
        lambda s, now: s.fleet.add_instance(
            InstancePlan("i1", ("llama2-7b",), 2), now + s.fleet.load_time_s(["llama2-7b"], 2)
        ),
    )
    sim.at(3.0, lambda s, now: s.fleet.retire_instance("i1", now))  # idle: gives its 2 GPUs back at once
    res = sim.run([W("a", 0.0, 100, 200, "s")], strict_services=True)
    end = res.records[0].finish_s
    assert end == approx(6.379, abs=1e-9)  # alone on i0 (see test_sim_hooks)
    cluster = summarize(res, sim.spec.services)["cluster"]
    # i0: 1 GPU × 6.379 s; i1: 2 GPUs from 1 s (loading counts) to 3 s; the 4th GPU is never used
    assert cluster["gpu_seconds"] == approx(6.379 + 2 * 2.0, abs=1e-9)
    assert cluster["gpus_in_use"] == [[0.0, 1], [1.0, 3], [3.0, 1]]
    assert cluster["provisioned_gpus"] == 3
    assert cluster["mean_gpus_in_use"] == approx((6.379 + 4.0) / 6.379)
    assert res.instances[1]["started_s"] == 1.0 and res.instances[1]["released_s"] == 3.0


def test_a_new_instance_waits_for_gpus_and_arrivals_wait_for_its_load(tiny):
    """2 GPUs: i0 idle, i1 busy with a. At 1 s both retire (i1 drains a) and a tp2 instance is added:
    it takes the GPUs when a is done, loads, and then serves b, which arrived meanwhile."""
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama2-7b",), 1)],
               services=(S7,), dispatch=Prefer("i1", "n"))  # fmt: skip

    def replace(s, now):
        s.fleet.retire_instance("i0", now)
        s.fleet.retire_instance("i1", now, "drain")
        s.fleet.add_instance(
            InstancePlan("n", ("llama2-7b",), 2), now + s.fleet.load_time_s(["llama2-7b"], 2)
        )

    sim.at(1.0, replace)
    res = sim.run([W("a", 0.0, 100, 200, "s"), W("b", 2.0, 100, 5, "s")], strict_services=True)
    a, b = res.records
    assert a.finish_s == approx(6.379, abs=1e-9) and a.instance == "i1"
    ready = a.finish_s + load_s(sim, "llama2-7b", 2)
    assert b.instance == "n" and b.first_token_s == approx(ready + 0.21, abs=1e-9)
    assert a.dispatched_s == 0.0 and b.dispatched_s == approx(ready, abs=1e-9)  # b held until n is ready
    assert res.gpu_log == [(0.0, 2), (1.0, 1), (a.finish_s, 2)]  # i0 out at 1 s; i1 out and n in at a's end
    assert res.instances[2]["started_s"] == a.finish_s


def test_changes_are_validated(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)])
    with pytest.raises(KeyError, match="nope"):
        sim.fleet.set_models("nope", ("llama2-7b",), 0.0)
    with pytest.raises(ValueError, match="not served"):
        sim.fleet.set_models("i0", ("llama2-70b",), 0.0)
    with pytest.raises(ValueError, match="mode"):
        sim.fleet.retire_instance("i0", 0.0, "vanish")
    with pytest.raises(ValueError, match="already used"):
        sim.fleet.add_instance(InstancePlan("i0", ("llama2-7b",), 1), 1.0)
    with pytest.raises(ValueError, match="GPUs"):
        sim.fleet.add_instance(InstancePlan("big", ("llama2-7b",), 4), 1.0)
    with pytest.raises(ValueError, match="before now"):
        sim.at(-1.0, lambda s, now: None)
    assert sim.fleet.fleet_changes == 0 and sim.coupling() is None


def test_a_busy_instance_starts_loading_at_its_next_step_boundary(tiny):
    """a decodes alone on i0 (fast-forwarded chunks); the change at 1 s cuts the chunk to the iteration
    in progress, whose end τ is when the new model's memory is claimed and its load starts."""
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)])
    ready = []
    orig = sim.fleet.ready
    sim.fleet.ready = lambda iid, model, t: (ready.append(t), orig(iid, model, t))
    sim.at(1.0, lambda s, now: s.fleet.set_models("i0", ("llama2-7b", "llama3-8b"), now))
    res = sim.run([W("a", 0.0, 100, 200, "s")], strict_services=True)
    t, ctx = 0.21, 101  # prefill; then one decode per iteration, the context growing by one
    while t < 1.0:
        t += tiny.dec(1, ctx)
        ctx += 1
    assert ready == [approx(t + load_s(sim, "llama3-8b"), abs=1e-9)]
    assert res.records[0].finish_s == approx(6.379, abs=1e-9)  # a never noticed


def test_loading_a_model_evicts_kv_that_no_longer_fits(tiny):
    """1×A100-40GB: llama2-7b alone has 2,922 blocks of KV, beside llama3-8b only 904. Twenty 7b
    requests hold more than that when 8b is added: the newest re-prefill later (preempted), none is lost."""
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], cluster="1xA100-40GB")
    i0 = sim.instances["i0"]
    seen = {}

    def add(s, now):
        seen["used"] = i0.alloc.used_blocks
        s.fleet.set_models("i0", ("llama2-7b", "llama3-8b"), now)

    sim.at(60.0, add)  # all twenty prefilled by then
    res = sim.run([W(f"r{k}", 0.0, 1000, 200, "s") for k in range(20)], strict_services=True)
    both = pool_layout(sim.spec.cluster.hw, 1, [sim.spec.archs()[m] for m in ("llama2-7b", "llama3-8b")],
                       sim.spec.engine)  # fmt: skip
    assert seen["used"] > both.num_blocks and i0.alloc.num_blocks == both.num_blocks
    assert sum(r.preemptions for r in res.records) > 0
    assert all(r.done and r.produced == 200 and not r.failed for r in res.records)
    assert i0.alloc.used_blocks == 0 and tiny.kv_mismatches(sim) == []


def test_a_model_that_does_not_fit_beside_the_old_one_loads_after_it_unloads(tiny):
    """1×L4 holds llama2-7b or llama3-8b, not both: replacing 7b by 8b drains a (7b), unloads 7b,
    then loads 8b; b (8b) waits for it."""
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)], cluster="1xL4")
    sim.at(1.0, lambda s, now: s.fleet.set_models("i0", ("llama3-8b",), now))
    res = sim.run([W("a", 0.0, 100, 200, "s"), W("b", 1.5, 100, 5, "t")], strict_services=True)
    a, b = res.records
    assert a.finish_s == approx(6.379, abs=1e-9) and a.moves == 0
    assert b.first_token_s == approx(a.finish_s + load_s(sim, "llama3-8b") + 0.21, abs=1e-9)
    assert sim.instances["i0"].models == ("llama3-8b",)


def test_a_model_removed_while_loading_and_kept_again_serves_at_its_first_ready_time(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1)])
    both = ("llama2-7b", "llama3-8b")
    sim.at(1.0, lambda s, now: s.fleet.set_models("i0", both, now))
    sim.at(
        1.1, lambda s, now: s.fleet.set_models("i0", ("llama2-7b",), now)
    )  # a is running: not unloaded yet
    sim.at(1.2, lambda s, now: s.fleet.set_models("i0", both, now))
    res = sim.run([W("a", 0.9, 100, 50, "s"), W("b", 1.3, 100, 5, "t")], strict_services=True)
    a, b = res.records
    assert a.done and b.done and not b.failed
    assert b.first_token_s >= 1.0 + load_s(sim, "llama3-8b")
    assert sim.instances["i0"].models == both and not sim.instances["i0"].cancelled


def test_an_instance_waiting_for_gpus_can_be_changed_or_dropped(tiny):
    sim = make(tiny, [InstancePlan("i0", ("llama2-7b",), 1), InstancePlan("i1", ("llama2-7b",), 1)],
               services=(S7, S8))  # fmt: skip

    def hook(s, now):
        s.fleet.add_instance(InstancePlan("n", ("llama2-7b",), 1), now + 1.0)  # no free GPU: it waits
        s.fleet.add_instance(InstancePlan("m", ("llama2-7b",), 1), now + 1.0)
        s.fleet.set_models("n", ("llama3-8b",), now)  # still waiting: takes 8b instead
        s.fleet.retire_instance("m", now)  # dropped before it ever took a GPU
        s.fleet.retire_instance("i1", now)  # i1 gives its GPU to n

    sim.at(1.0, hook)
    res = sim.run([W("a", 0.0, 100, 5, "s"), W("b", 1.2, 100, 5, "t")], strict_services=True)
    b = res.records[1]
    n = sim.instances["n"]
    assert (n.models, n.started_s) == (("llama3-8b",), 1.0) and sim.instances["m"].started_s is None
    assert b.first_token_s == approx(1.0 + load_s(sim, "llama3-8b") + 0.21, abs=1e-9)
    assert res.gpu_log == [(0.0, 2)]  # i1 out and n in at the same instant


def chaos_run(tiny, seed: int, fast_forward: bool, local: str = "fcfs"):
    """Random adds, model changes and retirements every 0.37 s on 4 GPUs under a random two-model
    workload (the same for a seed whatever ``fast_forward``)."""
    import random

    from llmfleet.sim.run import PolicyBundle

    rng = random.Random(seed)
    models = ("llama2-7b", "llama3-8b")
    spec = tiny.spec(services=(S7, S8), cluster="4xA100-80GB")
    bundle = PolicyBundle(
        "x",
        engine={
            "policy": local,
            "options": {"batch_size": 4, "slice_end": "recompute"} if local == "static_sls" else {},
        },
    )
    plan = [InstancePlan("i0", models, 1), InstancePlan("i1", ("llama2-7b",), 1)]
    sim = Simulator(
        spec, plan, bundle.local_factory(), RoundRobin(), tiny.book(spec), fast_forward=fast_forward
    )
    bad: list = []
    count = [0]

    def chaos(s, now):
        bad.extend(tiny.kv_mismatches(s))
        live = [i for i, (_, ms) in s.fleet.hosting().items() if s.instances[i].started_s is not None]
        action = rng.random()
        if action < 0.3 and s.fleet.gpus_free >= 1:
            count[0] += 1
            ms = tuple(rng.sample(models, rng.randint(1, 2)))
            s.fleet.add_instance(
                InstancePlan(f"x{count[0]}", ms, rng.choice([1, 1, 2])), now + rng.uniform(0, 0.5)
            )
        elif action < 0.8 and live:
            ms = tuple(rng.sample(models, rng.randint(0, 2)))
            s.fleet.set_models(rng.choice(live), ms, now, mode=rng.choice(["move", "drain"]))
        elif live:
            s.fleet.retire_instance(rng.choice(live), now)

    sim.every(0.37, chaos)
    work = sorted(
        (
            W(f"r{k}", rng.uniform(0, 20), rng.randint(1, 600), rng.randint(1, 80), rng.choice("st"))
            for k in range(150)
        ),
        key=lambda w: w.arrival_s,
    )
    return sim, sim.run(work, strict_services=True), bad


@pytest.mark.parametrize(
    ("seed", "local"), [(0, "fcfs"), (1, "fcfs"), (2, "doubling_budget"), (3, "static_sls")]
)
def test_random_changes_lose_nothing_and_fast_forward_stays_exact(tiny, seed, local):
    """Every request ends done with exactly its tokens (or failed with a reason), KV bookkeeping holds
    at every hook, no more GPUs than the cluster's are ever in use, the pools are empty at the end, and
    fast-forwarded chunks give the same records as one iteration at a time."""
    sim, res, bad = chaos_run(tiny, seed, True, local)
    assert bad == []
    for r in res.records:
        assert (r.done and r.produced == r.output_tokens and not r.failed) or (not r.done and r.failed), r
    assert sum(r.done for r in res.records) > 100 and sum(r.moves for r in res.records) > 0
    assert all(0 <= n <= 4 for _, n in res.gpu_log)
    assert all(i.alloc.used_blocks == 0 and not i.core.requests for i in sim.instances.values())
    assert sim.fleet.gpus_used == sum(i.tp for i in sim.instances.values() if i.active)
    _, slow, _ = chaos_run(tiny, seed, False, local)
    for x, y in zip(res.records, slow.records, strict=True):
        assert (x.request_id, x.instance, x.produced, x.moves, x.preemptions, x.failed) == (
            y.request_id, y.instance, y.produced, y.moves, y.preemptions, y.failed,
        )  # fmt: skip
        assert (x.finish_s or 0) == approx(y.finish_s or 0, abs=1e-9)

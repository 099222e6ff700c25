"""The simulator runs the very policy objects of the live services; it holds no copies of policy code."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import llmfleet.sim
import pytest
from llmfleet.kvblocks import BlockAllocator
from llmfleet.policies.batching import StaticSls, StaticSlsOptions
from llmfleet.policies.dispatch import RoundRobin
from llmfleet.policies.request import Fcfs
from llmfleet.workload import WorkloadRequest as W

POLICY_METHODS = {"next_batch", "choose", "form_batch", "preemption_victim", "place", "stable_until"}


def sim_modules() -> list[Path]:
    paths = [Path(p) for p in llmfleet.sim.__path__]
    files = sorted(f for p in paths for f in p.glob("*.py"))
    assert {f.stem for f in files} >= {
        "cost",
        "instance",
        "memory",
        "metrics",
        "records",
        "simulator",
        "spec",
    }
    return files


def test_no_module_of_the_simulator_defines_policy_methods():
    for f in sim_modules():
        tree = ast.parse(f.read_text(), filename=str(f))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert not (defined & POLICY_METHODS), f"{f.name} defines {sorted(defined & POLICY_METHODS)}"
        classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        assert not (classes & {"Fcfs", "DoublingBudget", "RoundRobin", "BlockAllocator", "StaticSls"}), f.name


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def test_instance_and_simulator_import_the_shared_objects():
    files = {f.stem: f for f in sim_modules()}
    inst = imported_modules(files["instance"])
    assert "llmfleet.engine_core" in inst and "llmfleet.policies.batching" in inst
    assert "llmfleet.kvblocks" in inst
    simm = imported_modules(files["simulator"])
    assert "llmfleet.policies.dispatch" in simm
    assert any(m.startswith("llmfleet.policies.placement") for m in simm)
    # and at runtime the names are the policies' own objects, not look-alikes
    instance = importlib.import_module("llmfleet.sim.instance")
    simulator = importlib.import_module("llmfleet.sim.simulator")
    assert instance.BlockAllocator is BlockAllocator
    from llmfleet import engine_core
    from llmfleet.engine_core import core
    from llmfleet.policies import dispatch, placement, request

    assert instance.EngineCore is engine_core.EngineCore  # the live engine's core, not a copy
    assert core.stuck_requests is request.stuck_requests
    assert simulator.InstancePlan is placement.base.InstancePlan
    assert simulator.EngineCandidate is dispatch.EngineCandidate


def test_every_sim_module_imports_cleanly():
    for m in pkgutil.iter_modules(llmfleet.sim.__path__):
        importlib.import_module(f"llmfleet.sim.{m.name}")


@pytest.mark.parametrize("fast_forward", [True, False])
def test_the_simulator_calls_the_given_policy_objects(tiny, fast_forward):
    calls = {"next_batch": 0, "on_iteration": 0, "on_finish": 0, "on_arrival": 0, "choose": 0}
    made: list[Fcfs] = []

    class CountingFcfs(Fcfs):
        def __init__(self):
            made.append(self)

        def on_arrival(self, req, now):
            calls["on_arrival"] += 1
            return super().on_arrival(req, now)

        def next_batch(self, waiting, running, pool, limits, now):
            calls["next_batch"] += 1
            return super().next_batch(waiting, running, pool, limits, now)

        def on_iteration(self, batch, duration_s, now, requests):
            calls["on_iteration"] += 1
            return super().on_iteration(batch, duration_s, now, requests)

        def on_finish(self, req, now):
            calls["on_finish"] += 1
            return super().on_finish(req, now)

    class CountingRR(RoundRobin):
        def choose(self, model, candidates, exclude=frozenset(), request=None):
            calls["choose"] += 1
            assert request is not None and request.model == model and request.prompt_tokens > 0
            return super().choose(model, candidates, exclude, request)

    dispatch = CountingRR()
    sim = tiny.sim(instances=2, make_policy=CountingFcfs, dispatch=dispatch, fast_forward=fast_forward)
    assert sim.dispatch is dispatch
    assert [i.policy for i in sim.instances.values()] == made and len(made) == 2
    assert made[0] is not made[1]  # one policy object per instance
    res = sim.run([W(f"r{i}", 0.05 * i, 50, 6, "s") for i in range(6)])
    assert all(r.done for r in res.records)
    assert calls["choose"] == 6 and calls["on_arrival"] == 6 and calls["on_finish"] == 6
    assert calls["next_batch"] >= calls["on_iteration"] > 0
    # every iteration (or chunk) is reported to the policy once
    iterations = sum(i["iterations"] for i in res.instances)
    if fast_forward:
        assert calls["on_iteration"] <= iterations
    else:
        assert calls["on_iteration"] == iterations


def test_static_policy_object_forms_the_batches(tiny):
    formed = []

    class CountingSls(StaticSls):
        def form_batch(self, waiting, pool, limits, now):
            b = super().form_batch(waiting, pool, limits, now)
            if b is not None:
                formed.append(b.request_ids)
            return b

    sim = tiny.sim(make_policy=lambda: CountingSls(StaticSlsOptions(batch_size=4)))
    res = sim.run([W(f"r{i}", 0.01 * i, 20, 3, "s") for i in range(5)])
    assert all(r.done for r in res.records)
    assert formed == [("r0",), ("r1", "r2", "r3", "r4")]
    assert sim.instances["i0"].static and sim.instances["i0"].policy.__class__ is CountingSls

"""The migration leader's epoch: policy in, ids carrying epoch and leader, the active set, the
``migration_state`` it publishes (only on change) and a successor adopting it. Real etcd; the
engines are a scripted executor."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from llmfleet.api.v1 import common_pb2
from llmfleet.coord.migration_state import get_migration_state
from llmfleet.load.monitor import EngineLoadState, LoadMonitor
from llmfleet.policies.migration import EpochPlan, MellPacker, Migration, migration_id
from llmfleet.types import ENGINE_ROLE, NodeRecord
from llmfleet_migration.coordinator import MigrationCoordinator
from llmfleet_migration.executor import Outcome


@dataclass
class Nodes:
    records: dict[str, NodeRecord]

    def snapshot(self) -> dict[str, NodeRecord]:
        return dict(self.records)


@dataclass
class Executor:
    calls: list[list[Migration]] = field(default_factory=list)
    running: dict = field(default_factory=dict)
    recent: list = field(default_factory=list)

    probed: list[list[tuple[str, str]]] = field(default_factory=list)

    async def run(self, migrations):
        self.calls.append(list(migrations))
        return [Outcome(m, True, bytes=1 << 20, transfer_s=0.01) for m in migrations]

    async def measure_links(self, pairs, nbytes):
        self.probed.append(list(pairs))
        return {p: 5e8 for p in pairs if p != ("b", "a")}


class MoveFirst:
    """Moves every request of engine ``a`` to ``b`` once."""

    def __init__(self) -> None:
        self.done = False

    def epoch(self, gpus, now) -> EpochPlan:
        if self.done:
            return EpochPlan()
        self.done = True
        a = next(g for g in gpus if g.gpu_id == "a")
        moves = tuple(
            Migration(
                migration_id(r.request_id, "a", "b", 0), r.request_id, r.model, "a", "b", r.kv_bytes, r.tokens
            )
            for r in a.requests
        )
        return EpochPlan(moves, deactivate=("a",))


def monitor_with(now: float) -> LoadMonitor:
    m = LoadMonitor()
    for eid, n in (("a", 2), ("b", 1)):
        snap = common_pb2.LoadSnapshot(engine_id=eid, kv_capacity_bytes=1 << 30, running=n)
        for i in range(n):
            snap.requests.add(
                request_id=f"{eid}{i}", model="m", tokens=100, kv_bytes=100 << 10, phase="decode"
            )
        m.engines[eid] = EngineLoadState(eid, f"127.0.0.1:{9000 + len(m.engines)}", snap, now, True)
    return m


def coordinator(etcd_client, policy, name="m-1") -> MigrationCoordinator:
    import time

    nodes = Nodes({e: NodeRecord(e, ENGINE_ROLE, f"10.0.0.{i}:1", models=("m",)) for i, e in enumerate("ab")})
    return MigrationCoordinator(
        name, "mell", policy, None, monitor_with(time.monotonic()), nodes, etcd_client, Executor()
    )


async def test_epoch_runs_moves_with_leader_ids_and_publishes_state(etcd_client) -> None:
    c = coordinator(etcd_client, MoveFirst())
    s = await c.tick()
    (moves,) = c.executor.calls
    assert [m.request_id for m in moves] == ["a0", "a1"]
    assert all(m.migration_id == f"{m.request_id}:a->b#1@m-1" for m in moves)
    assert (s.epoch, s.planned, s.executed, s.deactivated) == (1, 2, 2, ("a",))
    assert c.bandwidth[("a", "b")] == (1 << 20) / 0.01  # learned from the finished KV moves
    state = await get_migration_state(etcd_client)
    assert state is not None and state.epoch == 1 and state.policy == "mell" and state.leader == "m-1"


async def test_mell_gates_engines_and_a_successor_adopts(etcd_client) -> None:
    c = coordinator(etcd_client, MellPacker())
    s = await c.tick()
    # three tiny requests (100 KiB of 1 GiB) on two engines: Allocate packs them onto one, the other
    # is deactivated
    assert len(c.active) == 1 and s.executed >= 1 and len(s.deactivated) == 1
    state = await get_migration_state(etcd_client)
    assert set(state.active) == c.active and state.view  # Mell's view for the schedulers' mell dispatch
    rev = (await etcd_client.get_kv(etcd_client.keys.prefix.rstrip("/") + "/migration_state"))[0].mod_revision
    await c.tick()  # nothing changed: not written again
    assert (await etcd_client.get_kv(etcd_client.keys.prefix.rstrip("/") + "/migration_state"))[
        0
    ].mod_revision == rev
    successor = coordinator(etcd_client, MellPacker(), name="m-2")
    await successor.adopt()
    assert successor.epoch == 1 and successor.active == c.active  # the last epoch written
    await successor.tick()
    assert successor.epoch == 2


async def test_the_computation_boundary_comes_from_the_engines_cost_model(etcd_client) -> None:
    from llmfleet_migration.costs import CostModels

    costs = CostModels(etcd_client)
    await costs.refresh({("llama2-7b", "a100-40gb"), ("mystery", "a100-40gb")})
    # no profiler record: the default cost source (A100-40GB is not measured: the scaled roofline)
    assert costs.get("llama2-7b", "a100-40gb").source == "calibrated:scaled-roofline"
    assert costs.get("mystery", "a100-40gb") is None
    c = coordinator(etcd_client, MoveFirst())
    c.nodes = Nodes({e: NodeRecord(e, ENGINE_ROLE, f"10.0.0.{i}:1", models=("llama2-7b",), hardware="a100-40gb")
                     for i, e in enumerate("ab")})  # fmt: skip
    c.costs = costs
    gpus = [dataclasses.replace(g, models=("llama2-7b",)) for g in c.snapshot_states(time.monotonic())]
    budget = c.budget(gpus)
    assert set(budget.prefill_tokens) == {"a", "b"} and all(v > 0 for v in budget.prefill_tokens.values())
    c.costs = CostModels(etcd_client)  # nothing fetched: the flag's value
    assert c.budget(gpus).prefill("a") == c.prefill_tokens_per_epoch


def no_kv_measured(executor):
    """The executor's moves, reporting no transfer (so only probes measure links)."""
    run = executor.run

    async def wrapped(migrations):
        return [dataclasses.replace(o, transfer_s=0.0) for o in await run(migrations)]

    return wrapped


class MoveBack(MoveFirst):
    """a -> b in the first epoch, then b -> a and a -> b again."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def epoch(self, gpus, now) -> EpochPlan:
        self.n += 1
        if self.n == 1:
            return super().epoch(gpus, now)
        return EpochPlan((
            Migration(f"x{self.n}", "b0", "m", "b", "a", 100 << 10, 100),
            Migration(f"y{self.n}", "a0", "m", "a", "b", 100 << 10, 100),
        ))  # fmt: skip


async def test_a_link_is_probed_once_before_its_first_planned_move(etcd_client) -> None:
    from llmfleet.policies.migration import make_transfer_planner

    c = coordinator(etcd_client, MoveBack())
    c.transfer = make_transfer_planner("kv")
    c.executor.run = no_kv_measured(c.executor)
    await c.tick()
    await c.probes_done()  # probes run beside the epoch, which does not wait for them
    assert c.executor.probed == [[("a", "b")]] and c.bandwidth == {("a", "b"): 5e8}
    await c.tick()
    await c.tick()
    await c.probes_done()
    # b -> a is new in epoch 2 (its probe fails, and is not retried); a -> b was probed already
    assert c.executor.probed == [[("a", "b")], [("b", "a")]]
    c.probe_bytes = 0
    c.probed.clear()
    await c.tick()
    assert len(c.executor.probed) == 2  # probes off

"""Request migration inside a simulation: a :mod:`llmfleet.policies.migration` policy every epoch.

Each epoch (``sim.every``) :class:`MigrationLoop` builds the policy's input from the instances —
one :class:`GpuState` per instance, its requests with the KV they hold now (whole blocks, as the pool
counts them; a waiting request counts its prompt, which it will hold once admitted) — runs the
policy, lets the transfer planner choose each migration's mode within the epoch's budgets, and
executes the moves with ``Fleet.move_request``:

- **KV transfer**: the request is away for ``kv_bytes / link bandwidth`` (the hardware's intra-node
  link for instances on one node, else its inter-node link, at ``comm_eff``) and lands with its KV;
- **token transfer**: it lands at once without KV and re-prefills prompt + output at the destination,
  whose engine core pays the prefill like any other;
- a request still queued (no KV yet) moves at once, whatever the mode: only its tokens exist.

A move the simulator refuses (the request is in the batch in flight, or finished meanwhile) is
skipped; the policy sees the real state next epoch. A request whose KV is still on the wire (or that
landed during a step and waits to join) is in no instance's engine: the policy sees it on its
destination with the KV it carries (live, the source reports it until the transfer ends), not as a
request that finished (a Depart, then an Allocate when it reappears). The same policy objects run live in the
migration coordinator. Budgets (Mell's two bins): a link moves ``bandwidth × epoch`` bytes per epoch;
a destination absorbs the re-prefill tokens whose *marginal* cost — what fusing them into one of its
decode iterations adds, from the cost model — stays within ``prefill_slack`` of that iteration, times
the iterations in the epoch (:func:`~llmfleet.policies.migration.hybrid_transfer.computation_boundary`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from llmfleet.policies.capacity import Saturation, plan_queue_moves
from llmfleet.policies.dispatch import Rebalancer
from llmfleet.policies.migration import (
    GpuState,
    Migration,
    MigrationPolicy,
    RequestState,
    TransferBudget,
    TransferPlanner,
)
from llmfleet.sim.cost import reprefill_boundary

if TYPE_CHECKING:
    from llmfleet.sim.instance import SimInstance
    from llmfleet.sim.simulator import Simulator


@dataclass
class MigrationStats:
    """What the loop did (``report["migration"]``)."""

    policy: str = ""
    transfer: str = ""
    epoch_s: float = 1.0
    epochs: int = 0
    operations: int = 0
    planned: int = 0
    executed: int = 0
    skipped: int = 0  # refused by the simulator (finished, or already leaving)
    queued_moves: int = 0  # of executed: requests still queued (no KV), moved at once
    deferred: int = 0  # did not fit this epoch's transfer budgets
    cancelled: int = 0  # removed by operation batching
    kv_moves: int = 0
    token_moves: int = 0
    kv_bytes_moved: int = 0
    transfer_s_total: float = 0.0  # Σ KV transfer times
    reprefill_tokens: int = 0
    max_per_epoch: int = 0
    policy_counters: dict[str, int] = field(default_factory=dict)  # the policy's own, if it keeps any

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MigrationLoop:
    """Run ``policy`` every ``epoch_s`` simulated seconds; ``transfer`` picks KV or token transfer
    (None: every move carries its KV, unbudgeted)."""

    policy: MigrationPolicy
    transfer: TransferPlanner | None = None
    epoch_s: float = 1.0
    prefill_slack: float = 0.1
    policy_name: str = ""
    transfer_name: str = ""
    stats: MigrationStats = field(init=False)
    _node: dict[str, int] = field(init=False, default_factory=dict)
    _adapters: dict[str, tuple[str, ...]] = field(init=False, default_factory=dict)  # base -> adapters
    _holding: set[str] = field(init=False, default_factory=set)  # requests holding KV (last states)
    _transit: dict[str, tuple[str, RequestState]] = field(
        init=False, default_factory=dict
    )  # rid -> (dst, state)

    def __post_init__(self) -> None:
        if not self.epoch_s > 0:
            raise ValueError(f"epoch_s must be > 0, got {self.epoch_s}")
        self.stats = MigrationStats(self.policy_name, self.transfer_name, self.epoch_s)

    def install(self, sim: Simulator) -> None:
        """Nodes by GPU order (instances fill nodes of ``gpus_per_node`` in plan order); epochs from now."""
        self._adapters = sim.spec.adapters
        per_node = sim.spec.cluster.hw.gpus_per_node
        gpu = 0
        for iid, inst in sim.fleet.instances.items():
            self._node[iid] = gpu // per_node
            gpu += inst.tp
        sim.every(self.epoch_s, self.tick)

    # ------------------------------------------------------------------------------------------ state
    def gpu_states(self, sim: Simulator) -> list[GpuState]:
        self._holding = set()
        arriving: dict[str, list[RequestState]] = {}
        for rid, (dst, r) in list(self._transit.items()):
            at = sim.fleet.instance_of(rid)
            listed = at is not None and rid in sim.fleet.instances[at].core.requests
            if at == dst and not listed:  # on the wire, or landed during a step and waiting to join
                arriving.setdefault(dst, []).append(r)
                self._holding.add(rid)
            elif at == dst or not listed:
                del self._transit[rid]  # joined its destination, finished, or gone
            # else: still on its source (it leaves when the step in flight ends), which reports it
        return [
            self._state(inst, arriving.get(inst.instance_id, ()))
            for inst in sim.fleet.instances.values()
            if inst.active and inst.serving
        ]

    def _state(self, inst: SimInstance, arriving: Sequence[RequestState] = ()) -> GpuState:
        """``arriving``: requests moving here (their KV in transfer), as they left their source."""
        block = inst.layout.block_bytes
        reqs = list(arriving)
        for rid, r in inst.core.requests.items():
            tpb = inst.tpb[r.sched.model]
            holding = r.sched.phase == "decode" or rid in inst.core.running
            tokens = r.kv_tokens if holding else r.sched.prompt_tokens
            if holding:
                self._holding.add(rid)
            kv = -(-max(tokens, 1) // tpb) * block
            reqs.append(RequestState(rid, r.sched.model, kv, max(tokens, 0), r.adapter or ""))
        # an instance with LoRA on serves its bases' adapters (listed beside them, as an engine's node
        # record lists them): a policy moves an adapter's request only where it is served
        served = [a for m in inst.adapter_slots for a in self._adapters.get(m, ())]
        return GpuState(
            inst.instance_id,
            (*inst.models, *served),
            inst.kv_capacity_bytes,
            tuple(reqs),
            active=bool(reqs),
            machine=f"node{self._node.get(inst.instance_id, 0)}",
        )

    def budget(self, sim: Simulator, gpus: Sequence[GpuState]) -> TransferBudget:
        """Per-epoch link bytes (intra- or inter-node) and per-destination re-prefill tokens."""
        hw = sim.spec.cluster.hw
        links: dict[tuple[str, str], float] = {}
        for a in gpus:
            for b in gpus:
                if a.gpu_id != b.gpu_id:
                    bw = hw.intra_node_bw if a.machine == b.machine else hw.inter_node_bw
                    links[(a.gpu_id, b.gpu_id)] = bw * hw.comm_eff * self.epoch_s
        prefill: dict[str, float] = {}
        for g in gpus:
            inst = sim.fleet.instances[g.gpu_id]
            lm = sim.cost.model(inst.models[0], inst.tp)
            ctx = sum(r.tokens for r in g.requests)
            prefill[g.gpu_id] = reprefill_boundary(lm, len(g.requests), ctx, self.epoch_s, self.prefill_slack)
        return TransferBudget(links, 0.0, prefill, 0.0)

    # ------------------------------------------------------------------------------------------ epoch
    def tick(self, sim: Simulator, now: float) -> None:
        gpus = self.gpu_states(sim)
        plan = self.policy.epoch(gpus, now)
        adapter_of = {r.request_id: r.adapter for g in gpus for r in g.requests if r.adapter}
        st = self.stats
        counters = getattr(self.policy, "counters", None)
        if callable(counters):
            st.policy_counters = counters()
        st.epochs += 1
        st.operations += plan.operations
        st.cancelled += plan.cancelled
        st.planned += len(plan.migrations)
        moves: Sequence[Migration] = plan.migrations
        if self.transfer is not None and moves:
            moves, deferred = self.transfer.assign(moves, self.budget(sim, gpus))
            st.deferred += len(deferred)
        done = 0
        hw = sim.spec.cluster.hw
        for m in moves:
            queued = m.request_id not in self._holding
            token = m.mode == "tokens" or queued
            if token:
                transfer_s = 0.0
            else:
                same = self._node.get(m.source) == self._node.get(m.destination)
                transfer_s = m.kv_bytes / ((hw.intra_node_bw if same else hw.inter_node_bw) * hw.comm_eff)
            if not sim.fleet.move_request(m.request_id, m.destination, transfer_s, now, reprefill=token):
                st.skipped += 1
                continue
            done += 1
            if queued:
                st.queued_moves += 1
                continue
            self._transit[m.request_id] = (
                m.destination,
                RequestState(m.request_id, m.model, m.kv_bytes, m.tokens, adapter_of.get(m.request_id, "")),
            )
            if token:
                st.token_moves += 1
                st.reprefill_tokens += m.tokens
            else:
                st.kv_moves += 1
                st.kv_bytes_moved += m.kv_bytes
                st.transfer_s_total += transfer_s
        st.executed += done
        st.max_per_epoch = max(st.max_per_epoch, done)


@dataclass
class RebalanceStats:
    """What the rebalancing loop did (``report["rebalance"]``)."""

    epoch_s: float = 1.0
    epochs: int = 0
    planned: int = 0
    executed: int = 0
    skipped: int = 0  # started (or gone) by the time it would move, or refused by the simulator

    def to_dict(self) -> dict:
        return asdict(self)


def epoch_stats(epoch_s: float) -> RebalanceStats:
    """Fresh stats of a loop run every ``epoch_s`` (ValueError unless > 0)."""
    if not epoch_s > 0:
        raise ValueError(f"epoch_s must be > 0, got {epoch_s}")
    return RebalanceStats(epoch_s)


def queued_at(inst: SimInstance, rid: str) -> bool:
    """``rid`` waits on ``inst`` with nothing computed yet (no token, not in the step in flight): it
    can move without its KV."""
    r = inst.core.requests.get(rid)
    return (
        r is not None
        and r.produced == 0
        and r.sched.phase != "decode"
        and rid not in inst.core.running
        and not inst.core.in_flight(rid)
    )


@dataclass
class RebalanceLoop:
    """Aladdin's Algorithm 2 every ``epoch_s``: the dispatch policy (a
    :class:`~llmfleet.policies.dispatch.Rebalancer`) plans moves of not-yet-started requests from
    under- to over-estimated workers; each is carried out with ``Fleet.move_request`` — at once
    (a queued request has no KV, only its prompt travels) — and recorded with ``apply_move``. A request
    that is no longer queued at its source (its prefill is in the step in flight, it produced a token,
    finished or moved) is skipped: Aladdin never migrates a started request."""

    policy: Rebalancer
    epoch_s: float = 1.0
    stats: RebalanceStats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = epoch_stats(self.epoch_s)

    def install(self, sim: Simulator) -> None:
        sim.every(self.epoch_s, self.tick)

    def tick(self, sim: Simulator, now: float) -> None:
        st = self.stats
        st.epochs += 1
        moves = self.policy.rebalance(now)
        st.planned += len(moves)
        for rid, src_id, dst_id in moves:
            if sim.fleet.instance_of(rid) != src_id or not queued_at(sim.fleet.instances[src_id], rid):
                st.skipped += 1
                continue
            if not sim.fleet.move_request(rid, dst_id, 0.0, now):
                st.skipped += 1
                continue
            self.policy.apply_move(rid, dst_id, now)
            st.executed += 1


@dataclass
class QueueMoveLoop:
    """The alternative to late binding, as the live scheduler's ``--move-queued``: every
    ``epoch_s`` the requests not started on instances past their room move to instances of the same
    model with room (``llmfleet.policies.capacity.queue_moves``), at once (no KV travels)."""

    saturation: Saturation = field(default_factory=Saturation)
    epoch_s: float = 1.0
    stats: RebalanceStats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = epoch_stats(self.epoch_s)

    def install(self, sim: Simulator) -> None:
        sim.every(self.epoch_s, self.tick)

    def tick(self, sim: Simulator, now: float) -> None:
        st = self.stats
        st.epochs += 1
        queued: dict[str, list[tuple[str, str]]] = {}
        for iid, inst in sim.fleet.instances.items():
            rows = [(r.payload.arrival_s, rid, r.sched.model) for rid, r in inst.core.requests.items()
                    if queued_at(inst, rid)]  # fmt: skip
            if rows:
                queued[iid] = [(rid, m) for _, rid, m in sorted(rows)]
        if not queued:
            return
        moves = plan_queue_moves(sim.fleet.candidates(), queued, self.saturation)
        st.planned += len(moves)
        for rid, _src, dst in moves:
            if sim.fleet.move_request(rid, dst, 0.0, now):
                st.executed += 1
            else:
                st.skipped += 1

"""SeaLLM's placement search (Algorithm 1, Appendix A.1): greedy sharing groups scored by simulation.

For each TP candidate p (powers of two ≤ GPUs per node) the pool is cut into groups of p GPUs, then:

    P ← ∅
    loop:
        UI ← SimulateUI(R, P)                       # UI_s = Σ_{r∈R_s} 1[L_r > SLO_s] + α·L_N^s
        for b in groups by ascending average request rate:
            for s in services by descending UI (services no group hosts first, Eq. 3):
                if b.CanAllocate(s): P.AddServices(b, s); restart the loop
        stop when nothing was added
    M_est ← SimulatePerformance(R, P)

and the candidate with the highest simulated SLO attainment wins, ties by lower normalized latency
(a candidate that leaves a service with traffic unhosted loses to one that hosts them all, Eq. 3).

Resolutions (the paper leaves these open):

* ``CanAllocate(b, s)`` ("checks if the GPU memory is enough for serving the shared LLMs with profiled
  memory usage", §4.1): s is not in b yet, b holds fewer than ``max_services`` services (the paper's
  evaluation shares at most 2 per engine), b's GPUs hold the weights of every distinct model in b ∪ {s}
  with ``MIN_KV_FRACTION`` of the memory left, and the unified KV pool left after weights and peak
  activations (:meth:`InstanceMemory.kv_bytes <llmfleet.policies.placement.adapter_costs.InstanceMemory.kv_bytes>`,
  at the pool's engine settings, as the simulator sizes it) holds one request of every model of b ∪ {s} at its longest context
  (:attr:`~llmfleet.costmodel.models.ModelArch.max_context`), vLLM's start-up rule (``max_model_len``
  must fit the KV cache). A pool that holds the mean request but not the longest passes groups whose
  longest requests, once preempted by the pool filling, can never be prefilled again. With LoRA on
  (``GpuPool.adapter_slots``) each model's adapter pool counts with its weights and comes out of the KV pool, as the engines reserve it
  (:class:`~llmfleet.policies.placement.adapter_costs.InstanceMemory`); the LoRA computation is in the
  simulated score. Without the KV term, 70B + 7B on two A100-80GB passed with a 1 GB pool (3,105 tokens
  of the 70B) while the 70B's prompts averaged 3,836 tokens: the engine fails such requests. A model
  (or its requests) too big for an empty group merges it with another empty group (p → 2p, within a
  node), as the paper says.
* Every service is placed (Eq. 3): a service with traffic that no group hosts goes before the UI order.
  By UI alone a small service (OPT's ~6 % of the rate) can stay below the violations of the big ones
  until every group is full, and its requests are then all lost.
* A group's average rate is Σ_{s∈b} rate_s / replicas_s (a service in k groups sends each 1/k).
* UI ties: higher request rate first, then name. Group ties: fewer GPUs, then id.
* The candidates advance in lockstep: each round the evaluator scores every candidate's current
  partial plan in one call, so a parallel evaluator runs the candidates' simulations side by side
  (the paper: 8 processes). The last evaluation of a candidate (the one after which nothing fits) is its
  M_est — the plan did not change since. A plan is scored once (candidates share the empty plan).
* Speculation (ours; the result is the same plan, only sooner): a round that leaves worker slots idle
  (fewer partial plans than ``evaluator.parallelism``, e.g. once only the TP-1 candidate, the longest
  chain, is left) fills them with the plans the next steps would make if the unserved index kept its
  last ordering. A step whose guessed plan was scored takes that score without another round.
* A new service (in ``services`` but hosted by no instance of ``context.current``) first gets the
  minimum dedicated GPUs: the smallest fitting group on GPUs the current plan leaves free, without a
  search (SeaLLM §4); the next periodic search then places everything.
* Cold start (ours, the same rule): with no evaluator — a live leader that has seen no requests yet —
  every unhosted service gets its minimum dedicated GPUs, even when nothing is placed at all; with every
  service hosted and no evaluator there is nothing to search on (ValueError).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from llmfleet.costmodel.models import model_arch
from llmfleet.policies.placement.adapter_costs import InstanceMemory
from llmfleet.policies.placement.base import (
    GpuPool,
    InstancePlan,
    PlacementContext,
    PlacementInfeasible,
    PlacementNeeds,
    PlanEvaluator,
    PlannerReport,
    PlanScore,
    ServiceLoad,
)
from llmfleet.policies.placement.dedicated_even import GIB, MIN_KV_FRACTION, fits_tp, pool_note, smallest_tp


def _has_traffic(s: ServiceLoad) -> bool:
    """Arrivals in the window or requests waiting: Eq. 3 wants such a service hosted."""
    return s.rate_rps > 0 or s.queued > 0


@dataclass
class _Group:
    gid: str
    tp: int
    services: list[str] = field(default_factory=list)


@dataclass
class _Candidate:
    """One (TP, sharing cap) candidate's search state."""

    tp: int
    cap: int
    groups: list[_Group]
    done: bool = False
    score: PlanScore | None = None
    added: list[tuple[str, str]] = field(default_factory=list)  # (group, service) in order


@dataclass(frozen=True)
class SeaLLMOptions:
    """Algorithm 1's options.

    Args:
        max_services: services per sharing group (paper's evaluation: 2); a sequence searches each cap
            as a further candidate dimension (e.g. ``(1, 2)`` also scores simulation-sized dedicated
            plans, so sharing is chosen only where the simulator says it helps — our extension).
        alpha: α of the unserved index (paper: 1e-4).
        tp_candidates: TP sizes to try (default: powers of two ≤ GPUs per node).
        speculate: fill idle evaluator slots with guessed next plans (same result; see the module doc).
    """

    max_services: int | Sequence[int] = 2
    alpha: float = 1e-4
    tp_candidates: Sequence[int] | None = None
    speculate: bool = True

    def __post_init__(self) -> None:
        caps = self.caps
        if not caps or any(c < 1 for c in caps):
            raise ValueError(f"max_services must be >= 1 (or a sequence of such), got {self.max_services}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        for tp in self.tp_candidates or ():
            if tp < 1 or tp & (tp - 1):
                raise ValueError(f"tp candidates must be powers of two, got {tp}")

    @property
    def caps(self) -> tuple[int, ...]:
        """The group-size caps searched, ascending."""
        m = self.max_services
        return tuple(sorted(set((m,) if isinstance(m, int) else m)))


class SeaLLMPlacement(PlannerReport):
    """Algorithm 1 of SeaLLM with ``options``; see the module docstring. Needs a
    :class:`PlanEvaluator` in the context."""

    name = "seallm"
    needs = PlacementNeeds(evaluator=True)
    Options: ClassVar[type[SeaLLMOptions]] = SeaLLMOptions

    def __init__(self, options: SeaLLMOptions | None = None) -> None:
        o = options if options is not None else SeaLLMOptions()
        self.caps = o.caps
        self.alpha = float(o.alpha)
        self.tp_candidates = tuple(o.tp_candidates) if o.tp_candidates else None
        self.speculate = bool(o.speculate)
        self.last_score: PlanScore | None = None  # M_est of the last plan returned (None: not simulated)
        self.last_reason = ""
        self.evaluations = 0  # plans the last search simulated (each distinct plan once)
        self.speculated = 0  # of those, simulated ahead of need (see the module doc)
        self.speculation_hits = 0  # of those, the ones a later step used
        self.search_log: dict = {}  # tp (or (tp, cap)) -> (group, service) added, in order

    # ---------------------------------------------------------------------------------- helpers
    @staticmethod
    def _fits(members: Sequence[ServiceLoad], tp: int, memory: InstanceMemory) -> bool:
        """CanAllocate's memory check: weights and adapter pools (with ``MIN_KV_FRACTION`` left), and one
        request of each member's model at its longest context in the KV pool left after weights, adapter
        pools and peak activations."""
        archs = [model_arch(m) for m in sorted({s.model for s in members})]
        if not fits_tp(memory.fixed_bytes(archs), memory.hw.mem_bytes, tp, MIN_KV_FRACTION):
            return False
        return memory.holds_longest(tp, archs)

    def unserved_index(self, score: PlanScore, services: Sequence[ServiceLoad]) -> dict[str, float]:
        """UI_s = Σ_r 1[L_r > SLO_s] + α·L_N^s for every service (0 for one with no requests)."""
        return {
            s.name: score.violations.get(s.name, 0) + self.alpha * score.latency_sum.get(s.name, 0.0)
            for s in services
        }

    @staticmethod
    def _plan(cand: _Candidate, model_of: dict[str, str]) -> list[InstancePlan]:
        return [
            InstancePlan(g.gid, tuple(sorted({model_of[s] for s in g.services})), g.tp)
            for g in cand.groups
            if g.services
        ]

    def _step(
        self,
        cand: _Candidate,
        ui: dict[str, float],
        services: Sequence[ServiceLoad],
        gpus_per_node: int,
        memory: InstanceMemory,
    ) -> bool:
        """One pass of the loop body: add the first (group, service) that fits; False when none does."""
        svc = {s.name: s for s in services}
        replicas = {s.name: 0 for s in services}
        for g in cand.groups:
            for s in g.services:
                replicas[s] += 1

        def group_rate(g: _Group) -> float:
            return sum(svc[s].rate_rps / replicas[s] for s in g.services)

        def placed_or_idle(s: ServiceLoad) -> bool:  # Eq. 3: unhosted services with traffic go first
            return replicas[s.name] > 0 or not (_has_traffic(s) or ui[s.name] > 0)

        groups = sorted(cand.groups, key=lambda g: (group_rate(g), g.tp, g.gid))
        order = sorted(services, key=lambda s: (placed_or_idle(s), -ui[s.name], -s.rate_rps, s.name))
        for g in groups:
            if len(g.services) >= cand.cap:
                continue
            for load in order:
                if load.name in g.services:
                    continue
                members = [svc[x] for x in g.services] + [load]
                if self._fits(members, g.tp, memory):
                    g.services.append(load.name)
                    cand.added.append((g.gid, load.name))
                    return True
                if not g.services and self._merge(cand, g, members, gpus_per_node, memory):
                    g.services.append(load.name)
                    cand.added.append((g.gid, load.name))
                    return True
        return False

    def _guesses(
        self,
        active: Sequence[_Candidate],
        last_ui: dict[int, dict[str, float]],
        services: Sequence[ServiceLoad],
        gpus_per_node: int,
        memory: InstanceMemory,
        model_of: dict[str, str],
        slots: int,
        known: dict,
    ) -> dict[tuple[InstancePlan, ...], list[InstancePlan]]:
        """Up to ``slots`` plans not in ``known`` that the active candidates' next steps make if their
        last unserved index still held: one step ahead for each candidate in turn, then two, ..."""
        out: dict[tuple[InstancePlan, ...], list[InstancePlan]] = {}
        chains = [
            (
                _Candidate(c.tp, c.cap, [_Group(g.gid, g.tp, list(g.services)) for g in c.groups]),
                last_ui[id(c)],
            )
            for c in active
            if id(c) in last_ui
        ]
        while slots > 0 and chains:
            alive = []
            for sim, ui in chains:
                if slots == 0 or not self._step(sim, ui, services, gpus_per_node, memory):
                    continue
                alive.append((sim, ui))
                plan = self._plan(sim, model_of)
                if tuple(plan) not in known and tuple(plan) not in out:
                    out[tuple(plan)] = plan
                    slots -= 1
            chains = alive
        return out

    def _merge(
        self,
        cand: _Candidate,
        g: _Group,
        members: list[ServiceLoad],
        gpus_per_node: int,
        memory: InstanceMemory,
    ) -> bool:
        """Grow the empty group ``g`` by absorbing other empty groups of its size until ``members`` fit."""
        while not self._fits(members, g.tp, memory):
            if g.tp * 2 > gpus_per_node:
                return False
            other = next((o for o in cand.groups if o is not g and not o.services and o.tp == g.tp), None)
            if other is None:
                return False
            cand.groups.remove(other)
            g.tp *= 2
            g.gid = f"{g.gid}+{other.gid.rsplit('-', 1)[-1]}"
        return True

    def _new_services(
        self,
        gpus: GpuPool,
        services: Sequence[ServiceLoad],
        current: Sequence[InstancePlan],
        memory: InstanceMemory,
        cold: bool = False,
    ) -> list[InstancePlan] | None:
        """The current plan plus minimal dedicated groups for services it does not host, or None when
        every service is hosted (or the free GPUs cannot hold the newcomers: then search). An empty
        current plan is searched unless ``cold`` (no evaluator: nothing to search on)."""
        hosted = {m for p in current for m in p.models}
        new = [s for s in services if s.model not in hosted]
        if not new or not (current or cold):
            return None
        free = gpus.count - sum(p.tp for p in current)
        plan = list(current)
        for m in sorted({s.model for s in new}):
            fixed = memory.fixed_bytes([model_arch(m)])
            tp = smallest_tp(fixed, memory.hw.mem_bytes, gpus.gpus_per_node, MIN_KV_FRACTION)
            if tp is None or tp > free:
                return None
            plan.append(InstancePlan(f"new-{m}", (m,), tp))
            free -= tp
        return plan

    # -------------------------------------------------------------------------------------- place
    def place(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], context: PlacementContext | None = None
    ) -> list[InstancePlan]:
        ctx = context or PlacementContext()
        self.evaluations = 0
        if not services:
            self.last_score, self.last_reason = None, "no services"
            return []
        memory = InstanceMemory.of(gpus)
        evaluator = ctx.evaluator
        cold = evaluator is None
        quick = self._new_services(gpus, services, ctx.current, memory, cold=cold)
        if quick is not None:
            self.last_score = None
            self.last_reason = "new services get minimal dedicated GPUs before the next search" + (
                " (no recent workload to search on)" if cold else ""
            )
            return quick
        if evaluator is None:
            raise ValueError(
                "the seallm planner searches on recent requests (PlacementContext.evaluator) and has none"
            )
        cands = self._candidates(gpus, services, memory)
        model_of = {s.name: s.model for s in services}
        self._search(cands, services, gpus.gpus_per_node, memory, model_of, evaluator)
        return self._best(cands, services, model_of)

    def _candidates(
        self, gpus: GpuPool, services: Sequence[ServiceLoad], memory: InstanceMemory
    ) -> list[_Candidate]:
        """One empty candidate per (TP size, sharing cap): the pool cut into groups of that TP."""
        for m in {s.model for s in services}:
            fixed = memory.fixed_bytes([model_arch(m)])
            if smallest_tp(fixed, memory.hw.mem_bytes, gpus.gpus_per_node, MIN_KV_FRACTION) is None:
                raise PlacementInfeasible(
                    f"model {m!r}: {fixed / GIB:.1f} GiB of weights{pool_note(memory.pool_bytes(model_arch(m)))} do not fit "
                    f"{gpus.gpus_per_node} {gpus.hardware} GPUs of a node"
                )
        tps = self.tp_candidates or tuple(1 << i for i in range(gpus.gpus_per_node.bit_length()))
        cands = [
            _Candidate(tp, cap, [_Group(f"tp{tp}-{i}", tp) for i in range(gpus.count // tp)])
            for tp in tps
            for cap in self.caps
            if tp <= min(gpus.count, gpus.gpus_per_node)
        ]
        if not cands:
            raise PlacementInfeasible(f"no TP candidate fits a pool of {gpus.count} GPUs")
        return cands

    def _search(
        self,
        cands: list[_Candidate],
        services: Sequence[ServiceLoad],
        gpus_per_node: int,
        memory: InstanceMemory,
        model_of: dict[str, str],
        evaluator: PlanEvaluator,
    ) -> None:
        """Run the candidates in lockstep until none can add a service: each round scores every
        candidate's current plan in one call (with speculative guesses in idle slots), then steps each."""
        self.speculated = self.speculation_hits = 0
        scored: dict[tuple[InstancePlan, ...], PlanScore] = {}
        ahead: set[tuple[InstancePlan, ...]] = set()  # scored speculatively, not used yet
        last_ui: dict[int, dict[str, float]] = {}
        width = max(1, evaluator.parallelism) if self.speculate else 1
        while True:
            active = [c for c in cands if not c.done]
            if not active:
                break
            need: dict[tuple[InstancePlan, ...], list[InstancePlan]] = {}
            for c in active:
                plan = self._plan(c, model_of)
                if tuple(plan) not in scored:
                    need.setdefault(tuple(plan), plan)
            if need:
                guesses = self._guesses(active, last_ui, services, gpus_per_node, memory, model_of,
                                        (-len(need)) % width, {**scored, **need})  # fmt: skip
                scores = evaluator.evaluate([*need.values(), *guesses.values()])
                scored.update(zip([*need, *guesses], scores, strict=True))
                ahead.update(guesses)
                self.speculated += len(guesses)
                self.evaluations += len(need) + len(guesses)
            for c in active:
                key = tuple(self._plan(c, model_of))
                if key in ahead:
                    ahead.discard(key)
                    self.speculation_hits += 1
                c.score = scored[key]
                last_ui[id(c)] = ui = self.unserved_index(c.score, services)
                if not self._step(c, ui, services, gpus_per_node, memory):
                    c.done = True

    def _best(
        self, cands: list[_Candidate], services: Sequence[ServiceLoad], model_of: dict[str, str]
    ) -> list[InstancePlan]:
        """The searched candidate that hosts the most services with traffic, then has the highest
        simulated SLO attainment, then the lowest normalized latency (Eq. 3); its plan."""
        # every candidate is scored by the search; (candidate, its score) of those hosting a service
        placed = [(c, c.score) for c in cands if c.score is not None and any(g.services for g in c.groups)]
        if not placed:
            raise PlacementInfeasible("no service fits any GPU group of the pool")
        self.search_log = {(c.tp if len(self.caps) == 1 else (c.tp, c.cap)): list(c.added) for c in cands}
        wanted = {s.name for s in services if _has_traffic(s)}

        def unhosted(c: _Candidate) -> int:  # Eq. 3: services with traffic the plan leaves out
            return len(wanted - {s for g in c.groups for s in g.services})

        def rank(entry: tuple[_Candidate, PlanScore]) -> tuple[int, float, float, int, int]:
            c, score = entry
            return unhosted(c), -score.slo_attainment, score.normalized_latency, c.tp, c.cap

        best, score = min(placed, key=rank)
        self.last_score = score
        self.last_reason = (
            f"tp={best.tp}, ≤ {best.cap} services per group: simulated SLO attainment {score.slo_attainment:.3f}, normalized latency "
            f"{score.normalized_latency:.2f} (best of {len(placed)} candidates, "
            f"{self.evaluations} simulations, {self.speculation_hits} of {self.speculated} speculative "
            "ones used)"
        )
        return self._plan(best, model_of)

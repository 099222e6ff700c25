"""SeaLLM's doubling-budget (DB) scheduling (SeaLLM §4.3 and Algorithm 2, appendix A.2).

Ideal priority (eq. 7): O_r = T'_r · L̂_s, the estimated remaining time times the service's mean execution
time, smallest first — the c-μ / exchange-argument order that minimises the normalized latency
L_N = Σ_r L_r / L̂_s (Theorems 1 and 2). T'_r is unknown, so DB uses a budget instead:

* Budget at arrival: Q_r = L̂_s + σ_s (mean and standard deviation of service s's execution time,
  :class:`~llmfleet.policies.request.service_stats.ServiceStats`, fed by ``on_finish``).
* Q_r decreases by the duration of every iteration r takes part in (the whole iteration is charged to
  each member of the batch).
* Priority O_r = Q_r · L̂_s; the smallest runs first. Ties: earlier arrival, then request id.
* Renewal with geometric doubling (``renewal="reset"``, the default, as the paper states): when Q_r ≤ 0
  the k-th renewal **resets** the budget to Q′ = 2^k (L̂_s + σ_s), k = 1, 2, ... ("we double its budget,
  i.e. Q′ = 2(L̂_s + Var_s), and reset its priority to Q′·L̂_s. We repeat to double the budget once the
  budget is used up", §4.2). The time run past the exhausted budget is dropped, so one iteration renews
  at most once and Q_r depends on how the executed time was cut into iterations (engine and simulator
  charge the same iterations, so they agree). ``renewal="carry"`` is the earlier variant that takes the
  overshoot off the new budget (Q_r ← Q_r + 2^k (L̂_s + σ_s), repeated while Q_r ≤ 0; after k renewals
  Q_r = (2^{k+1} − 1)(L̂_s + σ_s) − executed time). It did not measure clearly better on the SeaLLM
  benchmark (normalized latency within 1–4% of reset at every rate, lower at three of the four loaded
  rates; see docs/benchmarks/placement.md), so it is an option only.
* Starvation: a service is starving when one of its requests has made no progress for longer than the
  service's threshold (config per service; default ``starvation_factor`` × L̂_s = 100 L̂_s; the paper
  gives no value). L̂_s is the single-request time, which a request under colocated, batched load
  exceeds many times over: at 10 L̂_s (the earlier default, set when L̂_s was the batched time) the
  threshold tripped for every service under overload and turned DB into longest-stall-first (SeaLLM
  benchmark, 160 req/s: normalized latency 101.6 at 10×, 29.2 at 100×, 29.1 with starvation off). "No
  progress"
  is counted from the end of the last iteration the request took part in (from its arrival if it never
  ran), for waiting prefills and running decodes alike, so neither a queued nor an admitted request can
  stall forever. Starving services are served first, the longest-stalled first; a starving service's
  batch is seeded with its longest-stalled request.
* Seed = the first request of the ranking (starving services first, then all by O_r). If it is a
  prefill that does not fit the pool, the batch is seeded with the best decode instead (decodes free KV
  as they finish) and no prefill is admitted, or, with nothing running, with the best prefill that
  fits; ``None`` only when nothing can run. Queues are never mutated (Algorithm 2 as printed can loop
  forever; this cannot). The seed's service and model are DB's choice; ``admission`` says what of that
  service's work runs with it:

  - ``"literal"``: Algorithm 2 as printed. The batch holds ONE service, ONE phase and ONE model: the
    seed, then requests of the same service, phase and model in priority order until ``max_requests``,
    or for prefills until the next one does not fit the prefill-token limit or the pool (summed over
    the batch). A running request that has not used up its first budget ranks ahead of a new request
    of its service (its O_r has only fallen), so new requests wait until the running batch renews.
  - ``"mixed"`` (default): one service, both phases: the service's running decodes (priority order, up
    to ``max_requests``) plus its waiting prefills that fit the remaining slots, the limits and the
    pool. It is the default because it measured lowest: on the SeaLLM benchmark
    (docs/benchmarks/papers.md) its mean normalized latency was 0–9 % below ``prefill_first``'s at
    every point of four model assignments × 5/10/20 req/s and 21 % below at 30 req/s (assignment 0,
    offered load 0.66), and ``literal``'s was 1.2–3.2× ``prefill_first``'s. The paper's token-level
    results (TTFT up to 51.98× lower than vLLM, TPOT similar, §6.2) describe an engine that admits new
    requests promptly, which the literal reading does not.
  - ``"prefill_first"``: one service, one phase, and that service's waiting prefills join
    first: if any of them can be admitted (priority order, the same limits and pool check, no more
    than ``max_requests`` running + admitted requests of the service), the iteration is those prefills;
    only when none can be admitted does it decode the service's running requests. This is vLLM
    0.2–0.4's one-phase rule inside DB's choice of service. It keeps the paper's batch rule (one service
    and one phase per iteration).
* Preemption victim: the running request with the largest O_r (least urgent), ties by later arrival.

Budgets live in the policy's own table (:class:`RequestBudget` per request object), so they survive
preemption; a request the policy has not seen (e.g. one migrated in from another engine) is
initialised on first sight, and its entry goes with the request: at ``on_finish``, or when the
request object is gone (cancelled, migrated away).

L̂_s and σ_s (``exec_time``). Eq. 7's L̂_r is "the profiled execution time of r on one GPU", and L̂_s the
mean execution time of the service's requests: ``exec_time="solo"`` (default) has ``on_finish`` observe
the finished request's **single-request** execution time, ``cost.solo_time(model, prompt_tokens,
generated)`` from a cost model the policy declares by type
(:class:`~llmfleet.policies.request.solo_cost.SoloCost`; default the default cost source on one A100-80GB,
``cost={"hardware": NAME}`` for another GPU). A model the cost model does not know (a KeyError, e.g. a
tiny test model outside the catalog) falls back to the executed time below and is counted in
``solo_fallbacks``. A request preempted with recompute has its regenerated tokens folded into its prompt,
so they count as prefill there. ``exec_time="executed"`` is the earlier behaviour: the summed durations
of the batched iterations the request took part in (``executed_s``; now − arrival_s if it never ran),
which grows with the batch and the colocated load rather than with the request. (Never now −
first_scheduled_s: that counts the time spent waiting while other services ran, which inflates a
starved service's L̂_s and lowers its priority further — a feedback loop the simulator exposed.)
Budgets are still charged with the real (batched) iteration durations: "the budget Q decreases with
the request execution".
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from llmfleet.policies.request.base import (
    Batch,
    BatchLimits,
    BatchPhase,
    Phase,
    PoolView,
    SchedRequest,
    admit_prefills,
    batch_members,
    check_duration,
    fits_alone,
    mark_ran,
)
from llmfleet.policies.request.service_stats import ServiceStats
from llmfleet.policies.request.solo_cost import SoloCost, as_solo_cost

MIN_BUDGET_UNIT_S = 1e-6  # floor of L̂_s + σ_s so a degenerate service (all zeros) still renews finitely
Renewal = Literal["reset", "carry"]
ExecTime = Literal["solo", "executed"]
Admission = Literal["mixed", "prefill_first", "literal"]
RENEWALS: tuple[Renewal, ...] = get_args(Renewal)
EXEC_TIMES: tuple[ExecTime, ...] = get_args(ExecTime)
ADMISSIONS: tuple[Admission, ...] = get_args(Admission)


@dataclass(frozen=True)
class DoublingBudgetOptions:
    """DB's options (see the module docstring): ``default_mean_s`` and ``default_std_s`` are the prior
    L̂_s and σ_s of a service before its first finished request; a service starves after
    ``starvation_threshold_s[service]``, else ``starvation_factor`` × L̂_s (None: never); ``renewal``,
    ``exec_time`` and ``admission`` choose the variants; ``cost`` prices the solo execution time."""

    default_mean_s: float = 1.0
    default_std_s: float = 0.5
    starvation_factor: float | None = 100.0
    starvation_threshold_s: Mapping[str, float] = field(default_factory=dict)
    renewal: Renewal = "reset"
    exec_time: ExecTime = "solo"
    cost: SoloCost | Mapping[str, Any] | None = None
    admission: Admission = "mixed"

    def __post_init__(self) -> None:
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {self.admission!r}")
        if self.renewal not in RENEWALS:
            raise ValueError(f"renewal must be one of {RENEWALS}, got {self.renewal!r}")
        if self.exec_time not in EXEC_TIMES:
            raise ValueError(f"exec_time must be one of {EXEC_TIMES}, got {self.exec_time!r}")
        factor = self.starvation_factor
        if factor is not None and not factor > 0:
            raise ValueError(f"starvation_factor must be > 0 or None, got {factor!r}")
        bad = {s: t for s, t in self.starvation_threshold_s.items() if not t > 0}
        if bad:
            raise ValueError(f"starvation_threshold_s must be > 0 (inf disables): {bad}")


@dataclass(slots=True)
class RequestBudget:
    """One request's budget: ``left_s`` is Q_r, the time it may still run before its next renewal, and
    ``renewals`` is k, how many times it was renewed. ``owner`` is the request it belongs to."""

    owner: weakref.ref[SchedRequest]
    left_s: float
    renewals: int = 0


class DoublingBudget:
    """SeaLLM DB scheduling with ``options``; ``stats`` shares an existing ServiceStats (its priors
    then apply instead of the options' defaults)."""

    name = "doubling_budget"
    Options: ClassVar[type[DoublingBudgetOptions]] = DoublingBudgetOptions

    def __init__(
        self, options: DoublingBudgetOptions | None = None, *, stats: ServiceStats | None = None
    ) -> None:
        o = options if options is not None else DoublingBudgetOptions()
        self.admission = o.admission
        self.renewal = o.renewal
        self.exec_time = o.exec_time
        self.cost: SoloCost | None = as_solo_cost(o.cost) if o.exec_time == "solo" else None
        self.solo_fallbacks = 0  # finished requests whose model the cost model did not know
        self.stats = stats if stats is not None else ServiceStats(o.default_mean_s, o.default_std_s)
        self.starvation_factor = o.starvation_factor
        self.starvation_threshold_s = dict(o.starvation_threshold_s)
        self._budgets: dict[int, RequestBudget] = {}  # id(request) -> its budget

    # ------------------------------------------------------------------ formulas

    def observe(self, service: str, exec_time_s: float) -> None:
        """Seed/feed service statistics with one execution time (see ServiceStats.observe)."""
        self.stats.observe(service, exec_time_s)

    def budget_unit(self, service: str) -> float:
        """L̂_s + σ_s: the initial budget, and the base of the geometric renewals 2^k (L̂_s + σ_s)."""
        return max(self.stats.mean(service) + self.stats.std(service), MIN_BUDGET_UNIT_S)

    def priority_of(self, req: SchedRequest) -> float:
        """O_r = Q_r · L̂_s (smaller runs first)."""
        return self.budget(req).left_s * self.stats.mean(req.service)

    def starvation_threshold(self, service: str) -> float:
        """The configured threshold, else starvation_factor × L̂_s; inf when starvation is disabled."""
        if service in self.starvation_threshold_s:
            return self.starvation_threshold_s[service]
        if self.starvation_factor is None:
            return math.inf
        return self.starvation_factor * self.stats.mean(service)

    def charge(self, req: SchedRequest, duration_s: float) -> None:
        """Q_r −= duration; if Q_r ≤ 0: k += 1 and Q_r = 2^k (L̂_s + σ_s) (``reset``, the paper), or
        while Q_r ≤ 0: k += 1, Q_r += 2^k (L̂_s + σ_s) (``carry``: the overshoot is taken off)."""
        self._charge(req, duration_s, self.stats.mean(req.service))

    def _charge(self, req: SchedRequest, duration_s: float, mean_s: float) -> None:
        """:meth:`charge` with the service's L̂_s (``mean_s``) looked up once for a whole batch."""
        b = self.budget(req)
        b.left_s -= duration_s
        if b.left_s <= 0:
            if self.renewal == "reset":
                b.renewals += 1
                b.left_s = (2**b.renewals) * self.budget_unit(req.service)
            while b.left_s <= 0:
                b.renewals += 1
                b.left_s += (2**b.renewals) * self.budget_unit(req.service)
        req.priority = b.left_s * mean_s

    def starving_services(
        self, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], now: float
    ) -> list[tuple[str, SchedRequest]]:
        """(service, its longest-stalled request) for every starving service, longest stall first."""
        worst: dict[str, tuple[float, SchedRequest]] = {}
        for queue in (waiting, running):
            for r in queue:
                last = r.last_run_s
                _note_stall(worst, r, now - (last if last is not None else r.arrival_s))
        return self._starving(worst)

    def _starving(self, worst: Mapping[str, tuple[float, SchedRequest]]) -> list[tuple[str, SchedRequest]]:
        """The services whose longest stall (``worst``: service -> stall, request) passes their
        threshold, longest stall first."""
        starving = [(s, svc, r) for svc, (s, r) in worst.items() if s > self.starvation_threshold(svc)]
        starving.sort(key=lambda t: (-t[0], t[1]))
        return [(svc, r) for _, svc, r in starving]

    # ------------------------------------------------------------------ RequestPolicy

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        """InitBudget + InitPriority: Q_r = L̂_s + σ_s, O_r = Q_r · L̂_s (kept if already initialised)."""
        self.budget(req)

    def next_batch(
        self,
        waiting: Sequence[SchedRequest],
        running: Sequence[SchedRequest],
        pool: PoolView,
        limits: BatchLimits,
        now: float,
    ) -> Batch | None:
        if not waiting and not running:
            return None
        worst: dict[str, tuple[float, SchedRequest]] = {}
        best_w = self._scan(waiting, now, worst)
        best_r = self._scan(running, now, worst)
        chosen = self._seed(waiting, running, best_w, best_r, self._starving(worst), pool, now)
        if chosen is None:
            return None
        seed, phase, blocked = chosen
        # the seed's service and model in priority order (a stable sort of the queue, filtered)
        svc, model = seed.service, seed.model
        prefills = sorted([r for r in waiting if r.service == svc and r.model == model], key=_key)
        decodes = sorted([r for r in running if r.service == svc and r.model == model], key=_key)
        if self.admission == "literal":
            queue = prefills if phase == "prefill" else decodes
            peers = [r for r in queue if r.request_id != seed.request_id and _same(r, seed)]
            if phase == "decode":
                members = [seed, *peers][: limits.max_requests]
            else:
                members = admit_prefills([seed, *peers], pool, limits, limits.max_requests)
            return Batch(seed.model, phase, tuple(r.request_id for r in members))
        return self._service_batch(seed, phase, prefills, decodes, pool, limits, blocked)

    def _service_batch(
        self,
        seed: SchedRequest,
        phase: Phase,
        prefills: list[SchedRequest],
        decodes: list[SchedRequest],
        pool: PoolView,
        limits: BatchLimits,
        blocked: bool,
    ) -> Batch:
        """``prefill_first`` and ``mixed``: the seed's service's admissible prefills first (priority
        order), with (``mixed``) or instead of (``prefill_first``) its running decodes."""
        first = [seed]  # the seed leads its queue (a starving service's longest-stalled request)
        runs = _lead(first if phase == "decode" else [], decodes, seed)
        waits = [] if blocked else _lead(first if phase == "prefill" else [], prefills, seed)
        if self.admission == "prefill_first":
            admitted = admit_prefills(waits, pool, limits, limits.max_requests - len(runs))
            if admitted:
                return Batch(seed.model, "prefill", tuple(r.request_id for r in admitted))
            return Batch(seed.model, "decode", tuple(r.request_id for r in runs[: limits.max_requests]))
        runs = runs[: limits.max_requests]
        admitted = admit_prefills(waits, pool, limits, limits.max_requests - len(runs))
        kind: BatchPhase = "mixed" if runs and admitted else ("decode" if runs else "prefill")
        return Batch(seed.model, kind, tuple(r.request_id for r in (*runs, *admitted)))

    def stable_until(
        self, batch: Batch, waiting: Sequence[SchedRequest], running: Sequence[SchedRequest], now: float
    ) -> float:
        """How long ``batch`` stays DB's choice if only time passes (the simulator's fast-forward).

        For a pure-decode batch with no starving service: the members' budgets only fall (their O_r
        falls, so they stay ahead of every other request, whose O_r is frozen) until the first member's
        Q_r is used up (a renewal raises its O_r), and no other service can start starving before its
        oldest stall reaches its threshold. Waiting prefills that did not fit cannot fit later (free
        blocks only shrink while decoding). Otherwise the batch may change at the next iteration.
        """
        if batch.phase != "decode" or self.starving_services(waiting, running, now):
            return now
        ids = set(batch.request_ids)
        horizon = now + min(self.budget(r).left_s for r in running if r.request_id in ids)
        thresholds: dict[str, float] = {}
        for queue in (waiting, running):
            for r in queue:
                if r.request_id not in ids:
                    svc = r.service
                    threshold = thresholds.get(svc)
                    if threshold is None:
                        threshold = thresholds[svc] = self.starvation_threshold(svc)
                    last = r.last_run_s
                    until = (last if last is not None else r.arrival_s) + threshold
                    if until < horizon:
                        horizon = until
        return horizon

    def on_iteration(
        self, batch: Batch, duration_s: float, now: float, requests: Sequence[SchedRequest]
    ) -> None:
        """UpdateBudget + UpdatePriority for the members of ``batch``."""
        check_duration(duration_s)
        means = self._means()
        for r in batch_members(batch, requests):
            mark_ran(r, duration_s, now)
            self._charge(r, duration_s, means(r.service))

    def on_iterations(
        self, batch: Batch, durations_s: Sequence[float], now: float, requests: Sequence[SchedRequest]
    ) -> None:
        """A run of identical iterations (the simulator's fast-forward), charged one by one so the
        budgets round exactly as with one ``on_iteration`` call per iteration."""
        members = batch_members(batch, requests)
        ds = np.asarray(durations_s, dtype=np.float64)
        if ds.size == 0:
            return
        if not (np.isfinite(ds).all() and ds.min() >= 0):
            raise ValueError(f"iteration durations must be finite and >= 0, got {ds!r}")
        if not members:
            return
        head, last, total = ds[:-1], float(ds[-1]), float(ds.sum())
        budgets = [self.budget(r) for r in members]
        # one row per member, each accumulated left to right: the sequential subtractions Q - d1 - d2 ...
        # and additions executed + d1 + d2 ... (bit-identical to one charge / mark_ran per iteration)
        qs = np.empty((len(members), ds.size), dtype=np.float64)
        qs[:, 0] = [b.left_s for b in budgets]
        qs[:, 1:] = head
        qs = np.subtract.accumulate(qs, axis=1)
        renewed = qs.min(axis=1) <= 0  # a renewal inside the run (stable_until normally rules it out)
        executed = np.empty((len(members), ds.size + 1), dtype=np.float64)
        executed[:, 0] = [r.executed_s for r in members]
        executed[:, 1:] = ds
        executed = np.add.accumulate(executed, axis=1)
        means = self._means()
        for i, (r, b) in enumerate(zip(members, budgets, strict=True)):
            mean_s = means(r.service)
            if renewed[i]:
                for d in head.tolist():
                    self._charge(r, d, mean_s)
            else:
                b.left_s = float(qs[i, -1])
            self._charge(r, last, mean_s)
            mark_ran(r, total, now)
            r.executed_s = float(executed[i, -1])

    def execution_time(self, req: SchedRequest, now: float) -> float:
        """What ``on_finish`` observes for L̂_s: the single-request time (``solo``), else (``executed``, or a
        model the cost model does not know) Σ durations of its iterations (now − arrival_s if it never
        ran)."""
        if self.cost is not None:
            try:
                return self.cost.solo_time(req.model, req.prompt_tokens, req.generated)
            except KeyError:
                self.solo_fallbacks += 1
        if req.first_scheduled_s is not None:
            return req.executed_s
        return max(0.0, now - req.arrival_s)

    def on_finish(self, req: SchedRequest, now: float) -> None:
        """Observe the request's execution time (:meth:`execution_time`) for its service's L̂_s, σ_s; its
        budget goes."""
        self.stats.observe(req.service, self.execution_time(req, now))
        self._budgets.pop(id(req), None)

    def preemption_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest:
        """The running request with the largest O_r; ties: the later arrival, then the larger id."""
        if not running:
            raise ValueError("no running request to preempt")
        for r in running:
            r.priority = self.priority_of(r)
        return max(running, key=_key)

    # ------------------------------------------------------------------ internals

    def _means(self) -> Callable[[str], float]:
        """L̂_s by service, each looked up once (the statistics change only when a request finishes)."""
        means: dict[str, float] = {}
        mean = self.stats.mean

        def get(service: str) -> float:
            m = means.get(service)
            if m is None:
                m = means[service] = mean(service)
            return m

        return get

    def _scan(
        self, queue: Sequence[SchedRequest], now: float, worst: dict[str, tuple[float, SchedRequest]]
    ) -> SchedRequest | None:
        """One pass over ``queue``: sets every request's O_r = Q_r · L̂_s (:meth:`priority_of`), notes
        each service's longest stall in ``worst`` (:meth:`starving_services`) and returns the queue's
        first request by (O_r, arrival, id), None when it is empty."""
        budgets = self._budgets
        means: dict[str, float] = {}
        best: SchedRequest | None = None
        best_p = best_a = 0.0
        for r in queue:
            b = budgets.get(id(r))
            if b is None or b.owner() is not r:
                b = self.budget(r)
            svc = r.service
            m = means.get(svc)
            if m is None:
                m = means[svc] = self.stats.mean(svc)
            p = r.priority = b.left_s * m
            arrival = r.arrival_s
            if (
                best is None
                or p < best_p
                or (
                    p == best_p
                    and (arrival < best_a or (arrival == best_a and r.request_id < best.request_id))
                )
            ):
                best, best_p, best_a = r, p, arrival
            last = r.last_run_s
            _note_stall(worst, r, now - (last if last is not None else arrival))
        return best

    def _seed(
        self,
        waiting: Sequence[SchedRequest],
        running: Sequence[SchedRequest],
        best_w: SchedRequest | None,
        best_r: SchedRequest | None,
        starving: list[tuple[str, SchedRequest]],
        pool: PoolView,
        now: float,
    ) -> tuple[SchedRequest, Phase, bool] | None:
        """The first request of the ranking (:meth:`_ranking`) and its phase, or, when that is a prefill
        the pool cannot take, the best decode (then ``blocked``: no prefill is admitted) or else the best
        prefill that fits; None when nothing can run. With no starving service the ranking is every
        request by O_r (prefills first on a tie), so its head is the smaller of the queues' first
        requests (``best_w``, ``best_r``) and only the fallback to a fitting prefill needs a queue in
        order."""
        if starving:
            ranked = self._ranking(sorted(waiting, key=_key), sorted(running, key=_key), now)
            seed, phase = ranked[0]
            if phase == "decode" or fits_alone(pool, seed):
                return seed, phase, False
            alt = next((r for r, p in ranked if p == "decode"), None)
            if alt is not None:
                return alt, "decode", True
            fit = next((r for r, p in ranked if p == "prefill" and fits_alone(pool, r)), None)
            return (fit, "prefill", False) if fit is not None else None
        if best_w is None or (best_r is not None and _key(best_r) < _key(best_w)):
            assert best_r is not None
            return best_r, "decode", False
        if fits_alone(pool, best_w):
            return best_w, "prefill", False
        if best_r is not None:
            return best_r, "decode", True
        fit = next((r for r in sorted(waiting, key=_key) if fits_alone(pool, r)), None)
        return (fit, "prefill", False) if fit is not None else None

    def budget(self, req: SchedRequest) -> RequestBudget:
        """``req``'s budget; a request seen for the first time gets Q_r = L̂_s + σ_s (InitBudget) and
        O_r = Q_r · L̂_s (InitPriority)."""
        key = id(req)
        b = self._budgets.get(key)
        if b is None or b.owner() is not req:
            owner = weakref.ref(req, functools.partial(self._forget, key))
            b = RequestBudget(owner, self.budget_unit(req.service))
            self._budgets[key] = b
            req.priority = b.left_s * self.stats.mean(req.service)
        return b

    @property
    def tracked(self) -> int:
        """How many requests' budgets the table holds."""
        return len(self._budgets)

    def _forget(self, key: int, _: weakref.ref[SchedRequest]) -> None:
        """A request object is gone: so is its budget (unless a newer request took its id)."""
        b = self._budgets.get(key)
        if b is not None and b.owner() is None:
            del self._budgets[key]

    def _ranking(
        self, prefills: list[SchedRequest], decodes: list[SchedRequest], now: float
    ) -> list[tuple[SchedRequest, Phase]]:
        """Seed order: each starving service (longest stall first) with its longest-stalled request
        first, then its other requests by O_r; then every other request by O_r."""
        both: list[tuple[SchedRequest, Phase]] = [(r, "prefill") for r in prefills]
        both += [(r, "decode") for r in decodes]
        both.sort(key=lambda t: _key(t[0]))
        out: list[tuple[SchedRequest, Phase]] = []
        starving = self.starving_services(prefills, decodes, now)
        for svc, stalled in starving:
            out += [t for t in both if t[0].request_id == stalled.request_id]
            out += [t for t in both if t[0].service == svc and t[0].request_id != stalled.request_id]
        names = {svc for svc, _ in starving}
        out += [t for t in both if t[0].service not in names]
        return out


def _lead(head: list[SchedRequest], queue: list[SchedRequest], seed: SchedRequest) -> list[SchedRequest]:
    """``head``, then the requests of ``queue`` of the seed's service and model not in it."""
    ids = {r.request_id for r in head}
    return [*head, *(r for r in queue if _same(r, seed) and r.request_id not in ids)]


def _note_stall(worst: dict[str, tuple[float, SchedRequest]], r: SchedRequest, stall: float) -> None:
    """Keep ``r`` as its service's worst if its ``stall`` is longer (ties: earlier arrival, smaller id)."""
    cur = worst.get(r.service)
    if (
        cur is None
        or stall > cur[0]
        or (stall == cur[0] and (r.arrival_s, r.request_id) < (cur[1].arrival_s, cur[1].request_id))
    ):
        worst[r.service] = (stall, r)


def _same(a: SchedRequest, b: SchedRequest) -> bool:
    """Same service and model: what one batch may hold."""
    return a.service == b.service and a.model == b.model


# (O_r, arrival, id): the ranking's order
_key: Callable[[SchedRequest], tuple[float, float, str]] = operator.attrgetter(
    "priority", "arrival_s", "request_id"
)

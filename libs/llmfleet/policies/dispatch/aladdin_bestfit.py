"""Aladdin's online best-fit request placement (Aladdin §4.2 Algorithm 1, §4.3 Algorithm 2).

Each request goes to the MOST loaded worker (by ``capacity_norm``) that satisfies the MIP's
constraints for that worker with the request added (letters as in the paper):

- (b) ATGT:    Σ_j (l_in_j + γ·l_pred_j) ≤ θ·l_d(b + 1; T_dec·(1 − ρ))   (Eq. 4, b = requests on the
               worker, ρ = its prefill load: decode only runs 1 − ρ of the time, so t_d ≤ T_dec·(1 − ρ))
- (c) TTFT:    t_pre(Σ_new l_in) ≤ T_pre                          (Eq. 2)
- (d) protect: t_pre(Σ_new l_in) + t_d(b + 1) ≤ θ·min_j (T_dec·l_out_j − t_dec_j) over ongoing requests
               (l_out_j tokens so far, t_dec_j seconds since its first token: measured)
- (e) KV:      Σ_j w_j[k] ≤ M for every future iteration k           (w_j from its CURRENT length)

``constraints="paper"`` checks (b) and (d) as the paper writes them: (b) Σ_j (l_in_j + γ·l_pred_j) ≤
θ·l_d(b + 1) at the full T_dec (Eq. 4), (d) t_pre(Σ_new l_in) ≤ θ·min_j (T_dec·l_out_j − t_dec_j) (no
next-iteration term). ``"strict"`` (default, the forms above) is kept as a named option.
``"strict_d"`` takes strict's (d) and the paper's (b), to measure the two changes one at a time.

If no worker is feasible: ``on_infeasible="least_loaded"`` (default) sends the request to the LEAST
loaded worker by the same norm and increments ``infeasible``; ``"open"`` is the paper's best fit
(Algorithm 1 opens a new worker for it): best fit only considers workers already opened, opens the
first unopened one (engine-id order) and counts it in ``opened``; when every worker is open it falls
back to the least loaded (``infeasible``).

Contract with callers (simulator, scheduler). The dispatcher is the only entity placing requests, so
the policy keeps its own ledger of every request it placed (l_in, prediction, estimated start):

- ``choose(model, candidates, exclude, request, now=None)``: the request is recorded on the returned
  engine. Time is ``now`` if given, else ``request.arrival_s`` (callers stamp it with the dispatch
  time); calls must come in non-decreasing time. Choosing again for a known ``request_id`` re-places it.
  Without a ``request`` the choice is made for an empty request and nothing is recorded.
- ``on_finish(request_id, engine_id, output_tokens, now)`` (a ``FinishListener``): the simulator and
  the scheduler call it when a placement ends, whatever the outcome. Unknown ids are ignored. The
  predictor is not fed here (the profiler observes completions).
- ``rebalance(now)`` plans moves of not-yet-started requests; ``apply_move`` records one that the
  caller carried out (a :class:`~.base.Rebalancer`: the simulator runs it every epoch and moves
  requests with ``Simulator.move_request``, see ``llmfleet.sim.migration.RebalanceLoop``).

Resolutions of what the paper leaves open:

- Progress (constraint (d), §4.2 "for ongoing requests, we take into account the current length
  generated"). Callers that can (the simulator from its instances, the scheduler from the tokens it
  relays) give every candidate the measured progress of the requests decoding there
  (``EngineCandidate.requests``: tokens so far l_out_j and first-token time), and (d)'s slack is
  T_dec·l_out_j − (now − t_first_j), min over every request decoding there (ours or not). The
  prefills still pending there (our requests without a first token) and the candidate's run before
  j's next token, then one decode iteration of the grown batch: the next token keeps j's ATGT
  (t_dec_j + t_pre + t_d(b+1))/l_out_j ≤ T_dec exactly when t_pre + t_d(b+1) ≤ T_dec·l_out_j − t_dec_j.
  A stale report only under-counts tokens (conservative). Our requests start when their first token
  shows, and their place on the iteration clock follows their real token count.
- Requests whose prefill has not ended (``protect_prefills``, default on). Such a request has one
  token and no decode time at its first token, and with one-phase engines every prefill placed after
  it runs before its second token, so the worker's slack is at most T_dec while Σ new l_in > 0.
  The pending prefills' own time is counted in t_pre as well (conservative by that time): the policy
  cannot tell a running prefill from a queued one.
- Time model without progress (``requests is None``): a placed request is *new* until its estimated
  start ``t_place + t_pre(Σ_new l_in)``, then *ongoing*. Each worker has an iteration clock
  advancing at 1/t_d with t_d = decode.predict(b, Σ(l_in + γ·l_pred)/b) (piecewise constant, updated
  on every change of the worker) that STANDS STILL for the prefill time each placement adds (the
  prefill preempts the batch); a request's tokens are estimated as 1 + (iterations since its start),
  so (d)'s slack T_dec·l_out − t_dec starts at T_dec and each admitted prefill consumes the time it
  adds to the pending batch (the old clock kept running through prefills: the slack only grew).
- (b)'s prefill load ρ_i: Σ of the prefill time each placement added on worker i over the last
  ``prefill_window_s`` (the candidate's included) ÷ the window, capped at 0.99; l_d at
  T_dec·(1 − ρ) is the latency model's ``context_limit``, evaluated for the workers in load order
  until one passes (like the exact (d)), after a vectorised pass with the full T_dec.
- (b) uses the current prediction l_pred for every request on the worker, new or ongoing.
- (c)/(d) evaluate t_pre by linear interpolation on 257 points in [0, x_c], x_c = the most tokens
  with t_pre ≤ T_pre: exact for Aladdin's linear t_pre, conservative for the convex roofline.
- (e) is exact over ALL future iterations (K = ∞ ≥ the model's sequence limit): in the worker's
  iteration clock a request started at s holds l_in + 1 + (K − s) tokens for K ≤ e = s + l_pred − 1,
  then 0. A not-yet-started request counts from its placement iteration (conservative by its prefill
  wait; replaced by the real start when it starts), the candidate from now. Units are tokens
  (kv = h·t with j = 0; bytes ÷ bytes/token). The profile's maximum lies at a breakpoint e_j or at the
  candidate's end, so each worker keeps its sorted breakpoints with suffix sums and prefix/suffix
  maxima (rebuilt when its set changes) and the check for all workers at once is one vectorised
  O(W·b) pass, run only on workers whose Σ final lengths + the request's exceed M.
- Ordering. capacity_norm = ‖(b / B_max, Σ(l_in + γ·l_pred) / L_max)‖₂ with the decode-limit line's
  intercepts: B_max = the batch where l_d(b) reaches 0 and L_max = l_d extrapolated to b = 0. The
  line is then x + y = 1 for Aladdin's linear l_d, so both axes weigh the same. Ties by engine id.
- Re-prediction (§4.3). When an ongoing request's estimated l_out passes l_pred without a finish, its
  prediction becomes E[l_out | l_in, l_out > g] with g = max(l_pred, estimated l_out), from the
  predictor (a ``LengthPredictor``: ``predict(LengthQuery(..., generated_tokens=g))``, or a callable
  ``f(service, prompt_tokens, g) -> tokens``); if there is none or it answers ≤ g: 2·g.
- Error point (Algorithm 2) of worker i, (b_e, l_e), in the (batch, Σ(l_in + γ·l_pred)) plane of (b):
  a request that outlived its prediction adds (+1, l_in + γ·l'_pred) until it finishes; a request that
  finished early adds (−1, −(l_in + γ·l_pred)) until its predicted end; a move adds (−1, −c_j) to the
  source and (+1, +c_j) to the target until j's predicted end. Signed distance
  d_i = (l_e + β·b_e)/√(1 + β²), β = L_max/B_max (the decode-limit line's slope): d > 0 under-estimated
  (more load than planned), d < 0 over-estimated. ``rebalance`` greedily moves not-yet-started requests
  from the most under-estimated worker to the most over-estimated one while Σ_i |d_i| falls and the
  target stays feasible under (b)–(e).
- Engines hosting several models are accounted per model (Aladdin workers serve one model).

Cost per decision: numpy passes over the W candidate workers — O(W) for (b)–(d) and the norms, one
scalar exact (b)/(d) check per worker tried in load order until one passes, O(Σ progress entries) to
read the candidates' measured progress,
O(W·b) for (e) on the workers that need it — plus O(log n) per request event (placement, start,
finish, re-prediction) and O(b log b) to rebuild the profile of a worker whose set changed. Predictor
answers are memoised (:data:`~.aladdin_book.MEMO_S`). ``tools/bench/aladdin_micro.py`` measures it.

Parts: the per-worker books (numpy arrays, (e) profiles) live in :mod:`.aladdin_ledger`; the requests
placed, their clock, the measured progress and re-prediction in :mod:`.aladdin_book`; Algorithm 2's
greedy moves in :mod:`.aladdin_rebalance`. This module decides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from llmfleet.policies.dispatch.aladdin_book import KvCapacity, RequestBook
from llmfleet.policies.dispatch.aladdin_ledger import PlacedRequest
from llmfleet.policies.dispatch.aladdin_options import AladdinBestFitOptions
from llmfleet.policies.dispatch.aladdin_rebalance import MoveCheck, plan_moves
from llmfleet.policies.dispatch.base import (
    DispatchNeeds,
    DispatchRequest,
    EngineCandidate,
    FinishListener,
)


def _slo_pair(slo: Any) -> tuple[float, float]:
    """(T_pre, T_dec) from a pair, a mapping or an object with ttft_s/tpot_s (``llmfleet.types.Slo``)."""
    if isinstance(slo, Mapping):
        return float(slo["ttft_s"]), float(slo["tpot_s"])
    if hasattr(slo, "ttft_s"):
        return float(slo.ttft_s), float(slo.tpot_s)
    t_pre, t_dec = slo
    return float(t_pre), float(t_dec)


class AladdinBestFit(FinishListener):
    """Aladdin best-fit placement under constraints (b)–(e) with ``options``
    (:class:`~.aladdin_options.AladdinBestFitOptions`); see the module docstring."""

    name = "aladdin_bestfit"
    # predictions (the scheduler asks the profiler), latency models and SLOs (from the DispatchContext)
    # and its own ledger; of the candidates only ids, models and KV capacity, never their load
    # and, of the candidates, each decoding request's measured progress (constraint (d))
    needs: ClassVar[DispatchNeeds] = DispatchNeeds(
        reads_predictions=True, reads_costs=True, reads_progress=True
    )
    Options: ClassVar[type[AladdinBestFitOptions]] = AladdinBestFitOptions

    def __init__(self, options: AladdinBestFitOptions) -> None:
        o = options
        if not o.latency_models or not o.slos:
            raise ValueError(
                "aladdin_bestfit needs latency_models={model: AladdinModel | RooflineModel} and "
                "slos={model: (T_pre_s, T_dec_s)}"
            )
        self.protect = bool(o.protect)
        self.heartbeat_s = float(o.heartbeat_s)
        self.constraints = o.constraints
        self.on_infeasible = o.on_infeasible
        self.opened = 0  # workers opened (on_infeasible="open")
        self._open: dict[str, set[int]] = {}
        self.latency_models = dict(o.latency_models)
        self.slos = {m: _slo_pair(s) for m, s in o.slos.items()}
        self.kv_capacity_tokens = o.kv_capacity_tokens
        self.kv_capacity_bytes = o.kv_capacity_bytes
        self.kv_bytes_per_token = o.kv_bytes_per_token
        self.gamma = float(o.gamma)
        self.theta = float(o.theta)
        self.predictor = o.predictor
        self.default_output_tokens = float(o.default_output_tokens)
        self.prefill_window_s = float(o.prefill_window_s)
        self.infeasible = 0  # placements with no feasible worker (went to the least loaded)
        self.placed = 0
        capacity = KvCapacity(o.kv_capacity_tokens, o.kv_capacity_bytes, o.kv_bytes_per_token)
        self.book = RequestBook(
            self.latency_models,
            self.slos,
            capacity,
            self.gamma,
            o.predictor,
            bool(o.protect_prefills),
        )

    @property
    def repredictions(self) -> int:
        """Requests re-predicted after outliving their prediction (§4.3)."""
        return self.book.repredictions

    # ------------------------------------------------------------------------------------ API
    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = frozenset(),
        request: DispatchRequest | None = None,
        now: float | None = None,
    ) -> str:
        pool = self.book.pool(model)
        bpt = float(request.kv_bytes_per_token) if request is not None else 0.0
        idx = self.book.slots(pool, model, candidates, exclude, bpt)
        t = now if now is not None else (request.arrival_s if request is not None else self.book.now)
        self.book.observe(pool, model, candidates, max(t, self.book.now))
        now = self.book.advance(t)
        it = pool.iters(now)
        self.book.repredict_overdue(pool, it, now)
        if request is not None:
            old = self.book.reqs.get(request.request_id)
            if old is not None:
                self.book.remove(self.book.pools[old.model], old, now)
            l_in = float(max(request.prompt_tokens, 0))
            l_pred = float(request.predicted_output_tokens)
            if l_pred <= 0:
                l_pred = self.book.predict(request.service, l_in, 0) or self.default_output_tokens
        else:
            l_in, l_pred = 0.0, self.default_output_tokens
        l_pred = max(l_pred, 1.0)
        ctx = l_in + self.gamma * l_pred
        final = l_in + l_pred

        norm = pool.norm(idx)
        ok = pool.mask_bcd(idx, it, now, l_in, ctx, self.theta, self.protect)
        opened = self._open.setdefault(model, set())
        if self.on_infeasible == "open":
            ok &= np.isin(idx, list(opened))
        cand, nc = idx[ok], norm[ok]
        if cand.size:
            tight = pool.final[cand] + final > pool.kv_tokens[cand]  # Σ final lengths: (e) holds if not
            if tight.any():
                rows = cand[tight]
                keep = ~tight
                keep[np.flatnonzero(tight)[pool.kv_fits(rows, it[rows], l_in, l_pred)]] = True
                cand, nc = cand[keep], nc[keep]
        chosen = -1
        if cand.size:  # the most loaded worker that passes the exact (b) and (d), ties by engine id
            slack = pool.slack(cand, it, now)
            win = self.prefill_window_s
            paper_b, paper_d = self.constraints != "strict", self.constraints == "paper"
            for k in np.lexsort((pool.rank[cand], -nc)).tolist():
                i = int(cand[k])
                rho = 0.0
                if not paper_b:  # ρ with this request's prefill added (the time it adds to the pending batch)
                    pend = float(pool.new_in[i])
                    added = float(pool.tpre(pend + l_in)) - (float(pool.tpre(pend)) if pend > 0 else 0.0)
                    rho = min(pool.prefill_seconds(i, now, win) / win + added / win, 0.99)
                sk = float(slack[k]) if self.protect else math.inf
                if pool.exact_bd(i, sk, l_in, ctx, self.theta, rho, paper_d):
                    chosen = i
                    break
        if chosen < 0 and self.on_infeasible == "open":
            closed = [int(i) for i in idx if int(i) not in opened]
            if closed:
                chosen = min(closed, key=lambda i: pool.rank[i])
                opened.add(chosen)
                self.opened += 1
        if chosen < 0:
            self.infeasible += 1
            low = idx[norm == norm.min()]
            chosen = int(low[np.argmin(pool.rank[low])])
        if request is not None:
            r = PlacedRequest(request.request_id, model, request.service, chosen, l_in, l_pred)
            self.book.record(pool, chosen, r, now)
            self.placed += 1
        return pool.ids[chosen]

    def on_finish(self, request_id: str, engine_id: str, output_tokens: int, now: float) -> None:
        """A placed request finished with ``output_tokens``; early finishes mark over-estimates."""
        del engine_id  # the ledger knows where it was placed
        now = self.book.advance(now)
        r = self.book.reqs.get(request_id)
        if r is None:
            return
        pool = self.book.pools[r.model]
        i = r.slot
        self.book.remove(pool, r, now)
        if r.started and output_tokens < r.l_pred:
            # over-estimate: one request and its context fewer than planned until its predicted end
            pool.err_b[i] -= 1.0
            pool.err_l[i] -= r.ctx
            pool.adj[i].append((r.e_iter, -1.0, -r.ctx))
            if len(pool.adj[i]) > 64:
                pool.expire_adj(i, pool.iter_at(i, now))

    # ------------------------------------------------------------------------- introspection
    def state(self, engine_id: str, model: str) -> dict[str, float]:
        """The ledger of one worker: batch, Σ(l_in + γ·l_pred), Σ new l_in, Σ final lengths, M."""
        pool = self.book.pool(model)
        i = pool.slot_of[engine_id]
        return {
            "batch": float(pool.b[i]),
            "context": float(pool.S[i]),
            "new_input": float(pool.new_in[i]),
            "final_tokens": float(pool.final[i]),
            "kv_capacity_tokens": float(pool.kv_tokens[i]),
        }

    def norms(self, model: str) -> dict[str, float]:
        """capacity_norm of every known worker of ``model``."""
        pool = self.book.pool(model)
        v = pool.norm(np.arange(pool.slots_used))
        return {e: float(v[i]) for i, e in enumerate(pool.ids)}

    def prediction(self, request_id: str) -> float | None:
        r = self.book.reqs.get(request_id)
        return None if r is None else r.l_pred

    def started(self, request_id: str) -> bool | None:
        r = self.book.reqs.get(request_id)
        return None if r is None else r.started

    def kv_peak(self, engine_id: str, model: str, now: float) -> float:
        """Exact (e) peak in tokens of the requests on ``engine_id`` from ``now`` on."""
        now = self.book.advance(now)
        pool = self.book.pool(model)
        i = pool.slot_of[engine_id]
        return pool.kv_peak(i, pool.iter_at(i, now))

    def error_distance(self, model: str, now: float) -> dict[str, float]:
        """Signed distance d_i of every worker's error point (Algorithm 2); > 0 under-estimated."""
        now = self.book.advance(now)
        pool = self.book.pool(model)
        it = pool.iters(now)
        self.book.repredict_overdue(pool, it, now)
        for i in range(pool.slots_used):
            if pool.adj[i]:
                pool.expire_adj(i, float(it[i]))
        d = (pool.err_l[: pool.slots_used] + pool.beta * pool.err_b[: pool.slots_used]) * pool.err_norm
        return {e: float(d[i]) for i, e in enumerate(pool.ids)}

    # ------------------------------------------------------------------------------ rebalance
    def rebalance(self, now: float) -> list[tuple[str, str, str]]:
        """Algorithm 2: moves (request_id, from_engine, to_engine) of not-yet-started requests.

        Changes no placement (it only brings time-derived bookkeeping up to ``now``, as any call
        does); the caller carries the moves out and records each with :meth:`apply_move`. Greedy:
        from the most under-estimated worker (largest d > 0), the not-started request whose move to
        the most over-estimated feasible worker (d < 0) lowers Σ_i |d_i| the most, until none does
        (:mod:`.aladdin_rebalance`).
        """
        moves: list[tuple[str, str, str]] = []
        paper_b, paper_d = self.constraints != "strict", self.constraints == "paper"
        for model in sorted(self.book.pools):
            pool = self.book.pools[model]
            dist = self.error_distance(model, now)
            d = np.array([dist[e] for e in pool.ids])
            it = pool.iters(self.book.now)
            opened = frozenset(self._open.get(model, set())) if self.on_infeasible == "open" else None
            check = MoveCheck(self.theta, paper_b, paper_d, self.prefill_window_s, self.book.now, opened)
            moves += plan_moves(pool, d, it, check)
        return moves

    def apply_move(self, request_id: str, to_engine: str, now: float) -> None:
        """Record that a not-yet-started request was moved to ``to_engine`` (Algorithm 2, 23–26)."""
        now = self.book.advance(now)
        r = self.book.reqs.get(request_id)
        if r is None:
            raise KeyError(f"unknown request {request_id!r}")
        if r.started:
            raise ValueError(f"request {request_id!r} has started; Aladdin does not migrate it")
        pool = self.book.pools[r.model]
        y = pool.slot_of.get(to_engine)
        if y is None:
            raise KeyError(f"engine {to_engine!r} does not serve {r.model!r}")
        x = r.slot
        it = pool.iters(now)
        self.book.remove(pool, r, now)
        self.book.record(pool, y, r, now)
        for i, sign in ((x, -1.0), (y, 1.0)):
            pool.err_b[i] += sign
            pool.err_l[i] += sign * r.ctx
            pool.adj[i].append((float(it[i]) + r.l_pred, sign, sign * r.ctx))

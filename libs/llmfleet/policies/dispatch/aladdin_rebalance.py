"""Aladdin's re-balancing of not-yet-started requests (§4.3 Algorithm 2), for :mod:`.aladdin_bestfit`.

Given each worker's signed error distance d_i (> 0: more load than planned), :func:`plan_moves` greedily
moves, from the most under-estimated worker, the not-started request whose move to the most
over-estimated worker that can take it lowers Σ_i |d_i| the most, until no move does. A move is
checked against (b)–(e) by :class:`MoveCheck`, counting the moves already planned onto the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmfleet.policies.dispatch.aladdin_ledger import EPS, ModelPool, PlacedRequest


@dataclass(frozen=True)
class MoveCheck:
    """(b)–(e) for a request moved onto a worker at ``now``: ``theta`` is θ, ``paper_b`` / ``paper_d`` the
    printed forms of (b) / (d), ``window_s`` the prefill-load window of (b)'s ρ, ``open_slots`` the workers moves may
    go to (``on_infeasible="open"``: the open ones; None: any)."""

    theta: float
    paper_b: bool
    paper_d: bool
    window_s: float
    now: float
    open_slots: frozenset[int] | None = None

    def fits(
        self, pool: ModelPool, y: int, it: np.ndarray, r: PlacedRequest, planned: list[PlacedRequest]
    ) -> bool:
        """(b)–(e) for request r on worker y, with the requests already planned to move there."""
        b = pool.b[y] + len(planned)
        s = pool.S[y] + sum(q.ctx for q in planned)
        new_in = pool.new_in[y] + sum(q.l_in for q in planned) + r.l_in
        if s + r.ctx > self.theta * float(pool.ld(np.array([b + 1.0]))[0]):
            return False
        if new_in > pool.prefill_cap_tokens:
            return False
        slack = float(pool.slack(np.array([y]), it, self.now)[0])
        t_next = 0.0 if self.paper_d else pool.td(b + 1.0, s + r.ctx)
        if float(pool.tpre(new_in)) + t_next > self.theta * slack:
            return False
        if self.open_slots is not None and y not in self.open_slots:
            return False  # moves go to open workers only
        win = self.window_s
        rho = 0.0 if self.paper_b else min(pool.prefill_seconds(y, self.now, win) / win, 0.99)
        if rho > 0:
            t_eff = pool.t_dec * (1.0 - rho)
            if s + r.ctx > self.theta * max(0.0, float(pool.latency.decode.context_limit(b + 1.0, t_eff))):
                return False
        extra = [(q.l_in, q.l_pred) for q in (*planned, r)]
        return pool.kv_peak(y, float(it[y]), extra) <= pool.kv_tokens[y] + EPS


def plan_moves(
    pool: ModelPool, d: np.ndarray, it: np.ndarray, check: MoveCheck
) -> list[tuple[str, str, str]]:
    """Moves (request_id, from_engine, to_engine) among ``pool``'s workers with error distances ``d``
    (updated in place as moves are planned) and iteration clocks ``it``; see the module docstring."""
    moves: list[tuple[str, str, str]] = []
    extra: dict[int, list[PlacedRequest]] = {}  # simulated aggregates of the targets (moves already planned)
    gone: set[str] = set()
    while True:
        best = None
        for x in np.argsort(-d).tolist():
            if d[x] <= 0:
                break
            pend = [r for r in pool.members[x].values() if not r.started and r.rid not in gone]
            for r in pend:
                delta = (r.ctx + pool.beta) * pool.err_norm
                for y in np.argsort(d).tolist():
                    if d[y] >= 0:
                        break
                    gain = abs(d[x]) + abs(d[y]) - abs(d[x] - delta) - abs(d[y] + delta)
                    if gain <= 1e-12 or (best is not None and gain <= best[0]):
                        break
                    if check.fits(pool, y, it, r, extra.get(y, [])):
                        best = (gain, r, x, y, delta)
                        break
            if best is not None:
                break
        if best is None:
            return moves
        _, r, x, y, delta = best
        d[x] -= delta
        d[y] += delta
        extra.setdefault(y, []).append(r)
        gone.add(r.rid)
        moves.append((r.rid, pool.ids[x], pool.ids[y]))

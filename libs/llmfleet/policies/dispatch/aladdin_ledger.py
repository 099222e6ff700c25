"""The vectorised ledger behind Aladdin's best-fit placement (:mod:`.aladdin_bestfit`).

One :class:`ModelPool` per model holds that model's workers as slots of numpy arrays: per worker the
batch b, Σ(l_in + γ·l_pred) S, Σ new l_in, Σ final lengths, the iteration clock (base, time, rate),
the (d) slack maximum, the error point and, for constraint (e), each worker's sorted breakpoints with
suffix sums and prefix/suffix maxima (rebuilt lazily when its set of requests changes). Every
constraint and norm is then one numpy pass over the candidate workers. The definitions (time model,
(b)–(e), capacity norm, error points) are in :mod:`.aladdin_bestfit`'s docstring; this module only
keeps the books, the policy decides.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

B_CAP = 1 << 20  # search cap for B_max when l_d never reaches 0
GRID = 257
EPS = 1e-6  # tokens: rounding slack of the (e) comparison
# the per-worker arrays of a ModelPool and its (e) profile rows with the value that pads a row
SLOT_ARRAYS = (
    "b", "S", "new_in", "final", "amax", "it_base", "t_base", "rate", "min_end", "kv_tokens", "err_b",
    "err_l", "rank", "dirty", "meas", "dkey", "pre_sum", "pu",
)  # fmt: skip
PROFILE_PADS = {"E": math.inf, "SC": 0.0, "NC": 0.0, "SM": -math.inf, "PM": -math.inf}


def _no_slots(count: int) -> list[np.ndarray]:
    return [np.zeros(0) for _ in range(count)]


class PlacedRequest:
    """One request in the ledger: input, prediction and its place in the worker's iteration clock."""

    __slots__ = (
        "a_val", "ctx", "e_iter", "l_in", "l_pred", "model", "rid", "s_iter", "service", "slot",
        "started", "t_start", "under",
    )  # fmt: skip

    def __init__(self, rid: str, model: str, service: str, slot: int, l_in: float, l_pred: float) -> None:
        self.rid, self.model, self.service, self.slot = rid, model, service, slot
        self.l_in, self.l_pred = l_in, l_pred
        self.ctx = 0.0
        self.started = False
        self.t_start = 0.0
        self.s_iter = 0.0
        self.e_iter = 0.0
        self.a_val = -math.inf
        self.under = False


@dataclass
class ModelPool:
    """Workers of one model: per-worker aggregates in numpy arrays indexed by slot."""

    model: str
    latency: Any
    t_pre: float
    t_dec: float
    ids: list[str] = field(default_factory=list)
    slot_of: dict[str, int] = field(default_factory=dict)
    members: list[dict[str, PlacedRequest]] = field(default_factory=list)
    ends: list[list[tuple[float, str]]] = field(default_factory=list)  # heap of (e_iter, rid)
    adj: list[list[tuple[float, float, float]]] = field(default_factory=list)  # (expiry, db, dl)
    pre_log: list[deque[tuple[float, float]]] = field(default_factory=list)  # (t_place, t_pre seconds)
    cache_ids: list[str] | None = None
    cache_idx: np.ndarray | None = None
    protect_prefills: bool = True  # (d) also covers requests placed here whose prefill has not ended

    def __post_init__(self) -> None:
        self.slots_used = 0  # slots in use
        # per-worker aggregates, one entry per slot (add_slot grows every array in SLOT_ARRAYS):
        # batch b, Σ(l_in + γ·l_pred) S, Σ l_in of prefills not ended new_in, Σ final lengths, and
        # kv_tokens, the worker's KV capacity in tokens (the paper's M)
        self.b, self.S, self.new_in, self.final, self.kv_tokens = _no_slots(5)
        # iteration clock: it_base iterations at t_base, rate per second, standing still until pu
        # (prefills placed there run)
        self.it_base, self.t_base, self.rate, self.pu = _no_slots(4)
        # (d): amax = max over ongoing requests of T_dec·(s_iter − 1) − t_start; measured: meas = 1 where
        # the caller reports per-request progress, dkey = min over the requests decoding there of
        # T_dec·l_out + t_first (slack at t = dkey − t); pre_sum = prefill seconds placed there within
        # the prefill window (the (b) prefill load)
        self.amax, self.meas, self.dkey, self.pre_sum = _no_slots(4)
        # error point (err_b, err_l), earliest predicted end, engine-id rank, (e) row needs a rebuild
        self.err_b, self.err_l, self.min_end, self.rank, self.dirty = _no_slots(5)
        # (e) profile rows: sorted breakpoints E, suffix sums SC of c0 and counts NC, suffix max SM of
        # the profile at the breakpoints, prefix max PM of (profile + E); width = most members + 1
        self.width = 8
        rows = [np.full((0, self.width), pad) for pad in PROFILE_PADS.values()]
        self.E, self.SC, self.NC, self.SM, self.PM = rows
        # _context_limits[b] = l_d(b), the most context tokens a batch of b decodes within T_dec;
        # index 0 unused (set to l_d(1))
        self._context_limits = np.array([np.inf])
        l1, l2 = self.ld_scalar(1), self.ld_scalar(2)
        self._context_limits[0] = l1
        self.L_max = max(l1, 2 * l1 - l2) if math.isfinite(l1) and math.isfinite(l2) else math.inf
        # B_max: where l_d reaches 0 (doubling, then bisection on a continuous batch)
        if l1 <= 0:
            self.B_max = 1.0
        else:
            hi = 2.0
            while hi < B_CAP and self.ld_scalar(hi) > 0:
                hi *= 2
            lo = hi / 2
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if self.ld_scalar(mid) > 0 else (lo, mid)
            self.B_max = lo
        finite = math.isfinite(self.L_max) and self.L_max > 0
        self.inv_L = 1.0 / self.L_max if finite else 0.0
        self.beta = self.L_max / self.B_max if finite else 0.0
        self.err_norm = 1.0 / math.sqrt(1.0 + self.beta * self.beta)
        # prefill: prefill_cap_tokens = most tokens with t_pre <= T_pre (the paper's x_c); t_pre(x) on
        # [0, x_c] as a grid: prefill_grid_s[k] = t_pre(prefill_grid_tokens[k])
        pre = self.latency.prefill
        if pre.predict(0.0) > self.t_pre:
            self.prefill_cap_tokens = -1.0
            self.prefill_grid_tokens = np.array([0.0, 1.0])
            self.prefill_grid_s = np.array([math.inf, math.inf])
        else:
            hi = 1.0
            while hi < 1e9 and pre.predict(hi) <= self.t_pre:
                hi *= 2
            lo = hi / 2 if hi > 1 else 0.0
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if pre.predict(mid) <= self.t_pre else (lo, mid)
            self.prefill_cap_tokens = math.floor(lo)
            self.prefill_grid_tokens = np.linspace(0.0, max(self.prefill_cap_tokens, 1.0), GRID)
            self.prefill_grid_s = np.array([pre.predict(float(x)) for x in self.prefill_grid_tokens])

    # ------------------------------------------------------------------------------ model helpers
    def ld_scalar(self, b: float) -> float:
        return max(0.0, float(self.latency.decode.context_limit(b, self.t_dec)))

    def ld(self, b: np.ndarray) -> np.ndarray:
        """l_d(b) for integer batch sizes b ≥ 1 (table extended on demand)."""
        top = int(b.max()) if b.size else 0
        if top >= len(self._context_limits):
            size = max(top + 1, 2 * len(self._context_limits))
            old = len(self._context_limits)
            ext = np.empty(size - old)
            for k in range(old, size):
                ext[k - old] = 0.0 if k > self.B_max else self.ld_scalar(k)
            self._context_limits = np.concatenate([self._context_limits, ext])
        return self._context_limits[b.astype(np.intp)]

    def tpre(self, x: np.ndarray | float) -> Any:
        return np.interp(x, self.prefill_grid_tokens, self.prefill_grid_s)

    def tpre_scalar(self, x: float) -> float:
        return float(self.latency.prefill.predict(float(x)))

    def td(self, b: float, s: float) -> float:
        return float(self.latency.decode.predict(b, s / b))

    # ---------------------------------------------------------------------------------- slots
    def add_slot(self, engine_id: str, m_tokens: float) -> int:
        i = self.slots_used
        if i >= len(self.b):
            cap = max(16, 2 * len(self.b))
            for nm in SLOT_ARRAYS:
                arr = getattr(self, nm)
                new = np.zeros(cap)
                new[: len(arr)] = arr
                setattr(self, nm, new)
            for nm, pad in PROFILE_PADS.items():
                arr = getattr(self, nm)
                new = np.full((cap, self.width), pad)
                new[: len(arr)] = arr
                setattr(self, nm, new)
        self.slots_used += 1
        self.ids.append(engine_id)
        self.slot_of[engine_id] = i
        self.members.append({})
        self.ends.append([])
        self.adj.append([])
        self.pre_log.append(deque())
        for nm, v in (
            ("amax", -math.inf),
            ("min_end", math.inf),
            ("kv_tokens", m_tokens),
            ("dkey", math.inf),
            ("pu", -math.inf),
        ):
            getattr(self, nm)[i] = v
        order = sorted(range(self.slots_used), key=lambda k: self.ids[k])
        self.rank[order] = np.arange(self.slots_used)
        return i

    def iters(self, now: float) -> np.ndarray:
        """The iteration clocks at ``now``: they run at ``rate`` except while paused (until ``pu``)."""
        n = self.slots_used
        tb = self.t_base[:n]
        run = np.where(now > tb, np.maximum(0.0, now - np.maximum(tb, self.pu[:n])), now - tb)
        return self.it_base[:n] + run * self.rate[:n]

    def iter_at(self, i: int, t: float) -> float:
        tb = float(self.t_base[i])
        run = max(0.0, t - max(tb, float(self.pu[i]))) if t > tb else t - tb
        return float(self.it_base[i] + run * self.rate[i])

    def touch(self, i: int, now: float) -> None:
        """Advance worker i's iteration clock to ``now`` (before its rate changes)."""
        if now > self.t_base[i]:
            self.it_base[i] += max(0.0, now - max(self.t_base[i], self.pu[i])) * self.rate[i]
            self.t_base[i] = now

    def set_rate(self, i: int) -> None:
        b = self.b[i]
        if b <= 0.5:
            self.b[i] = self.S[i] = self.new_in[i] = self.final[i] = 0.0
            self.rate[i] = 0.0
            return
        self.rate[i] = 1.0 / max(self.td(float(b), float(self.S[i])), 1e-9)

    def breakpoints(self, i: int, k_now: float) -> list[tuple[float, float]]:
        """(e, c0) of the requests on worker i, sorted: occupancy c0 + K for K ≤ e (clamped to now)."""
        return sorted((max(r.e_iter, k_now), r.l_in + 1.0 - r.s_iter) for r in self.members[i].values())

    def build_row(self, i: int, k_now: float) -> None:
        pairs = self.breakpoints(i, k_now)
        n = len(pairs)
        if n + 1 > self.width:
            self.widen(2 * n + 1)
        e = [p[0] for p in pairs]
        sc = [0.0] * (n + 1)
        for m in range(n - 1, -1, -1):
            sc[m] = sc[m + 1] + pairs[m][1]
        prof = [sc[m] + (n - m) * e[m] for m in range(n)]
        sm = [-math.inf] * (n + 1)
        for m in range(n - 1, -1, -1):
            sm[m] = max(sm[m + 1], prof[m])
        pm, best = [0.0] * n, -math.inf
        for m in range(n):
            best = max(best, prof[m] + e[m])
            pm[m] = best
        pad = self.width - n
        inf = math.inf
        self.E[i] = e + [inf] * pad
        self.SC[i] = sc + [0.0] * (pad - 1)
        self.NC[i] = [*range(n, -1, -1)] + [0.0] * (pad - 1)
        self.SM[i] = sm + [-inf] * (pad - 1)
        self.PM[i] = pm + [-inf] * pad
        self.dirty[i] = 0.0

    def widen(self, width: int) -> None:
        for nm, pad in PROFILE_PADS.items():
            arr = getattr(self, nm)
            new = np.full((arr.shape[0], width), pad)
            new[:, : self.width] = arr
            setattr(self, nm, new)
        self.width = width

    def kv_fits(self, rows: np.ndarray, k_now: np.ndarray, l_in: float, l_pred: float) -> np.ndarray:
        """Constraint (e) with the candidate added, exactly, for each worker in ``rows``.

        Peak = max(A, B, C): A = the profile at breakpoints from the candidate's end e_x on, B = at
        breakpoints before e_x plus the candidate's occupancy there, C = at e_x (all requests with
        e ≥ e_x, the candidate at its final length).
        """
        for p in np.flatnonzero((self.dirty[rows] > 0) | (self.E[rows, 0] < k_now)).tolist():
            self.build_row(int(rows[p]), float(k_now[p]))
        e_x = k_now + l_pred - 1.0
        c0_x = l_in + 1.0 - k_now
        E = self.E[rows, : int(self.b[rows].max()) + 1]  # columns past the fullest row are padding
        q = (e_x[:, None] > E).sum(axis=1)  # breakpoints before the candidate's end
        c = self.SC[rows, q] + self.NC[rows, q] * e_x + (l_in + l_pred)
        b = np.where(q > 0, c0_x + self.PM[rows, np.maximum(q - 1, 0)], -math.inf)
        a = self.SM[rows, q]  # breakpoints at e_x add nothing beyond c
        return np.maximum(np.maximum(a, b), c) <= self.kv_tokens[rows] + EPS

    def clean_ends(self, i: int) -> None:
        h = self.ends[i]
        mem = self.members[i]
        while h:
            e, rid = h[0]
            r = mem.get(rid)
            if r is not None and r.started and r.e_iter == e:
                break
            heapq.heappop(h)
        self.min_end[i] = h[0][0] if h else math.inf

    def recompute_amax(self, i: int) -> None:
        self.amax[i] = max((r.a_val for r in self.members[i].values() if r.started), default=-math.inf)

    def log_prefill(self, i: int, now: float, seconds: float) -> None:
        if seconds > 0:
            self.pre_log[i].append((now, seconds))
            self.pre_sum[i] += seconds

    def prefill_seconds(self, i: int, now: float, window: float) -> float:
        """Prefill seconds placed on worker i within the last ``window`` seconds (each request's
        t_pre as the pending batch grew): ρ·window, (b)'s prefill load."""
        log = self.pre_log[i]
        while log and log[0][0] < now - window:
            self.pre_sum[i] -= log.popleft()[1]
        if not log:
            self.pre_sum[i] = 0.0
        return float(self.pre_sum[i])

    def sync(self, r: PlacedRequest, it_i: float, generated: float) -> None:
        """Measured progress of ongoing ``r``: ``generated`` tokens so far; its place on the worker's
        iteration clock follows (so (e) and re-prediction use the real length)."""
        s_iter = it_i - (generated - 1.0)
        if abs(s_iter - r.s_iter) < 0.5:
            return
        i = r.slot
        r.s_iter = s_iter
        r.e_iter = s_iter + r.l_pred - 1.0
        heapq.heappush(self.ends[i], (r.e_iter, r.rid))
        if r.e_iter < self.min_end[i]:
            self.min_end[i] = r.e_iter
        self.dirty[i] = 1.0

    def expire_adj(self, i: int, it_i: float) -> None:
        keep = []
        for ent in self.adj[i]:
            if ent[0] < it_i:
                self.err_b[i] -= ent[1]
                self.err_l[i] -= ent[2]
            else:
                keep.append(ent)
        self.adj[i] = keep

    # ------------------------------------------------------------------------------ request events
    def place(self, i: int, r: PlacedRequest, now: float, gamma: float) -> None:
        """Record ``r`` on worker i at ``now`` as a new request (it starts after its prefill)."""
        self.touch(i, now)
        x = self.new_in[i] + r.l_in
        t_x = max(self.tpre_scalar(x), 0.0)
        dp = max(t_x - max(self.tpre_scalar(self.new_in[i]), 0.0), 0.0) if self.new_in[i] > 0 else t_x
        r.slot = i
        r.ctx = r.l_in + gamma * r.l_pred
        r.started = False
        r.t_start = now + t_x
        r.s_iter = self.iter_at(i, now)  # until it starts: its placement iteration
        r.e_iter = r.s_iter + r.l_pred - 1.0
        self.members[i][r.rid] = r
        self.b[i] += 1.0
        self.S[i] += r.ctx
        self.new_in[i] = x
        self.final[i] += r.l_in + r.l_pred
        self.dirty[i] = 1.0
        self.set_rate(i)
        # the prefill preempts the decode batch: the worker's iteration clock stands still for the
        # time it adds to the pending prefill batch (an estimate; measured progress replaces it where
        # the caller reports it)
        self.pu[i] = max(self.pu[i], now) + dp
        self.log_prefill(i, now, dp)

    def start(self, r: PlacedRequest, t: float) -> None:
        """``r``'s prefill ended at ``t``: it becomes ongoing on its worker's iteration clock."""
        i = r.slot
        r.started = True
        r.s_iter = self.iter_at(i, t)
        r.e_iter = r.s_iter + r.l_pred - 1.0
        r.a_val = self.t_dec * (r.s_iter - 1.0) - t
        self.new_in[i] -= r.l_in
        self.dirty[i] = 1.0
        if r.a_val > self.amax[i]:
            self.amax[i] = r.a_val
        heapq.heappush(self.ends[i], (r.e_iter, r.rid))
        if r.e_iter < self.min_end[i]:
            self.min_end[i] = r.e_iter

    def remove(self, r: PlacedRequest, now: float) -> None:
        """Take ``r`` off its worker at ``now`` (finished, moved or re-placed)."""
        i = r.slot
        self.touch(i, now)
        del self.members[i][r.rid]
        self.b[i] -= 1.0
        self.S[i] -= r.ctx
        self.final[i] -= r.l_in + r.l_pred
        self.dirty[i] = 1.0
        if r.started:
            if r.a_val >= self.amax[i]:
                self.recompute_amax(i)
            if r.e_iter <= self.min_end[i]:
                self.clean_ends(i)
        else:
            self.new_in[i] -= r.l_in
        if r.under:
            self.err_b[i] -= 1.0
            self.err_l[i] -= r.ctx
        self.set_rate(i)

    def pop_overdue(self, i: int, it_i: float) -> list[PlacedRequest]:
        """Pop the ongoing requests on worker i whose predicted end lies before iteration ``it_i``."""
        h, mem = self.ends[i], self.members[i]
        out = []
        while h and h[0][0] < it_i:
            e, rid = heapq.heappop(h)
            r = mem.get(rid)
            if r is not None and r.started and r.e_iter == e:
                out.append(r)
        return out

    def repredict(self, r: PlacedRequest, new: float, gamma: float) -> None:
        """``r`` outlived its prediction, which becomes ``new``: r marks an under-estimate (§4.3)."""
        i = r.slot
        d = new - r.l_pred
        ctx_new = r.l_in + gamma * new
        if r.under:
            self.err_l[i] += ctx_new - r.ctx
        else:
            r.under = True
            self.err_b[i] += 1.0
            self.err_l[i] += ctx_new
        self.S[i] += ctx_new - r.ctx
        self.final[i] += d
        r.ctx, r.l_pred = ctx_new, new
        r.e_iter += d
        heapq.heappush(self.ends[i], (r.e_iter, r.rid))

    # ------------------------------------------------------------------------------ constraints
    def kv_peak(self, i: int, it_i: float, extra: Sequence[tuple[float, float]] = ()) -> float:
        """Max over iterations K ≥ now of Σ occupancy on worker i, plus ``extra`` (l_in, l_pred) starting
        now (the scalar twin of :meth:`kv_fits`, for rebalancing and introspection)."""
        pairs = self.breakpoints(i, it_i)
        pairs += [(it_i + max(lp, 1.0) - 1.0, li + 1.0 - it_i) for li, lp in extra]
        pairs.sort()
        sc = best = 0.0
        for k, (e, c0) in enumerate(reversed(pairs), start=1):
            sc += c0
            best = max(best, sc + k * e)
        return best

    def mask_bcd(
        self,
        idx: np.ndarray,
        it: np.ndarray,
        now: float,
        l_in: float,
        ctx: float,
        theta: float,
        protect: bool = True,
    ) -> np.ndarray:
        """Necessary conditions of (b), (c), (d) for a request (l_in, context ctx) on each worker in
        ``idx``, one numpy pass: (b) at the full T_dec (no prefill load), (c), and (d) without the next
        decode iteration. :meth:`exact_bd` completes (b) and (d) for one worker."""
        b = self.b[idx]
        ok = self.S[idx] + ctx <= theta * self.ld(b + 1.0)  # (b)
        x = self.new_in[idx] + l_in
        ok &= x <= self.prefill_cap_tokens  # (c)
        if protect:  # (d); no ongoing request: +inf
            ok &= self.tpre(x) <= theta * self.slack(idx, it, now)
        return ok

    def slack(self, idx: np.ndarray, it: np.ndarray, now: float) -> np.ndarray:
        """min_j (T_dec·l_out_j − t_dec_j) over the requests decoding on each worker (+inf: none):
        measured where progress is reported (``dkey − now``), else from the estimated clock. With
        ``protect_prefills``, a worker holding requests whose prefill has not ended (Σ new l_in > 0)
        has at most T_dec: each of them has 1 token and no decode time at its first token, and the
        prefills placed after it run before its next token."""
        est = self.t_dec * it[idx] - now - self.amax[idx]
        out = np.where(self.meas[idx] > 0, self.dkey[idx] - now, est)
        if self.protect_prefills:
            out = np.where(self.new_in[idx] > 0, np.minimum(out, self.t_dec), out)
        return out

    def exact_bd(
        self, i: int, slack: float, l_in: float, ctx: float, theta: float, rho: float, paper: bool = False
    ) -> bool:
        """(b) with the prefill load and (d) with the batch growth, for the request on worker i.

        (b): decode runs only 1 − ρ of the time (ρ = the worker's prefill share), so the batch with
        the request must keep t_d ≤ T_dec·(1 − ρ): Σ ctx ≤ θ·l_d(b + 1; T_dec·(1 − ρ)).
        (d): every ongoing request j has l_out_j tokens after t_dec_j seconds of decoding; the pending
        prefills with this one (t_pre(x)) and then the next decode iteration of the grown batch
        (t_d(b + 1)) come before its next token, whose ATGT must stay ≤ T_dec:
        (t_dec_j + t_pre(x) + t_d(b + 1)) / l_out_j ≤ T_dec ⟺ t_pre(x) + t_d(b + 1) ≤ T_dec·l_out_j −
        t_dec_j, with θ as the paper's margin on the right.

        ``paper``: the constraints as the paper prints them (Eq. 4 at the full T_dec; (d) with t_pre
        only), which :meth:`mask_bcd` already checked, so True. ``rho`` = 0 leaves (b) as printed (what
        :meth:`mask_bcd` checked) and checks (d) with the next iteration (``constraints="strict_d"``).
        """
        if paper:
            return True
        b1 = float(self.b[i]) + 1.0
        s1 = float(self.S[i]) + ctx
        if rho > 0:
            t_eff = self.t_dec * (1.0 - rho)
            if s1 > theta * max(0.0, float(self.latency.decode.context_limit(b1, t_eff))):
                return False
        if not math.isfinite(slack):
            return True
        x = float(self.new_in[i]) + l_in
        return float(self.tpre(x)) + self.td(b1, s1) <= theta * slack

    def norm(self, idx: np.ndarray) -> np.ndarray:
        """capacity_norm of the workers in ``idx``."""
        return np.hypot(self.b[idx] / self.B_max, self.S[idx] * self.inv_L)

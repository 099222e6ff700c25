"""The book Aladdin's best-fit dispatch keeps of the requests it placed (:mod:`.aladdin_bestfit`).

:class:`RequestBook` holds, across models, one :class:`~.aladdin_ledger.ModelPool` per model, every
placed request and the heap of their estimated starts, and brings them to the policy's clock: estimated
starts (:meth:`RequestBook.advance`), the measured progress the candidates carry
(:meth:`RequestBook.observe`) and the re-prediction of requests that outlived their prediction (§4.3,
with the predictor's answers memoised). :class:`KvCapacity` is constraint (e)'s M per worker from the
policy's options. The time model and the constraints are defined in :mod:`.aladdin_bestfit`'s docstring.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmfleet.policies.dispatch.aladdin_ledger import ModelPool, PlacedRequest
from llmfleet.policies.dispatch.base import EngineCandidate, eligible
from llmfleet.predict.base import LengthQuery


def per_model(value: Any, model: str) -> Any:
    """``value[model]`` for a mapping (None when absent), else ``value`` itself."""
    if isinstance(value, Mapping):
        return value.get(model)
    return value


@dataclass(frozen=True)
class KvCapacity:
    """M per worker in tokens: ``kv_tokens`` (a number or model -> number), else ``kv_bytes`` (or the
    engine's reported capacity) ÷ ``bytes_per_token`` (or the request's); else unbounded."""

    kv_tokens: float | Mapping[str, float] | None = None
    kv_bytes: float | Mapping[str, float] | None = None
    bytes_per_token: float | Mapping[str, float] | None = None

    def tokens(self, model: str, cand: EngineCandidate, bpt_req: float) -> float:
        tok = per_model(self.kv_tokens, model)
        if tok is not None:
            return float(tok)
        bpt = per_model(self.bytes_per_token, model) or bpt_req
        cap = per_model(self.kv_bytes, model)
        if cap is None and cand.kv_capacity_bytes > 0:
            cap = cand.kv_capacity_bytes
        if cap is not None and bpt:
            return float(cap) / float(bpt)
        return math.inf


# predictor answers are memoised per (service, input bin, generated tokens) — the bin from the
# predictor's ``bin_of(prompt_tokens)`` when it has one (Aladdin's predictor is conditioned on
# input-length ranges), else the exact prompt length — and the memo is dropped every MEMO_S seconds of
# policy time so that new observations show through
MEMO_S = 10.0


@dataclass
class RequestBook:
    """Aladdin's requests, per model and by id, on the policy's clock; see the module docstring.

    ``latency_models`` and ``slos`` ((T_pre, T_dec) per model) price each model's pool; ``gamma`` is
    (b)'s γ; ``predictor`` (a ``LengthPredictor`` or a callable) answers re-predictions, memoised per
    (service, input bin, generated tokens) and dropped every :data:`MEMO_S` seconds of policy time."""

    latency_models: Mapping[str, Any]
    slos: Mapping[str, tuple[float, float]]
    capacity: KvCapacity
    gamma: float
    predictor: Any
    protect_prefills: bool = True
    pools: dict[str, ModelPool] = field(default_factory=dict)
    reqs: dict[str, PlacedRequest] = field(default_factory=dict)
    starts: list[tuple[float, int, str]] = field(default_factory=list)  # (t_start, seq, rid)
    seq: int = 0
    now: float = -math.inf
    repredictions: int = 0
    _memo: dict[tuple[str, int, int], float] = field(default_factory=dict, repr=False)
    _memo_t: float = -math.inf

    def pool(self, model: str) -> ModelPool:
        """The ledger of ``model``'s workers (made on first use)."""
        pool = self.pools.get(model)
        if pool is None:
            lat = self.latency_models.get(model)
            slo = self.slos.get(model)
            if lat is None or slo is None:
                raise ValueError(f"aladdin_bestfit has no latency model and SLO for model {model!r}")
            pool = ModelPool(model, lat, slo[0], slo[1], protect_prefills=self.protect_prefills)
            self.pools[model] = pool
        return pool

    def slots(
        self,
        pool: ModelPool,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str],
        bpt: float,
    ) -> np.ndarray:
        """Slots of the candidates hosting ``model``, less ``exclude`` (new engines get a slot with
        their KV capacity); NoCandidate, with the reason, when none is left."""
        ids = [c.engine_id for c in candidates]
        idx = pool.cache_idx
        if idx is None or ids != pool.cache_ids:
            idx = np.array(
                [self._slot(pool, model, c, bpt) for c in candidates if model in c.models], dtype=np.intp
            )
            pool.cache_ids, pool.cache_idx = ids, idx
        if exclude:
            ex = [pool.slot_of[e] for e in exclude if e in pool.slot_of]
            if ex:
                idx = idx[~np.isin(idx, ex)]
        if not idx.size:
            eligible(model, candidates, exclude)  # raises NoCandidate with the reason
        return idx

    def _slot(self, pool: ModelPool, model: str, candidate: EngineCandidate, bpt: float) -> int:
        """``candidate``'s slot in ``pool`` (a new engine gets one with its KV capacity)."""
        i = pool.slot_of.get(candidate.engine_id)
        if i is None:
            i = pool.add_slot(candidate.engine_id, self.capacity.tokens(model, candidate, bpt))
        return i

    def advance(self, now: float) -> float:
        """Bring the time-derived state to ``now``: requests whose prefill ended become ongoing (by
        the estimate, on workers without measured progress; elsewhere when their first token shows)."""
        now = max(now, self.now)
        self.now = now
        h = self.starts
        while h and h[0][0] <= now:
            t, _, rid = heapq.heappop(h)
            r = self.reqs.get(rid)
            if r is None or r.started or r.t_start != t:
                continue
            pool = self.pools[r.model]
            if pool.meas[r.slot] > 0:
                continue  # measured: it starts when the engine reports its first token
            pool.start(r, t)
        return now

    def observe(self, pool: ModelPool, model: str, candidates: Sequence[EngineCandidate], now: float) -> None:
        """Take in the measured progress the candidates carry (``EngineCandidate.requests``).

        Per worker: dkey = min_j (T_dec·l_out_j + t_first_j) over every request decoding there (ours
        or not: any ongoing request's ATGT is at stake), so that (d)'s slack at t is dkey − t. Our
        requests that produced a token are started at their first token, and their place on the
        worker's iteration clock follows their real token count."""
        t_dec = pool.t_dec
        tds: dict[str, float | None] = {model: t_dec}  # T_dec per model seen (None: no SLO known)
        slos, placed = self.slos, self.reqs.get
        for c in candidates:
            reqs = c.requests
            if reqs is None or model not in c.models:
                continue
            i = pool.slot_of.get(c.engine_id)
            if i is None:
                continue
            pool.meas[i] = 1.0
            key = math.inf
            it_i = None
            for rid, m, g, first in reqs:
                if g < 1:
                    continue
                if m in tds:
                    td = tds[m]
                else:
                    td = tds[m] = slos.get(m, (0.0, None))[1]
                if td is not None:
                    v = td * g + first
                    if v < key:  # min(key, v): the same float
                        key = v
                r = placed(rid)
                if r is None or r.slot != i or r.model != model:
                    continue
                if not r.started:
                    pool.start(r, min(first, now))
                if it_i is None:
                    it_i = pool.iter_at(i, now)
                if not abs(it_i - (g - 1.0) - r.s_iter) < 0.5:  # else sync leaves r where it is
                    pool.sync(r, it_i, float(g))
            pool.dkey[i] = key

    def predict(self, service: str, l_in: float, generated: float) -> float | None:
        """The predictor's l_out given ``generated`` tokens so far (memoised; None: no predictor)."""
        p = self.predictor
        if p is None:
            return None
        bin_of = getattr(p, "bin_of", None)
        key = (service, bin_of(int(l_in)) if bin_of else int(l_in), int(generated))
        if self.now - self._memo_t > MEMO_S:
            self._memo.clear()
            self._memo_t = self.now
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if hasattr(p, "predict"):
            q = LengthQuery(service, prompt_tokens=int(l_in), generated_tokens=int(generated))
            mean = getattr(p, "predict_mean", None)  # predict(q).mean without the spread, where offered
            out = float(mean(q)) if mean is not None else float(p.predict(q).mean)
        else:
            out = float(p(service, int(l_in), int(generated)))
        self._memo[key] = out
        return out

    def repredict_overdue(self, pool: ModelPool, it: np.ndarray, now: float) -> None:
        """§4.3: ongoing requests past their predicted end get E[l_out | l_in, l_out > g]."""
        late = np.flatnonzero(it > pool.min_end[: pool.slots_used])
        for i in late.tolist():
            it_i = float(it[i])
            todo = pool.pop_overdue(i, it_i)
            if todo:
                pool.touch(i, now)
                for r in todo:
                    g = max(r.l_pred, math.floor(1.0 + it_i - r.s_iter))
                    new = self.predict(r.service, r.l_in, g)
                    if new is None or not new > g:
                        new = 2.0 * max(g, 1.0)
                    pool.repredict(r, new, self.gamma)
                    self.repredictions += 1
                pool.dirty[i] = 1.0
                pool.set_rate(i)
            pool.clean_ends(i)

    def record(self, pool: ModelPool, i: int, r: PlacedRequest, now: float) -> None:
        """Place ``r`` on slot ``i`` of ``pool`` (and schedule its estimated start)."""
        pool.place(i, r, now, self.gamma)
        self.reqs[r.rid] = r
        self.seq += 1
        heapq.heappush(self.starts, (r.t_start, self.seq, r.rid))

    def remove(self, pool: ModelPool, r: PlacedRequest, now: float) -> None:
        """Take ``r`` off its worker."""
        pool.remove(r, now)
        self.reqs.pop(r.rid, None)

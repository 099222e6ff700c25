"""Iteration latency from measured GPU operator timings (Microsoft Vidur's public profiling data).

Data: ``data/vidur_<gpu>.json``, derived by ``tools/vidur_tables.py`` from Vidur's CSVs (MIT license,
github.com/microsoft/vidur; the commit is in each file, the license text in ``data/VIDUR_LICENSE``):
per profiled layer shape and TP degree, the median time of one layer's non-attention operators
(layernorms, QKV and output projections, RoPE, MLP up/act/down, residual add) and of the embedding at
``num_tokens`` = 1 … 4096 (32,768 for Llama-3 on A100), and all-reduce time against message size per
TP group (DGX, the group inside one node). Attention itself is not in the data.

One iteration (prefill of T tokens with Σl² = Q, or decode of b sequences with Σ context S), seconds::

    t = O + L·f_layer(n) + f_emb(n) + 2L·f_ar(n·h) + lm_head + attention

- n = T (prefill) or b (decode): the tokens the non-attention operators see.
- ``f_layer``: a convex, non-decreasing piecewise-linear fit of the measured per-layer time in n
  (:func:`fit_hinge`: c + s·n + Σ_k d_k·max(0, n − t_k) with c, s, d_k ≥ 0 and two knots, weighted
  least squares on relative error, knots chosen by search over the measured token counts). Its
  segments are the cost legs; max over them equals the fit because it is convex.
- ``f_emb``: the embedding lookup, an affine fit (no knot) of the same kind.
- ``f_ar``: Megatron TP does two all-reduces of n·h fp16 elements per layer; the measured time
  against message size gets the same fit with one knot, rescaled to n. TP = 1 has none.
- lm_head (not in Vidur's operators): roofline, its V·h weights read once per iteration at the
  attainable bandwidth, plus 2·V·h FLOPs per decoded sequence at the attainable FLOP/s (logits are
  computed for each sequence's last token only; a prefill's per-prompt share is neglected).
- attention, from the roofline's rates (``Hardware.flops`` = peak × compute_eff, ``Hardware.bandwidth``
  = peak × mem_eff, as in :mod:`llmfleet.costmodel.roofline`):
  prefill 2·L·H·d·Q FLOPs (QKᵀ and PV under the causal mask) + T·kv_bytes written to the cache;
  decode S·max(4·L·H·d FLOPs, kv_bytes) (the cached KV read, memory-bound in practice) + b·kv_bytes
  written.
- O = :data:`FRAMEWORK_OVERHEAD_S`, a fixed per-iteration framework overhead (see there).

Shapes that were not profiled (Llama-2-13B, OPT-6.7B, Qwen2-7B, …) are derived (:func:`derived_curve`):
at every measured token count n, the per-layer times of all profiled (shape, TP) pairs on that GPU are
regressed (non-negative, relative error) on the per-GPU GEMM work and element-wise work per token::

    f_layer(n) ≈ a(n) + b(n)·w_gemm + c(n)·w_elem
    w_gemm = (h·(q + 2·kv) + q·h + m·h·f) / TP      (m = 3 gated MLP, 2 otherwise; q = H·d, kv = H_kv·d)
    w_elem = 3·h + ((q + kv) + (2 if gated else 1)·f) / TP      (norms and residual add replicated)

and the new shape's (w_gemm, w_elem) give its per-layer time at each n, fitted then like a measured
curve. The embedding is regressed on h alone. ``heldout_errors`` and ``leave_one_shape_out`` measure
the fit and the derivation against the data (``tools/bench/cost_sources.py``).

A shape matches a profile by layer shape (h, f, H, H_kv, gated MLP), not name: Mistral-7B uses the
Llama-3-8B layer profile, Llama-3-70B on H100 the Llama-2-70B one (only the vocabulary differs, which
touches the embedding lookup only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import combinations

import numpy as np

from llmfleet.costmodel.hardware import Hardware
from llmfleet.costmodel.models import MODEL_CATALOG, ModelArch


def nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """scipy's non-negative least squares, imported on first use (scipy.optimize takes about a second
    to import, and most processes that price iterations never fit a Vidur curve)."""
    from scipy.optimize import nnls as scipy_nnls

    return scipy_nnls(a, b)


FRAMEWORK_OVERHEAD_S = 2.0e-3
"""Fixed per-iteration framework overhead (scheduling, input preparation, sampling, output processing),
a modelling assumption: Vidur's own CPU-overhead profile of vLLM on A100 (microsoft/vidur,
``data/profiling/a100/cpu_overheads.csv``; not among the files copied here) gives, for Llama-2-7B at
TP 1 and batch 8, medians of schedule 0.17 + sampler 0.89 + prepare inputs 0.29 + process model outputs
0.62 ≈ 2.0 ms per iteration. The same profile grows to ≈ 7.6 ms at batch 64, so a constant understates
large batches; it is kept fixed (and overridable) because the data for its batch dependence is not
shipped."""

LAYER_KNOTS = 2  # knots of the per-layer fit (3 legs)
AR_KNOTS = 1  # knots of the all-reduce fit (2 legs)
EMB_KNOTS = 0  # the embedding lookup is affine in tokens
_MS = 1e-3
GPUS = ("a100", "h100")


class VidurDataError(LookupError):
    """No measured data for this hardware or TP degree (the caller falls back to the roofline)."""


# ---------------------------------------------------------------------------------------- the fit form
@dataclass(frozen=True)
class Hinge:
    """Convex non-decreasing piecewise-linear f(x) = c + s·x + Σ d_k·max(0, x − t_k), all ≥ 0."""

    c: float
    s: float
    knots: tuple[tuple[float, float], ...] = ()  # (t_k, d_k), t ascending

    def __call__(self, x: np.ndarray | float) -> np.ndarray | float:
        x = np.asarray(x, dtype=float)
        y = self.c + self.s * x
        for t, d in self.knots:
            y = y + d * np.maximum(0.0, x - t)
        return y if y.ndim else float(y)

    def __add__(self, other: Hinge) -> Hinge:
        knots = {}
        for t, d in (*self.knots, *other.knots):
            knots[t] = knots.get(t, 0.0) + d
        return Hinge(self.c + other.c, self.s + other.s, tuple(sorted(knots.items())))

    def scaled(self, k: float) -> Hinge:
        """k·f(x) for k ≥ 0."""
        return Hinge(k * self.c, k * self.s, tuple((t, k * d) for t, d in self.knots))

    def of_scaled_x(self, m: float) -> Hinge:
        """x ↦ f(m·x) for m > 0."""
        return Hinge(self.c, self.s * m, tuple((t / m, d * m) for t, d in self.knots))

    def legs(self) -> tuple[tuple[float, float], ...]:
        """(α, β) of each segment: f(x) = max_j (α_j + β_j·x) for x ≥ 0 (exact, since f is convex)."""
        out = [(self.c, self.s)]
        a, b = self.c, self.s
        for t, d in self.knots:
            a, b = a - d * t, b + d
            out.append((a, b))
        return tuple(out)


def fit_hinge(x: Sequence[float], y: Sequence[float], n_knots: int = 2) -> Hinge:
    """Non-negative weighted least squares (residuals relative to y) of the :class:`Hinge` form.

    Knots sit at measured x values. Every subset of at most ``n_knots`` of a log-spaced grid of 24
    interior candidates is solved; the best one's knots are then refined, one at a time, over every
    measured x between their grid neighbours. The lowest relative residual wins.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2 + n_knots or np.any(y <= 0):
        raise ValueError(f"fit_hinge needs ≥ {2 + n_knots} points with y > 0, got {len(x)}")
    scale = float(x.max())
    xs = x / scale
    w = 1.0 / y
    ux = np.unique(xs)
    inner = ux[1:-2] if len(ux) > 4 else ux[:0]
    grid = inner
    if len(grid) > 24:
        grid = grid[np.unique(np.round(np.geomspace(1, len(grid), 24)).astype(int) - 1)]
    base = np.column_stack([np.ones_like(xs), xs])

    def solve(ts: tuple[float, ...]) -> tuple[float, np.ndarray]:
        a = np.column_stack([base, *(np.maximum(0.0, xs - t) for t in ts)])
        coef, _ = nnls(a * w[:, None], y * w)
        return float(np.sum(((a @ coef - y) * w) ** 2)), coef

    best_r, best_coef, best_ts = math.inf, np.zeros(2), ()
    for k in range(n_knots + 1):
        for ts in combinations(grid, k):
            r, coef = solve(ts)
            if r < best_r - 1e-15:
                best_r, best_coef, best_ts = r, coef, ts
    for i in range(len(best_ts)):  # local refinement over the measured x between grid neighbours
        pos = int(np.searchsorted(grid, best_ts[i]))
        lo = grid[pos - 1] if pos > 0 else inner[0]
        hi = grid[pos + 1] if pos + 1 < len(grid) else inner[-1]
        for t in inner[(inner > lo) & (inner < hi)]:
            ts = tuple(sorted((*best_ts[:i], t, *best_ts[i + 1 :])))
            if len(set(ts)) < len(ts):
                continue
            r, coef = solve(ts)
            if r < best_r - 1e-15:
                best_r, best_coef, best_ts = r, coef, ts
    knots = tuple(
        (float(t * scale), float(d / scale)) for t, d in zip(best_ts, best_coef[2:], strict=True) if d > 0
    )
    return Hinge(float(best_coef[0]), float(best_coef[1] / scale), knots)


# ---------------------------------------------------------------------------------------- the tables
@cache
def load_table(gpu: str) -> dict:
    """The shipped derived table for ``gpu`` ("a100", "h100")."""
    if gpu not in GPUS:
        raise VidurDataError(f"no Vidur table for GPU {gpu!r}; available: {list(GPUS)}")
    path = resources.files("llmfleet.costmodel") / "data" / f"vidur_{gpu}.json"
    return json.loads(path.read_text())


@cache
def _gpu_of() -> dict[str, str]:
    return {hw: gpu for gpu in GPUS for hw in load_table(gpu)["hardware"]}


def gpu_for(hw: Hardware) -> str:
    """The Vidur GPU directory that measured this catalog hardware; :class:`VidurDataError` if none."""
    gpu = _gpu_of().get(hw.name)
    if gpu is None:
        raise VidurDataError(
            f"no Vidur measurements for hardware {hw.name!r} (measured: {sorted(_gpu_of())})"
        )
    return gpu


ShapeKey = tuple[int, int, int, int, bool]  # (h, f, H, H_kv, gated)


def shape_key(arch: ModelArch) -> ShapeKey:
    return (arch.hidden_size, arch.ffn_size, arch.num_heads, arch.num_kv_heads, arch.gated_mlp)


def profile_key(p: dict) -> ShapeKey:
    return (p["n_embd"], p["n_expanded_embd"], p["n_head"], p["n_kv_head"], bool(p["use_gated_mlp"]))


def profile_for(gpu: str, key: ShapeKey) -> str | None:
    """Name of the first profile (sorted) with this layer shape on ``gpu``, or None."""
    for name in sorted(load_table(gpu)["models"]):
        if profile_key(load_table(gpu)["models"][name]) == key:
            return name
    return None


def _work(key: ShapeKey, tp: int) -> tuple[float, float]:
    """(w_gemm in M MACs, w_elem in K elements) per token per GPU (module docstring)."""
    h, f, n_head, n_kv, gated = key
    d = h // n_head
    q, kv = n_head * d, n_kv * d
    gemm = (h * (q + 2 * kv) + q * h + (3 if gated else 2) * h * f) / tp
    elem = 3 * h + ((q + kv) + (2 if gated else 1) * f) / tp
    return gemm / 1e6, elem / 1e3


@dataclass(frozen=True)
class Curve:
    """Per-layer and embedding time (ms) at each token count for one (shape, TP) on one GPU."""

    tokens: np.ndarray
    layer_ms: np.ndarray
    emb_ms: np.ndarray
    provenance: str  # "measured:<profile>" or "derived"


def measured_curve(gpu: str, profile: str, tp: int) -> Curve:
    p = load_table(gpu)["models"][profile]
    rows = p["tp"].get(str(tp))
    if rows is None:
        raise VidurDataError(f"{profile} on {gpu} was not profiled at TP {tp} (profiled: {sorted(p['tp'])})")
    return Curve(
        np.asarray(rows["tokens"], dtype=float),
        np.asarray(rows["layer_ms"], dtype=float),
        np.asarray(rows["emb_ms"], dtype=float),
        f"measured:{profile}",
    )


def derived_curve(gpu: str, key: ShapeKey, tp: int, exclude: ShapeKey | None = None) -> Curve:
    """Per-layer time of an unprofiled shape from the profiled ones (module docstring); ``exclude``
    leaves one profiled shape out (for the leave-one-shape-out check)."""
    models = load_table(gpu)["models"]
    rows = []  # (key, tp, {tokens: (layer, emb)})
    for p in models.values():
        k = profile_key(p)
        if k == exclude:
            continue
        for t, r in p["tp"].items():
            rows.append(
                (k, int(t), dict(zip(r["tokens"], zip(r["layer_ms"], r["emb_ms"], strict=True), strict=True)))
            )
    if len({(k, t) for k, t, _ in rows}) < 3:
        raise VidurDataError(f"too few profiles on {gpu} to derive a shape")
    grid = sorted(set.intersection(*(set(r) for _, _, r in rows)))
    feats = np.array([[1.0, *_work(k, t)] for k, t, _ in rows])
    emb_feats = np.array([[1.0, k[0] / 1e3] for k, _, _ in rows])
    target = np.array([1.0, *_work(key, tp)])
    target_emb = np.array([1.0, key[0] / 1e3])
    layer, emb = [], []
    for n in grid:
        y = np.array([r[n][0] for _, _, r in rows])
        ye = np.array([r[n][1] for _, _, r in rows])
        coef, _ = nnls(feats / y[:, None], np.ones_like(y))
        coef_e, _ = nnls(emb_feats / ye[:, None], np.ones_like(ye))
        layer.append(float(target @ coef))
        emb.append(float(target_emb @ coef_e))
    return Curve(np.asarray(grid, dtype=float), np.asarray(layer), np.asarray(emb), "derived")


def curve_for(gpu: str, arch: ModelArch, tp: int) -> Curve:
    """The measured curve of the arch's layer shape at ``tp`` if profiled, else the derived one."""
    key = shape_key(arch)
    name = profile_for(gpu, key)
    if name is not None and str(tp) in load_table(gpu)["models"][name]["tp"]:
        return measured_curve(gpu, name, tp)
    return derived_curve(gpu, key, tp)


def allreduce_hinge(gpu: str, tp: int) -> Hinge:
    """All-reduce ms against message size (fp16 elements) for a TP group of ``tp``."""
    return _allreduce_hinge(gpu, tp, None)


@cache
def _allreduce_hinge(gpu: str, tp: int, parity: int | None) -> Hinge:
    rows = load_table(gpu)["all_reduce"].get(str(tp))
    if rows is None:
        raise VidurDataError(
            f"no all-reduce measurement on {gpu} for {tp} GPUs (measured: {sorted(load_table(gpu)['all_reduce'], key=int)})"
        )
    x, y = np.asarray(rows["size"], dtype=float), np.asarray(rows["ms"], dtype=float)
    if parity is not None:
        x, y = x[parity::2], y[parity::2]
    return fit_hinge(x, y, AR_KNOTS)


# ---------------------------------------------------------------------------------------- compile
@dataclass(frozen=True)
class VidurLegs:
    """Cost legs (α, β, γ) in seconds for ``llmfleet.sim.cost.LinearCost``: prefill over (T, Q) and decode
    over (b, S); ``tokens`` is the non-attention time alone (seconds, n tokens), ``curve`` the data."""

    prefill: tuple[tuple[float, float, float], ...]
    decode: tuple[tuple[float, float, float], ...]
    tokens: Hinge
    gpu: str
    provenance: str


def non_attention(arch: ModelArch, gpu: str, tp: int, curve: Curve | None = None) -> Hinge:
    """L·f_layer(n) + f_emb(n) + 2L·f_ar(n·h) in seconds, as one :class:`Hinge` in tokens n."""
    c = curve if curve is not None else curve_for(gpu, arch, tp)
    t = fit_hinge(c.tokens, c.layer_ms, LAYER_KNOTS).scaled(arch.num_layers)
    t = t + fit_hinge(c.tokens, c.emb_ms, EMB_KNOTS)
    if tp > 1:
        t = t + allreduce_hinge(gpu, tp).of_scaled_x(arch.hidden_size).scaled(2 * arch.num_layers)
    return t.scaled(_MS)


@cache
def vidur_legs(
    arch: ModelArch, hw: Hardware, tp: int = 1, overhead_s: float = FRAMEWORK_OVERHEAD_S
) -> VidurLegs:
    """Compile the iteration time (module docstring) of ``arch`` at TP ``tp`` on ``hw``.

    Raises :class:`VidurDataError` when ``hw`` was not measured or ``tp`` > 1 has no all-reduce data.
    """
    if tp < 1:
        raise ValueError(f"tensor-parallel degree must be ≥ 1, got {tp}")
    if overhead_s < 0:
        raise ValueError(f"overhead must be ≥ 0, got {overhead_s}")
    gpu = gpu_for(hw)
    curve = curve_for(gpu, arch, tp)
    tokens = non_attention(arch, gpu, tp, curve)
    f, bw = tp * hw.flops, tp * hw.bandwidth
    lm_bytes = arch.vocab_size * arch.hidden_size * arch.dtype_bytes / bw
    lm_flops = 2 * arch.vocab_size * arch.hidden_size / f
    kv_write = arch.kv_bytes_per_token / bw
    attn = arch.num_layers * arch.num_heads * arch.head_dim
    pre_gamma = 2 * attn / f
    dec_gamma = max(4 * attn / f, arch.kv_bytes_per_token / bw)
    fixed = overhead_s + lm_bytes
    prefill = tuple((a + fixed, b + kv_write, pre_gamma) for a, b in tokens.legs())
    decode = tuple((a + fixed, b + kv_write + lm_flops, dec_gamma) for a, b in tokens.legs())
    return VidurLegs(prefill, decode, tokens, gpu, curve.provenance)


# ---------------------------------------------------------------------------------------- validation
def _rel(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    e = np.abs(pred - meas) / meas
    return {"mean_rel": float(e.mean()), "max_rel": float(e.max()), "n": len(e)}


def heldout_errors(gpu: str) -> list[dict]:
    """Fit on even-indexed token counts (and all-reduce sizes), test on the odd ones, per (profile, TP):

    - ``layer``: the per-layer non-attention fit against the measured per-layer time;
    - ``forward``: the whole non-attention part of an iteration as compiled, L·f_layer(n) + f_emb(n) +
      2L·f_ar(n·h), against L·layer + emb + 2L·all-reduce as measured (the all-reduce interpolated
      linearly between measured sizes), with L and h of the catalog model that has the profile's layer
      shape (``depth_of``), 32 layers where none does.
    """
    out = []
    table = load_table(gpu)
    for name, p in sorted(table["models"].items()):
        layers = depth_of(profile_key(p))
        h = p["n_embd"]
        for tp in sorted(p["tp"], key=int):
            c = measured_curve(gpu, name, int(tp))
            tr, te = slice(0, None, 2), slice(1, None, 2)
            lay = fit_hinge(c.tokens[tr], c.layer_ms[tr], LAYER_KNOTS)
            fwd = lay.scaled(layers) + fit_hinge(c.tokens[tr], c.emb_ms[tr], EMB_KNOTS)
            meas_fwd = layers * c.layer_ms[te] + c.emb_ms[te]
            keep = np.ones(len(meas_fwd), dtype=bool)
            if int(tp) > 1:  # scored only where the message size is inside the measured range
                ar = table["all_reduce"][tp]
                fwd = fwd + _allreduce_hinge(gpu, int(tp), 0).of_scaled_x(h).scaled(2 * layers)
                meas_fwd = meas_fwd + 2 * layers * np.interp(c.tokens[te] * h, ar["size"], ar["ms"])
                keep = c.tokens[te] * h <= ar["size"][-1]
            out.append(
                {
                    "gpu": gpu,
                    "profile": name,
                    "tp": int(tp),
                    "layers": layers,
                    "layer": _rel(lay(c.tokens[te]), c.layer_ms[te]),
                    "forward": _rel(fwd(c.tokens[te][keep]), meas_fwd[keep]),
                    "legs": len(fwd.legs()),
                }
            )
    return out


def depth_of(key: ShapeKey, default: int = 32) -> int:
    """Layers of the first catalog model (by name) with this layer shape, else ``default``."""

    for name in sorted(MODEL_CATALOG):
        if shape_key(MODEL_CATALOG[name]) == key:
            return MODEL_CATALOG[name].num_layers
    return default


def allreduce_heldout_errors(gpu: str) -> list[dict]:
    """All-reduce fit on even-indexed sizes, tested on the odd ones, per TP group."""
    out = []
    for tp, rows in sorted(load_table(gpu)["all_reduce"].items(), key=lambda kv: int(kv[0])):
        h = _allreduce_hinge(gpu, int(tp), 0)
        x, y = np.asarray(rows["size"], dtype=float)[1::2], np.asarray(rows["ms"], dtype=float)[1::2]
        out.append({"gpu": gpu, "tp": int(tp), "devices_per_node": rows["devices_per_node"], **_rel(h(x), y)})
    return out


def leave_one_shape_out(gpu: str) -> list[dict]:
    """Derive each profiled layer shape from the others (all its profiles left out) and compare the
    derived per-layer time (after the same hinge fit the cost uses) with the measured one, per TP."""
    out = []
    models = load_table(gpu)["models"]
    seen: set[ShapeKey] = set()
    for name, p in sorted(models.items()):
        key = profile_key(p)
        if key in seen:
            continue
        seen.add(key)
        for tp in sorted(p["tp"], key=int):
            meas = measured_curve(gpu, name, int(tp))
            der = derived_curve(gpu, key, int(tp), exclude=key)
            fit = fit_hinge(der.tokens, der.layer_ms, LAYER_KNOTS)
            sel = np.isin(meas.tokens, der.tokens)
            out.append(
                {
                    "gpu": gpu,
                    "profile": name,
                    "tp": int(tp),
                    "layer": _rel(fit(meas.tokens[sel]), meas.layer_ms[sel]),
                }
            )
    return out


def summarize(errors: list[dict], field: str | None) -> dict[str, float]:
    """Mean of the per-row means and max of the per-row maxima."""
    rows = [e[field] if field else e for e in errors]
    if not rows:
        return {"mean_rel": math.nan, "max_rel": math.nan}
    return {
        "mean_rel": float(np.mean([r["mean_rel"] for r in rows])),
        "max_rel": float(max(r["max_rel"] for r in rows)),
    }

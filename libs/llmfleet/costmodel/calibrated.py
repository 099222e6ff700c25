"""The calibrated cost source: measured operators plus the fitted per-iteration CPU overhead.

One iteration on a GPU that Vidur measured (A100-80GB, H100), at a TP degree with all-reduce data::

    t = vidur(n) − its fixed 2 ms + a[tp] + c[tp]·b

- ``vidur(n)``: the measured-operator legs of :mod:`llmfleet.costmodel.vidur` (per-layer operators,
  embedding, all-reduces, the roofline's lm_head and attention), built with no fixed overhead;
- ``a + c·b``: :data:`llmfleet.costmodel.overhead.VIDUR_A100_OVERHEAD`, fitted per TP on Vidur's CPU
  overhead profile of vLLM (schedule, sampler, input preparation, output processing, Ray round trip),
  b the sequences in the iteration. A decode of b sequences pays a + c·b; a prefill pays a + c (its
  prompts are counted as one sequence: the cost form carries tokens, not prompts), so a mixed
  iteration pays a + c·(b + 1).

Everywhere else (hardware without measurements such as L4, V100, H200, or a TP degree without
all-reduce data) the roofline is scaled: per phase and TP degree, max(k_c·compute, k_m·memory) + e·L,
with the roofline's compute and memory legs, L the model's layers and e a fixed time per layer (the
kernel launches and small-kernel floor the roofline lacks, which do not shrink with TP). k_c, k_m and e
are fitted where both the measured cost and the roofline exist (every measured layer shape with a
catalog model, on both GPUs, at TP 1, 2, 4, 8), then the overhead is added. A TP degree without a fit takes the nearest fitted one (log2, ties to the larger).
:func:`scale_heldout_errors` scores the factors on rows left out of their fit (one GPU, or one layer
shape, at a time); ``tools/bench/cost_sources.py`` reports it.

The CPU (``hardware("cpu")``) is not a GPU: factors fitted on GPUs do not transfer, so it keeps the
plain roofline.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from llmfleet.costmodel.hardware import Hardware, hardware
from llmfleet.costmodel.models import MODEL_CATALOG, ModelArch
from llmfleet.costmodel.overhead import VIDUR_A100_OVERHEAD, IterationOverhead
from llmfleet.costmodel.roofline import roofline_legs
from llmfleet.costmodel.vidur import GPUS, VidurDataError, load_table, profile_key, shape_key, vidur_legs

log = logging.getLogger(__name__)

Leg = tuple[float, float, float]
FIT_TPS = (1, 2, 4, 8)
PREFILL_TOKENS = tuple(2**k for k in range(4, 13))  # 16 … 4,096: the measured range
DECODE_BATCHES = tuple(2**k for k in range(9))  # 1 … 256
DECODE_CONTEXTS = (128, 512, 2048)  # tokens per sequence
_GRID = np.geomspace(0.25, 16.0, 241)  # candidate factors, 1.75% apart


@dataclass(frozen=True)
class Points:
    """The roofline's compute and memory legs and the measured cost at the fit's points of one
    (GPU, layer shape, TP, phase); ``shape`` names the catalog model."""

    gpu: str
    shape: str
    tp: int
    phase: str  # "prefill" | "decode"
    layers: int
    compute: np.ndarray
    memory: np.ndarray
    measured: np.ndarray


@dataclass(frozen=True)
class RooflineScale:
    """Factors (k_compute, k_memory, e seconds per layer) per (phase, TP) that scale the roofline."""

    factors: Mapping[tuple[str, int], tuple[float, float, float]]

    def of(self, phase: str, tp: int) -> tuple[float, float, float]:
        tps = [t for p, t in self.factors if p == phase]
        if not tps:
            raise ValueError(f"no {phase} factors fitted")
        best = min(tps, key=lambda k: (abs(math.log2(k) - math.log2(tp)), -k))
        return self.factors[(phase, best)]

    def legs(self, phase: str, tp: int, legs: Sequence[Leg], layers: int) -> tuple[Leg, ...]:
        """The roofline's (compute, memory) ``legs`` of ``phase`` at ``tp``, scaled, for a model of
        ``layers`` layers."""
        kc, km, e = self.of(phase, tp)
        (ac, bc, gc), (am, bm, gm) = legs
        return ((kc * ac + e * layers, kc * bc, kc * gc), (km * am + e * layers, km * bm, km * gm))

    def predict(self, p: Points) -> np.ndarray:
        kc, km, e = self.of(p.phase, p.tp)
        return np.maximum(kc * p.compute, km * p.memory) + e * p.layers


def _legs_at(legs: Sequence[Leg], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each leg's value at points (x, y) (rows: legs)."""
    return np.array([a + b * x + g * y for a, b, g in legs])


def _max_legs(legs: Sequence[Leg], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _legs_at(legs, x, y).max(axis=0)


def _prefill_xy() -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(PREFILL_TOKENS, dtype=float)
    return t, t * t


def _decode_xy() -> tuple[np.ndarray, np.ndarray]:
    b, c = np.meshgrid(np.asarray(DECODE_BATCHES, float), np.asarray(DECODE_CONTEXTS, float))
    return b.ravel(), (b * c).ravel()


def measured_shapes(gpu: str) -> list[tuple[str, int]]:
    """(catalog model, TP) for each layer shape measured on ``gpu`` with a catalog model of that
    shape (the first by name), at every TP the fit uses; a shape profiled twice counts once."""
    models = load_table(gpu)["models"]
    by_shape: dict[tuple, str] = {}
    for name in sorted(MODEL_CATALOG):
        by_shape.setdefault(shape_key(MODEL_CATALOG[name]), name)
    out, seen = [], set()
    for p in models.values():
        key = profile_key(p)
        if key in seen or key not in by_shape:
            continue
        seen.add(key)
        out += [(by_shape[key], tp) for tp in FIT_TPS if str(tp) in p["tp"]]
    return sorted(out)


def _gpu_hardware(gpu: str) -> Hardware:
    return hardware(sorted(load_table(gpu)["hardware"])[0])


@cache
def fit_points() -> tuple[Points, ...]:
    """The points both costs exist at: every measured shape on every measured GPU (see module)."""
    out = []
    for gpu in GPUS:
        hw = _gpu_hardware(gpu)
        for model, tp in measured_shapes(gpu):
            arch = MODEL_CATALOG[model]
            try:
                v = vidur_legs(arch, hw, tp, overhead_s=0.0)
            except VidurDataError:
                continue
            r_pre, r_dec = roofline_legs(arch, hw, tp)
            for phase, (x, y), rl, vl in (
                ("prefill", _prefill_xy(), r_pre, v.prefill),
                ("decode", _decode_xy(), r_dec, v.decode),
            ):
                legs = _legs_at(rl, x, y)
                out.append(
                    Points(gpu, model, tp, phase, arch.num_layers, legs[0], legs[1], _max_legs(vl, x, y))
                )
    return tuple(out)


def fit_scale(points: Iterable[Points]) -> RooflineScale:
    """Per (phase, TP): the factors k_c, k_m (searched on :data:`_GRID`) and e ≥ 0 (solved for each
    pair in closed form) that minimise the mean squared relative error of max(k_c·compute,
    k_m·memory) + e·L against the measured cost."""
    groups: dict[tuple[str, int], list[Points]] = {}
    for p in points:
        groups.setdefault((p.phase, p.tp), []).append(p)
    if not groups:
        raise ValueError("no points to fit the roofline's factors on")
    factors = {}
    for key, ps in sorted(groups.items()):
        c = np.concatenate([p.compute for p in ps])
        m = np.concatenate([p.memory for p in ps])
        y = np.concatenate([p.measured for p in ps])
        lay = np.concatenate([np.full(len(p.measured), float(p.layers)) for p in ps])
        pred = np.maximum(_GRID[:, None, None] * c, _GRID[None, :, None] * m)  # (kc, km, points)
        u = lay / y  # relative error (pred + e·L − y)/y = r + e·u with r = (pred − y)/y
        r = (pred - y) / y
        e = np.maximum(0.0, -(r * u).sum(axis=2) / (u * u).sum())
        err = ((r + e[:, :, None] * u) ** 2).mean(axis=2)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        factors[key] = (float(_GRID[i]), float(_GRID[j]), float(e[i, j]))
    return RooflineScale(factors)


@cache
def roofline_scale() -> RooflineScale:
    """The factors fitted on every measured point (what the calibrated source uses)."""
    return fit_scale(fit_points())


def _errors(scale: RooflineScale, points: Iterable[Points]) -> dict[str, float]:
    errs = [np.abs(scale.predict(p) - p.measured) / p.measured for p in points]
    e = np.concatenate(errs) if errs else np.array([math.nan])
    return {"mean_rel": float(e.mean()), "max_rel": float(e.max()), "n": len(e)}


def scale_heldout_errors() -> list[dict]:
    """The scaled roofline against the measured cost on rows left out of the factors' fit: each GPU
    held out in turn (fitted on the other), and each layer shape held out in turn (fitted on the rest);
    per phase. The in-sample error of the factors in use is the ``all`` row."""
    pts = fit_points()
    out = []
    for phase in ("prefill", "decode"):
        mine = [p for p in pts if p.phase == phase]
        out.append({"phase": phase, "held_out": "none (in sample)", **_errors(roofline_scale(), mine)})
        for gpu in GPUS:
            scale = fit_scale(p for p in pts if p.gpu != gpu)
            out.append(
                {
                    "phase": phase,
                    "held_out": f"gpu {gpu}",
                    **_errors(scale, [p for p in mine if p.gpu == gpu]),
                }
            )
        for shape in sorted({p.shape for p in pts}):
            scale = fit_scale(p for p in pts if p.shape != shape)
            out.append(
                {
                    "phase": phase,
                    "held_out": f"shape {shape}",
                    **_errors(scale, [p for p in mine if p.shape == shape]),
                }
            )
    return out


def with_overhead(
    prefill: Sequence[Leg], decode: Sequence[Leg], overhead: IterationOverhead, tp: int
) -> tuple[tuple[Leg, ...], tuple[Leg, ...]]:
    """The legs plus a + c·b: a + c on every prefill leg (one sequence), a on every decode leg's α and c
    on its β."""
    a, c = overhead.coefficients(tp)
    return (
        tuple((al + a + c, be, ga) for al, be, ga in prefill),
        tuple((al + a, be + c, ga) for al, be, ga in decode),
    )


def calibrated_legs(
    arch: ModelArch, hw: Hardware, tp: int = 1, overhead: IterationOverhead = VIDUR_A100_OVERHEAD
) -> tuple[tuple[Leg, ...], tuple[Leg, ...], str]:
    """(prefill legs, decode legs, source) of the calibrated cost (module docstring)."""
    if tp < 1:
        raise ValueError(f"tensor-parallel degree must be ≥ 1, got {tp}")
    if hw.name == "cpu":
        r_pre, r_dec = roofline_legs(arch, hw, tp)
        return r_pre, r_dec, "roofline"
    try:
        v = vidur_legs(arch, hw, tp, overhead_s=0.0)
        prefill, decode = with_overhead(v.prefill, v.decode, overhead, tp)
        return prefill, decode, f"calibrated:{v.gpu}" + (":derived" if v.provenance == "derived" else "")
    except VidurDataError as e:
        log.debug(
            "calibrated cost for %s at TP %d on %s: %s; scaling the roofline", arch.name, tp, hw.name, e
        )
    r_pre, r_dec = roofline_legs(arch, hw, tp)
    scale = roofline_scale()
    prefill, decode = with_overhead(
        scale.legs("prefill", tp, r_pre, arch.num_layers),
        scale.legs("decode", tp, r_dec, arch.num_layers),
        overhead,
        tp,
    )
    return prefill, decode, "calibrated:scaled-roofline"

"""The Mell migration benchmark's setups, load levels, workloads and policy variants
(``migration_bench.py``; the module docstring there describes them)."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
from llmfleet.costmodel import hardware, model_arch
from llmfleet.sim.memory import pool_layout
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload import Workload
from llmfleet.workload.datasets import alpaca_lengths

from tools.bench.papers import common as C

COST = (
    "the simulator's roofline cost models on catalog hardware (a100-40gb, rtx-4090) × catalog models "
    "(llama2-7b, llama2-13b); not GPU-fitted"
)
CONTEXT = 4096  # Llama-2
LONG_SCALE = 4  # conv-x4: the conv trace's prompts and outputs × 4 (mean prompt ~4.6k tokens)
GPUS = 40
# × the trace's mean rate (paper: λ 0.5 / 0.8 / 1.1 for low / mid / high); "fleet" is 3 × mid, the load at
# which the reference setup holds at least 40 active GPUs, run on FLEET_GPUS so that no policy hits the size
LEVELS = {"low": 6.25, "mid": 10.0, "high": 13.75, "fleet": 30.0}
FLEET_GPUS = 96
STEADY_SKIP = 0.25  # the steady window: the arrival window without its first quarter (ramp-up) and the drain
SETUPS: dict[str, tuple[str, str, str]] = {
    "a100-7b": ("A100-40GB", "llama2-7b", "Llama-2-7B on A100-40GB"),
    "4090-7b": ("RTX-4090", "llama2-7b", "Llama-2-7B on RTX 4090"),
    "a100-13b": ("A100-40GB", "llama2-13b", "Llama-2-13B on A100-40GB"),
}
REF_SETUP = "a100-7b"
BASELINES = ("BF", "WF", "LB")
THEOREM_RATIO = 4 / 3  # Mell Theorem 2: |A(I)| ≤ 4/3·OPT(I) + c
THEOREM_ADDITIVE = 3  # c: the most recently opened T-, S- and M-GPUs may be part-full (proof of Theorem 2)
CONTROLS = ("alpaca-poisson",)  # KV is not the binding constraint there: reported, not in the goals
# the paper's Mell; beyond the paper: Mell+ (fill_first), Mell++ (fill_first + compact)
MELLS = ("Mell", "Mell+", "Mell++")
HEADLINE = (*BASELINES, *MELLS)
SECTIONS = ("headline", "batching", "transfer")
SECTION_VARIANTS = {
    "headline": HEADLINE,
    "batching": ("Mell", "Mell-nobatch"),
    "transfer": ("Mell-kv", "Mell-tokens", "Mell"),
}
PLOT_RUN = ("a100-7b", "conv-poisson")  # the time-series plot: at the highest level run (paper Fig. 15)


# the paper's WF: worst fit among the active GPUs, a new GPU only when none fits
WF_OPTIONS = {"active_only": True}


def bundle(variant: str) -> PolicyBundle:
    """The policy bundle of one variant (see the module docstring)."""
    if variant == "BF":
        return PolicyBundle("bf", "dedicated_even", "best_fit_kv", "fcfs")
    if variant == "WF":
        return PolicyBundle("wf", "dedicated_even", {"policy": "worst_fit_kv", "options": WF_OPTIONS}, "fcfs")
    if variant == "LB":
        return PolicyBundle("lb", "dedicated_even", {"policy": "worst_fit_kv", "options": WF_OPTIONS}, "fcfs",
                            migration={"policy": "llumnix_lb", "transfer": "kv"})  # fmt: skip
    if variant == "Mell":
        return PolicyBundle(
            "mell", "dedicated_even", "mell", "fcfs", migration={"policy": "mell", "transfer": "hybrid"}
        )
    if variant == "Mell+":  # beyond the paper: before Allocate opens a GPU, fill an active one (best fit)
        return _mell("mell-fill", options={"fill_first": True})
    if variant == "Mell++":  # beyond the paper: Mell+ and, each epoch, empty one GPU into the others' room
        return _mell("mell-fill-compact", options={"fill_first": True, "compact": True})
    if variant == "Mell-nobatch":
        return _mell("mell-nobatch", options={"batching": False})
    if variant in ("Mell-kv", "Mell-tokens"):
        mode = variant.split("-")[1]
        return _mell(f"mell-{mode}", transfer=mode)
    raise ValueError(f"unknown variant {variant!r}")


def _mell(name: str, **migration: object) -> PolicyBundle:
    """Mell's bundle with its migration section's fields updated."""
    return dataclasses.replace(bundle("Mell").with_overrides(migration=migration), name=name)


def cluster_gpus(level: str) -> int:
    """GPUs per setup at ``level``: :data:`GPUS`, or :data:`FLEET_GPUS` at the ``fleet`` load."""
    return FLEET_GPUS if level == "fleet" else GPUS


def steady_window(first_s: float, last_s: float) -> tuple[float, float]:
    """The steady-state window of a run whose arrivals span [``first_s``, ``last_s``]: the arrivals'
    span without its first :data:`STEADY_SKIP` (ramp-up), up to the last arrival (the drain left out).
    The same window for every policy on a workload. A replayed trace can end before the horizon (the
    whole conv trace at 30 × lasts 117 s), so the span is the workload's, not the horizon."""
    return first_s + STEADY_SKIP * (last_s - first_s), last_s


def weights_ceiling(setup: str) -> float:
    """The most the weights-included reading can show: (weights + a full KV pool C) / GPU memory
    (the engine gives KV what is left after weights, activations and headroom)."""
    hw, model, _ = SETUPS[setup]
    return (model_arch(model).weight_bytes + kv_capacity(setup)) / hardware(hw.lower()).mem_bytes


def kv_demand(pairs: np.ndarray) -> float:
    """Mean KV-token-steps a request holds: output × (prompt + output / 2) (its KV over its decode
    steps); a workload's KV demand at a rate is that rate times this, per decode step."""
    p, o = pairs[:, 0].astype(float), pairs[:, 1].astype(float)
    return float(np.mean(o * (p + o / 2)))


def fit_capacity(pairs: np.ndarray, cap_tokens: int) -> np.ndarray:
    """(prompt, output) pairs that fit one GPU's KV: output ≤ cap − 1 first, then prompt ≤ cap − output."""
    out = np.minimum(pairs[:, 1], cap_tokens - 1)
    prompt = np.maximum(1, np.minimum(pairs[:, 0], cap_tokens - out))
    return np.stack([prompt, out], axis=1)


def long_pairs(setup: str) -> np.ndarray:
    """``conv-x4``: the conv trace's lengths × :data:`LONG_SCALE`, not cut to Llama-2's context (the
    paper scales its conversations to mimic long-context models), only to fit the setup's KV capacity."""
    raw = np.array(C.trace_lengths(), dtype=np.int64) * LONG_SCALE
    return fit_capacity(raw, int(capacity_tokens(setup)))


def kv_capacity(setup: str) -> int:
    """C: the KV bytes of one instance of the setup's model on one of its GPUs (the simulator's sizing)."""
    hw, model, _ = SETUPS[setup]
    return pool_layout(hardware(hw.lower()), 1, [model_arch(model)], EngineSettings()).kv_bytes


def capacity_tokens(setup: str) -> float:
    return kv_capacity(setup) / model_arch(SETUPS[setup][1]).kv_bytes_per_token


def load_scale(setup: str) -> float:
    """The setup's KV capacity in tokens relative to the reference setup's (rates scale with it)."""
    return capacity_tokens(setup) / capacity_tokens(REF_SETUP)


def trace_rate() -> float:
    tr = C.conv_trace()
    return len(tr) / tr.duration_s


def truncate(pairs: np.ndarray) -> np.ndarray:
    """(prompt, output) pairs within the context: output ≤ ctx − 1 first, then prompt ≤ ctx − output."""
    out = np.minimum(pairs[:, 1], CONTEXT - 1)
    prompt = np.maximum(1, np.minimum(pairs[:, 0], CONTEXT - out))
    return np.stack([prompt, out], axis=1)


@lru_cache(maxsize=2)
def alpaca_pairs(scale: int) -> np.ndarray:
    return truncate(np.array(alpaca_lengths(C.ALPACA), dtype=np.int64) * scale)


@lru_cache(maxsize=1)
def conv_pairs() -> np.ndarray:
    return truncate(C.trace_lengths())


def multiple(setup: str, level: str) -> float:
    """The level's multiple of the trace's mean rate for ``setup`` (capacity-scaled)."""
    return LEVELS[level] * load_scale(setup)


@lru_cache(maxsize=8)
def workload(setup: str, kind: str, level: str, horizon_s: float) -> Workload:
    rate = multiple(setup, level) * trace_rate()
    if kind == "conv-poisson":
        return C.poisson_workload(conv_pairs(), rate, horizon_s, seed=1)
    if kind == "alpaca10-poisson":
        return C.poisson_workload(alpaca_pairs(10), rate, horizon_s, seed=2)
    if kind == "alpaca-poisson":
        return C.poisson_workload(alpaca_pairs(1), rate, horizon_s, seed=3)
    if kind == "conv-x4":  # the same KV demand as conv-poisson at the level, in 4× larger requests
        pairs = long_pairs(setup)
        return C.poisson_workload(pairs, rate * kv_demand(conv_pairs()) / kv_demand(pairs), horizon_s, seed=4)
    if kind == "conv-trace":
        w = C.rescaled(C.conv_trace(), multiple(setup, level), horizon_s)
        p = truncate(np.array(w.lengths(), dtype=np.int64))
        return Workload(
            tuple(
                dataclasses.replace(r, prompt_tokens=int(a), output_tokens=int(b))
                for r, (a, b) in zip(w.requests, p.tolist(), strict=True)
            )
        )
    raise ValueError(f"unknown workload {kind!r}")


def workloads(cfg: dict) -> list[tuple[str, str]]:
    """(kind, level) pairs run on every setup."""
    out = [(k, lv) for k in ("conv-poisson", "conv-trace", "alpaca10-poisson") for lv in cfg["levels"]]
    if cfg["alpaca_control"]:
        out.append(("alpaca-poisson", "mid"))
    return out


def setup_info(cfg: dict) -> dict:
    """What every section reports about the setups (the JSON's ``setup``)."""
    return {
        "cluster": f"{GPUS} GPUs per setup ({FLEET_GPUS} at the fleet load), one model instance per GPU",
        "steady_window": f"the arrivals' span without its first {STEADY_SKIP:g} (ramp-up), to the last arrival",
        "weights_ceiling": {k: weights_ceiling(k) for k in SETUPS},
        "setups": {k: v[2] for k, v in SETUPS.items()},
        "kv_capacity_tokens": {k: round(capacity_tokens(k)) for k in SETUPS},
        "load_scale": {k: load_scale(k) for k in SETUPS},
        "levels": {lv: LEVELS[lv] for lv in cfg["levels"]},
        "trace_rate_rps": trace_rate(),
        "horizon_s": cfg["horizon_s"],
        "context_tokens": CONTEXT,
        "migration_epoch_s": 1.0,
        "cost": COST,
    }

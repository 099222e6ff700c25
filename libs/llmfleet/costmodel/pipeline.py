"""Heterogeneous GPUs for UELLM's testbed: power caps as a speed factor, and a layer pipeline over
mixed devices as one simulated instance.

UELLM §5.1: "a local cluster (consisting of 4 Nvidia RTX 3090 GPUs) … To differentiate GPU performance
… we set different performance limits for the GPUs" (Table 2: 350, 300, 250 and 150 W), and
ChatGLM2-6B is served through a transformers ``device_map`` (layers split over a subset of the GPUs,
run one stage after the other: "multiple hardware accelerators can only work serially during
inference", §1).

- ``RTX_3090``: GA102 datasheet, 71 TF fp16 tensor with fp32 accumulate (dense), 936 GB/s GDDR6X,
  24 GB, PCIe Gen4 x16, 350 W board power. Not in the catalog (``costmodel.hardware``) so that the
  monitor's GPU matching does not change; it is a plain :class:`Hardware`.
- ``power_capped(hw, cap_w, tdp_w)``: the power cap as one speed factor ``cap/tdp`` on both peak FLOP/s
  and memory bandwidth. Assumption, fixed before any run: clocks fall about in proportion to the
  board power once the cap binds; it is the strong end of the effect (a real memory clock drops less).
- ``pipeline(stages)``: a model whose layers are split over devices, stage after stage, costs on the
  roofline (``costmodel.roofline``) what one device costs whose time per FLOP and per byte are the
  layer-weighted sums of the stages': ``1/flops = Σ f_d / flops_d`` and ``1/bw = Σ f_d / bw_d`` with
  ``f_d`` the fraction of layers on ``d``; its memory is the stages' total. The roofline takes the max
  of compute and memory per iteration over the whole model, not per stage, and the hop between stages
  (a hidden-state copy over PCIe, microseconds in decode) is not charged here: both make a multi-device
  pipeline slightly cheaper than it is.
- ``PipelineOverhead``: what a transformers ``generate`` loop over a ``device_map`` pays besides the
  GPU work, per iteration (``per_iteration_s``: the Python decoding loop — logits processors, sampling,
  stopping criteria, ``torch.cat`` of the ids, kernel launches in eager mode) and per stage boundary per
  iteration (``per_stage_s``: accelerate's device hooks moving the hidden state and the
  synchronisation at each device change). **Assumptions, not measurements**, until a GPU measures them:
  :data:`HF_PIPELINE_OVERHEAD` is 10 ms per iteration (ChatGLM2-6B's eager HF decoding of one sequence
  on an RTX 3090 runs at about 25–40 tokens/s, against a 16–17 ms weight read at 80 % of 936 GB/s: the
  rest is that loop) and 0.5 ms per stage boundary (a PCIe round of a few KB plus a device sync and
  the hooks' Python per boundary).
- ``static_batch_time(cost, prompts, steps, overhead, stages)``: one padded static batch as HF
  ``generate`` runs it: a prefill of n rows of the longest prompt, then ``steps − 1`` decode iterations of
  all n rows (finished rows keep computing padding until the last one stops), each paying the overhead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.costmodel.hardware import GB, TB, Hardware
from llmfleet.costmodel.iteration_costs import LinearCost

RTX_3090 = Hardware("rtx-3090", 71 * TB, 936 * GB, 24 * GB, 32 * GB, 3.125 * GB, h2d_bytes_per_s=32 * GB)
RTX_3090_TDP_W = 350.0


def power_capped(hw: Hardware, cap_w: float, tdp_w: float, name: str | None = None) -> Hardware:
    """``hw`` under a power cap: peak FLOP/s and memory bandwidth × min(1, cap/tdp)."""
    if not (cap_w > 0 and tdp_w > 0):
        raise ValueError(f"power cap and board power must be > 0 W, got cap {cap_w} W, TDP {tdp_w} W")
    f = min(1.0, cap_w / tdp_w)
    return dataclasses.replace(
        hw,
        name=name or f"{hw.name}@{cap_w:g}W",
        peak_flops=hw.peak_flops * f,
        mem_bandwidth=hw.mem_bandwidth * f,
    )


def pipeline(stages: Sequence[tuple[Hardware, int]], name: str | None = None) -> Hardware:
    """One device equivalent to running ``(hardware, layers)`` stages one after the other (see the
    module docstring). Efficiencies, links and node size are the first stage's."""
    stages = [(hw, int(n)) for hw, n in stages]
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    if any(n < 0 for _, n in stages) or sum(n for _, n in stages) == 0:
        raise ValueError(f"stage layer counts must be ≥ 0 and not all 0, got {[n for _, n in stages]}")
    total = sum(n for _, n in stages)
    used = [(hw, n / total) for hw, n in stages if n > 0]
    first = used[0][0]
    inv_flops = sum(f / (hw.peak_flops * hw.compute_eff) for hw, f in used)
    inv_bw = sum(f / (hw.mem_bandwidth * hw.mem_eff) for hw, f in used)
    return dataclasses.replace(
        first,
        name=name or "+".join(f"{hw.name}:{n}" for hw, n in stages if n > 0),
        peak_flops=1.0 / inv_flops / first.compute_eff,
        mem_bandwidth=1.0 / inv_bw / first.mem_eff,
        mem_bytes=sum(hw.mem_bytes for hw, _ in used),
        h2d_bytes_per_s=min(hw.h2d_bytes_per_s for hw, _ in used),
    )


def balanced_layers(num_layers: int, devices: int) -> list[int]:
    """transformers/accelerate ``device_map="auto"`` (balanced): layers split as evenly as possible
    over the devices in order, the remainder to the first ones."""
    if devices < 1 or num_layers < devices:
        raise ValueError(
            f"cannot split {num_layers} layers over {devices} devices (need 1 ≤ devices ≤ layers)"
        )
    q, r = divmod(num_layers, devices)
    return [q + (1 if i < r else 0) for i in range(devices)]


@dataclass(frozen=True)
class PipelineOverhead:
    """Seconds a ``generate`` loop over a ``device_map`` pays per iteration and per stage boundary per
    iteration, besides the GPU work (see the module docstring: assumptions until measured)."""

    per_iteration_s: float
    per_stage_s: float

    def __post_init__(self) -> None:
        if self.per_iteration_s < 0 or self.per_stage_s < 0:
            raise ValueError(f"overheads must be ≥ 0 s, got {self}")

    def iteration(self, stages: int) -> float:
        """The overhead of one iteration of a pipeline of ``stages`` devices."""
        if stages < 1:
            raise ValueError(f"a pipeline has at least one stage, got {stages}")
        return self.per_iteration_s + self.per_stage_s * (stages - 1)


HF_PIPELINE_OVERHEAD = PipelineOverhead(per_iteration_s=0.010, per_stage_s=0.0005)
NO_OVERHEAD = PipelineOverhead(0.0, 0.0)


def static_batch_time(
    cost: LinearCost, prompts: Sequence[int], steps: int, overhead: PipelineOverhead, stages: int
) -> float:
    """Seconds of one padded static batch (see the module docstring): ``prompts`` the rows' prompt
    lengths, ``steps`` the tokens generated (the longest row's: every row runs that many)."""
    n = len(prompts)
    if n == 0 or steps < 1:
        raise ValueError(f"a static batch needs rows and at least one step, got {n} rows, {steps} steps")
    top = max(prompts)
    step_overhead = overhead.iteration(stages)
    t = cost.prefill(n * top, n * top * top) + step_overhead
    if steps > 1:
        t += float(cost.decode_steps(n, n * (top + 1), n, steps - 1).sum()) + step_overhead * (steps - 1)
    return t

"""UELLM's testbed and deployers (paper §5.1–5.2), for ``papers/uellm.py``.

Paper §5.1, quoted: "a local cluster (consisting of 4 Nvidia RTX 3090 GPUs) … To differentiate GPU
performance in our experiments, we set different performance limits for the GPUs" — Table 2: maximum
power 350, 300, 250, 150 W; GPU#0–#1 and GPU#2–#3 are PIX pairs (one PCIe bridge), the pairs are NODE
apart (PCIe plus the host-bridge interconnect). §5.2: "UELLM-deploy (UD), which only uses the HELR model
deployment algorithm … UELLM-batch (UB), which uses the SLO-ODBS batching algorithm [with] the default
deployment algorithm … UELLM-all (UA) … Morphling (Mor) and the batching algorithm in S³ as our
baselines"; Morphling "performs stress tests on each candidate configuration" and "Compared to
Morphling, UD reduces stress testing, which in turn reduces stress testing time, leading to lower
overall inference latency" (§5.3).

Ours:

- GPUs: ``costmodel.pipeline.RTX_3090`` under each cap (speed factor cap/350 W on FLOP/s and bandwidth,
  the assumption stated there). Link latency for HELR: 10 µs per PCIe bridge crossed, PIX = 1, NODE = 2
  (assumption; only HELR's order depends on it, and it is < 0.1 % of a decode step).
- A deployment is one ``device_map``: the model's layers split over an ordered device subset, run stage
  after stage (``costmodel.pipeline.pipeline``): one simulated instance.
- Default deployment (S³, UB): transformers' ``device_map="auto"``, the layers balanced over all four
  GPUs in index order. The paper names no default beyond "the default deployment algorithm"; "auto" is
  what a transformers user gets (assumption).
- HELR (UD, UA): ``policies.placement.helr.HelrPlanner`` in mode ``helr`` on the four devices, performance =
  the capped GPU's attainable bytes/s (a decode step reads the weights), T = 0 reserved for KV (any T up
  to ~9 GB gives the same plan here: the 13.5 GB model fits one 24 GB GPU).
- Morphling-like: stress-tests every configuration of a space of ≤ 30 (Morphling's sampling budget: "by
  sampling only 30 candidates in a large search space consisting of 720 options", Wang et al., SoCC '21):
  the first k GPUs balanced (k = 1–4) × static batch size 4–64; a trial loads the weights (h2d) and
  serves a burst of 2·b requests (two batches) from the same length pool; the configuration with the
  highest measured throughput is kept, FIFO static batches of its size. The trials run one after
  another on the cluster before serving starts, so requests arriving before the sum of the trial times
  wait for it (the paper's accounting, §5.3); the same run without that wait is reported beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from llmfleet.costmodel import Hardware, model_arch
from llmfleet.costmodel.memory import load_seconds
from llmfleet.costmodel.pipeline import RTX_3090, RTX_3090_TDP_W, balanced_layers, pipeline, power_capped
from llmfleet.policies.placement.device_topology import Device, LayeredModel, Topology
from llmfleet.policies.placement.helr import HelrOptions, HelrPlanner
from llmfleet.workload import Workload, WorkloadRequest

CAPS_W = (350.0, 300.0, 250.0, 150.0)  # Table 2, GPU#0–#3
PIX = ((0, 1), (2, 3))
HOP_S = 10e-6  # per PCIe bridge crossed (assumption)
MORPHLING_BUDGET = 30
MORPHLING_BATCHES = (4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Deployment:
    """One device_map: the ordered (GPU index, layers) stages and the instance hardware they make."""

    name: str
    stages: tuple[tuple[int, int], ...]
    hw: Hardware

    @property
    def label(self) -> str:
        return "+".join(f"GPU#{i}:{n}" for i, n in self.stages)


def gpus(caps_w: Sequence[float] = CAPS_W) -> list[Hardware]:
    return [power_capped(RTX_3090, c, RTX_3090_TDP_W, name=f"gpu{i}@{c:g}W") for i, c in enumerate(caps_w)]


def topology(devs: Sequence[Hardware]) -> Topology:
    n = len(devs)
    lat = [[0.0 if i == j else HOP_S * (1 if (i, j) in PIX or (j, i) in PIX else 2) for j in range(n)]
           for i in range(n)]  # fmt: skip
    return Topology(tuple(Device(f"cuda:{i}", h.mem_bytes, h.bandwidth) for i, h in enumerate(devs)), lat)


def deploy(name: str, devs: Sequence[Hardware], stages: Sequence[tuple[int, int]], model: str) -> Deployment:
    """The stages as one instance; a stage whose layers do not fit its GPU's memory is a ValueError
    naming the GPU, the layers and both sizes."""
    st = tuple((int(i), int(n)) for i, n in stages if n > 0)
    per_layer = LayeredModel.from_arch(model_arch(model)).bytes_per_layer
    for i, n in st:
        if n * per_layer > devs[i].mem_bytes:
            raise ValueError(
                f"{name}: GPU#{i} ({devs[i].name}, {devs[i].mem_bytes / 1e9:.1f} GB) cannot hold {n} layers of "
                f"{model} ({n * per_layer / 1e9:.1f} GB)"
            )
    hw = pipeline([(devs[i], n) for i, n in st], name=f"{name}:" + "+".join(f"{i}x{n}" for i, n in st))
    return Deployment(name, st, hw)


def default_deployment(model: str, devs: Sequence[Hardware], k: int | None = None) -> Deployment:
    """``device_map="auto"``: layers balanced over the first ``k`` (all) GPUs in index order."""
    k = len(devs) if k is None else k
    layers = balanced_layers(model_arch(model).num_layers, k)
    return deploy(f"auto{k}", devs, list(enumerate(layers)), model)


def helr_deployment(model: str, devs: Sequence[Hardware]) -> Deployment:
    plan = HelrPlanner(HelrOptions(mode="helr")).device_map(
        topology(devs), LayeredModel.from_arch(model_arch(model))
    )
    stages = [(int(d.split(":")[1]), n) for d, n in zip(plan.order, plan.layers, strict=True)]
    return deploy("helr", devs, stages, model)


@dataclass(frozen=True)
class Trial:
    gpus: int
    batch: int
    load_s: float
    serve_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class MorphlingChoice:
    deployment: Deployment
    batch: int
    profile_s: float
    trials: tuple[Trial, ...]


def morphling(
    model: str,
    devs: Sequence[Hardware],
    lengths: np.ndarray,
    serve: Callable[[Deployment, Workload, int], float],
    seed: int = 0,
) -> MorphlingChoice:
    """Stress-test every (k, batch) configuration (≤ the 30-sample budget) and keep the highest
    throughput; ``serve(deployment, burst, batch)`` returns the burst's makespan (s)."""
    space = [(k, b) for k in range(1, len(devs) + 1) for b in MORPHLING_BATCHES]
    if len(space) > MORPHLING_BUDGET:
        raise ValueError(
            f"{len(space)} configurations exceed Morphling's sampling budget of {MORPHLING_BUDGET}"
        )
    rng = np.random.default_rng(seed)
    arch = model_arch(model)
    trials, best = [], None
    for k, b in space:
        try:
            d = default_deployment(model, devs, k)
        except ValueError:
            continue  # the model does not fit the first k GPUs: not a configuration
        pick = rng.integers(0, len(lengths), 2 * b)
        burst = Workload(
            tuple(WorkloadRequest(f"s{i}", 0.0, int(lengths[j][0]), int(lengths[j][1]), "stress", model)
                  for i, j in enumerate(pick.tolist()))
        )  # fmt: skip
        serve_s = serve(d, burst, b)
        tokens = float(sum(r.output_tokens for r in burst.requests))
        t = Trial(k, b, load_seconds([arch], d.hw, 1), serve_s, tokens / serve_s if serve_s > 0 else 0.0)
        trials.append(t)
        if best is None or t.tokens_per_s > best[0].tokens_per_s:
            best = (t, d)
    if best is None:
        raise ValueError(f"{model} fits no configuration of the first 1–{len(devs)} GPUs")
    return MorphlingChoice(best[1], best[0].batch, sum(t.load_s + t.serve_s for t in trials), tuple(trials))


def after_profiling(wl: Workload, start_s: float) -> Workload:
    """The workload as a deployment that starts serving at ``start_s`` sees it: earlier arrivals wait."""
    return Workload(tuple(dataclasses.replace(r, arrival_s=max(r.arrival_s, start_s)) for r in wl.requests))

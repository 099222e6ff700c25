"""Calibration: groups of identical requests sent straight to the engine and through the cluster, and
the loop overheads (beyond the profiled forward pass) fitted from them."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from llmfleet.api.v1 import engine_pb2_grpc
from llmfleet.client import AsyncClient
from llmfleet.costmodel.aladdin import DecodeModel, PrefillModel
from llmfleet.rpc.channels import open_channel

from .replay import engine_generate, run_one
from .workload import Settings, make_prompt


@dataclass(frozen=True)
class CalibrationGroup:
    """``batch`` identical requests sent together to the engine; the engine's Usage of each member."""

    batch: int
    prompt_tokens: int
    output_tokens: int
    ttft_s: tuple[float, ...]  # engine arrival -> first token
    latency_s: tuple[float, ...]  # engine arrival -> last token

    @property
    def iteration_s(self) -> float:
        """Median over members of the mean decode iteration (latency − ttft)/(out − 1)."""
        return statistics.median(
            (lat - ttft) / (self.output_tokens - 1)
            for ttft, lat in zip(self.ttft_s, self.latency_s, strict=True)
        )

    @property
    def mean_context(self) -> float:
        """Context per sequence over the decode iterations (prompt + i, i = 1 .. out − 1): its mean."""
        return self.prompt_tokens + self.output_tokens / 2


@dataclass(frozen=True)
class Overhead:
    """What a live serving iteration costs beyond the profiled forward pass (seconds)."""

    prefill_s: float  # o1, added to c1
    per_iteration_s: float  # o3, added to c3
    per_sequence_s: float  # o2, added to c2
    points: tuple[tuple[int, float], ...]  # (batch, mean of live decode iteration − fitted t_d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fit_overhead(groups: Iterable[CalibrationGroup], prefill: Any, decode: Any) -> Overhead:
    """The live loop's overheads from the engine-side timings of calibration groups.

    Decode: per group, live iteration − fitted t_d(b, l) (l = mean context); the mean per batch size is
    fitted as o3 + o2·b (:func:`anchored_line`; one batch size gives o3 only). Prefill: the mean over the batch-1
    groups of TTFT − fitted t_pre(prompt), ≥ 0: what a lone request's first iteration costs beyond
    the forward pass. Means, not medians: on a shared machine the groups are bimodal (quiet and
    contended periods) and the workload meets both, so the expected cost is the mean.
    """
    groups = list(groups)
    if not groups:
        raise ValueError("no calibration groups")
    per_batch: dict[int, list[float]] = {}
    for g in groups:
        per_batch.setdefault(g.batch, []).append(g.iteration_s - decode.predict(g.batch, g.mean_context))
    points = tuple((b, statistics.fmean(v)) for b, v in sorted(per_batch.items()))
    o3, o2 = anchored_line(points)
    lone = [g for g in groups if g.batch == 1] or groups
    pre = [t - prefill.predict(g.prompt_tokens) for g in lone for t in g.ttft_s]
    return Overhead(max(0.0, statistics.fmean(pre)), o3, o2, points)


def anchored_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(o3, o2) of the overhead line o3 + o2·b, exact at the smallest batch (the lone requests that
    dominate an arrival-bound workload) with the least-squares slope through the larger ones, both
    >= 0. (A plain least-squares line let a jump from b=1 to b=2 raise the lone iteration's cost.)"""
    b0, d0 = points[0]
    rest = [(b - b0, d - d0) for b, d in points[1:]]
    o2 = max(0.0, sum(x * y for x, y in rest) / sum(x * x for x, _ in rest)) if rest else 0.0
    return max(0.0, d0 - o2 * b0), o2


def with_overhead(record: Any, o: Overhead) -> Any:
    """``record`` with the measured overheads added: c1 += o1, c3 += o3, c2 += o2."""

    a = record.aladdin
    pre = PrefillModel(a.prefill.k1, a.prefill.c1 + o.prefill_s)
    dec = DecodeModel(a.decode.k2, a.decode.c2 + o.per_sequence_s, a.decode.c3 + o.per_iteration_s)
    return dataclasses.replace(record, aladdin=dataclasses.replace(a, prefill=pre, decode=dec))


async def calibrate(engine_address: str, s: Settings, rng: random.Random) -> list[CalibrationGroup]:
    """One calibration phase: per round and batch size b, b identical requests sent together straight
    to the engine, one group at a time; the engine's own Usage of each."""

    groups = []
    async with open_channel(engine_address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        for _ in range(s.calib_rounds):
            for b in s.calib_batches:
                prompts = [make_prompt(s.calib_prompt, rng) for _ in range(b)]
                rs = await asyncio.gather(*(engine_generate(stub, q, s.calib_output) for q in prompts))
                groups.append(
                    CalibrationGroup(b, rs[0][0], rs[0][1], tuple(r[2] for r in rs), tuple(r[3] for r in rs))
                )
    return groups


async def calibrate_cluster(
    scheduler_address: str, s: Settings, rng: random.Random
) -> list[CalibrationGroup]:
    """The same groups as :func:`calibrate`, sent through the SDK and the scheduler (the workload's
    path) and timed on the client: what an iteration costs while the control plane relays the tokens
    on the same cores, and what the client -> scheduler -> engine hops add to a first token."""

    groups = []
    async with AsyncClient(scheduler_address) as client:
        for _ in range(s.calib_rounds):
            for b in s.calib_batches:
                prompts = [make_prompt(s.calib_prompt, rng) for _ in range(b)]
                rs = await asyncio.gather(*(run_one(client, q, s.calib_output) for q in prompts))
                groups.append(
                    CalibrationGroup(
                        b,
                        rs[0]["prompt_tokens"],
                        rs[0]["completion_tokens"],
                        tuple(r["first"] - r["sent"] for r in rs),
                        tuple(r["end"] - r["sent"] for r in rs),
                    )
                )
    return groups


def deployed_overhead(
    engine: Overhead,
    engine_groups: Sequence[CalibrationGroup],
    cluster_groups: Sequence[CalibrationGroup],
    prefill: Any,
    decode: Any,
) -> tuple[Overhead, float]:
    """Overheads of the engine as deployed (control plane on the same cores) and the hop time.

    Decode overheads (o3, o2) come from the groups sent through the cluster, the prefill overhead o1
    from ``engine`` (the engine-side fit: a first iteration's own cost). The hop (client -> scheduler ->
    engine and the first token's way back) is the lone requests' mean TTFT through the cluster minus
    their mean TTFT on the engine's clock: a constant per request, it delays every arrival at the
    engine and every token at the client alike, so it adds to each simulated TTFT and latency and
    leaves the engine's schedule as it is."""
    through = fit_overhead(cluster_groups, prefill, decode)
    lone_c = [t for g in cluster_groups if g.batch == 1 for t in g.ttft_s]
    lone_e = [t for g in engine_groups if g.batch == 1 for t in g.ttft_s]
    hop = max(0.0, statistics.fmean(lone_c) - statistics.fmean(lone_e)) if lone_c and lone_e else 0.0
    return dataclasses.replace(through, prefill_s=engine.prefill_s), hop

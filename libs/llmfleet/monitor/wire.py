"""Protobuf ↔ monitor dataclasses (placement.proto): the only module of the package that knows gRPC
types. Sample times travel as ages (seconds before the report), since the two ends' clocks differ."""

from __future__ import annotations

import math

from llmfleet.api.v1 import placement_pb2
from llmfleet.monitor.decisions import Decision
from llmfleet.monitor.pool import EnginePool
from llmfleet.monitor.records import RequestSample
from llmfleet.monitor.stats import Distribution, LengthStats, ServiceStats, WindowStats


class BadReport(ValueError):
    """A report with impossible numbers (negative counts, NaN, ...)."""


def _length_pb(s: LengthStats) -> placement_pb2.LengthSummary:
    return placement_pb2.LengthSummary(count=s.count, mean=s.mean, m2=s.m2)


def _dist_pb(d: Distribution) -> placement_pb2.Distribution:
    return placement_pb2.Distribution(count=d.count, mean=d.mean, p50=d.p50, p90=d.p90, p99=d.p99)


def window_to_proto(w: WindowStats) -> placement_pb2.WindowStats:
    return placement_pb2.WindowStats(
        window_s=w.window_s, span_s=w.span_s, arrivals=w.arrivals, rate_rps=w.rate_rps,
        completed=w.completed, failed=w.failed, prompt_tokens=_length_pb(w.prompt_tokens),
        output_tokens=_length_pb(w.output_tokens), ttft_s=_dist_pb(w.ttft_s), tpot_s=_dist_pb(w.tpot_s),
        latency_s=_dist_pb(w.latency_s), slo_met=w.slo_met, latency_met=w.latency_met,
        ttft_tpot_met=w.ttft_tpot_met, normalized_sum=w.normalized_sum,
        normalized_count=w.normalized_count,
    )  # fmt: skip


def stats_to_proto(s: ServiceStats, now: float, samples: bool = True) -> placement_pb2.ServiceStats:
    """``now``: the sender's clock, to turn sample arrival times into ages."""
    msg = placement_pb2.ServiceStats(
        service=s.service,
        model=s.model,
        windows=[window_to_proto(w) for w in s.windows],
        samples_complete=s.samples_complete if samples else False,
        infeasible=s.infeasible,
        queued=s.queued,
        cold=s.cold,
        held=s.held,
    )
    if samples:
        msg.samples.extend(
            placement_pb2.RequestSample(
                age_s=max(now - x.arrival_s, 0.0),
                prompt_tokens=x.prompt_tokens,
                output_tokens=x.output_tokens,
            )
            for x in s.samples
        )
    return msg


def _check(where: str, *values: float) -> None:
    for v in values:
        if not math.isfinite(v) or v < 0:
            raise BadReport(f"{where}: every count, time and length must be finite and >= 0, got {v!r}")


def _length(m: placement_pb2.LengthSummary, where: str) -> LengthStats:
    _check(where, m.count, m.mean, m.m2)
    return LengthStats(m.count, m.mean, m.m2)


def _dist(m: placement_pb2.Distribution, where: str) -> Distribution:
    _check(where, m.count, m.mean, m.p50, m.p90, m.p99)
    return Distribution(m.count, m.mean, m.p50, m.p90, m.p99)


def window_from_proto(m: placement_pb2.WindowStats, where: str = "window") -> WindowStats:
    where = f"{where} {m.window_s:g}s"
    _check(where, m.span_s, m.arrivals, m.rate_rps, m.completed, m.failed, m.slo_met, m.latency_met,
           m.ttft_tpot_met, m.normalized_sum, m.normalized_count)  # fmt: skip
    if m.window_s <= 0 or not math.isfinite(m.window_s):
        raise BadReport(f"{where}: window_s must be a positive number")
    finished = m.completed + m.failed
    if max(m.slo_met, m.latency_met, m.ttft_tpot_met) > finished:
        raise BadReport(f"{where}: more requests met the SLO than finished ({finished})")
    return WindowStats(
        window_s=m.window_s, span_s=m.span_s, arrivals=m.arrivals, rate_rps=m.rate_rps,
        completed=m.completed, failed=m.failed,
        prompt_tokens=_length(m.prompt_tokens, where), output_tokens=_length(m.output_tokens, where),
        ttft_s=_dist(m.ttft_s, where), tpot_s=_dist(m.tpot_s, where), latency_s=_dist(m.latency_s, where),
        slo_met=m.slo_met, latency_met=m.latency_met, ttft_tpot_met=m.ttft_tpot_met,
        normalized_sum=m.normalized_sum, normalized_count=m.normalized_count,
    )  # fmt: skip


def stats_from_proto(m: placement_pb2.ServiceStats, now: float) -> ServiceStats:
    """``now``: the receiver's clock (samples' arrival = now − age). Raises :class:`BadReport`."""
    if not m.service:
        raise BadReport("a service's stats need its name")
    where = f"service {m.service!r}"
    windows = tuple(sorted((window_from_proto(w, where) for w in m.windows), key=lambda w: w.window_s))
    if len({w.window_s for w in windows}) != len(windows):
        raise BadReport(f"{where}: two windows of the same length")
    samples = []
    for x in m.samples:
        _check(f"{where} sample", x.age_s, x.prompt_tokens, x.output_tokens)
        samples.append(RequestSample(now - x.age_s, x.prompt_tokens, x.output_tokens))
    samples.sort(key=lambda x: x.arrival_s)
    return ServiceStats(
        m.service,
        m.model,
        windows,
        tuple(samples),
        m.samples_complete,
        m.infeasible,
        m.queued,
        m.cold,
        m.held,
    )


def pool_to_proto(pool: EnginePool, plan: placement_pb2.PlacementPlan) -> None:
    """Fill ``plan``'s pool, gpus_in_use and gpus_total."""
    for e in pool.engines:
        plan.pool.add(
            engine_id=e.engine_id, address=e.address, hardware=e.hardware, device=e.device,
            memory_bytes=e.memory_bytes, tp=e.tp, models=list(e.models), desired=list(e.desired),
            idle=e.idle,
        )  # fmt: skip
    plan.gpus_in_use = pool.gpus_in_use
    plan.gpus_total = pool.gpus_total


def decision_to_proto(d: Decision) -> placement_pb2.PlacementDecision:
    return placement_pb2.PlacementDecision(
        time=d.time, policy=d.policy, summary=d.summary, reason=d.reason, ok=d.ok, error=d.error
    )


def decision_from_proto(m: placement_pb2.PlacementDecision) -> Decision:
    return Decision(m.time, m.policy, m.summary, m.reason, m.ok, m.error)

"""Shared by the Mell tests: C = 1200 bytes throughout (L (600, 1200], M (400, 600], S (300, 400],
T (150, 300], tiny ≤ 150), GPU states and a packer that has seen the cluster once."""

from __future__ import annotations

from llmfleet.policies.migration.base import EpochPlan, GpuState, RequestState
from llmfleet.policies.migration.mell import MellOptions, MellPacker

C = 1200


def gpu(gid: str, *reqs: tuple[str, int], active: bool = True, models=("m",), machine: str = "") -> GpuState:
    return GpuState(gid, models, C, tuple(RequestState(r, models[0], s) for r, s in reqs), active, machine)


def idle(gid: str) -> GpuState:
    return gpu(gid, active=False)


def moves(plan: EpochPlan) -> list[tuple[str, str, str]]:
    return [(m.request_id, m.source, m.destination) for m in plan.migrations]


def taught(*gpus: GpuState, **kw) -> MellPacker:
    """A packer that has seen ``gpus`` once (and moved nothing)."""
    p = MellPacker(MellOptions(**kw))
    plan = p.epoch(gpus, 0.0)
    assert plan.migrations == (), moves(plan)
    return p

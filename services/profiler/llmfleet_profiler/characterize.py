"""Resource characterization: run an engine's Profile sweeps, fit the cost models, store them in etcd.

The fitted forms are Aladdin's (prefill k1·Σl_in + c1; decode (k2·l_ave + c2)·b + c3) and SCLS's
(p1..p4, d1..d4); ``llmfleet.costmodel`` does the fitting, this module only moves data.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import grpc
from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc, profiler_pb2
from llmfleet.coord import EtcdClient, PrefixView
from llmfleet.costmodel import (
    FitError,
    ProfileRecord,
    UnknownHardware,
    UnknownModel,
    fit_engine_profile,
    hardware,
    model_arch,
    record_from_fit,
    roofline_record,
)
from llmfleet.rpc.channels import open_channel
from llmfleet.types import ENGINE_ROLE, NodeRecord


class CharacterizeError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def record_to_proto(record: ProfileRecord, samples: int = 0) -> profiler_pb2.CostProfile:
    """A costmodel ProfileRecord as the CostProfile message (full JSON plus the fit summary)."""
    return profiler_pb2.CostProfile(
        model=record.model,
        hardware=record.hardware,
        engine=record.engine,
        source=record.source,
        date=record.date,
        coefficients_json=record.to_json(),
        fits=[
            profiler_pb2.FitQuality(
                name=name, rmse_s=r.rmse_s, max_rel_error=r.max_rel_error, points=r.n_points
            )
            for name, r in sorted(record.reports.items())
        ],
        samples=samples
        or (
            max((r.n_points for r in record.reports.values()), default=0) if record.source == "fitted" else 0
        ),
    )


@dataclass
class Characterizer:
    etcd: EtcdClient
    nodes: PrefixView[NodeRecord]
    timeout_s: float = 600.0

    def engine(self, engine_id: str, model: str) -> NodeRecord:
        node = self.nodes.snapshot().get(engine_id)
        if node is None or node.role != ENGINE_ROLE:
            live = sorted(n.node_id for n in self.nodes.snapshot().values() if n.role == ENGINE_ROLE)
            raise CharacterizeError(
                grpc.StatusCode.NOT_FOUND, f"unknown engine {engine_id!r}; live engines: {live}"
            )
        if model not in node.models:
            raise CharacterizeError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"engine {engine_id!r} does not host model {model!r} (it hosts {list(node.models)})",
            )
        return node

    async def run(self, req: profiler_pb2.CharacterizeRequest) -> profiler_pb2.CostProfile:
        if not req.model or not req.engine_id:
            raise CharacterizeError(grpc.StatusCode.INVALID_ARGUMENT, "model and engine_id are required")
        node = self.engine(req.engine_id, req.model)
        hw_name = req.hardware or ("cpu" if node.device.startswith("cpu") else "")
        if not hw_name:
            raise CharacterizeError(
                grpc.StatusCode.INVALID_ARGUMENT, f"hardware is required for a {node.device} engine"
            )
        try:
            hardware(hw_name)
        except UnknownHardware as e:
            raise CharacterizeError(grpc.StatusCode.NOT_FOUND, _reason(e)) from None
        sweep = engine_pb2.ProfileRequest(
            model=req.model,
            batch_sizes=list(req.batch_sizes),
            input_lengths=list(req.input_lengths),
            context_lengths=list(req.context_lengths),
            repeats=req.repeats,
        )
        async with open_channel(node.address) as channel:
            try:
                resp = await engine_pb2_grpc.EngineStub(channel).Profile(sweep, timeout=self.timeout_s)
                info = await engine_pb2_grpc.EngineStub(channel).GetInfo(
                    engine_pb2.GetInfoRequest(), timeout=10
                )
            except grpc.aio.AioRpcError as e:
                code = (
                    e.code() if e.code() != grpc.StatusCode.NOT_FOUND else grpc.StatusCode.FAILED_PRECONDITION
                )
                raise CharacterizeError(code, f"engine {req.engine_id}: {e.details()}") from None
        samples = [(s.phase, s.batch_size, s.tokens, s.seconds) for s in resp.samples]
        try:
            fitted = fit_engine_profile(samples)
        except FitError as e:
            raise CharacterizeError(
                grpc.StatusCode.FAILED_PRECONDITION, f"cannot fit {req.model}: {e}"
            ) from None
        record = record_from_fit(
            fitted,
            model=req.model,
            hardware=hw_name,
            engine=f"llmfleet-{info.backend}",
            date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        await self.etcd.put(self.etcd.keys.profile(req.model, hw_name), record.to_json().encode())
        return record_to_proto(record, samples=len(samples))

    async def get(self, req: profiler_pb2.GetProfileRequest) -> profiler_pb2.CostProfile:
        if not req.model or not req.hardware:
            raise CharacterizeError(grpc.StatusCode.INVALID_ARGUMENT, "model and hardware are required")
        raw = await self.etcd.get(self.etcd.keys.profile(req.model, req.hardware))
        if raw is not None:
            return record_to_proto(ProfileRecord.from_json(raw))
        try:
            arch, hw = model_arch(req.model), hardware(req.hardware)
        except (UnknownModel, UnknownHardware) as e:
            raise CharacterizeError(
                grpc.StatusCode.NOT_FOUND, f"{_reason(e)} (and no fitted profile is stored)"
            ) from None
        return record_to_proto(roofline_record(arch, hw))


def _reason(e: Exception) -> str:
    """An exception's message; a KeyError's str() is its message quoted (found by fuzzing: GetProfile
    answered NOT_FOUND '"unknown model ..."')."""
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)

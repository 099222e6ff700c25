"""Migration gRPC shell: Status reports per-engine KV use as the engines stream it, and — from the
coordinator — each engine's active flag and Mell GPU type, migrations running and recent, and the
last epochs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc
from llmfleet.coord import LeaderElection
from llmfleet.load.monitor import LoadMonitor
from llmfleet.policies.migration import GpuState, Migration, gpu_type

from llmfleet_migration.coordinator import MigrationCoordinator


def _record(m: Migration, state: str, error: str = "", seconds: float = 0.0) -> migration_pb2.MigrationRecord:
    return migration_pb2.MigrationRecord(
        migration_id=m.migration_id, request_id=m.request_id, source=m.source, destination=m.destination,
        mode=m.mode, kv_bytes=m.kv_bytes, state=state, error=error, seconds=seconds,
    )  # fmt: skip


@dataclass
class MigrationServicer(migration_pb2_grpc.MigrationServicer):
    node_id: str
    monitor: LoadMonitor
    election: LeaderElection | None = None  # set once etcd is reached
    coordinator: MigrationCoordinator | None = None

    async def Status(self, request: migration_pb2.StatusRequest, context: grpc.aio.ServicerContext):
        leader = ""
        if self.election is not None:
            try:
                leader = await self.election.observe() or ""
            except Exception as e:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd unavailable: {e}")
        out = migration_pb2.StatusResponse(
            leader_id=leader, is_leader=bool(self.election and self.election.is_leader)
        )
        c = self.coordinator
        gpus: dict[str, GpuState] = {g.gpu_id: g for g in c.gpus} if c is not None else {}
        now = time.monotonic()
        for eid, st in sorted(self.monitor.engines.items()):
            g = gpus.get(eid)
            active = g.active if g is not None else bool(st.snapshot and st.snapshot.running)
            if c is not None and c.active is not None:
                active = eid in c.active
            e = out.engines.add(
                engine_id=eid,
                address=st.address,
                reporting=st.reporting,
                active=active,
                gpu_type=gpu_type(g) if g is not None else "",
            )
            if st.snapshot is not None:
                e.load.CopyFrom(st.snapshot)
                e.age_s = now - (st.received_at or now)
        if c is not None:
            out.policy, out.epoch_s = c.policy_name, c.epoch_s
            out.running.extend(_record(m, "running") for m in c.executor.running.values())
            out.recent.extend(_record(o.migration, o.state, o.error, o.seconds) for o in c.executor.recent)
            for s in c.epochs:
                out.epochs.add(
                    epoch=s.epoch, time=s.time, operations=s.operations, planned=s.planned,
                    executed=s.executed, failed=s.failed, deferred=s.deferred, cancelled=s.cancelled,
                    activated=list(s.activated), deactivated=list(s.deactivated),
                    active_engines=s.active_engines,
                )  # fmt: skip
        return out

"""Migration gRPC shell: Status reports per-engine KV use as the engines stream it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from llmfleet.api.v1 import migration_pb2, migration_pb2_grpc
from llmfleet.coord import LeaderElection
from llmfleet.load.monitor import LoadMonitor


@dataclass
class MigrationServicer(migration_pb2_grpc.MigrationServicer):
    node_id: str
    monitor: LoadMonitor
    election: LeaderElection | None = None  # set once etcd is reached

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
        now = time.monotonic()
        for eid, st in sorted(self.monitor.engines.items()):
            e = out.engines.add(engine_id=eid, address=st.address, reporting=st.reporting)
            if st.snapshot is not None:
                e.load.CopyFrom(st.snapshot)
                e.age_s = now - (st.received_at or now)
        return out

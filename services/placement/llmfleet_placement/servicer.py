"""Placement gRPC shell: GetPlan reports desired vs loaded models per engine, and who leads."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import grpc
from llmfleet.api.v1 import engine_pb2, placement_pb2, placement_pb2_grpc
from llmfleet.coord import LeaderElection, PrefixView
from llmfleet.types import DesiredPlacement, NodeRecord


@dataclass
class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    node_id: str
    election: LeaderElection | None = None  # set once etcd is reached
    placement_view: PrefixView[DesiredPlacement] | None = None
    nodes_view: PrefixView[NodeRecord] | None = None
    views: tuple[PrefixView, ...] = ()

    async def shutdown(self) -> None:
        """Hand leadership over at once (resign) and stop the watches (the campaign is cancelled first)."""
        if self.election is not None:
            with contextlib.suppress(Exception):
                await self.election.resign()
        for v in self.views:
            await v.stop()

    async def GetPlan(self, request: placement_pb2.GetPlanRequest, context: grpc.aio.ServicerContext):
        if self.election is None or self.placement_view is None or self.nodes_view is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "placement is not connected to etcd yet; retry")
        try:
            leader = await self.election.observe()
        except Exception as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd unavailable: {e}")
        nodes = self.nodes_view.snapshot()
        plan = placement_pb2.PlacementPlan(
            leader_id=leader or "", is_leader=self.election.is_leader, revision=self.placement_view.revision
        )
        for eid, p in sorted(self.placement_view.snapshot().items()):
            node = nodes.get(eid)
            plan.engines.add(
                engine_id=eid,
                models=[engine_pb2.ModelSpec(name=m.name, source=m.source, dtype=m.dtype) for m in p.models],
                loaded=list(node.models) if node else [],
            )
        return plan

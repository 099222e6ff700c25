"""Many emulated GPUs in one process (``llmfleet-engine --backend emulated --engines N``).

Each engine is a whole engine node, as a real one is: its own executor, gRPC server and port, etcd
lease and ``nodes/{id}`` record, ``vllm:*`` metrics (own registry, own ``/metrics`` port) and
placement follower. What the process shares is what a host's processes would not need N copies of:
one etcd client (connection) and one watch per prefix (see :mod:`.shared`).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from llmfleet.rpc.node import ServiceNode

from llmfleet_engine.emulated.shared import SharedEtcd


@dataclass
class EngineGroup:
    """N engine nodes started and stopped together (what ``run_service`` serves instead of one)."""

    nodes: list[ServiceNode]
    shared: SharedEtcd
    role: str = "engine"
    metrics_port: int = -1  # -1 none; 0 any free port per engine; P: engine i on P + i
    metrics_host: str = "127.0.0.1"
    _started: list[ServiceNode] = field(default_factory=list)

    @property
    def node_id(self) -> str:
        return f"{self.nodes[0].node_id}..{self.nodes[-1].node_id} ({len(self.nodes)} engines)"

    @property
    def address(self) -> str:
        return ", ".join(n.address for n in self.nodes[:3]) + (", ..." if len(self.nodes) > 3 else "")

    async def start(self) -> None:
        self.shared.start()
        for i, n in enumerate(self.nodes):
            n.metrics_host = self.metrics_host
            n.metrics_port = (
                -1 if self.metrics_port == -1 else (self.metrics_port + i if self.metrics_port else 0)
            )
        for n in self.nodes:  # in order: a port clash names the engine that hit it
            await n.start()
            self._started.append(n)

    async def stop(self) -> None:
        await asyncio.gather(*(n.stop() for n in self._started), return_exceptions=True)
        await self.shared.stop()


def engine_ids(base: str, count: int) -> list[str]:
    """``base-0`` … ``base-{count-1}``."""
    return [f"{base}-{i}" for i in range(count)]


def build_group(
    args: argparse.Namespace, base_id: str, build_one: Callable[..., tuple[ServiceNode, object]], settings
) -> EngineGroup:
    """``args.engines`` engine nodes from one set of flags (ports ``--port + i``, or any free port)."""
    shared = SharedEtcd(settings)
    nodes = []
    for i, nid in enumerate(engine_ids(base_id, args.engines)):
        port = args.port + i if args.port else 0
        node, _ = build_one(args, nid=nid, port=port, shared=shared)
        nodes.append(node)
    return EngineGroup(nodes, shared)

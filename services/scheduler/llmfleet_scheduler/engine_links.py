"""The scheduler's data path to engines: one multiplexed ``GenerateMany`` call per engine
(``llmfleet.rpc.mux``) carries every request the scheduler sends there, each stream with its own span
while tracing is on."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.rpc.mux import GENERATE_MANY, MuxLink, MuxStream

from llmfleet_scheduler.directory import ClusterDirectory


@dataclass
class EngineLinks:
    """A :class:`MuxLink` per engine address, opened on first use; a broken call fails its streams
    (UNAVAILABLE: the relay fails them over) and the next request starts a new one."""

    directory: ClusterDirectory
    _links: dict[str, MuxLink] = field(default_factory=dict)

    def open(self, address: str, req: engine_pb2.GenerateRequest, timeout_s: float | None) -> MuxStream:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = MuxLink(
                lambda: engine_pb2_grpc.EngineStub(self.directory.channel(address)).GenerateMany(
                    wait_for_ready=False
                ),
                engine_pb2.GenerateCommands,
                GENERATE_MANY,
                name=f"engine {address}",
            )
        return link.open(req.request_id, req, timeout_s)

    async def close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()

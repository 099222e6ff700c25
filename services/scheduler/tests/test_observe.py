"""ObservationBatcher: completed requests reach the profiler in one Observe call per window; with
tracing on, one call per request (its span belongs to that request's trace)."""

from __future__ import annotations

import asyncio

import pytest
from llmfleet.api.v1 import profiler_pb2, profiler_pb2_grpc
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.testing import StaticView
from llmfleet.types import NodeRecord
from llmfleet_scheduler import observe
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.observe import ObservationBatcher


class FakeProfiler(profiler_pb2_grpc.ProfilerServicer):
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def Observe(self, request, context):
        self.calls.append([o.request_id for o in request.items])
        return profiler_pb2.ObserveResponse(accepted=len(request.items))


@pytest.fixture
async def profiler():
    fake = FakeProfiler()
    server = await GrpcServer(
        [(profiler_pb2_grpc.add_ProfilerServicer_to_server, fake, service_name(profiler_pb2, "Profiler"))]
    ).start()
    directory = ClusterDirectory(
        StaticView({}), StaticView({"p": NodeRecord("p", "profiler", server.address)})
    )
    try:
        yield fake, directory
    finally:
        await directory.close()
        await server.stop(0)


def obs(rid: str) -> profiler_pb2.Observation:
    return profiler_pb2.Observation(request_id=rid, service="s", prompt_tokens=3, output_tokens=5)


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_observations_within_a_window_share_one_call(profiler, monkeypatch):
    monkeypatch.setattr(observe, "tracing_enabled", lambda: False)  # (another test may have enabled it)
    fake, directory = profiler
    b = ObservationBatcher(directory, window_s=0.05)
    for i in range(5):
        b.add(obs(f"r{i}"))
    await until(lambda: fake.calls)
    await asyncio.sleep(0.1)
    assert fake.calls == [[f"r{i}" for i in range(5)]] and b.calls == 1
    b.add(obs("late"))  # a later window: its own call
    await until(lambda: len(fake.calls) == 2)
    assert fake.calls[1] == ["late"]


async def test_a_full_batch_goes_at_once_and_close_sends_the_rest(profiler, monkeypatch):
    monkeypatch.setattr(observe, "tracing_enabled", lambda: False)
    fake, directory = profiler
    b = ObservationBatcher(directory, window_s=60, max_items=3)
    for i in range(4):
        b.add(obs(f"r{i}"))
    await until(lambda: fake.calls)
    assert fake.calls == [["r0", "r1", "r2"]]
    await b.close()
    assert fake.calls == [["r0", "r1", "r2"], ["r3"]]


async def test_with_tracing_each_request_is_its_own_call(profiler, monkeypatch):
    fake, directory = profiler
    monkeypatch.setattr(observe, "tracing_enabled", lambda: True)
    b = ObservationBatcher(directory, window_s=60)
    b.add(obs("a"))
    b.add(obs("b"))
    await until(lambda: len(fake.calls) == 2)
    assert sorted(fake.calls) == [["a"], ["b"]]


async def test_no_profiler_costs_nothing_but_the_observations():
    directory = ClusterDirectory(StaticView({}), StaticView({}))
    b = ObservationBatcher(directory, window_s=0.01)
    b.add(obs("x"))
    await asyncio.sleep(0.05)
    await b.close()
    assert b.calls == 0 and b.failures == 0

"""One data path whichever RPC a request enters by: a generic gRPC client's ``Submit`` call (a call
per request, as grpc-requests or grpcurl make) and the SDK's ``SubmitMany`` streams go through the
same relay and the scheduler's one multiplexed call per engine, with the same tokens; a bad request
gets its status and a cancel stops the request on either."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from harness import Cluster, launch
from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.client import AsyncClient
from llmfleet.client.errors import InvalidArgument, NotFound

PROMPTS = ["Once upon a time", "The fleet of models", "A tiny llama"]
SAMPLING = {"max_tokens": 12, "seed": 3, "temperature": 0.8}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = launch(tmp_path_factory.mktemp("paths"), engines=1, placement_replicas=1)
    try:
        yield c
    finally:
        c.stop()


async def _submit(stub: scheduler_pb2_grpc.SchedulerStub, prompt: str, service: str = "chat", **sampling):
    """A Submit call's token ids (a generic gRPC client, no SDK)."""
    req = scheduler_pb2.SubmitRequest(
        service=service, prompt=prompt, sampling=common_pb2.SamplingParams(**sampling)
    )
    return [t async for chunk in stub.Submit(req, timeout=60) for t in chunk.token_ids]


async def test_submit_calls_and_sdk_streams_give_the_same_tokens(cluster: Cluster) -> None:
    async with grpc.aio.insecure_channel(cluster.scheduler) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        a = await asyncio.gather(*[_submit(stub, p, **SAMPLING) for p in PROMPTS])
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        done = await asyncio.gather(*[client.complete(p, service="chat", **SAMPLING) for p in PROMPTS])
    assert a == [list(c.token_ids) for c in done] and all(len(t) == 12 for t in a)


async def test_errors_and_cancel_on_a_submit_call(cluster: Cluster) -> None:
    async with grpc.aio.insecure_channel(cluster.scheduler) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _submit(stub, "x", service="nope")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "unknown service 'nope'" in e.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _submit(stub, "x", top_p=1.5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in e.value.details()
        call = stub.Submit(
            scheduler_pb2.SubmitRequest(
                service="chat", prompt="Once upon a time", sampling=common_pb2.SamplingParams(max_tokens=1500)
            )
        )
        async for _ in call:
            break
        call.cancel()
        assert len(await _submit(stub, "again", max_tokens=2)) == 2


async def test_errors_and_cancel_on_an_sdk_stream(cluster: Cluster) -> None:
    async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
        with pytest.raises(NotFound, match="unknown service 'nope'"):
            await client.complete("x", service="nope")
        with pytest.raises(InvalidArgument, match="top_p"):
            await client.complete("x", service="chat", top_p=1.5)
        stream = client.generate("Once upon a time", service="chat", max_tokens=1500)
        async for _ in stream:
            break
        assert await stream.cancel(timeout_s=10) is True
        assert (await client.complete("again", service="chat", max_tokens=2)).usage.completion_tokens == 2

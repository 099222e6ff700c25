"""The data path before issue 23 stays a working option: a scheduler on ``--engine-path per-request``
(a Generate call per request) serves the SDK's multiplexed and per-request calls alike, with the same
tokens; a request cancelled by the SDK stops, and a bad request gets its status on either path."""

from __future__ import annotations

import asyncio

import pytest
from harness import Cluster, launch
from llmfleet.client import AsyncClient
from llmfleet.client.errors import InvalidArgument, NotFound

PROMPTS = ["Once upon a time", "The fleet of models", "A tiny llama"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = launch(tmp_path_factory.mktemp("paths"), engines=1, placement_replicas=1,
               scheduler_args=("--engine-path", "per-request"))  # fmt: skip
    try:
        yield c
    finally:
        c.stop()


async def _tokens(client: AsyncClient) -> list[list[int]]:
    done = await asyncio.gather(
        *[client.complete(p, service="chat", max_tokens=12, seed=3, temperature=0.8) for p in PROMPTS]
    )
    return [list(c.token_ids) for c in done]


async def test_both_sdk_paths_give_the_same_tokens_through_a_per_request_scheduler(cluster: Cluster) -> None:
    async with AsyncClient(cluster.scheduler, timeout_s=60, multiplex=False) as per_request:
        a = await _tokens(per_request)
        assert per_request._links == {}
    async with AsyncClient(cluster.scheduler, timeout_s=60) as mux:
        b = await _tokens(mux)
        assert len(mux._links) == 1
    assert a == b and all(len(t) == 12 for t in a)


@pytest.mark.parametrize("multiplex", [False, True])
async def test_errors_and_cancel_on_either_path(cluster: Cluster, multiplex: bool) -> None:
    async with AsyncClient(cluster.scheduler, timeout_s=60, multiplex=multiplex) as client:
        with pytest.raises(NotFound, match="unknown service 'nope'"):
            await client.complete("x", service="nope")
        with pytest.raises(InvalidArgument, match="top_p"):
            await client.complete("x", service="chat", top_p=1.5)
        stream = client.generate("Once upon a time", service="chat", max_tokens=1500)
        async for _ in stream:
            break
        assert await stream.cancel(timeout_s=10) is True
        assert (await client.complete("again", service="chat", max_tokens=2)).usage.completion_tokens == 2

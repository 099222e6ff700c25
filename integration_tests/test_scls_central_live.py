"""SCLS central scheduling live (``dispatch: scls_central``): the scheduler pools the requests, forms
batches with the DP every interval, offloads them max-min to engines running the ``given`` batching
policy in static mode (padded rows, the paper's recompute at a slice end), and takes each unfinished
request back after a slice of S tokens. Greedy outputs must equal transformers' own ``generate``."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import pytest
from harness import launch
from llmfleet.client import AsyncClient
from util import hf_greedy

S = 4  # tokens per slice
N = 10  # tokens per request: three slices (4 + 4 + 2)
CONFIG = {
    "services": {"central": {"model": "tiny-llama", "dispatch": "scls_central", "max_tokens": N}},
    "models": {"tiny-llama": {"source": "{endless}"}},
    "engines": {
        f"engine-{i}": {"models": ["tiny-llama"], "policy": "given", "options": {"slice_end": "recompute"}}
        for i in range(2)
    },
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    options = json.dumps({"slice_iterations": S, "gamma_s": 0.05})
    c = launch(
        tmp_path_factory.mktemp("scls-central"),
        config=CONFIG,
        placement_replicas=1,
        scheduler_args=("--scls-options", options),
    )
    yield c
    c.stop()


def dispatches(cluster) -> dict[str, float]:
    url = re.search(r"metrics on (http://\S+/metrics)", cluster.log("scheduler")).group(1)
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'llmfleet_scheduler_dispatch_total\{engine="([^"]+)",service="central"\} (\S+)', body
        )
    }


async def test_requests_run_slice_by_slice_in_central_batches(cluster):
    # short and long prompts: padding the short ones to the long ones costs more than a second batch,
    # so the DP splits them and max-min sends the two batches to different engines
    prompts = [f"request {i}: " + "word " * (2 + i if i < 3 else 300 + i) for i in range(6)]
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        results = await asyncio.gather(
            *(client.complete(p, service="central", max_tokens=N) for p in prompts)
        )
    model_dir = cluster.models_dir / "endless-llama"
    for p, r in zip(prompts, results, strict=True):
        assert r.usage.finish_reason == "length" and len(r.token_ids) == N
        assert list(r.token_ids) == hf_greedy(model_dir, p, N), p  # recompute at each slice end is exact
    per_engine = dispatches(cluster)
    assert sum(per_engine.values()) == len(prompts) * 3  # every request ran three slices
    assert set(per_engine) == {"engine-0", "engine-1"}  # two batches in a round: both engines


async def test_a_cancelled_request_leaves_the_pool_and_the_rest_complete(cluster):
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        stream = client.generate("to be cancelled " * 3, service="central", max_tokens=N)
        first = await anext(aiter(stream))
        assert first.token_ids
        await stream.aclose()
        done = await client.complete("still served", service="central", max_tokens=N)
        assert len(done.token_ids) == N

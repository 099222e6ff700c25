"""Scheduler high availability: two replicas; kill -9 the one serving live streams and every stream
resumes on the other with the same request id, its tokens exactly once and equal to an
uninterrupted run (greedy and seeded sampling)."""

from __future__ import annotations

import asyncio
import signal

import pytest
from harness import launch
from llmfleet.client import AsyncClient

N = 1000  # long enough to be mid-stream when the replica dies (a stream may still be fully buffered)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = launch(tmp_path_factory.mktemp("ha"), engines=2, placement_replicas=1)
    c.start("scheduler-1", "llmfleet-scheduler", "--orphan-grace-s", "0.5", "--http-port", "-1")
    c.wait_healthy(["scheduler-1"])
    yield c
    c.stop()


JOBS = [  # (prompt, sampling)
    ("The fleet keeps going", {"temperature": 0.0}),
    ("A seeded story about engines", {"temperature": 1.0, "top_p": 0.9, "seed": 7}),
    ("Another greedy one", {"temperature": 0.0}),
    ("Seeded again", {"temperature": 0.8, "seed": 123}),
]


async def test_a_replica_dies_mid_stream_and_every_stream_resumes_exactly_once(cluster):
    a, b = cluster.addresses["scheduler"], cluster.addresses["scheduler-1"]
    async with AsyncClient(b, timeout_s=120) as ref:  # the uninterrupted runs
        want = [(await ref.complete(p, service="chat", max_tokens=N, **s)).token_ids for p, s in JOBS]
    assert all(len(w) == N for w in want)

    async with AsyncClient(f"{a},{b}", timeout_s=120, retries=5, backoff_s=0.05) as client:
        streams = [client.generate(p, service="chat", max_tokens=N, **s) for p, s in JOBS]
        got: list[list[int]] = [[] for _ in JOBS]
        texts: list[list[str]] = [[] for _ in JOBS]

        async def read(i: int, until: int | None) -> None:
            async for chunk in streams[i]:
                got[i].extend(chunk.token_ids)
                texts[i].append(chunk.text)
                if until is not None and len(got[i]) >= until:
                    return

        await asyncio.gather(*(read(i, 20) for i in range(len(JOBS))))  # all mid-stream on replica a
        assert client.address == a
        cluster.procs.kill("scheduler", signal.SIGKILL)
        await asyncio.gather(*(read(i, None) for i in range(len(JOBS))))
        assert client.address == b  # moved to the surviving replica
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        first_diff = next((k for k, (x, y) in enumerate(zip(g, w, strict=False)) if x != y), None)
        assert g == list(w), f"job {i}: {len(g)} tokens, first difference at {first_diff}"
        assert streams[i].finish_reason == "length"
    assert sum(s.attempts >= 2 for s in streams) >= len(JOBS) // 2  # most were cut and resumed

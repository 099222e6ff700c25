"""An API key's rate limit holds for the whole cluster, not per scheduler replica: two replicas on one
etcd split the key's limit by the demand each sees (``llmfleet.security.limit_shares``), so a client
that sends five times the limit to each replica gets the limit in total, and a replica that stops
releases its share to the other."""

from __future__ import annotations

import asyncio
import time

import pytest
from harness import Cluster, launch
from llmfleet.client import AsyncClient, ResourceExhausted

KEY = "sk-metered-0001"
RATE, BURST = 4.0, 4  # requests/s of the key, for the whole cluster


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Cluster:
    root = tmp_path_factory.mktemp("key-limits")
    keys = root / "keys.yaml"
    keys.write_text(
        f"keys:\n  - {{name: metered, key: {KEY}, limits: {{requests_per_s: {RATE}, burst: {BURST}}}}}\n"
    )
    c = launch(root, engines=1, placement_replicas=1, scheduler_args=("--api-keys", str(keys)))
    try:
        c.start("scheduler-2", "llmfleet-scheduler", "--orphan-grace-s", "0.5", "--http-port", "-1",
                "--api-keys", str(keys))  # fmt: skip
        c.wait_healthy(["scheduler-2"])
        yield c
    finally:
        c.stop()


async def _send(address: str, rate: float, seconds: float) -> tuple[int, int]:
    """Requests at ``rate`` for ``seconds`` to one replica: (admitted, refused as rate limited)."""
    admitted = refused = 0
    async with AsyncClient(address, timeout_s=60, retries=0, api_key=KEY) as client:

        async def one() -> None:
            nonlocal admitted, refused
            try:
                await client.complete("hi", "chat", max_tokens=1)
                admitted += 1
            except ResourceExhausted:
                refused += 1

        tasks = []
        start = time.monotonic()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return admitted, refused


def test_five_times_the_limit_at_each_replica_admits_the_limit_in_total(two: Cluster):
    seconds = 30.0  # the setup: 5R to each replica for 30 s

    async def both() -> list[tuple[int, int]]:
        return await asyncio.gather(
            *(_send(two.addresses[s], 5 * RATE, seconds) for s in ("scheduler", "scheduler-2"))
        )

    results = asyncio.run(both())
    admitted = sum(a for a, _ in results)
    assert all(r > 0 for _, r in results)  # each replica refused its excess
    assert admitted <= 1.1 * RATE * seconds + BURST, results
    assert admitted >= 0.8 * RATE * seconds, results  # the limit is used, not starved
    assert min(a for a, _ in results) >= 0.25 * RATE * seconds, results  # split, not one replica's


def test_a_replica_that_stops_releases_its_share(two: Cluster):
    two.procs.stop("scheduler-2")
    time.sleep(1.0)  # its lease is revoked on a clean stop: its record goes at once
    seconds = 8.0
    admitted, _ = asyncio.run(_send(two.addresses["scheduler"], 5 * RATE, seconds))
    assert admitted >= 0.8 * RATE * seconds

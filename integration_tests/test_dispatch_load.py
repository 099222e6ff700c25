"""Live dispatch sees load: two engines host the same model, engine-0 is busy with long requests sent
to it directly (the scheduler never saw them), so only the engines' WatchLoad reports — through the
scheduler's load monitor — tell the scheduler; new requests under ``jsq`` and ``least_loaded`` must go
to engine-1, a concurrent burst included (dispatched-since accounting). With zero-load candidates both
policies would choose engine-0 (ties go to the smaller id)."""

from __future__ import annotations

import asyncio
import subprocess

import grpc
import pytest
from harness import BIN, launch
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.client import AsyncClient
from util import wait_running

ENGINES = {"engine-0": {"models": ["tiny-llama"]}, "engine-1": {"models": ["tiny-llama"]}}
CONFIG = {
    "services": {
        "s-jsq": {"model": "tiny-llama", "dispatch": "jsq", "max_tokens": 4},
        "s-least": {"model": "tiny-llama", "dispatch": "least_loaded", "max_tokens": 4},
    },
    "models": {"tiny-llama": {"source": "{endless}"}},  # no EOS: every request runs to max_tokens
    "engines": ENGINES,
}
PRELOAD = 4  # long requests on engine-0
BURST = 3  # concurrent new requests per policy (fewer than PRELOAD: engine-1 stays the shorter queue)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = launch(
        tmp_path_factory.mktemp("dispatch-load"),
        config=CONFIG,
        placement_replicas=1,
        scheduler_args=("--load-interval-s", "0.1"),
    )
    yield c
    c.stop()


async def test_new_requests_go_to_the_idle_engine(cluster):
    async with grpc.aio.insecure_channel(cluster.addresses["engine-0"]) as ch:
        engine0 = engine_pb2_grpc.EngineStub(ch)
        prompt = "a long prompt that fills the KV cache " * 8
        calls = [
            engine0.Generate(
                engine_pb2.GenerateRequest(
                    request_id=f"preload-{i}",
                    model="tiny-llama",
                    prompt=prompt,
                    sampling=common_pb2.SamplingParams(max_tokens=1500),
                )
            )
            for i in range(PRELOAD)
        ]
        try:
            for call in calls:  # each is running once its first token is out
                await call.read()
            await wait_running(
                cluster.addresses["migration"],
                lambda r: r.get("engine-0", 0) >= PRELOAD,
                timeout=10,
                what="engine-0 to report its preload",
            )
            await asyncio.sleep(0.4)  # the scheduler's monitor reports every 0.1 s
            async with AsyncClient(cluster.scheduler, timeout_s=60) as client:
                for service in ("s-jsq", "s-least"):
                    results = await asyncio.gather(
                        *(client.complete(f"hello {i}", service=service) for i in range(BURST))
                    )
                    engines = [r.usage.engine_id for r in results]
                    assert engines == ["engine-1"] * BURST, (service, engines)
            assert all(not call.done() for call in calls), "the preload ended before the checks"
        finally:
            for call in calls:
                call.cancel()


def test_a_load_reading_policy_without_the_load_monitor_is_refused_at_start():
    out = subprocess.run(
        [str(BIN / "llmfleet-scheduler"), "--no-load-monitor", "--dispatch", "jsq", "--etcd", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "dispatch policy 'jsq' reads engine load (queue lengths)" in out.stderr
    assert "--no-load-monitor" in out.stderr

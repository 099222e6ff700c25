"""The live cluster ``llmfleet up`` plans (etcd + control plane + ONE CPU engine) with the benchmark's
engine and scheduler flags, waiting until it serves, and the engine's Profile sweep."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.cli.local_cluster import LocalCluster, start_local_cluster, wait_routed
from llmfleet.rpc.channels import open_channel
from llmfleet_engine.models import materialize, without_eos

from .workload import ENGINE_ID, MODEL, SERVICE, Settings


def engine_flags(s: Settings) -> list[str]:
    return [
        "--threads",
        str(s.threads),
        "--policy",
        "fcfs",
        "--max-running",
        str(s.max_batch),
        "--max-batch-requests",
        str(s.max_batch),
        "--max-prefill-tokens",
        str(s.max_prefill_tokens),
        "--memory-budget",
        s.memory_budget,
        "--block-bytes",
        str(s.block_bytes),
        "--watermark",
        str(s.watermark),
        "--offline",
    ]


def scheduler_flags(s: Settings) -> list[str]:
    """``--no-predict`` unless predictions are asked for: FCFS and
    round-robin ignore predictions, and the profiler round trip is a path cost the simulator has no
    notion of."""
    return [] if s.scheduler_predict else ["--no-predict"]


def start_cluster(root: Path, s: Settings, log: Any) -> LocalCluster:
    """etcd + the children ``llmfleet up`` plans, with the engine's (and scheduler's) flags appended."""
    import yaml

    models_dir = root / "models"
    endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
    config = {
        "services": {SERVICE: {"model": MODEL, "max_tokens": s.output_max}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {ENGINE_ID: {"models": [MODEL]}},
    }
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    extra = {ENGINE_ID: engine_flags(s), "scheduler": scheduler_flags(s)}
    cluster = start_local_cluster(config_path, root, extra=extra, prefix=f"/fidelity-{uuid.uuid4().hex[:8]}")
    log(f"cluster healthy: {cluster.addresses}")
    return cluster


async def wait_ready(cluster: LocalCluster, timeout: float = 180) -> Any:
    """Until the engine has loaded the model (placement) and the scheduler routes the service to it;
    the engine's GetInfo."""
    return await wait_routed(
        cluster.addresses[ENGINE_ID], cluster.addresses["scheduler"], MODEL, SERVICE, timeout
    )


async def profile_engine(address: str, s: Settings) -> list[tuple[str, int, int, float]]:
    """The engine's Profile sweep: raw (phase, batch, tokens, seconds) samples."""

    async with open_channel(address) as ch:
        resp = await engine_pb2_grpc.EngineStub(ch).Profile(
            engine_pb2.ProfileRequest(
                model=MODEL,
                batch_sizes=list(s.sweep_batches),
                input_lengths=list(s.sweep_inputs),
                context_lengths=list(s.sweep_contexts),
                repeats=s.sweep_repeats,
            ),
            timeout=600,
        )
    return [(x.phase, x.batch_size, x.tokens, x.seconds) for x in resp.samples]

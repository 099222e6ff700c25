"""The live side of ``migration_live.py``: a local cluster of three CPU engines with a migration
policy, readiness, and the planned requests sent at their times while the migration leader's Status is
polled (engines holding requests, the active set, finished migrations, epoch records)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from pathlib import Path
from typing import Any

from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc, migration_pb2, migration_pb2_grpc
from llmfleet.cli.local_cluster import start_local_cluster
from llmfleet.client import AsyncClient
from llmfleet.rpc.channels import open_channel
from llmfleet_engine.models import materialize, without_eos

from tools.bench.sim_fidelity.cluster import engine_flags, scheduler_flags
from tools.bench.sim_fidelity.replay import stream_request, timed_row
from tools.bench.sim_fidelity.workload import MODEL, Settings, make_prompt

SERVICE = "chat"
ENGINES = [f"engine-{i}" for i in range(3)]
EPOCH_S = 0.5
POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class Planned:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    long: bool


def start(root: Path, models_dir: Path, s: Settings, dispatch: str, policy: str, log: Any) -> Any:
    import yaml

    endless = models_dir / "endless-llama"
    if not endless.exists():
        endless = without_eos(materialize("tiny://llama", models_dir), endless)
    config = {
        "services": {SERVICE: {"model": MODEL, "max_tokens": 16, "dispatch": dispatch}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {eid: {"models": [MODEL]} for eid in ENGINES},
        "migration": {"policy": policy, "epoch_s": EPOCH_S, "load_interval_s": POLL_S},
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    extra = {eid: engine_flags(s) for eid in ENGINES}
    extra["scheduler"] = scheduler_flags(s)
    cluster = start_local_cluster(path, root, extra=extra, prefix=f"/mell-live-{uuid.uuid4().hex[:8]}")
    log(f"cluster up ({dispatch} dispatch, {policy} migration)")
    return cluster


async def status(address: str) -> Any:
    import grpc

    async with grpc.aio.insecure_channel(address) as ch:
        return await migration_pb2_grpc.MigrationStub(ch).Status(migration_pb2.StatusRequest(), timeout=5)


async def wait_ready(cluster: Any, timeout: float = 180) -> Any:
    """Every engine has loaded the model, the scheduler routes ``chat`` to all three, the migration
    leader is elected and sees all three engines reporting; the first engine's GetInfo."""

    deadline = time.monotonic() + timeout
    info = None
    for eid in ENGINES:
        async with open_channel(cluster.addresses[eid]) as ch:
            stub = engine_pb2_grpc.EngineStub(ch)
            while True:
                got = await stub.GetInfo(engine_pb2.GetInfoRequest(), timeout=10)
                if any(m.name == MODEL for m in got.models):
                    info = info or got
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{eid} did not load {MODEL}")
                await asyncio.sleep(0.25)
    async with AsyncClient(cluster.addresses["scheduler"]) as client:
        while True:
            services = {x.name: x for x in await client.list_services(timeout_s=10)}
            if SERVICE in services and len(services[SERVICE].engines) == len(ENGINES):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler does not route {SERVICE} to every engine: {services}")
            await asyncio.sleep(0.25)
    while True:
        st = await status(cluster.addresses["migration"])
        if st.is_leader and sum(e.reporting for e in st.engines) == len(ENGINES):
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"no migration leader seeing every engine: {st}")
        await asyncio.sleep(0.25)


@dataclasses.dataclass
class LeaderWatch:
    """What polling the migration leader's Status every ``POLL_S`` records, from ``t0`` on."""

    address: str
    t0: float
    samples: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)  # (t, busy, active)
    migrations: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    epochs: dict[int, Any] = dataclasses.field(default_factory=dict)

    async def poll(self, done: asyncio.Event) -> None:
        while True:
            st = await status(self.address)
            now = time.monotonic() - self.t0
            busy = sum(1 for e in st.engines if e.load.running + e.load.waiting > 0)
            self.samples.append((now, busy, sum(1 for e in st.engines if e.active)))
            for r in [*st.recent, *st.running]:
                if r.state in ("done", "failed"):
                    self.migrations[r.migration_id] = {
                        "request_id": r.request_id, "source": r.source, "destination": r.destination,
                        "mode": r.mode, "state": r.state, "seconds": r.seconds, "kv_bytes": r.kv_bytes, "error": r.error,
                    }  # fmt: skip
            for e in st.epochs:
                self.epochs[e.epoch] = e
            if done.is_set():
                return
            await asyncio.sleep(POLL_S)

    def epoch_totals(self) -> dict[str, int]:
        ep = [self.epochs[k] for k in sorted(self.epochs)]
        return {
            "count": len(ep),
            "executed": sum(e.executed for e in ep),
            "failed": sum(e.failed for e in ep),
            "planned": sum(e.planned for e in ep),
            "deferred": sum(e.deferred for e in ep),
            "cancelled": sum(e.cancelled for e in ep),
            "deactivations": sum(len(e.deactivated) for e in ep),
            "activations": sum(len(e.activated) for e in ep),
        }


async def send_one(client: Any, p: Planned, prompt: str, t0: float) -> dict[str, Any]:
    """One planned request, sent at its arrival time (relative to ``t0``) and streamed to the end."""
    await asyncio.sleep(max(0.0, p.arrival_s - (time.monotonic() - t0)))
    st = await stream_request(client, prompt, p.output_tokens, SERVICE)
    u = st.usage
    return {
        **timed_row(p.request_id, p.arrival_s, st.sent, st.first, st.end, t0),
        "prompt_tokens": u.prompt_tokens if u else 0,
        "output_tokens": u.completion_tokens if u else 0,
        "planned_output_tokens": p.output_tokens,
        "long": p.long,
    }


async def run_live(cluster: Any, planned: list[Planned], seed: int) -> dict[str, Any]:
    """The planned requests through the cluster's scheduler, the leader watched meanwhile."""

    rng = random.Random(seed)
    prompts = [make_prompt(p.prompt_tokens, rng) for p in planned]
    watch = LeaderWatch(cluster.addresses["migration"], time.monotonic())
    done = asyncio.Event()
    poller = asyncio.create_task(watch.poll(done))
    async with AsyncClient(cluster.addresses["scheduler"], timeout_s=600) as client:
        res = await asyncio.gather(
            *(send_one(client, p, q, watch.t0) for p, q in zip(planned, prompts, strict=True)),
            return_exceptions=True,
        )
    await asyncio.sleep(2 * EPOCH_S)  # the last epochs' records
    done.set()
    await poller
    rows = [r for r in res if isinstance(r, dict)]
    errors = [repr(r) for r in res if not isinstance(r, dict)]
    return {
        "rows": rows,
        "errors": errors,
        "series": watch.samples,
        "migrations": list(watch.migrations.values()),
        "epochs": watch.epoch_totals(),
    }

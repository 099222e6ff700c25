"""Running the workload: through the SDK and the scheduler, straight to the engine, and on the simulator."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.client import AsyncClient
from llmfleet.policies.placement import InstancePlan
from llmfleet.rpc.channels import open_channel
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.run import simulate as sim_run
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.workload import Workload, WorkloadRequest

from .metrics import summarize
from .workload import ENGINE_ID, HARDWARE, MODEL, SERVICE, PlannedRequest, Settings, make_prompt


@dataclasses.dataclass(frozen=True)
class Streamed:
    """One request streamed through the SDK: client monotonic times and the scheduler's Usage (if any)."""

    request_id: str
    sent: float
    first: float | None  # the first chunk with tokens; None when none came
    end: float
    usage: Any


async def stream_request(client: Any, prompt: str, max_tokens: int, service: str = SERVICE) -> Streamed:
    """Send one request to ``service`` and read its stream to the end."""
    sent = time.monotonic()
    first = None
    stream = client.generate(prompt, service, max_tokens=max_tokens)
    async with stream:
        async for chunk in stream:
            if first is None and chunk.token_ids:
                first = time.monotonic()
    return Streamed(stream.request_id, sent, first, time.monotonic(), stream.usage)


def timed_row(
    request_id: str, planned_arrival_s: float, sent: float, first: float | None, end: float, t0: float
) -> dict[str, Any]:
    """The start of a request's row: its times relative to the workload's start ``t0`` (the first token at
    its end when none came)."""
    return {
        "request_id": request_id,
        "planned_arrival_s": planned_arrival_s,
        "arrival_s": sent - t0,
        "first_token_s": (first or end) - t0,
        "finish_s": end - t0,
    }


async def run_one(client: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One request through the SDK and the scheduler: client-side times and the scheduler's Usage."""
    st = await stream_request(client, prompt, max_tokens)
    sent, first, end, u = st.sent, st.first, st.end, st.usage
    if u is None:
        raise RuntimeError(f"request {st.request_id} ended without usage")
    return {
        "sent": sent,
        "first": first if first is not None else end,
        "end": end,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "scheduler_ttft_s": u.ttft_s,
        "scheduler_latency_s": u.latency_s,
        "finish_reason": u.finish_reason,
    }


async def engine_generate(stub: Any, prompt: str, max_tokens: int) -> tuple[int, int, float, float]:
    """One request straight to the engine's Generate: its own Usage (prompt, completion, ttft, latency)."""

    req = engine_pb2.GenerateRequest(
        request_id=f"calib-{uuid.uuid4().hex}",
        model=MODEL,
        prompt=prompt,
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
    )
    last = None
    async for msg in stub.Generate(req, timeout=120):
        last = msg
    if last is None or not last.finish_reason:
        raise RuntimeError("a calibration request ended without a final chunk")
    u = last.usage
    return u.prompt_tokens, u.completion_tokens, u.ttft_s, u.latency_s


async def watch_load(engine_address: str, stop: asyncio.Event, out: list[tuple[float, int]]) -> None:
    """The engine's WatchLoad every 50 ms until ``stop``: (client monotonic time, running + waiting)."""

    async with open_channel(engine_address) as ch:
        call = engine_pb2_grpc.EngineStub(ch).WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        try:
            async for snap in call:
                out.append((time.monotonic(), snap.running + snap.waiting))
                if stop.is_set():
                    break
        finally:
            call.cancel()


async def replay(
    address: str, planned: Sequence[PlannedRequest], s: Settings, engine_address: str | None = None
) -> tuple[list[dict[str, Any]], list[tuple[float, int]]]:
    """Submit every request at its planned arrival (asyncio, one task each); per request the client-side
    times relative to the workload's start, the engine-counted lengths and the scheduler's Usage. With
    ``engine_address``, also the engine's load snapshots during the run (see :func:`little_latency`)."""

    rng = random.Random(s.seed + 2)
    prompts = [make_prompt(p.prompt_tokens, rng) for p in planned]  # identical in every run
    async with AsyncClient(address) as client:
        await run_one(client, make_prompt(32, rng), 4)  # open the channel before the clock starts
        t0 = time.monotonic() + 0.5

        async def one(p: PlannedRequest, prompt: str) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + p.arrival_s - time.monotonic()))
            r = await run_one(client, prompt, p.output_tokens)
            return {
                **timed_row(p.request_id, p.arrival_s, r["sent"], r["first"], r["end"], t0),
                "planned_prompt_tokens": p.prompt_tokens,
                "prompt_tokens": r["prompt_tokens"],
                "planned_output_tokens": p.output_tokens,
                "output_tokens": r["completion_tokens"],
                "scheduler_ttft_s": r["scheduler_ttft_s"],
                "scheduler_latency_s": r["scheduler_latency_s"],
                "finish_reason": r["finish_reason"],
            }

        load: list[tuple[float, int]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_load(engine_address, stop, load)) if engine_address else None
        rows = list(await asyncio.gather(*(one(p, q) for p, q in zip(planned, prompts, strict=True))))
        if watcher is not None:
            await asyncio.sleep(0.1)  # one more snapshot after the last finish
            stop.set()
            await watcher
        return rows, load


async def replay_direct(
    engine_address: str, planned: Sequence[PlannedRequest], s: Settings
) -> tuple[list[dict[str, Any]], list[tuple[float, int]]]:
    """Diagnostic: the identical workload straight to the engine's Generate (no scheduler, no SDK);
    client-side times plus the engine's own Usage (engine arrival -> first / last token)."""

    rng = random.Random(s.seed + 2)
    prompts = [make_prompt(p.prompt_tokens, rng) for p in planned]  # the same prompts as replay()
    async with open_channel(engine_address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        await engine_generate(stub, make_prompt(32, rng), 4)
        t0 = time.monotonic() + 0.5

        async def one(p: PlannedRequest, prompt: str) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + p.arrival_s - time.monotonic()))
            req = engine_pb2.GenerateRequest(
                request_id=f"direct-{uuid.uuid4().hex}",
                model=MODEL,
                prompt=prompt,
                sampling=common_pb2.SamplingParams(max_tokens=p.output_tokens),
            )
            sent, first, last = time.monotonic(), None, None
            async for msg in stub.Generate(req, timeout=120):
                if first is None and msg.token_ids:
                    first = time.monotonic()
                last = msg
            end = time.monotonic()
            assert last is not None
            return {
                **timed_row(p.request_id, p.arrival_s, sent, first, end, t0),
                "prompt_tokens": last.usage.prompt_tokens,
                "output_tokens": last.usage.completion_tokens,
                "planned_output_tokens": p.output_tokens,
                "engine_ttft_s": last.usage.ttft_s,
                "engine_latency_s": last.usage.latency_s,
            }

        load: list[tuple[float, int]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_load(engine_address, stop, load))
        rows = list(await asyncio.gather(*(one(p, q) for p, q in zip(planned, prompts, strict=True))))
        await asyncio.sleep(0.1)
        stop.set()
        await watcher
        return rows, load


def replay_spec(
    rows: Sequence[dict[str, Any]],
    s: Settings,
    kv_bytes: int,
    block_tokens: int,
    instances: int,
    max_tokens: int,
) -> tuple[Any, Any]:
    """The simulator's spec (``instances`` × ``cpu`` with the live engines' knobs and pool) and the
    replayed requests (``rows``: request_id, planned_arrival_s, prompt_tokens, output_tokens) in
    arrival order. ``max_tokens`` ≤ every output: each request's cap is then its own output length,
    as live."""

    spec = SimSpec(
        cluster=ClusterSpec.parse(f"{instances}x{HARDWARE}"),
        services=(SimService(SERVICE, MODEL, max_tokens=max_tokens),),
        engine=EngineSettings(
            max_running=s.max_batch,
            max_batch_requests=s.max_batch,
            max_prefill_tokens=s.max_prefill_tokens,
            watermark=s.watermark,
            block_tokens=block_tokens,
            kv_bytes=kv_bytes,
        ),
    )
    workload = Workload(
        tuple(
            WorkloadRequest(
                r["request_id"],
                r["planned_arrival_s"],
                r["prompt_tokens"],
                r["output_tokens"],
                SERVICE,
                MODEL,
            )
            for r in sorted(rows, key=lambda r: r["planned_arrival_s"])
        )
    )
    return spec, workload


def simulate(
    rows: Sequence[dict[str, Any]],
    record: Any,
    s: Settings,
    kv_bytes: int,
    block_tokens: int,
    hop_s: float = 0.0,
) -> dict[str, Any]:
    """The identical workload on one simulated ``cpu`` instance with the live engine's knobs and pool;
    ``hop_s`` (see :func:`deployed_overhead`) is added to every first token and finish."""

    spec, workload = replay_spec(rows, s, kv_bytes, block_tokens, instances=1, max_tokens=s.output_min)
    exp = sim_run(
        spec,
        workload,
        PolicyBundle("fidelity", placement="dedicated_even", dispatch="round_robin", engine="fcfs"),
        records=[record],
        plan=[InstancePlan(ENGINE_ID, (MODEL,), 1)],
    )
    recs = exp.result.records
    failed = [r.request_id for r in recs if not r.done]
    if failed:
        raise RuntimeError(f"the simulation did not complete {failed[:5]}")
    summary = summarize(
        [
            {
                "arrival_s": r.arrival_s,
                "first_token_s": r.first_token_s + hop_s,
                "finish_s": r.finish_s + hop_s,
                "output_tokens": r.output_tokens,
            }
            for r in recs
        ]
    )
    iterations = exp.report["cluster"]["iterations"]
    busy = sum(i["busy_s"] for i in exp.result.instances)
    return {
        "summary": summary,
        "iterations": iterations,
        "mean_batch": sum(r.output_tokens for r in recs) / max(1, iterations),  # tokens per iteration
        "utilization": busy / summary["makespan_s"] if summary["makespan_s"] > 0 else 0.0,
        "busy_s": busy,
        "preemptions": exp.report["overall"]["preemptions"],
        "cost_models": exp.report["cost_models"],
        "record": record.to_dict(),
        "hop_s": hop_s,
    }

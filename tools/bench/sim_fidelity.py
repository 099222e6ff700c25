"""Simulator fidelity (issue 5): one small workload through the live local cluster and the simulator.

    python tools/bench/sim_fidelity.py --out .bench      # writes sim_fidelity.json and .md

1. **Cluster.** A real local cluster exactly as ``llmfleet up`` plans it (``llmfleet.cli.up.
   plan_services``: etcd, scheduler, profiler, placement, migration, engines as child processes) with
   ONE CPU engine hosting ONE model, the tiny llama without EOS (every request generates exactly
   ``max_tokens``), FCFS, and fixed knobs appended to the engine's command line
   (``--max-running = --max-batch-requests``, ``--max-prefill-tokens``, ``--threads``, pool size).
2. **Cost model.** The engine's ``Profile`` RPC sweeps prefill (batch x input length) and decode
   (batch x context); ``fit_engine_profile`` -> ``record_from_fit`` gives the Aladdin forms
   t_pre = k1*T + c1 and t_d = (k2*l + c2)*b + c3 that the simulator's ``CostBook`` uses.
3. **Calibration** (separate requests, never the workload). The sweep times the bare forward pass;
   a serving iteration also plans the batch, samples, detokenizes and streams, and on this machine
   it shares two cores with the scheduler, the client and other users. Groups of b identical
   requests (b = 1, 2, 4, 8) are sent together straight to the engine's ``Generate``, one group at a
   time, before, between and after the live runs; the engine's own Usage (its clock: arrival ->
   first / last token) gives the live decode iteration (latency - ttft) / (out - 1). Its excess over
   the fitted t_d(b, l) is fitted as o3 + o2*b (added to c3 and c2), the lone requests' TTFT minus
   t_pre as o1 (added to c1). (The scheduler's Usage cannot serve here: it times the relay, whose
   token bursts after a stall of the scheduler process look like impossibly fast iterations.)
   **As deployed**: the same groups also go through the SDK and the scheduler, timed on the client
   (whole requests, so relay bursts average out): their decode excess gives o3, o2 with the control
   plane sharing the cores, and the lone requests' TTFT minus the engine-side one is the hop, a
   constant delay added to every simulated first token and finish.
4. **Live runs.** A seeded Poisson workload (``llmfleet.workload.poisson``; prompts 16-256 tokens,
   outputs 8-64) is submitted with ``AsyncClient`` at the planned times, per request the send,
   first-token and finish times on the client. The identical workload runs ``--live-runs`` times
   (default 2): their spread is the noise floor of the machine at the time.
5. **Simulation.** The identical workload (planned arrivals, the engine-reported prompt lengths, the
   output lengths) on one simulated ``cpu`` instance with the same policy, knobs and KV pool, once per
   cost model: the raw fit, the calibrated one and the one calibrated as deployed.
   Diagnostic: the workload once more straight to the engine (no scheduler, no SDK), timed by the
   engine itself, which is what the simulator models (``--no-direct`` skips it).
6. **Report** (``sim_fidelity.json`` / ``.md``): live vs sim mean / p99 latency, TTFT, TPOT and
   throughput with relative differences, the live run-to-run spread, the fitted coefficients, the
   calibration, the settings and the wall time of each phase.

The simulator only ever sees numbers measured before or beside the workload (the profile sweep and
the calibration groups), never the timings of the workload it is compared against.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "tiny-llama"  # catalog name (llmfleet.costmodel.models) of the engine's model
SERVICE = "fidelity"
HARDWARE = "cpu"
ENGINE_ID = "engine-0"
GOAL = 0.10  # issue 5: live vs sim within 10 %
# Characters the tiny byte-level BPE tokenizer never merges (absent from its training corpus): a prompt
# of k of them is exactly k tokens plus <s> (checked against the engine's count in every run).
PROMPT_ALPHABET = "~^|@#$%&*=`"
VARIANTS = {"raw": "raw fit", "calibrated": "calibrated", "deployed": "calibrated as deployed"}


# ------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Settings:
    requests: int = 200
    rate_rps: float = 12.0
    seed: int = 0
    prompt_min: int = 16
    prompt_max: int = 256
    output_min: int = 8
    output_max: int = 64
    max_batch: int = 16  # --max-running = --max-batch-requests (the sim's max_requests is both)
    max_prefill_tokens: int = 1024
    threads: int = 1
    memory_budget: str = "512MiB"
    block_bytes: int = 64 * 1024
    watermark: float = 0.01
    sweep_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    sweep_inputs: tuple[int, ...] = (16, 32, 64, 128, 256)
    sweep_contexts: tuple[int, ...] = (16, 64, 128, 256, 320)
    sweep_repeats: int = 5
    scheduler_predict: bool = False  # the scheduler's output-length Predict round trip before dispatch
    live_runs: int = 2  # the identical workload this many times: the run-to-run spread is the noise floor
    direct_run: bool = True  # diagnostic: the workload once more, straight to the engine
    calibrate: bool = True
    calib_batches: tuple[int, ...] = (1, 2, 4, 8)
    calib_rounds: int = 2  # per calibration phase (phases: before, between and after the runs)
    calib_prompt: int = 32
    calib_output: int = 64

    def __post_init__(self) -> None:
        if self.requests < 1 or self.rate_rps <= 0 or self.live_runs < 1:
            raise ValueError("requests, rate and live runs must be positive")
        if not 2 <= self.prompt_min <= self.prompt_max or not 2 <= self.output_min <= self.output_max:
            raise ValueError("length ranges must satisfy 2 <= min <= max")
        if self.max_batch < 1 or self.max_prefill_tokens < 1 or self.threads < 1:
            raise ValueError("engine knobs must be positive")
        if self.calib_output < 2 or self.calib_prompt < 2 or self.calib_rounds < 1:
            raise ValueError("calibration requests need >= 2 prompt and output tokens, rounds >= 1")


@dataclass(frozen=True)
class PlannedRequest:
    request_id: str
    arrival_s: float  # from the workload's start
    prompt_tokens: int  # including <s>
    output_tokens: int


def plan_workload(s: Settings) -> list[PlannedRequest]:
    """Seeded Poisson arrivals (``llmfleet.workload.poisson``), uniform prompt and output lengths."""
    from llmfleet.workload import poisson

    arrivals = poisson(s.rate_rps, n=s.requests, seed=s.seed)
    rng = np.random.default_rng(s.seed + 1)
    prompts = rng.integers(s.prompt_min, s.prompt_max + 1, size=s.requests)
    outputs = rng.integers(s.output_min, s.output_max + 1, size=s.requests)
    return [
        PlannedRequest(f"r{i}", float(a), int(p), int(o))
        for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))
    ]


def make_prompt(tokens: int, rng: random.Random) -> str:
    """A prompt of ``tokens`` tokens for the tiny tokenizer: ``tokens - 1`` unmerged symbols + <s>."""
    if tokens < 2:
        raise ValueError(f"a prompt needs at least 2 tokens (<s> + one), got {tokens}")
    return "".join(rng.choice(PROMPT_ALPHABET) for _ in range(tokens - 1))


# ---------------------------------------------------------------------------------------- metrics
def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else 0.0


def summarize(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """rows: arrival_s, first_token_s, finish_s, output_tokens (seconds on one clock). Throughput is
    over the makespan, first arrival to last finish (as ``llmfleet.sim.metrics``)."""
    if not rows:
        raise ValueError("no requests to summarize")
    lat = [r["finish_s"] - r["arrival_s"] for r in rows]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in rows]
    tpot = [
        (r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
        for r in rows
        if r["output_tokens"] > 1
    ]
    span = max(r["finish_s"] for r in rows) - min(r["arrival_s"] for r in rows)
    return {
        "requests": len(rows),
        "latency_mean_s": float(np.mean(lat)),
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
        "ttft_mean_s": float(np.mean(ttft)),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else 0.0,
        "makespan_s": span,
        "throughput_rps": len(rows) / span if span > 0 else 0.0,
        "throughput_tokens_per_s": sum(r["output_tokens"] for r in rows) / span if span > 0 else 0.0,
    }


COMPARED = (
    ("latency_mean_s", "mean latency (s)"),
    ("latency_p50_s", "p50 latency (s)"),
    ("latency_p99_s", "p99 latency (s)"),
    ("ttft_mean_s", "mean TTFT (s)"),
    ("ttft_p99_s", "p99 TTFT (s)"),
    ("tpot_mean_s", "mean TPOT (s)"),
    ("throughput_rps", "throughput (req/s)"),
    ("throughput_tokens_per_s", "throughput (tok/s)"),
)
HEADLINE = ("latency_mean_s", "latency_p99_s", "throughput_rps")  # the three


def rel_diff(sim: float, live: float) -> float:
    """(sim − live) / live; NaN when live is 0."""
    return (sim - live) / live if live else math.nan


def compare(live: dict[str, float], sim: dict[str, float]) -> dict[str, dict[str, float]]:
    return {
        k: {"live": live[k], "sim": sim[k], "rel_diff": rel_diff(sim[k], live[k])}
        for k, _ in COMPARED
        if k in live and k in sim
    }


def mean_summary(summaries: Sequence[dict[str, float]]) -> dict[str, float]:
    """Metric-wise mean of several runs' summaries."""
    return {k: float(np.mean([x[k] for x in summaries])) for k in summaries[0]}


def spread(summaries: Sequence[dict[str, float]]) -> dict[str, float]:
    """Run-to-run noise per metric: (max − min) / mean over the runs (0 for one run)."""
    out = {}
    for k in summaries[0]:
        v = [x[k] for x in summaries]
        m = float(np.mean(v))
        out[k] = (max(v) - min(v)) / m if m else 0.0
    return out


# ------------------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class CalibrationGroup:
    """``batch`` identical requests sent together to the engine; the engine's Usage of each member."""

    batch: int
    prompt_tokens: int
    output_tokens: int
    ttft_s: tuple[float, ...]  # engine arrival -> first token
    latency_s: tuple[float, ...]  # engine arrival -> last token

    @property
    def iteration_s(self) -> float:
        """Median over members of the mean decode iteration (latency − ttft)/(out − 1)."""
        return statistics.median(
            (lat - ttft) / (self.output_tokens - 1)
            for ttft, lat in zip(self.ttft_s, self.latency_s, strict=True)
        )

    @property
    def mean_context(self) -> float:
        """Context per sequence over the decode iterations (prompt + i, i = 1 .. out − 1): its mean."""
        return self.prompt_tokens + self.output_tokens / 2


@dataclass(frozen=True)
class Overhead:
    """What a live serving iteration costs beyond the profiled forward pass (seconds)."""

    prefill_s: float  # o1, added to c1
    per_iteration_s: float  # o3, added to c3
    per_sequence_s: float  # o2, added to c2
    points: tuple[tuple[int, float], ...]  # (batch, mean of live decode iteration − fitted t_d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fit_overhead(groups: Iterable[CalibrationGroup], prefill: Any, decode: Any) -> Overhead:
    """The live loop's overheads from the engine-side timings of calibration groups.

    Decode: per group, live iteration − fitted t_d(b, l) (l = mean context); the mean per batch size is
    fitted as o3 + o2·b, both ≥ 0 (one batch size gives o3 only). Prefill: the mean over the batch-1
    groups of TTFT − fitted t_pre(prompt), ≥ 0: what a lone request's first iteration costs beyond
    the forward pass. Means, not medians: on a shared machine the groups are bimodal (quiet and
    contended periods) and the workload meets both, so the expected cost is the mean.
    """
    from llmfleet.costmodel.fit import FitError, fit_linear

    groups = list(groups)
    if not groups:
        raise ValueError("no calibration groups")
    per_batch: dict[int, list[float]] = {}
    for g in groups:
        per_batch.setdefault(g.batch, []).append(g.iteration_s - decode.predict(g.batch, g.mean_context))
    points = tuple((b, statistics.fmean(v)) for b, v in sorted(per_batch.items()))
    try:
        p, _ = fit_linear(
            [[1.0, float(b)] for b, _ in points],
            [d for _, d in points],
            ["o3", "o2"],
            [True, True],
            "overhead",
        )
        o3, o2 = p["o3"], p["o2"]
    except FitError:  # a single batch size
        o3, o2 = max(0.0, statistics.fmean(d for _, d in points)), 0.0
    lone = [g for g in groups if g.batch == 1] or groups
    pre = [t - prefill.predict(g.prompt_tokens) for g in lone for t in g.ttft_s]
    return Overhead(max(0.0, statistics.fmean(pre)), o3, o2, points)


def with_overhead(record: Any, o: Overhead) -> Any:
    """``record`` with the measured overheads added: c1 += o1, c3 += o3, c2 += o2."""
    from llmfleet.costmodel.aladdin import DecodeModel, PrefillModel

    a = record.aladdin
    pre = PrefillModel(a.prefill.k1, a.prefill.c1 + o.prefill_s)
    dec = DecodeModel(a.decode.k2, a.decode.c2 + o.per_sequence_s, a.decode.c3 + o.per_iteration_s)
    return dataclasses.replace(record, aladdin=dataclasses.replace(a, prefill=pre, decode=dec))


# ------------------------------------------------------------------------------------------ cluster
def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_base_port(rng: random.Random) -> int:
    """A base port with every port ``up`` derives from it (control plane, the engine) free."""
    from llmfleet.cli.up import CONTROL_PLANE, ENGINE_PORT_OFFSET

    offsets = [o for *_, o in CONTROL_PLANE] + [ENGINE_PORT_OFFSET]
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        if all(_port_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free port range found")


@dataclass
class LiveCluster:
    root: Path
    etcd: Any
    group: Any
    addresses: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        try:
            self.group.stop_all(grace=10)
        finally:
            self.etcd.stop()


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
    """``--no-predict`` where the scheduler has it (unless predictions are asked for): FCFS and
    round-robin ignore predictions, and the profiler round trip is a path cost the simulator has no
    notion of."""
    if s.scheduler_predict:
        return []
    try:
        from llmfleet_scheduler.main import build_parser
    except ImportError:
        return []
    known = {o for a in build_parser()._actions for o in a.option_strings}
    return ["--no-predict"] if "--no-predict" in known else []


def start_cluster(root: Path, s: Settings, log: Any) -> LiveCluster:
    """etcd + the children ``llmfleet up`` plans, with the engine's (and scheduler's) flags appended."""
    import yaml
    from llmfleet.cli.up import plan_services
    from llmfleet.config import ClusterConfig
    from llmfleet.coord import LocalEtcd
    from llmfleet.supervisor import ProcessGroup
    from llmfleet_engine.models import materialize, without_eos

    models_dir = root / "models"
    endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
    config = {
        "services": {SERVICE: {"model": MODEL, "default_max_tokens": s.output_max}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {ENGINE_ID: {"models": [MODEL]}},
    }
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    etcd = LocalEtcd(root / "etcd").start()
    cluster = LiveCluster(root, etcd, ProcessGroup(root / "logs"))
    try:
        plans = plan_services(
            ClusterConfig.load(config_path),
            config_path,
            etcd=etcd.endpoint,
            state_dir=root,
            base_port=pick_base_port(random.Random(os.getpid() ^ time.monotonic_ns())),
            prefix=f"/fidelity-{uuid.uuid4().hex[:8]}",
            log_level="WARNING",
        )
        for p in plans:
            extra = {ENGINE_ID: engine_flags(s), "scheduler": scheduler_flags(s)}.get(p.name, [])
            cluster.group.spawn(p.name, [*p.argv, *extra], log_path=p.log_path)
            cluster.addresses[p.name] = p.address
        for p in plans:
            cluster.group.wait_healthy(p.name, p.address, timeout=180)
        log(f"cluster healthy: {cluster.addresses}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def wait_ready(cluster: LiveCluster, timeout: float = 180) -> Any:
    """Until the engine has loaded the model (placement) and the scheduler routes the service to it;
    the engine's GetInfo."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.client import AsyncClient
    from llmfleet.rpc.channels import open_channel

    deadline = time.monotonic() + timeout
    async with open_channel(cluster.addresses[ENGINE_ID]) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        while True:
            info = await stub.GetInfo(engine_pb2.GetInfoRequest(), timeout=10)
            if any(m.name == MODEL for m in info.models):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine did not load {MODEL}: {info}")
            await asyncio.sleep(0.25)
    async with AsyncClient(cluster.addresses["scheduler"]) as client:
        while True:
            services = {x.name: x for x in await client.list_services(timeout_s=10)}
            if SERVICE in services and services[SERVICE].engines:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler does not route {SERVICE!r}: {services}")
            await asyncio.sleep(0.25)
    return info


async def profile_engine(address: str, s: Settings) -> list[tuple[str, int, int, float]]:
    """The engine's Profile sweep: raw (phase, batch, tokens, seconds) samples."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel

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


async def run_one(client: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One request through the SDK and the scheduler: client-side times and the scheduler's Usage."""
    sent = time.monotonic()
    first = None
    stream = client.generate(prompt, SERVICE, max_tokens=max_tokens)
    async with stream:
        async for chunk in stream:
            if first is None and chunk.token_ids:
                first = time.monotonic()
    end = time.monotonic()
    u = stream.usage
    if u is None:
        raise RuntimeError(f"request {stream.request_id} ended without usage")
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
    from llmfleet.api.v1 import common_pb2, engine_pb2

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


async def calibrate(engine_address: str, s: Settings, rng: random.Random) -> list[CalibrationGroup]:
    """One calibration phase: per round and batch size b, b identical requests sent together straight
    to the engine, one group at a time; the engine's own Usage of each."""
    from llmfleet.api.v1 import engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel

    groups = []
    async with open_channel(engine_address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        for _ in range(s.calib_rounds):
            for b in s.calib_batches:
                prompts = [make_prompt(s.calib_prompt, rng) for _ in range(b)]
                rs = await asyncio.gather(*(engine_generate(stub, q, s.calib_output) for q in prompts))
                groups.append(
                    CalibrationGroup(b, rs[0][0], rs[0][1], tuple(r[2] for r in rs), tuple(r[3] for r in rs))
                )
    return groups


async def calibrate_cluster(
    scheduler_address: str, s: Settings, rng: random.Random
) -> list[CalibrationGroup]:
    """The same groups as :func:`calibrate`, sent through the SDK and the scheduler (the workload's
    path) and timed on the client: what an iteration costs while the control plane relays the tokens
    on the same cores, and what the client -> scheduler -> engine hops add to a first token."""
    from llmfleet.client import AsyncClient

    groups = []
    async with AsyncClient(scheduler_address) as client:
        for _ in range(s.calib_rounds):
            for b in s.calib_batches:
                prompts = [make_prompt(s.calib_prompt, rng) for _ in range(b)]
                rs = await asyncio.gather(*(run_one(client, q, s.calib_output) for q in prompts))
                groups.append(
                    CalibrationGroup(
                        b,
                        rs[0]["prompt_tokens"],
                        rs[0]["completion_tokens"],
                        tuple(r["first"] - r["sent"] for r in rs),
                        tuple(r["end"] - r["sent"] for r in rs),
                    )
                )
    return groups


def deployed_overhead(
    engine: Overhead,
    engine_groups: Sequence[CalibrationGroup],
    cluster_groups: Sequence[CalibrationGroup],
    prefill: Any,
    decode: Any,
) -> tuple[Overhead, float]:
    """Overheads of the engine as deployed (control plane on the same cores) and the hop time.

    Decode overheads (o3, o2) come from the groups sent through the cluster, the prefill overhead o1
    from ``engine`` (the engine-side fit: a first iteration's own cost). The hop (client -> scheduler ->
    engine and the first token's way back) is the lone requests' mean TTFT through the cluster minus
    their mean TTFT on the engine's clock: a constant per request, it delays every arrival at the
    engine and every token at the client alike, so it adds to each simulated TTFT and latency and
    leaves the engine's schedule as it is."""
    through = fit_overhead(cluster_groups, prefill, decode)
    lone_c = [t for g in cluster_groups if g.batch == 1 for t in g.ttft_s]
    lone_e = [t for g in engine_groups if g.batch == 1 for t in g.ttft_s]
    hop = max(0.0, statistics.fmean(lone_c) - statistics.fmean(lone_e)) if lone_c and lone_e else 0.0
    return dataclasses.replace(through, prefill_s=engine.prefill_s), hop


async def watch_load(engine_address: str, stop: asyncio.Event, out: list[tuple[float, int]]) -> None:
    """The engine's WatchLoad every 50 ms until ``stop``: (client monotonic time, running + waiting)."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel

    async with open_channel(engine_address) as ch:
        call = engine_pb2_grpc.EngineStub(ch).WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        try:
            async for snap in call:
                out.append((time.monotonic(), snap.running + snap.waiting))
                if stop.is_set():
                    break
        finally:
            call.cancel()


def little_latency(samples: Sequence[tuple[float, int]], requests: int) -> float:
    """Mean time a request spends in the engine, by Little's law over the engine's own load snapshots:
    ∫ (running + waiting) dt / requests (the engine is empty before and after the workload)."""
    area = sum(n * (t1 - t0) for (t0, n), (t1, _) in itertools.pairwise(samples))
    return area / requests if requests else 0.0


async def replay(
    address: str, planned: Sequence[PlannedRequest], s: Settings, engine_address: str | None = None
) -> tuple[list[dict[str, Any]], list[tuple[float, int]]]:
    """Submit every request at its planned arrival (asyncio, one task each); per request the client-side
    times relative to the workload's start, the engine-counted lengths and the scheduler's Usage. With
    ``engine_address``, also the engine's load snapshots during the run (see :func:`little_latency`)."""
    from llmfleet.client import AsyncClient

    rng = random.Random(s.seed + 2)
    prompts = [make_prompt(p.prompt_tokens, rng) for p in planned]  # identical in every run
    async with AsyncClient(address) as client:
        await run_one(client, make_prompt(32, rng), 4)  # open the channel before the clock starts
        t0 = time.monotonic() + 0.5

        async def one(p: PlannedRequest, prompt: str) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, t0 + p.arrival_s - time.monotonic()))
            r = await run_one(client, prompt, p.output_tokens)
            return {
                "request_id": p.request_id,
                "planned_arrival_s": p.arrival_s,
                "arrival_s": r["sent"] - t0,
                "first_token_s": r["first"] - t0,
                "finish_s": r["end"] - t0,
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
    from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
    from llmfleet.rpc.channels import open_channel

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
                "request_id": p.request_id,
                "planned_arrival_s": p.arrival_s,
                "arrival_s": sent - t0,
                "first_token_s": (first or end) - t0,
                "finish_s": end - t0,
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


def summarize_usage(rows: Sequence[dict[str, Any]], prefix: str) -> dict[str, float]:
    """Latency metrics from a component's own per-request Usage (``{prefix}_ttft_s``, ``{prefix}_latency_s``:
    its arrival -> first / last token), i.e. without the hops in front of it."""
    lat = [r[f"{prefix}_latency_s"] for r in rows]
    ttft = [r[f"{prefix}_ttft_s"] for r in rows]
    tpot = [
        (r[f"{prefix}_latency_s"] - r[f"{prefix}_ttft_s"]) / (r["output_tokens"] - 1)
        for r in rows
        if r["output_tokens"] > 1
    ]
    return {
        "latency_mean_s": float(np.mean(lat)),
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
        "ttft_mean_s": float(np.mean(ttft)),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else 0.0,
    }


# ------------------------------------------------------------------------------------------ simulate
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
    from llmfleet.policies.placement import InstancePlan
    from llmfleet.sim.run import PolicyBundle
    from llmfleet.sim.run import simulate as sim_run
    from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
    from llmfleet.workload import Workload, WorkloadRequest

    spec = SimSpec(
        cluster=ClusterSpec.parse(f"1x{HARDWARE}"),
        # max_tokens <= every output: each request's cap is then its own output length, as live
        services=(SimService(SERVICE, MODEL, max_tokens=s.output_min),),
        engine=EngineSettings(
            max_requests=s.max_batch,
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
            for r in rows
        )
    )
    exp = sim_run(
        spec,
        workload,
        PolicyBundle("fidelity", placement="dedicated_even", dispatch="round_robin", local="fcfs"),
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


# -------------------------------------------------------------------------------------------- report
def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.1f}%"


def _ms(values: Iterable[float]) -> str:
    return ", ".join(f"{v * 1e3:.2f}" for v in values)


def _table(
    title: str, live: dict[str, float], sims: dict[str, Any], extra: dict[str, list[str]] | None = None
) -> list[str]:
    """A markdown table: metric, live value, optional extra columns, then sim value and diff per variant."""
    extra = extra or {}
    head = f"| metric | {title} |" + "".join(f" {c} |" for c in extra)
    head += "".join(f" sim: {VARIANTS[v]} | diff |" for v in sims)
    lines = [head, "|---|---:|" + "---:|" * len(extra) + "---:|---:|" * len(sims)]
    for i, (key, label) in enumerate(k for k in COMPARED if k[0] in live):
        row = f"| {label} | {live[key]:.4g} |" + "".join(f" {col[i]} |" for col in extra.values())
        row += "".join(
            f" {x['summary'][key]:.4g} | {pct(rel_diff(x['summary'][key], live[key]))} |"
            for x in sims.values()
        )
        lines.append(row)
    return lines


def explain(report: dict[str, Any]) -> list[str]:
    """What separates live and simulated numbers, with this run's figures."""
    live, noise, sims = report["live"]["summary"], report["live"]["spread"], report["sim"]
    lines = ["## What explains the residual", ""]
    raw = sims["raw"]["summary"]
    lines.append(
        f"- Throughput is set by the arrivals at this load (the engine idles between bursts): raw and "
        f"calibrated sims are within {100 * abs(rel_diff(raw['throughput_rps'], live['throughput_rps'])):.1f}% "
        "whatever the cost model."
    )
    lines.append(
        f"- Raw fit: latency {pct(rel_diff(raw['latency_mean_s'], live['latency_mean_s']))}. The Profile sweep "
        "times only the forward pass on an otherwise idle worker thread; a serving iteration also plans the "
        "batch, samples, detokenizes and hands chunks to the engine's gRPC thread (same GIL), and the "
        "engine shares two cores with the scheduler, the client and other users' jobs. For the tiny model a "
        "forward is ~1 ms, so this overhead dominates."
    )
    cal = report.get("calibration")
    if cal and "calibrated" in sims:
        c = sims["calibrated"]["summary"]
        lone = [g["iteration_s"] for g in cal["groups"] if g["batch"] == 1]
        lines.append(
            f"- Calibrated (engine-side overhead from separate requests): mean latency "
            f"{pct(rel_diff(c['latency_mean_s'], live['latency_mean_s']))}, mean TPOT "
            f"{pct(rel_diff(c['tpot_mean_s'], live['tpot_mean_s']))} against a live run-to-run spread of "
            f"{100 * noise['latency_mean_s']:.0f}% / {100 * noise['tpot_mean_s']:.0f}%."
        )
        if lone:
            lines.append(
                f"- Shape of the distribution: the same lone decode iteration took {min(lone) * 1e3:.2f} to "
                f"{max(lone) * 1e3:.2f} ms across the calibration groups (quiet vs contended periods of the "
                "shared machine). The simulator runs one deterministic mean speed, so it over-predicts the "
                f"median (p50 {pct(rel_diff(c['latency_p50_s'], live['latency_p50_s']))}) and under-predicts "
                f"the tail (p99 {pct(rel_diff(c['latency_p99_s'], live['latency_p99_s']))}): live tails come "
                "from contended stretches and stalls, amplified by queueing (the live p99 itself moved "
                f"{100 * noise['latency_p99_s']:.0f}% between identical runs)."
            )
    dep = (cal or {}).get("deployed")
    if dep and "deployed" in sims:
        x = sims["deployed"]["summary"]
        lines.append(
            f"- Calibrated as deployed (the calibration groups sent through the SDK and the scheduler): mean "
            f"latency {pct(rel_diff(x['latency_mean_s'], live['latency_mean_s']))}, TTFT "
            f"{pct(rel_diff(x['ttft_mean_s'], live['ttft_mean_s']))}, TPOT "
            f"{pct(rel_diff(x['tpot_mean_s'], live['tpot_mean_s']))}, p99 "
            f"{pct(rel_diff(x['latency_p99_s'], live['latency_p99_s']))}. The hops "
            f"({dep['hop_s'] * 1e3:.1f} ms per request) and the relay's share of the cores are what the "
            "engine-side calibration misses. The p99 stays short: the slowest requests arrive in bursts, "
            "where live iterations (larger batches, longer contexts, prefills mixed in) run slower than the "
            "linear calibration from groups of at most "
            f"{max(g['batch'] for g in dep['groups'])} requests with {report['settings']['calib_prompt']}-token "
            "prompts predicts."
        )
        direct = report.get("direct")
        if direct and "calibrated" in sims:
            e = direct["engine_side"]
            lines.append(
                f"  The engine alone shows the same short tail (calibrated sim p99 "
                f"{pct(rel_diff(sims['calibrated']['summary']['latency_p99_s'], e['latency_p99_s']))} on the "
                "engine's clock), so it is the engine's iteration model, not the relay."
            )
    direct = report.get("direct")
    if direct and "calibrated" in sims:
        c, e = sims["calibrated"]["summary"], direct["engine_side"]
        lines.append(
            f"- TTFT: on the engine's own clock (direct run) mean TTFT is {e['ttft_mean_s'] * 1e3:.1f} ms vs "
            f"{c['ttft_mean_s'] * 1e3:.1f} ms simulated; on the client it is {live['ttft_mean_s'] * 1e3:.1f} ms: "
            "the client -> scheduler -> engine hops, prompt validation and tokenization (before the engine's "
            "arrival stamp) and the way back, none of which the simulator models. The same path adds "
            f"{report['diagnostics']['client_minus_scheduler_latency_mean_s'] * 1e3:.1f} ms per request between "
            "client and scheduler alone."
        )
        lines.append(
            f"- Engine vs cluster: the direct run on the engine's clock has mean latency "
            f"{e['latency_mean_s'] * 1e3:.1f} ms (calibrated sim {pct(rel_diff(c['latency_mean_s'], e['latency_mean_s']))}),"
            f" the cluster runs {live['latency_mean_s'] * 1e3:.1f} ms on the client."
        )
    little = report["diagnostics"].get("engine_little_latency_s") or {}
    if little.get("cluster") and "direct" in little and "calibrated" in sims:
        eng = float(np.mean(little["cluster"]))
        c = sims["calibrated"]["summary"]
        lines.append(
            f"- Where the cluster's extra time goes: by the engine's own WatchLoad (Little's law) a request "
            f"spent {eng * 1e3:.1f} ms in the engine during the cluster runs vs {little['direct'] * 1e3:.1f} ms "
            f"in the direct run (calibrated sim: {c['latency_mean_s'] * 1e3:.1f} ms), and "
            f"{live['latency_mean_s'] * 1e3:.1f} ms on the client. The difference between the two engine "
            "figures is the engine running slower while the scheduler and the SDK client relay every token "
            "on the same two cores; the rest is the relay path itself."
        )
    lines.append(
        "- A mixed iteration (prefills joining running decodes) is one forward in the engine; the "
        "simulator charges prefill + decode minus their shared fixed cost (min(c1, c3)), not both."
    )
    return lines


def little_lines(report: dict[str, Any]) -> list[str]:
    """Engine-side mean latency of every run from the engine's WatchLoad (Little's law)."""
    little = report["diagnostics"].get("engine_little_latency_s") or {}
    if not little.get("cluster"):
        return []
    line = (
        "- time in the engine per request, from the engine's own WatchLoad snapshots (Little's law, "
        f"∫(running + waiting)dt / requests): cluster runs {_ms(little['cluster'])} ms"
    )
    if "direct" in little and report.get("direct"):
        line += (
            f"; direct run {little['direct'] * 1e3:.2f} ms (its Usage says "
            f"{report['direct']['engine_side']['latency_mean_s'] * 1e3:.2f} ms)"
        )
    return [line]


def render_markdown(report: dict[str, Any]) -> str:
    s, m, t = report["settings"], report["machine"], report["timings"]
    sims = report["sim"]
    live, runs, noise = report["live"]["summary"], report["live"]["runs"], report["live"]["spread"]
    keys = [k for k, _ in COMPARED if k in live]
    extra = {f"run {i + 1}": [f"{r[k]:.4g}" for k in keys] for i, r in enumerate(runs)}
    extra["live spread"] = [f"{100 * noise[k]:.1f}%" for k in keys]
    lines = [
        "# Simulator fidelity (issue 5)",
        "",
        f"One CPU engine (`{MODEL}` without EOS, FCFS, max batch {s['max_batch']}, max prefill tokens "
        f"{s['max_prefill_tokens']}, {s['threads']} torch thread) behind the control plane `llmfleet up` "
        f"starts; {s['requests']} Poisson requests at {s['rate_rps']} req/s (seed {s['seed']}), prompts "
        f"{s['prompt_min']}-{s['prompt_max']} tokens, outputs {s['output_min']}-{s['output_max']} tokens, "
        "submitted with `AsyncClient` at the planned times and timed on the client. The identical workload "
        f"ran {s['live_runs']}x through the cluster ('live' = mean of the runs). Machine: {m['cpus']} CPUs "
        f"shared with other users, load average {m['loadavg_before'][0]:.2f} before / "
        f"{m['loadavg_after'][0]:.2f} after. Goal: |diff| <= {GOAL:.0%} on mean latency, p99 latency and "
        "throughput.",
        "",
        *_table("live", live, sims, extra),
        "",
        "diff = (sim − live) / live. live spread = (max − min) / mean over the live runs of the identical "
        "workload: the machine's noise floor at the time.",
        "",
    ]
    for v, x in sims.items():
        worst = max(abs(rel_diff(x["summary"][k], live[k])) for k in HEADLINE)
        lines.append(
            f"- sim ({VARIANTS[v]}): mean latency, p99 latency and throughput within {GOAL:.0%}: "
            f"**{'yes' if worst <= GOAL else 'no'}** (worst {100 * worst:.1f}%)"
        )
    lines += [
        "",
        "The same cluster runs timed by the scheduler (its Usage: arrival at the scheduler -> first / last "
        "token it relayed; without the client <-> scheduler hop):",
        "",
        *_table("live (scheduler)", report["live_scheduler_side"]["summary"], sims),
    ]
    direct = report.get("direct")
    if direct:
        lines += [
            "",
            "## Diagnostic: the workload straight to the engine",
            "",
            "The identical workload once more, sent straight to the engine's `Generate` (no scheduler, no "
            "SDK), between the cluster runs. Timed by the engine itself (its Usage: engine arrival -> first "
            "/ last token), which is what the simulator models, and on the client:",
            "",
            *_table("live (engine's clock)", direct["engine_side"], sims),
            "",
            *_table("live (client, direct)", direct["client_side"], sims),
        ]
    f = report["fit"]
    lines += [
        "",
        "## Cost model (fitted from the engine's Profile sweep)",
        "",
        f"- prefill t = k1*T + c1: k1 = {f['k1']:.3e} s/token, c1 = {f['c1'] * 1e3:.3f} ms "
        f"(max rel. error over the sweep's medians {f['reports']['aladdin.prefill']['max_rel_error']:.1%})",
        f"- decode t = (k2*l + c2)*b + c3: k2 = {f['k2']:.3e} s/token, c2 = {f['c2'] * 1e3:.3f} ms, "
        f"c3 = {f['c3'] * 1e3:.3f} ms (max rel. error {f['reports']['aladdin.decode']['max_rel_error']:.1%})",
    ]
    cal = report.get("calibration")
    if cal:
        o = cal["overhead"]
        lines += [
            "",
            "## Calibration (engine-side, separate requests, before / between / after the live runs)",
            "",
            f"Groups of b identical requests ({s['calib_prompt']}-token prompt, {s['calib_output']} tokens out) "
            "sent together straight to the engine, one group at a time; live decode iteration = "
            "(latency − ttft)/(out − 1) from the engine's own Usage:",
            "",
            "| b | live iteration, each group (ms) | fitted t_d (ms) | mean excess (ms) |",
            "|---:|---|---:|---:|",
        ]
        for b in sorted({g["batch"] for g in cal["groups"]}):
            gb = [g for g in cal["groups"] if g["batch"] == b]
            excess = statistics.fmean(g["iteration_s"] - g["fitted_iteration_s"] for g in gb)
            lines.append(
                f"| {b} | {_ms(g['iteration_s'] for g in gb)} | {gb[0]['fitted_iteration_s'] * 1e3:.3f} | "
                f"{excess * 1e3:+.3f} |"
            )
        c = cal["record"]["aladdin"]
        lines += [
            "",
            f"Excess fitted as o3 + o2*b: o3 = {o['per_iteration_s'] * 1e3:.3f} ms per iteration (-> c3), "
            f"o2 = {o['per_sequence_s'] * 1e3:.3f} ms per sequence (-> c2); lone-request TTFT − t_pre: "
            f"o1 = {o['prefill_s'] * 1e3:.3f} ms (-> c1). Calibrated: c1 = {c['prefill']['c1'] * 1e3:.3f} ms, "
            f"c2 = {c['decode']['c2'] * 1e3:.3f} ms, c3 = {c['decode']['c3'] * 1e3:.3f} ms.",
        ]
        dep = cal.get("deployed")
        if dep:
            od, cd = dep["overhead"], dep["record"]["aladdin"]
            lines += [
                "",
                "## Calibration as deployed (the same groups through the SDK and the scheduler)",
                "",
                "The same groups sent through the cluster and timed on the client: the decode iteration "
                "while the control plane relays tokens on the same cores, and the hops.",
                "",
                "| b | live iteration through the cluster, each group (ms) |",
                "|---:|---|",
                *(
                    f"| {b} | {_ms(g['iteration_s'] for g in dep['groups'] if g['batch'] == b)} |"
                    for b in sorted({g["batch"] for g in dep["groups"]})
                ),
                "",
                f"o3 = {od['per_iteration_s'] * 1e3:.3f} ms, o2 = {od['per_sequence_s'] * 1e3:.3f} ms "
                f"(c2 = {cd['decode']['c2'] * 1e3:.3f} ms, c3 = {cd['decode']['c3'] * 1e3:.3f} ms); o1 from the "
                f"engine-side groups. Hop: lone requests' TTFT through the cluster − on the engine's clock = "
                f"{dep['hop_s'] * 1e3:.2f} ms, added to every simulated first token and finish (a constant delay "
                "shifts all arrivals at the engine alike, so the engine's schedule does not change).",
            ]
    lines += ["", *explain(report)]
    d = report["diagnostics"]
    lines += [
        "",
        "## Diagnostics",
        "",
        f"- client − scheduler latency: {d['client_minus_scheduler_latency_mean_s'] * 1e3:.2f} ms per request "
        "on average (the client <-> scheduler hop)",
        f"- client send lag behind the plan: mean {d['send_lag_mean_s'] * 1e3:.2f} ms, max "
        f"{d['send_lag_max_s'] * 1e3:.2f} ms",
        f"- prompt lengths as planned (engine's count): {d['prompt_lengths_match']}/{d['requests_total']}; "
        f"outputs as planned: {d['output_lengths_match']}/{d['requests_total']}",
        f"- scheduler flags added: {' '.join(report['scheduler_flags']) or 'none'}",
        *little_lines(report),
        "- simulated engine: "
        + "; ".join(
            f"{VARIANTS[v]}: {x['iterations']} iterations, {x['mean_batch']:.2f} tokens per iteration, "
            f"busy {x['utilization']:.0%}"
            for v, x in sims.items()
        ),
        "",
        f"Runtime: {report['runtime_s']:.1f} s wall (cluster start {t['cluster_start_s']:.1f} s, profile "
        f"{t['profile_s']:.1f} s, calibration {t['calibration_s']:.1f} s, live runs {t['live_s']:.1f} s, "
        f"direct run {t['direct_s']:.1f} s, simulations {t['sim_s']:.2f} s, shutdown {t['shutdown_s']:.1f} s).",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    d = Settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".bench", help="output directory (default .bench)")
    ap.add_argument("--requests", type=int, default=d.requests)
    ap.add_argument("--rate", type=float, default=d.rate_rps, help="Poisson arrival rate (req/s)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--max-batch", type=int, default=d.max_batch, help="max running = max batch requests")
    ap.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    ap.add_argument("--threads", type=int, default=d.threads, help="engine torch threads")
    ap.add_argument(
        "--live-runs", type=int, default=d.live_runs, help="cluster runs of the workload (noise floor)"
    )
    ap.add_argument("--no-direct", action="store_true", help="skip the diagnostic run straight to the engine")
    ap.add_argument(
        "--scheduler-predict", action="store_true", help="keep the scheduler's Predict call before dispatch"
    )
    ap.add_argument("--no-calibrate", action="store_true", help="only the raw profile fit")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's state dir (logs) afterwards")
    ap.add_argument(
        "--resimulate",
        metavar="JSON",
        help="no live cluster: re-analyse a saved sim_fidelity_measurement.json (written by every run)",
    )
    args = ap.parse_args(argv)
    s = dataclasses.replace(
        d,
        requests=args.requests,
        rate_rps=args.rate,
        seed=args.seed,
        max_batch=args.max_batch,
        max_prefill_tokens=args.max_prefill_tokens,
        threads=args.threads,
        live_runs=args.live_runs,
        direct_run=not args.no_direct,
        scheduler_predict=args.scheduler_predict,
        calibrate=not args.no_calibrate,
    )
    return args, s


def measure(s: Settings, root: Path, log: Any) -> dict[str, Any]:
    """Everything that needs the live cluster: profile, calibration phases around the runs, the runs."""
    planned = plan_workload(s)
    timings = {"calibration_s": 0.0, "live_s": 0.0, "direct_s": 0.0}
    groups: list[CalibrationGroup] = []
    cluster_groups: list[CalibrationGroup] = []
    runs: list[list[dict[str, Any]]] = []
    direct: list[dict[str, Any]] | None = None
    loads: dict[str, Any] = {}  # engine-side mean latency by Little's law over WatchLoad, per run
    calib_rng = random.Random(s.seed + 99)
    t = time.perf_counter()
    cluster = start_cluster(root, s, log)
    try:
        info = asyncio.run(wait_ready(cluster))
        timings["cluster_start_s"] = time.perf_counter() - t
        log(f"engine ready: KV pool {info.kv_capacity_bytes} B")
        engine = cluster.addresses[ENGINE_ID]

        t = time.perf_counter()
        samples = asyncio.run(profile_engine(engine, s))
        timings["profile_s"] = time.perf_counter() - t

        # calibration phases bracket every run (calib, run, calib, run, ..., calib): slow drift in the
        # machine's load then biases neither side; the direct run sits between the cluster runs
        plan = ["cluster"] * s.live_runs
        if s.direct_run:
            plan.insert(1, "direct")
        for what in [*plan, None]:
            if s.calibrate:
                t = time.perf_counter()
                groups += asyncio.run(calibrate(engine, s, calib_rng))
                cluster_groups += asyncio.run(calibrate_cluster(cluster.addresses["scheduler"], s, calib_rng))
                timings["calibration_s"] += time.perf_counter() - t
            if what is None:
                break
            t = time.perf_counter()
            if what == "direct":
                log("direct run: the workload straight to the engine")
                direct, direct_load = asyncio.run(replay_direct(engine, planned, s))
                loads["direct"] = little_latency(direct_load, len(direct))
                timings["direct_s"] += time.perf_counter() - t
                continue
            log(f"live run {len(runs) + 1}/{s.live_runs}: {s.requests} requests at {s.rate_rps} req/s")
            rows, load = asyncio.run(replay(cluster.addresses["scheduler"], planned, s, engine))
            runs.append(rows)
            loads.setdefault("cluster", []).append(little_latency(load, len(rows)))
            timings["live_s"] += time.perf_counter() - t
            x = summarize(runs[-1])
            log(
                f"live run {len(runs)}: mean latency {x['latency_mean_s'] * 1e3:.1f} ms, p99 "
                f"{x['latency_p99_s'] * 1e3:.1f} ms, {x['throughput_rps']:.2f} req/s"
            )
    finally:
        t = time.perf_counter()
        cluster.stop()
        timings["shutdown_s"] = time.perf_counter() - t
    model = next(x for x in info.models if x.name == MODEL)
    return {
        "settings": dataclasses.asdict(s),
        "engine": {
            "kv_capacity_bytes": info.kv_capacity_bytes,
            "kv_block_bytes": info.kv_block_bytes,
            "tokens_per_block": model.tokens_per_block,
        },
        "samples": samples,
        "groups": [dataclasses.asdict(g) for g in groups],
        "cluster_groups": [dataclasses.asdict(g) for g in cluster_groups],
        "runs": runs,
        "direct": direct,
        "engine_little_latency_s": loads,
        "timings": timings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args, s = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load_before = os.getloadavg()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    from llmfleet.costmodel import fit_engine_profile, record_from_fit

    if args.resimulate:  # analyse a saved measurement again (e.g. after a simulator change)
        meas = json.loads(Path(args.resimulate).read_text())
        s = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in meas["settings"].items()})
    else:
        root = Path(tempfile.mkdtemp(prefix="llmfleet-fidelity-"))
        try:
            meas = measure(s, root, log)
        finally:
            if args.keep:
                log(f"cluster state and logs kept in {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
        meas["loadavg"] = [load_before, os.getloadavg()]
        meas["runtime_s"] = time.perf_counter() - t_start
        (out / "sim_fidelity_measurement.json").write_text(json.dumps(meas) + "\n")
    load_before, load_after = meas["loadavg"]
    t_analysis = time.perf_counter()
    runs, direct, timings = meas["runs"], meas["direct"], dict(meas["timings"])
    groups, cluster_groups = (
        [
            CalibrationGroup(**{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()})
            for g in meas.get(key, [])
        ]
        for key in ("groups", "cluster_groups")
    )
    kv, tpb = meas["engine"]["kv_capacity_bytes"], meas["engine"]["tokens_per_block"]

    for rows in [*runs, *([direct] if direct else [])]:
        wrong = [r for r in rows if r["output_tokens"] != r.get("planned_output_tokens", r["output_tokens"])]
        if wrong:
            raise RuntimeError(f"{len(wrong)} requests did not generate their planned length: {wrong[:3]}")
    fit = fit_engine_profile(meas["samples"])
    record = record_from_fit(fit, MODEL, HARDWARE, "native")
    pre, dec = record.aladdin.prefill, record.aladdin.decode
    log(f"fit: k1={pre.k1:.3e} c1={pre.c1:.3e} k2={dec.k2:.3e} c2={dec.c2:.3e} c3={dec.c3:.3e}")

    t = time.perf_counter()
    rows = runs[0]  # arrivals and lengths are the planned ones in every run
    sims = {"raw": simulate(rows, record, s, kv, tpb)}
    calibration = None
    if groups:
        o = fit_overhead(groups, pre, dec)
        calibrated = with_overhead(record, o)
        sims["calibrated"] = simulate(rows, calibrated, s, kv, tpb)
        log(
            f"calibration: o1 {o.prefill_s * 1e3:.3f} ms, o3 {o.per_iteration_s * 1e3:.3f} ms, "
            f"o2 {o.per_sequence_s * 1e3:.3f} ms"
        )
        calibration = {
            "groups": [
                {
                    **dataclasses.asdict(g),
                    "iteration_s": g.iteration_s,
                    "fitted_iteration_s": dec.predict(g.batch, g.mean_context),
                }
                for g in groups
            ],
            "overhead": o.to_dict(),
            "record": calibrated.to_dict(),
        }
        if cluster_groups:
            od, hop = deployed_overhead(o, groups, cluster_groups, pre, dec)
            deployed = with_overhead(record, od)
            sims["deployed"] = simulate(rows, deployed, s, kv, tpb, hop_s=hop)
            log(
                f"as deployed: o3 {od.per_iteration_s * 1e3:.3f} ms, o2 {od.per_sequence_s * 1e3:.3f} ms, "
                f"hop {hop * 1e3:.3f} ms"
            )
            calibration["deployed"] = {
                "groups": [{**dataclasses.asdict(g), "iteration_s": g.iteration_s} for g in cluster_groups],
                "overhead": od.to_dict(),
                "hop_s": hop,
                "record": deployed.to_dict(),
            }
    timings["sim_s"] = time.perf_counter() - t

    live_runs = [summarize(r) for r in runs]
    live = mean_summary(live_runs)
    sched = mean_summary([summarize_usage(r, "scheduler") for r in runs])
    every = [r for rs in runs for r in rs]
    lags = [r["arrival_s"] - r["planned_arrival_s"] for r in every]
    report: dict[str, Any] = {
        "settings": dataclasses.asdict(s),
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "engine": meas["engine"],
        "scheduler_flags": scheduler_flags(s),
        "fit": {
            **pre.to_dict(),
            **dec.to_dict(),
            "reports": {k: r.to_dict() for k, r in fit.reports.items()},
        },
        "record": record.to_dict(),
        "profile_samples": meas["samples"],
        "calibration": calibration,
        "live": {"summary": live, "runs": live_runs, "spread": spread(live_runs)},
        "live_scheduler_side": {"summary": sched},
        "direct": (
            {"engine_side": summarize_usage(direct, "engine"), "client_side": summarize(direct)}
            if direct
            else None
        ),
        "sim": sims,
        "comparison": {v: compare(live, x["summary"]) for v, x in sims.items()},
        "diagnostics": {
            "client_minus_scheduler_latency_mean_s": float(
                np.mean([r["finish_s"] - r["arrival_s"] - r["scheduler_latency_s"] for r in every])
            ),
            "send_lag_mean_s": float(np.mean(lags)),
            "send_lag_max_s": float(np.max(lags)),
            "prompt_lengths_match": sum(r["prompt_tokens"] == r["planned_prompt_tokens"] for r in every),
            "output_lengths_match": sum(r["output_tokens"] == r["planned_output_tokens"] for r in every),
            "requests_total": len(every),
            "engine_little_latency_s": meas.get("engine_little_latency_s", {}),
        },
        "timings": timings,
        "runtime_s": meas["runtime_s"] + time.perf_counter() - t_analysis,
        "live_requests": runs,
        "direct_requests": direct,
    }
    if direct:
        report["comparison_direct_engine_side"] = {
            v: compare(report["direct"]["engine_side"], x["summary"])
            for v, x in sims.items()
            if v != "deployed"
        }
    (out / "sim_fidelity.json").write_text(json.dumps(report, indent=2) + "\n")
    md = render_markdown(report)
    (out / "sim_fidelity.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

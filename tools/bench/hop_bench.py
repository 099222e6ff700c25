"""``make bench-hop``: what the control plane adds to a request's time to first token.

Starts a local cluster the way ``llmfleet up`` plans it (``llmfleet.cli.up.plan_services``: etcd,
scheduler, profiler, placement, migration and ONE CPU engine hosting the tiny llama without EOS, so
every request generates exactly ``max_tokens``), then measures the client-side TTFT (call started ->
first chunk with tokens) of the same requests sent

- **direct**: straight to the engine's ``Generate`` (a plain ``grpc.aio`` stub), and
- **through**: through the scheduler's ``Submit`` with the SDK users use (``llmfleet.client.AsyncClient``),

interleaved in one run so drift hits both alike, for 1-token and 16-token requests, **sequential**
(one request at a time, blocks of 10 per path, A B B A ...) and **100 concurrent** (bursts of 100
requests started together, alternating the paths). Each repeat gives p50/p90/p99 of both paths and
the added hop (through - direct, per percentile); the report shows the median over repeats and the
min-max spread. Beside each path, the CPU time per request of the scheduler, the engine, the profiler
and this process (the client): on a small machine that is where a hop under load goes.

Writes ``hop.json``, ``hop.md`` and ``hop.png`` to ``--out``. Nothing is asserted: these are
measurements; the goals of the issue (added TTFT <= 1 ms p50, <= 3 ms p99) are printed next to them.
The load average before and after is printed too: other work on the machine shows up in the tails.
Before measuring, ``--prefill`` 1-token requests (default 10,000) go through the scheduler, so its
request journal is as full as in a scheduler that has served for a while.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from hop_report import GOAL_P50_MS, GOAL_P99_MS, PATHS, markdown, plot
from llmfleet.cli.local_cluster import LocalCluster, start_local_cluster, wait_routed

SERVICE = "hop"
MODEL = "tiny-llama"
ENGINE_ID = "engine-0"
PROMPT = "Once upon a time there was a tiny model"
PCTS = (50, 90, 99)


# ------------------------------------------------------------------------------------------ cluster
def start_cluster(root: Path, engine_threads: int, scheduler_args: Sequence[str]) -> LocalCluster:
    """etcd + the children ``llmfleet up`` plans for a one-engine config (stopped by ``stop``)."""
    import yaml
    from llmfleet_engine.models import materialize, without_eos

    models_dir = root / "models"
    endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
    config = {
        "services": {SERVICE: {"model": MODEL, "default_max_tokens": 16}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {ENGINE_ID: {"models": [MODEL]}},
    }
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    extra = {
        ENGINE_ID: ["--threads", str(engine_threads), "--offline", "--max-batch-requests", "128"],
        "scheduler": list(scheduler_args),
    }
    return start_local_cluster(config_path, root, extra=extra, prefix=f"/hop-{uuid.uuid4().hex[:8]}")


# ------------------------------------------------------------------------------------------ requests
class Paths:
    """The two ways to send one request; each returns its client-side TTFT in seconds."""

    def __init__(self, engine: str, scheduler: str) -> None:
        from llmfleet.api.v1 import engine_pb2_grpc
        from llmfleet.client import AsyncClient
        from llmfleet.rpc.channels import open_channel

        self._engine_channel = open_channel(engine)
        self._engine = engine_pb2_grpc.EngineStub(self._engine_channel)
        self._client = AsyncClient(scheduler, timeout_s=60)

    async def direct(self, max_tokens: int) -> float:
        from llmfleet.api.v1 import common_pb2, engine_pb2

        t0 = time.perf_counter()
        req = engine_pb2.GenerateRequest(
            request_id=uuid.uuid4().hex,
            model=MODEL,
            prompt=PROMPT,
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        )
        first = None
        n = 0
        async for msg in self._engine.Generate(req, timeout=60):
            if first is None and msg.token_ids:
                first = time.perf_counter()
            n += len(msg.token_ids)
        if first is None or n != max_tokens:
            raise RuntimeError(f"direct request produced {n} tokens, wanted {max_tokens}")
        return first - t0

    async def through(self, max_tokens: int) -> float:
        t0 = time.perf_counter()
        first = None
        n = 0
        async with self._client.generate(PROMPT, SERVICE, max_tokens=max_tokens) as stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = time.perf_counter()
                n += len(chunk.token_ids)
        if first is None or n != max_tokens:
            raise RuntimeError(f"request through the scheduler produced {n} tokens, wanted {max_tokens}")
        return first - t0

    async def close(self) -> None:
        await self._client.close()
        await self._engine_channel.close()


def percentile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class CpuMeter:
    """CPU seconds (user + system) used by the cluster's processes and by this one (the client), per
    path: where the hop's time goes when the cores are the bottleneck."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.tick = os.sysconf("SC_CLK_TCK")
        self.used: dict[str, dict[str, float]] = {p: {} for p in PATHS}

    def snap(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(f[11]) + int(f[12])) / self.tick
            except (OSError, IndexError, ValueError):
                continue
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out["client"] = ru.ru_utime + ru.ru_stime
        return out

    def add(self, path: str, before: dict[str, float]) -> None:
        after = self.snap()
        for k, v in after.items():
            self.used[path][k] = self.used[path].get(k, 0.0) + v - before.get(k, v)


Send = dict[str, Callable[[int], Awaitable[float]]]


async def sequential(send: Send, tokens: int, n: int, cpu: CpuMeter | None = None, block: int = 10) -> dict:
    """``n`` requests per path one at a time, in blocks of ``block`` per path, alternating A B B A ..."""
    out: dict[str, list[float]] = {p: [] for p in PATHS}
    for i in range(max(1, n // block)):
        for p in PATHS if i % 2 == 0 else PATHS[::-1]:
            before = cpu.snap() if cpu else {}
            for _ in range(block):
                out[p].append(await send[p](tokens))
            if cpu:
                cpu.add(p, before)
    return out


async def concurrent(send: Send, tokens: int, bursts: int, width: int, cpu: CpuMeter | None = None) -> dict:
    """``bursts`` bursts per path of ``width`` requests started together, alternating the paths."""
    out: dict[str, list[float]] = {p: [] for p in PATHS}
    for i in range(bursts):
        for p in PATHS if i % 2 == 0 else PATHS[::-1]:
            before = cpu.snap() if cpu else {}
            out[p].extend(await asyncio.gather(*(send[p](tokens) for _ in range(width))))
            # the scheduler reports finished requests to the profiler within 50 ms: let that land here
            await asyncio.sleep(0.06)
            if cpu:
                cpu.add(p, before)
    return out


def summarize(samples: dict[str, list[float]]) -> dict:
    """Per-path percentiles (ms) of one repeat and the hop (through - direct) per percentile."""
    s = {p: {f"p{q}": 1e3 * percentile(samples[p], q) for q in PCTS} for p in PATHS}
    s["hop"] = {f"p{q}": s["through"][f"p{q}"] - s["direct"][f"p{q}"] for q in PCTS}
    s["n"] = len(samples["direct"])
    return s


def aggregate(repeats: list[dict]) -> dict:
    """Median over repeats and the min-max spread of every number."""
    out: dict[str, Any] = {}
    for key in (*PATHS, "hop"):
        out[key] = {}
        for pq in (f"p{q}" for q in PCTS):
            vals = [r[key][pq] for r in repeats]
            out[key][pq] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    out["n_per_repeat"] = repeats[0]["n"]
    return out


async def run_bench(args: argparse.Namespace, engine: str, scheduler: str, pids: dict[str, int]) -> dict:
    await wait_routed(engine, scheduler, MODEL, SERVICE)
    paths = Paths(engine, scheduler)
    send = {"direct": paths.direct, "through": paths.through}
    scenarios = [(mode, t) for mode in ("sequential", "concurrent") for t in args.tokens]
    raw: dict[str, list[dict]] = {f"{m}-{t}": [] for m, t in scenarios}
    samples: dict[str, dict[str, list[float]]] = {f"{m}-{t}": {p: [] for p in PATHS} for m, t in scenarios}
    cpu = {f"{m}-{t}": CpuMeter(pids) for m, t in scenarios}
    try:
        for t in args.tokens:  # warm-up: channels, engine kernels, the scheduler's first dispatch
            await sequential(send, t, 20)
            await concurrent(send, t, 1, args.concurrency)
        if args.prefill:  # a scheduler that has been up a while: its journal holds recent requests
            t_fill = time.monotonic()
            for _ in range(0, args.prefill, args.concurrency):
                await asyncio.gather(*(paths.through(1) for _ in range(args.concurrency)))
            print(
                f"  prefilled the journal with {args.prefill} requests in {time.monotonic() - t_fill:.1f} s"
            )
        for rep in range(args.repeats):
            for mode, t in scenarios:
                key = f"{mode}-{t}"
                if mode == "sequential":
                    got = await sequential(send, t, args.sequential, cpu[key])
                else:
                    got = await concurrent(send, t, args.bursts, args.concurrency, cpu[key])
                raw[key].append(summarize(got))
                for p in PATHS:
                    samples[key][p].extend(got[p])
                s = raw[key][-1]
                print(
                    f"  repeat {rep + 1}/{args.repeats} {mode:>10} {t:>2} tok: "
                    + "  ".join(
                        f"p{q} direct {s['direct'][f'p{q}']:6.2f} through {s['through'][f'p{q}']:6.2f} "
                        f"hop {s['hop'][f'p{q}']:+6.2f}"
                        for q in (50, 99)
                    )
                    + " ms",
                    flush=True,
                )
    finally:
        await paths.close()
    return {
        "scenarios": [
            {
                "mode": mode,
                "tokens": t,
                "concurrency": 1 if mode == "sequential" else args.concurrency,
                **aggregate(raw[f"{mode}-{t}"]),
                "repeats": raw[f"{mode}-{t}"],
                "pooled": summarize(samples[f"{mode}-{t}"]),
                "cpu_ms_per_request": {
                    p: {
                        k: 1e3 * v / len(samples[f"{mode}-{t}"][p])
                        for k, v in sorted(cpu[f"{mode}-{t}"].used[p].items())
                    }
                    for p in PATHS
                },
            }
            for mode, t in scenarios
        ]
    }


# ------------------------------------------------------------------------------------------ report
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".bench/hop", help="output directory")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sequential", type=int, default=100, help="requests per path per sequential repeat")
    ap.add_argument("--bursts", type=int, default=3, help="bursts per path per concurrent repeat")
    ap.add_argument("--concurrency", type=int, default=100, help="requests per burst")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16], help="max_tokens of the requests")
    ap.add_argument("--engine-threads", type=int, default=1, help="torch threads of the engine")
    ap.add_argument(
        "--prefill",
        type=int,
        default=10_000,
        help="1-token requests sent through the scheduler before measuring, so its journal is as full "
        "as after 10 minutes of service (it keeps up to 10,000 finished requests for 10 min); 0: fresh",
    )
    ap.add_argument(
        "--scheduler-args", default="", help="extra scheduler flags, one string (e.g. '--predict always')"
    )
    ap.add_argument("--scheduler", default=None, help="use a running cluster: scheduler address")
    ap.add_argument("--engine", default=None, help="use a running cluster: engine address")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scheduler_args = args.scheduler_args.split()
    t0 = time.monotonic()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cluster = None
    pids: dict[str, int] = {}
    if args.scheduler and args.engine:
        engine, scheduler = args.engine, args.scheduler
    else:
        root = Path(tempfile.mkdtemp(prefix="llmfleet-hop-"))
        print(f"starting a local cluster under {root} ...", flush=True)
        cluster = start_cluster(root, args.engine_threads, scheduler_args)
        engine, scheduler = cluster.addresses[ENGINE_ID], cluster.addresses["scheduler"]
        pids = {
            c.name: c.pid for c in cluster.group.children if c.name in ("scheduler", "profiler", ENGINE_ID)
        }
    try:
        result = asyncio.run(run_bench(args, engine, scheduler, pids))
    finally:
        if cluster is not None:
            cluster.stop()
    result.update(
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        cpus=os.cpu_count(),
        python=sys.version.split()[0],
        repeats=args.repeats,
        prefill=args.prefill,
        engine_threads=args.engine_threads,
        scheduler_args=scheduler_args,
        wall_s=time.monotonic() - t0,
        load_before=load_before,
        load_after=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        goals_ms={"p50": GOAL_P50_MS, "p99": GOAL_P99_MS},
    )
    result["plot"] = plot(result, out)
    (out / "hop.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "hop.md").write_text(markdown(result))
    print(f"\nwrote {out}/hop.json, hop.md, {result['plot']}\n")
    print(markdown(result))


if __name__ == "__main__":
    main()

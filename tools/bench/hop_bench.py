"""``make bench-hop``: what the control plane adds to a request's time to first token.

Starts a local cluster the way ``llmfleet up`` plans it (``llmfleet.cli.up.plan_services``: etcd,
scheduler, profiler, placement, migration and ONE CPU engine hosting the tiny llama without EOS, so
every request generates exactly ``max_tokens``), then measures the client-side TTFT (call started ->
first chunk with tokens) of the same requests sent

- **direct**: straight to the engine's ``Generate`` (a plain ``grpc.aio`` stub),
- **through**: through the scheduler's ``Submit`` with the SDK users use (``llmfleet.client.AsyncClient``),
- **http**: through the scheduler's OpenAI-compatible API, ``POST /v1/completions`` with
  ``"stream": true`` over one persistent ``aiohttp.ClientSession`` (keep-alive connections, enough for
  a whole burst), reading the server-sent events line by line; TTFT = the first ``data:`` event of the
  choice (the API sends one as soon as the first token's chunk arrives, even when that token's text is
  still empty). aiohttp is the thinnest common async client (the load generator of vLLM's serving
  benchmark; httpx's connection pool costs a burst of 100 streams more than the server does), so this
  row is the API's cost,
- **openai** (``--paths ... openai``, off by default): the same through the official ``openai``
  ``AsyncOpenAI`` client (its own parsing of every chunk added),

interleaved in one run so drift hits them alike, for 1-token and 16-token requests, **sequential**
(one request at a time, blocks of 10 per path, A B C C B A ...) and **100 concurrent** (bursts of 100
requests started together, alternating the paths' order). Each repeat gives p50/p90/p99 of every path
and the added hop over direct per percentile (``hop`` = through - direct, ``hop_http`` = http -
direct, ``hop_openai``); the report shows the median over repeats and the min-max spread. Beside each
path, the CPU time per request of the scheduler, the engine, the profiler and this process (the
client): on a small machine that is where a hop under load goes.

Writes ``hop.json``, ``hop.md`` and ``hop.png`` to ``--out``. Nothing is asserted: these are
measurements; the goals of the issue (added TTFT <= 1 ms p50, <= 3 ms p99 through the SDK; <= 2 ms p50
through the HTTP API) are printed next to them.
The load average before and after is printed too: other work on the machine shows up in the tails.
Before measuring, ``--prefill`` 1-token requests (default 10,000) go through the scheduler, so its
request journal is as full as in a scheduler that has served for a while.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from llmfleet.cli.local_cluster import LocalCluster, start_local_cluster, wait_routed
from llmfleet_engine.models import materialize, without_eos

from tools.bench.hop_paths import MODEL, SERVICE, Paths
from tools.bench.hop_report import (
    ALL_PATHS,
    GOAL_HTTP_P50_MS,
    GOAL_P50_MS,
    GOAL_P99_MS,
    hop_key,
    markdown,
    plot,
)
from tools.toolkit.host import load_average, machine
from tools.toolkit.stats import percentile, spread

ENGINE_ID = "engine-0"
PCTS = (50, 90, 99)


# ------------------------------------------------------------------------------------------ cluster
def start_cluster(
    root: Path,
    engine_threads: int,
    scheduler_args: Sequence[str],
    http: bool = False,
    engine_args: Sequence[str] = (),
    front_workers: int = 0,
) -> LocalCluster:
    """etcd + the children ``llmfleet up`` plans for a one-engine config (stopped by ``stop``);
    ``http``: the OpenAI-compatible API on a free port (``cluster.http``), served by the scheduler, or by
    the OpenAI front's ``front_workers`` processes when > 0."""
    import yaml

    models_dir = root / "models"
    endless = without_eos(materialize("tiny://llama", models_dir), models_dir / "endless-llama")
    config = {
        "services": {SERVICE: {"model": MODEL, "max_tokens": 16}},
        "models": {MODEL: {"source": str(endless)}},
        "engines": {ENGINE_ID: {"models": [MODEL]}},
    }
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    extra = {
        ENGINE_ID: [
            "--threads",
            str(engine_threads),
            "--offline",
            "--max-batch-requests",
            "128",
            *engine_args,
        ],
        "scheduler": list(scheduler_args),
    }
    return start_local_cluster(
        config_path, root, extra=extra, prefix=f"/hop-{uuid.uuid4().hex[:8]}", http_port=0 if http else -1,
        front_workers=front_workers if http else 0,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ measuring
class CpuMeter:
    """CPU seconds (user + system) used by the cluster's processes and by this one (the client), per
    path: where the hop's time goes when the cores are the bottleneck."""

    def __init__(self, pids: dict[str, int], paths: Sequence[str]) -> None:
        self.pids = pids
        self.tick = os.sysconf("SC_CLK_TCK")
        self.used: dict[str, dict[str, float]] = {p: {} for p in paths}

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
    """``n`` requests per path one at a time, in blocks of ``block`` per path, alternating the order of
    the paths (``send``'s): A B C C B A ..."""
    paths = list(send)
    out: dict[str, list[float]] = {p: [] for p in paths}
    for i in range(max(1, n // block)):
        for p in paths if i % 2 == 0 else paths[::-1]:
            before = cpu.snap() if cpu else {}
            for _ in range(block):
                out[p].append(await send[p](tokens))
            if cpu:
                cpu.add(p, before)
    return out


async def concurrent(send: Send, tokens: int, bursts: int, width: int, cpu: CpuMeter | None = None) -> dict:
    """``bursts`` bursts per path of ``width`` requests started together, alternating the paths' order."""
    paths = list(send)
    out: dict[str, list[float]] = {p: [] for p in paths}
    for i in range(bursts):
        for p in paths if i % 2 == 0 else paths[::-1]:
            before = cpu.snap() if cpu else {}
            out[p].extend(await asyncio.gather(*(send[p](tokens) for _ in range(width))))
            # the scheduler reports finished requests to the profiler within 50 ms: let that land here
            await asyncio.sleep(0.06)
            if cpu:
                cpu.add(p, before)
    return out


def summarize(samples: dict[str, list[float]]) -> dict:
    """Per-path percentiles (ms) of one repeat and each path's hop over direct per percentile."""
    paths = list(samples)
    s: dict[str, Any] = {p: {f"p{q}": 1e3 * percentile(samples[p], q) for q in PCTS} for p in paths}
    for p in paths[1:]:
        s[hop_key(p)] = {f"p{q}": s[p][f"p{q}"] - s["direct"][f"p{q}"] for q in PCTS}
    s["n"] = len(samples["direct"])
    return s


def aggregate(repeats: list[dict], paths: Sequence[str]) -> dict:
    """Median over repeats and the min-max spread of every number."""
    out: dict[str, Any] = {}
    for key in (*paths, *(hop_key(p) for p in paths[1:])):
        out[key] = {}
        for pq in (f"p{q}" for q in PCTS):
            out[key][pq] = spread([r[key][pq] for r in repeats])
    out["n_per_repeat"] = repeats[0]["n"]
    return out


async def wait_http(http: str, timeout_s: float = 60) -> None:
    """Until the scheduler's HTTP API answers ``/health`` (it starts just after gRPC reports healthy)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=f"http://{http}", timeout=5) as client:
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler's HTTP API at {http} did not come up")
            await asyncio.sleep(0.25)


async def run_bench(
    args: argparse.Namespace, engine: str, scheduler: str, pids: dict[str, int], http: str = ""
) -> dict:
    await wait_routed(engine, scheduler, MODEL, SERVICE)
    if http:
        await wait_http(http)
    paths = Paths(engine, scheduler, http, args.concurrency)
    names = [p for p in ALL_PATHS if p in args.paths]
    send = {p: getattr(paths, p) for p in names}
    scenarios = [(mode, t) for mode in ("sequential", "concurrent") for t in args.tokens]
    raw: dict[str, list[dict]] = {f"{m}-{t}": [] for m, t in scenarios}
    samples: dict[str, dict[str, list[float]]] = {f"{m}-{t}": {p: [] for p in names} for m, t in scenarios}
    cpu = {f"{m}-{t}": CpuMeter(pids, names) for m, t in scenarios}
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
                for p in names:
                    samples[key][p].extend(got[p])
                s = raw[key][-1]
                print(
                    f"  repeat {rep + 1}/{args.repeats} {mode:>10} {t:>2} tok: "
                    + "  ".join(
                        f"p{q} direct {s['direct'][f'p{q}']:6.2f} "
                        + " ".join(
                            f"{p} {s[p][f'p{q}']:6.2f} ({s[hop_key(p)][f'p{q}']:+6.2f})" for p in names[1:]
                        )
                        for q in (50, 99)
                    )
                    + " ms (hop)",
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
                **aggregate(raw[f"{mode}-{t}"], names),
                "repeats": raw[f"{mode}-{t}"],
                "pooled": summarize(samples[f"{mode}-{t}"]),
                "cpu_ms_per_request": {
                    p: {
                        k: 1e3 * v / len(samples[f"{mode}-{t}"][p])
                        for k, v in sorted(cpu[f"{mode}-{t}"].used[p].items())
                    }
                    for p in names
                },
            }
            for mode, t in scenarios
        ],
        "paths": names,
    }


# ------------------------------------------------------------------------------------------ main
def _parser() -> argparse.ArgumentParser:
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
    ap.add_argument(
        "--paths",
        nargs="+",
        default=["direct", "through", "http"],
        choices=ALL_PATHS,
        help="paths measured (direct always): through = SDK Submit, http = OpenAI API with aiohttp, "
        "openai = the same with the official openai client",
    )
    ap.add_argument("--scheduler", default=None, help="use a running cluster: scheduler address")
    ap.add_argument("--engine", default=None, help="use a running cluster: engine address")
    ap.add_argument(
        "--front-workers",
        type=int,
        default=0,
        help="http/openai paths through the OpenAI front with N worker processes (0: the scheduler's own API)",
    )
    ap.add_argument("--http", default=None, help="use a running cluster: the scheduler's HTTP API host:port")
    return ap


def _measure(
    ap: argparse.ArgumentParser, args: argparse.Namespace, scheduler_args: list[str], engine_args: list[str]
) -> dict:
    """``run_bench`` against the running cluster ``--scheduler``/``--engine`` name, or a local one."""
    wants_http = "http" in args.paths or "openai" in args.paths
    cluster = None
    pids: dict[str, int] = {}
    if args.scheduler and args.engine:
        engine, scheduler, http = args.engine, args.scheduler, args.http or ""
        if wants_http and not http:
            ap.error("--paths http/openai with a running cluster needs --http")
    else:
        root = Path(tempfile.mkdtemp(prefix="llmfleet-hop-"))
        print(f"starting a local cluster under {root} ...", flush=True)
        cluster = start_cluster(
            root, args.engine_threads, scheduler_args, http=wants_http, engine_args=engine_args,
            front_workers=args.front_workers,
        )  # fmt: skip
        engine, scheduler, http = cluster.addresses[ENGINE_ID], cluster.addresses["scheduler"], cluster.http
        pids = {
            c.name: c.pid
            for c in cluster.group.children
            if c.name in ("scheduler", "profiler", "front", ENGINE_ID)
        }
    try:
        return asyncio.run(run_bench(args, engine, scheduler, pids, http))
    finally:
        if cluster is not None:
            cluster.stop()


def main() -> None:
    ap = _parser()
    args = ap.parse_args()
    if "direct" not in args.paths:
        args.paths.insert(0, "direct")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scheduler_args = args.scheduler_args.split()
    engine_args: list[str] = []
    t0 = time.monotonic()
    load_before = load_average()
    result = _measure(ap, args, scheduler_args, engine_args)
    result.update(
        machine=machine(),
        cpus=os.cpu_count(),
        python=sys.version.split()[0],
        repeats=args.repeats,
        prefill=args.prefill,
        engine_threads=args.engine_threads,
        scheduler_args=scheduler_args,
        wall_s=time.monotonic() - t0,
        load_before=load_before,
        load_after=load_average(),
        goals_ms={"p50": GOAL_P50_MS, "p99": GOAL_P99_MS, "http_p50": GOAL_HTTP_P50_MS},
    )
    result["plot"] = plot(result, out)
    (out / "hop.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "hop.md").write_text(markdown(result))
    print(f"\nwrote {out}/hop.json, hop.md, {result['plot']}\n")
    print(markdown(result))


if __name__ == "__main__":
    main()

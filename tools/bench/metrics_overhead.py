"""``make bench-metrics``: what the engine's Prometheus metrics cost its throughput.

One native CPU executor in this process, hosting the tiny llama without EOS (every request generates
exactly ``--new-tokens``), runs a fixed batch workload (``--batch`` requests of ``--prompt-tokens``
prompt tokens, run to ``--new-tokens`` each, ``--rounds`` times) in these modes:

- **off**: no ``vllm:*`` hooks and no ``/metrics`` server (what ``--metrics-port -1`` gives an engine);
- **on**: the hooks of ``llmfleet.metrics.engine`` in the executor's loop and a ``/metrics`` server on
  the executor's registry, nobody scraping;
- **scrape 1s**: ``on`` plus a Prometheus-like scraper (a separate process, as Prometheus is) GETting
  ``/metrics`` every second;
- **scrape 0.1s**: the same every 100 ms (a stress variant: ten times a short scrape interval).

Every measured mode runs next to an ``off`` run, in alternating order (off X, X off, ...), ``--pairs``
times; the throughput ratio X / off is taken per pair, and the report gives its median and min-max
spread (the overhead is 1 - ratio). The machine is shared and noisy: the per-pair spread says how far a
single number can be trusted. Beside the end-to-end numbers, the cost of each hook and of one scrape is
timed directly, and the hooks' share of the run is estimated from them (calls per run x cost per call /
run time): an estimate that does not drown in the machine's noise.

Writes ``metrics.json``, ``metrics.md`` and ``metrics.png`` to ``--out``. Nothing is asserted; the
goal of the issue (< 1% of engine throughput) is printed next to the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.metrics.server import start_metrics_server
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import LoadedModel
from prometheus_client import CollectorRegistry, generate_latest

from tools.bench.engine_bench import endless, prompts, request
from tools.toolkit.host import load_average, machine
from tools.toolkit.stats import spread as median_spread

GOAL_OVERHEAD = 0.01
MODES = ("on", "scrape 1s", "scrape 0.1s")
SCRAPE_INTERVAL = {"on": None, "scrape 1s": 1.0, "scrape 0.1s": 0.1}

# the scraper: GET /metrics every interval (keeping to the schedule, as Prometheus does); prints how
# many scrapes it made and their mean duration when stdin closes or it is terminated
SCRAPER = r"""
import signal, sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
n, spent = 0, 0.0
def done(*_):
    print(n, spent, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
nxt = time.monotonic()
while True:
    t = time.monotonic()
    with urllib.request.urlopen(url, timeout=5) as r:
        r.read()
    n += 1
    spent += time.monotonic() - t
    nxt += every
    time.sleep(max(0.0, nxt - time.monotonic()))
"""


class Scraper:
    """A separate process scraping ``url`` every ``every`` seconds while in use."""

    def __init__(self, url: str, every: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, url, str(every)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the scraper did not start")
        self.scrapes = 0
        self.mean_ms = 0.0

    def stop(self) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        parts = out.split()
        if len(parts) == 2:
            self.scrapes = int(parts[0])
            self.mean_ms = 1e3 * float(parts[1]) / max(1, self.scrapes)


async def workload(ex: Executor, model: LoadedModel, batch: list[list[int]], new: int, rounds: int) -> float:
    """Seconds to run ``rounds`` times ``batch`` requests to ``new`` tokens each."""
    t0 = time.perf_counter()
    for k in range(rounds):
        streams = [
            ex.submit(request(model, ids, f"m{k}-{i}-{time.monotonic_ns()}", new))
            for i, ids in enumerate(batch)
        ]
        results = await asyncio.gather(*(s.collect() for s in streams))
        assert all(sum(len(c.token_ids) for c in r) == new for r in results), (
            "every request runs to max_tokens"
        )
    return time.perf_counter() - t0


def worker_cpu_s(ex: Executor) -> float:
    """CPU time of the executor's worker thread (where the hooks run), from the kernel's schedstat (ns):
    unlike wall time, it does not grow while other processes hold the cores."""
    try:
        return int(Path(f"/proc/self/task/{ex.worker_thread_id}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


async def run_mode(
    ex: Executor, mode: str, model: LoadedModel, batch: list[list[int]], args: argparse.Namespace
) -> dict:
    """One run of the workload in ``mode`` (``off`` or one of MODES): tokens/s and scrapes seen."""
    tokens = args.rounds * len(batch) * args.new_tokens
    if mode == "off":
        ex.metrics = None
        cpu0, w0 = time.process_time(), worker_cpu_s(ex)
        dt = await workload(ex, model, batch, args.new_tokens, args.rounds)
        return {
            "tokens_per_s": tokens / dt,
            "cpu_us_per_token": 1e6 * (time.process_time() - cpu0) / tokens,
            "worker_us_per_token": 1e6 * (worker_cpu_s(ex) - w0) / tokens,
        }
    registry = CollectorRegistry(auto_describe=True)
    metrics = EngineMetrics(registry)
    server = start_metrics_server(0, registry=registry)
    assert server is not None
    scraper = Scraper(server.url, SCRAPE_INTERVAL[mode]) if SCRAPE_INTERVAL[mode] else None
    ex.attach_metrics(metrics)
    try:
        cpu0, w0 = time.process_time(), worker_cpu_s(ex)
        dt = await workload(ex, model, batch, args.new_tokens, args.rounds)
        cpu, worker = time.process_time() - cpu0, worker_cpu_s(ex) - w0
    finally:
        ex.metrics = None
        if scraper is not None:
            scraper.stop()
        server.stop()
    out = {
        "tokens_per_s": tokens / dt,
        "cpu_us_per_token": 1e6 * cpu / tokens,
        "worker_us_per_token": 1e6 * worker / tokens,
    }
    if scraper is not None:
        out.update(scrapes=scraper.scrapes, scrape_ms=scraper.mean_ms)
    return out


def spread(values: list[float]) -> dict:
    """Median, min, max and the values themselves."""
    return {**median_spread(values), "values": values}


def time_calls(fn, n: int) -> float:
    """Microseconds per call of ``fn()`` (best of 3 batches of ``n``)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / n


async def hook_costs(
    ex: Executor, model: LoadedModel, batch: list[list[int]], args: argparse.Namespace
) -> dict:
    """The cost of each hook (us per call, on a fresh registry) and of one scrape (ms, while the
    workload runs, so the load collector sees live requests)."""
    m = EngineMetrics(CollectorRegistry(auto_describe=True))
    name, b = model.name, len(batch)
    costs = {
        "first_token_us": time_calls(lambda: m.first_token(name, args.prompt_tokens, 0.01), 20_000),
        "inter_token_us": time_calls(lambda: m.inter_token(name, 0.004), 20_000),
        "tokens_us": time_calls(lambda: m.tokens(name, 1), 20_000),
        "finished_us": time_calls(lambda: m.finished(name, "LENGTH", 0.001, 0.5, True), 20_000),
    }
    if hasattr(m, "decode_step"):  # one call per step for the whole batch (the executor's common path)
        costs["decode_step_us"] = time_calls(lambda: m.decode_step(name, 1.004, {1.0: b}, b), 20_000)
        costs["per_token_us"] = costs["decode_step_us"] / b
    else:  # one inter_token + tokens per token
        costs["per_token_us"] = costs["inter_token_us"] + costs["tokens_us"]
    ex.attach_metrics(m)
    task = asyncio.ensure_future(workload(ex, model, batch, args.new_tokens, args.rounds))
    await asyncio.sleep(0.2)
    spent, n = 0.0, 0
    while not task.done() and n < 30:
        t0 = time.perf_counter()
        generate_latest(m.registry)
        spent += time.perf_counter() - t0
        n += 1
        await asyncio.sleep(0.02)
    costs["scrape_ms"] = 1e3 * spent / max(1, n)
    costs["scrape_bytes"] = len(generate_latest(m.registry))
    await task
    ex.metrics = None
    return costs


def estimate(costs: dict, tokens_per_s: float, args: argparse.Namespace) -> dict:
    """The hooks' share of the executor's time, from their cost per call and the calls per second."""
    requests_per_s = tokens_per_s / args.new_tokens
    hooks_us_per_s = tokens_per_s * costs["per_token_us"] + requests_per_s * (
        costs["first_token_us"] + costs["finished_us"]
    )
    return {
        "hooks_share": hooks_us_per_s / 1e6,
        "scrape_share_1s": costs["scrape_ms"] / 1e3 / 1.0,
        "scrape_share_0.1s": costs["scrape_ms"] / 1e3 / 0.1,
    }


@dataclass
class Pairs:
    """Every off/X pair of each mode, with its ratios: throughput, CPU and worker CPU per token."""

    runs: dict[str, list[dict]] = field(default_factory=lambda: {m: [] for m in MODES})
    ratios: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    cpu_ratios: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    worker_ratios: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})

    def add(self, mode: str, order: tuple[str, str], got: dict[str, dict]) -> tuple[float, float, float]:
        """Record one pair; returns its (throughput, CPU, worker CPU) ratios X / off."""
        ratio = got[mode]["tokens_per_s"] / got["off"]["tokens_per_s"]
        cpu_ratio = got[mode]["cpu_us_per_token"] / got["off"]["cpu_us_per_token"]
        worker_ratio = got[mode]["worker_us_per_token"] / got["off"]["worker_us_per_token"]
        self.runs[mode].append(
            {
                "off": got["off"],
                mode: got[mode],
                "order": list(order),
                "ratio": ratio,
                "cpu_ratio": cpu_ratio,
                "worker_ratio": worker_ratio,
            }
        )
        self.ratios[mode].append(ratio)
        self.cpu_ratios[mode].append(cpu_ratio)
        self.worker_ratios[mode].append(worker_ratio)
        return ratio, cpu_ratio, worker_ratio

    def summary(self, m: str) -> dict:
        """The report's entry for mode ``m``."""
        runs = self.runs[m]
        return {
            "ratio": spread(self.ratios[m]),
            "overhead": spread([1 - r for r in self.ratios[m]]),
            # best run vs best run: the machine's noise only ever slows a run down
            "best_overhead": 1
            - max(r[m]["tokens_per_s"] for r in runs) / max(r["off"]["tokens_per_s"] for r in runs),
            # this process's CPU time per token (all its threads: executor, event loop, /metrics)
            "cpu_overhead": spread([r - 1 for r in self.cpu_ratios[m]]),
            # the executor worker thread's CPU time per token (the hooks' thread) vs off
            "worker_cpu_overhead": spread([r - 1 for r in self.worker_ratios[m]]),
            "runs": runs,
        }


async def run_pairs(
    ex: Executor, model: LoadedModel, batch: list[list[int]], args: argparse.Namespace
) -> Pairs:
    """``--pairs`` rounds of an off/X pair per mode, the order alternating (off X, X off, ...)."""
    pairs = Pairs()
    for i in range(args.pairs):
        for j, mode in enumerate(MODES):
            order = ("off", mode) if (i + j) % 2 == 0 else (mode, "off")
            got = {m: await run_mode(ex, m, model, batch, args) for m in order}
            ratio, cpu_ratio, worker_ratio = pairs.add(mode, order, got)
            extra = f", {got[mode]['scrapes']} scrapes" if "scrapes" in got[mode] else ""
            print(
                f"  pair {i + 1}/{args.pairs} {mode:>11}: off {got['off']['tokens_per_s']:7.0f} tok/s, "
                f"{mode} {got[mode]['tokens_per_s']:7.0f} tok/s, overhead {100 * (1 - ratio):+5.2f}%; "
                f"CPU/token {100 * (cpu_ratio - 1):+5.2f}%, worker CPU/token {100 * (worker_ratio - 1):+5.2f}%{extra}",
                flush=True,
            )
    return pairs


async def main_async(args: argparse.Namespace) -> dict:
    models = Path(args.models_dir or tempfile.mkdtemp(prefix="llmfleet-metrics-"))
    llama = endless("tiny://llama", models, "tiny-llama")
    torch.set_num_threads(args.threads)
    ex = Executor(
        ExecutorConfig(
            cache_dir=models, max_batch_requests=args.batch, allow_download=False, num_threads=args.threads
        )
    )
    ex.host.add_loaded(llama)
    batch = prompts(args.batch, args.prompt_tokens, llama.vocab_size, seed=1)
    try:
        await workload(ex, llama, batch, 8, 1)  # warm-up
        await run_mode(ex, "off", llama, batch, args)
        costs = await hook_costs(ex, llama, batch, args)
        print(
            "hook costs (us/call): "
            + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in costs.items() if k.endswith("_us"))
            + f"; one scrape {costs['scrape_ms']:.2f} ms ({costs['scrape_bytes']} bytes)",
            flush=True,
        )
        pairs = await run_pairs(ex, llama, batch, args)
    finally:
        ex.close()
    off_tps = statistics.median(r["off"]["tokens_per_s"] for m in MODES for r in pairs.runs[m])
    return {
        "machine": machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": args.threads,
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "pairs": args.pairs,
        "goal_overhead": GOAL_OVERHEAD,
        "off_tokens_per_s": off_tps,
        "hook_costs": costs,
        "estimate": estimate(costs, off_tps, args),
        "modes": {m: pairs.summary(m) for m in MODES},
    }


def markdown(result: dict) -> str:
    goal = 100 * result["goal_overhead"]
    lines = [
        "# Engine metrics overhead",
        "",
        f"{result['machine']} · {result['cpus']} CPUs · Python {result['python']} · torch {result['torch']} · "
        f"{result['threads']} intra-op thread(s) · batch {result['batch']} × {result['prompt_tokens']} prompt + "
        f"{result['new_tokens']} new tokens × {result['rounds']} rounds per run · {result['pairs']} pairs per mode · "
        f"wall {result['wall_s']:.0f} s · load average before / after {result['load_before']} / {result['load_after']}",
        "",
        "Native executor throughput with the `vllm:*` metrics vs without (`off`: no hooks, no `/metrics`), "
        "each run next to an `off` run in alternating order. Overhead = 1 − X/off per pair: median "
        f"(min–max). Goal: < {goal:g}%. Also the best X run against the best off run (other work on the "
        "machine only slows runs down), this process's CPU time per token (all its threads) and its "
        "executor worker thread's (where the hooks run; kernel schedstat) vs off, per pair: median "
        "(min–max). CPU time grows far less than wall time when other processes hold the cores.",
        "",
        "| mode | off tok/s (median) | X tok/s (median) | **overhead** | goal met | best X vs best off | CPU time per token vs off | worker thread CPU per token vs off |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for m, d in result["modes"].items():
        o, c, w = d["overhead"], d["cpu_overhead"], d["worker_cpu_overhead"]
        off = statistics.median(r["off"]["tokens_per_s"] for r in d["runs"])
        x = statistics.median(r[m]["tokens_per_s"] for r in d["runs"])
        lines.append(
            f"| {m} | {off:.0f} | {x:.0f} | **{100 * o['median']:+.2f}%** "
            f"({100 * o['min']:+.2f}% – {100 * o['max']:+.2f}%) | {'yes' if o['median'] < result['goal_overhead'] else 'no'} | "
            f"{100 * d['best_overhead']:+.2f}% | "
            f"{100 * c['median']:+.2f}% ({100 * c['min']:+.2f}% – {100 * c['max']:+.2f}%) | "
            f"{100 * w['median']:+.2f}% ({100 * w['min']:+.2f}% – {100 * w['max']:+.2f}%) |"
        )
    c, e = result["hook_costs"], result["estimate"]
    lines += [
        "",
        "Timed directly (not drowned in the machine's noise): each hook in µs per call — "
        + ", ".join(f"`{k[:-3]}` {v:.2f}" for k, v in c.items() if k.endswith("_us"))
        + f"; one scrape {c['scrape_ms']:.2f} ms ({c['scrape_bytes']} bytes) in the engine process.",
        f"Estimated share of the engine's time at {result['off_tokens_per_s']:.0f} tok/s: hooks "
        f"{100 * e['hooks_share']:.2f}%, scraping every 1 s {100 * e['scrape_share_1s']:.3f}%, every 0.1 s "
        f"{100 * e['scrape_share_0.1s']:.2f}%.",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    modes = list(result["modes"])
    for x, m in enumerate(modes):
        vals = [100 * v for v in result["modes"][m]["overhead"]["values"]]
        ax.scatter(
            [x - 0.1] * len(vals), vals, color="grey", s=14, zorder=2, label="wall" if x == 0 else None
        )
        ax.plot([x - 0.3, x + 0.05], [statistics.median(vals)] * 2, color="C0", linewidth=2, zorder=3)
        worker = result["modes"][m].get("worker_cpu_overhead")
        if worker:  # the executor thread's CPU time per token: far less noisy
            wv = [100 * v for v in worker["values"]]
            ax.scatter([x + 0.1] * len(wv), wv, color="C2", marker="x", s=14, zorder=2,
                       label="worker CPU" if x == 0 else None)  # fmt: skip
            ax.plot([x + 0.05, x + 0.3], [statistics.median(wv)] * 2, color="C2", linewidth=2, zorder=3)
    ax.axhline(100 * result["goal_overhead"], color="red", linestyle="--", linewidth=1, label="goal")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.axhline(
        100 * result["estimate"]["hooks_share"], color="C1", linestyle=":", linewidth=1, label="hooks (timed)"
    )
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("throughput overhead vs off (%)")
    ax.set_title("Engine metrics overhead per pair (lines: medians)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "metrics.png", dpi=120)
    plt.close(fig)
    return "metrics.png"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".bench/metrics", help="output directory")
    ap.add_argument("--pairs", type=int, default=15, help="off/X pairs per mode")
    ap.add_argument("--batch", type=int, default=32, help="requests run together")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8, help="batches per run (about 1 s here)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the engine")
    ap.add_argument(
        "--models-dir", default=None, help="where the tiny checkpoint is built (default: a temp dir)"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    load_before = load_average()
    result = asyncio.run(main_async(args))
    result.update(wall_s=time.monotonic() - t0, load_before=load_before, load_after=load_average())
    result["plot"] = plot(result, out)
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "metrics.md").write_text(markdown(result))
    print(f"\nwrote {out}/metrics.json, metrics.md, {result['plot']}\n")
    print(markdown(result))


if __name__ == "__main__":
    main()

"""``make bench-capacity``: what one scheduler process sustains, and what each request and token
costs it, on the data path (the SDK's ``SubmitMany`` call, one ``GenerateMany`` call per engine).

Setup (one run, one machine):

* ``llmfleet up --emulate 2xA100-80GB``: two emulated A100s (``--backend emulated``: the engine core
  with the cost model's step times, so the engines cost little CPU and what is left is the control
  plane's own cost), both hosting ``emu-7b`` (llama2-7b's costs; ``colocate_all`` placement), one
  service ``cap``.
* ``up``'s scheduler, and a second scheduler process on the same etcd and engines for
  ``--two-processes``.
* Load: ``--generators`` processes, each an asyncio loop with its own SDK client (one ``SubmitMany``
  call), sending an open-loop Poisson stream (offered rate / generators each) for ``--step-s`` seconds
  per step.
* Workloads: ``1tok`` (1-token requests at ``--rate-1tok``), ``64tok`` (64-token streams at
  ``--rate-64tok``: CPU per relayed token), and the ``16tok`` sweep over ``--rates``.

CPU figures are net of each process's idle CPU (measured for ``--idle-s`` before the steps: load
reports, leases, health checks), so a low rate is not charged for the background. Per step: offered and achieved req/s, errors, **hop** = client TTFT − the engine's own TTFT
(``Usage.engine_ttft_s``: what the SDK, the scheduler and two network transits added) p50/p99, CPU
seconds of every process (the scheduler under test, the engines, the generators) per request and per
relayed token. **Sustained**: the highest offered 16-token rate with ≥ 95 % of it completed, no
errors, hop p50 ≤ 3 ms and p99 ≤ 10 ms (the issue's bar).

``--two-processes``: a last sweep with two scheduler processes (the generators split between them)
against one.

First, the ``paths`` arm (``tools/bench/capacity_paths.py``; ``--paths-rounds 0`` leaves it out,
``--only-paths`` runs only it): the SDK, the scheduler's own OpenAI HTTP API (``POST /v1/completions``,
streamed) and the same requests through the OpenAI front (``llmfleet-front --workers
--front-workers``, on the scheduler's multiplexed path), alternating, ``--paths-concurrency``
closed-loop 16-token streams each: scheduler CPU per request, the front's own CPU per request and
requests/s, and the ratios against the goals (≤ 1.5× the SDK's scheduler CPU, ≥ 0.7× its requests/s).

Writes ``report.json``, ``report.md`` and PNGs (hop p50/p99 and scheduler CPU per request vs offered
load) to ``--out`` (default ``.bench/capacity``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import resource
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from llmfleet.client import AsyncClient, Client

from tools.bench import capacity_paths
from tools.bench.local_up import LocalUp, free_port

SERVICE = "cap"
CONFIG = {
    "services": {SERVICE: {"model": "emu-7b", "slo": {"ttft_s": 2.0, "tpot_s": 0.2}, "max_tokens": 16}},
    "models": {"emu-7b": {"source": "emulated://llama2-7b", "dtype": "float16", "sim_model": "llama2-7b"}},
    "placement": {"policy": "colocate_all", "interval_s": 5},
}
PROMPT = "Summarize the following text about fleets of language models serving many users at once"
HOP_P50_MS, HOP_P99_MS = 3.0, 10.0


# ------------------------------------------------------------------------------------- generators
def _generate(address: str, rate: float, duration_s: float, tokens: int, seed: int, q) -> None:
    """(a generator process) Poisson arrivals at ``rate`` for ``duration_s``; puts its results on ``q``."""
    import logging

    logging.getLogger("llmfleet.client").setLevel(logging.ERROR)
    q.put(asyncio.run(_generate_async(address, rate, duration_s, tokens, seed)))


async def _generate_async(
    address: str, rate: float, duration_s: float, tokens: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    rows: list[tuple[float, float, float, int]] = []  # (ttft, engine ttft, latency, tokens)
    errors: list[str] = []
    async with AsyncClient(address, timeout_s=30) as client:
        await client.complete(PROMPT, SERVICE, max_tokens=1)  # open the channel (and the mux call)

        async def one() -> None:
            t0 = time.perf_counter()
            first, n = None, 0
            try:
                async with client.generate(PROMPT, SERVICE, max_tokens=tokens) as stream:
                    async for chunk in stream:
                        if first is None and chunk.token_ids:
                            first = time.perf_counter()
                        n += len(chunk.token_ids)
                u = stream.usage
                assert first is not None and u is not None
                rows.append((first - t0, u.engine_ttft_s, time.perf_counter() - t0, n))
            except Exception as e:  # counted, never fatal
                errors.append(f"{type(e).__name__}: {e}"[:200])

        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        tasks: set[asyncio.Task] = set()
        start = time.perf_counter()
        t = start
        sent = 0
        while True:
            t += rng.expovariate(rate)
            if t - start >= duration_s:
                break
            delay = t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "sent": sent,
        "rows": rows,
        "errors": errors,
        "wall_s": time.perf_counter() - start,
        "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
    }


# -------------------------------------------------------------------------------------------- cluster
def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and its live children (the front's workers)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return out


class Cluster:
    """``llmfleet up --emulate`` plus a second scheduler process (``--two-processes``) and the OpenAI
    front (``front_workers`` processes; 0: none)."""

    def __init__(self, out: Path, gpus: int, hardware: str, front_workers: int = 1) -> None:
        self.up = LocalUp(
            out / "cluster", CONFIG, "--emulate", f"{gpus}x{hardware}", "--schedulers", "1",
            "--http-port", str(free_port()), "--front-workers", "0",
        )  # fmt: skip
        self.extra: list[subprocess.Popen] = []
        self.addresses: dict[str, str] = {}
        self.http = ""  # the first scheduler's OpenAI HTTP API, host:port
        self.front = ""  # the OpenAI front's HTTP API, host:port
        self.front_workers = front_workers
        self.pids: dict[str, int] = {}
        self.idle: dict[str, float] = {}  # CPU seconds per second of each process with no load

    def measure_idle(self, seconds: float) -> dict[str, float]:
        before, front0, t0 = cpu_seconds(self.pids), self.front_cpu(), time.monotonic()
        time.sleep(seconds)
        after, front1, span = cpu_seconds(self.pids), self.front_cpu(), time.monotonic() - t0
        self.idle = {k: (after[k] - before.get(k, after[k])) / span for k in after if k != "front"}
        if "front" in self.pids:
            self.idle["front"] = (front1 - front0) / span
        return self.idle

    def front_cpu(self) -> float:
        """CPU seconds of the front's processes (the parent and its workers)."""
        return tree_cpu_seconds(self.pids["front"]) if "front" in self.pids else 0.0

    def start(self) -> None:
        self.up.start()
        ep = self.up.endpoints
        self.addresses["scheduler"] = ep["scheduler"]["address"]
        self.http = ep["scheduler"]["http"]
        self.pids = {n: e["pid"] for n, e in ep.items() if isinstance(e, dict) and e.get("pid")}
        self._spawn("scheduler-2", psutil.Process(self.pids["scheduler"]).cmdline())
        if self.front_workers:
            self._spawn_front()

    def _spawn_front(self) -> None:
        """``llmfleet-front`` on the cluster's etcd, sending to ``up``'s scheduler."""
        http = free_port()
        script = Path(psutil.Process(self.pids["scheduler"]).cmdline()[0]).parent / "llmfleet-front"
        argv = [
            str(script) if script.exists() else "llmfleet-front",
            "--id", "front", "--port", str(free_port()), "--metrics-port", "-1", "--http-port", str(http),
            "--etcd", self.up.etcd, "--scheduler", self.addresses["scheduler"],
            "--workers", str(self.front_workers), "--log-level", "WARNING",
        ]  # fmt: skip
        log = open(self.up.dir / "front.log", "w")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.extra.append(proc)
        self.pids["front"] = proc.pid
        self.front = f"127.0.0.1:{http}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.front}/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the front at {self.front} is not ready after 60 s (see {self.up.dir}/front.log)")

    def _spawn(self, name: str, argv: list[str]) -> None:
        port = free_port()
        args = list(argv)
        flags = (
            ("--id", name),
            ("--port", str(port)),
            ("--metrics-port", "0"),
            ("--http-port", str(free_port())),
        )
        for flag, value in flags:
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        log = open(self.up.dir / f"{name}.log", "w")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.extra.append(proc)
        self.addresses[name] = f"127.0.0.1:{port}"
        self.pids[name] = proc.pid
        wait_serving(self.addresses[name])

    def stop(self) -> None:
        for p in self.extra:
            p.terminate()
        for p in self.extra:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.up.stop()


def wait_serving(address: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Client(address, timeout_s=10, retries=0) as c:
                c.complete(PROMPT, SERVICE, max_tokens=1)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# ---------------------------------------------------------------------------------------------- steps
def run_step(
    cluster: Cluster,
    targets: list[str],
    rate: float,
    tokens: int,
    duration_s: float,
    generators: int,
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(
            target=_generate,
            args=(cluster.addresses[targets[i % len(targets)]], rate / generators, duration_s,
                  tokens, random.randrange(1 << 30), q),
        )
        for i in range(generators)
    ]  # fmt: skip
    for p in procs:
        p.start()
    time.sleep(1.5)  # the generators import and open their channels before the clock starts
    before, t_before = cpu_seconds(cluster.pids), time.monotonic()
    idle = cluster.idle
    results = [q.get(timeout=duration_s + 180) for _ in procs]
    after = cpu_seconds(cluster.pids)
    for p in procs:
        p.join(30)
    rows = [r for res in results for r in res["rows"]]
    sent = sum(r["sent"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    wall = max(r["wall_s"] for r in results)
    hop = np.array([(ttft - eng) * 1000 for ttft, eng, _, _ in rows if eng > 0]) if rows else np.array([])
    ttft = np.array([r[0] * 1000 for r in rows]) if rows else np.array([])
    n_tokens = sum(r[3] for r in rows)
    span = time.monotonic() - t_before
    # net of each process's idle CPU (load reports, leases, health: measured before the steps)
    used = {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0) - idle.get(k, 0.0) * span) for k in after}
    sched = sum(used.get(t, 0.0) for t in targets)
    engines = sum(v for k, v in used.items() if k.startswith("emu"))
    done = len(rows)
    return {
        "schedulers": len(targets),
        "tokens": tokens,
        "offered_rps": rate,
        "sent": sent,
        "completed": done,
        "achieved_rps": done / wall if wall else 0.0,
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "hop_p50_ms": float(np.percentile(hop, 50)) if hop.size else None,
        "hop_p99_ms": float(np.percentile(hop, 99)) if hop.size else None,
        "ttft_p50_ms": float(np.percentile(ttft, 50)) if ttft.size else None,
        "scheduler_cpu_s": sched,
        "scheduler_cpu_ms_per_req": 1000 * sched / done if done else None,
        "scheduler_cpu_us_per_token": 1e6 * sched / n_tokens if n_tokens else None,
        "engines_cpu_s": engines,
        "generators_cpu_s": sum(r["cpu_s"] for r in results),
        "wall_s": wall,
        "cpu_by_process": used,
    }


def sustained(rows: list[dict]) -> float:
    ok = [
        r["offered_rps"]
        for r in rows
        if r["errors"] == 0
        and r["completed"] >= 0.95 * r["sent"]
        and r["achieved_rps"] >= 0.95 * r["offered_rps"]
        and r["hop_p50_ms"] is not None
        and r["hop_p50_ms"] <= HOP_P50_MS
        and r["hop_p99_ms"] <= HOP_P99_MS
    ]
    return max(ok, default=0.0)


# --------------------------------------------------------------------------------------------- report
def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def markdown(report: dict) -> str:
    lines = [
        "# make bench-capacity",
        "",
        f"Machine: {report['machine']}; {report['cores']} cores. Emulated engines: {report['engines']}.",
        "",
        "| workload | sched. procs | offered req/s | achieved req/s | errors | hop p50 ms | hop p99 ms "
        "| sched. CPU ms/req | sched. CPU µs/token | engines CPU s | generators CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["steps"]:
        lines.append(
            f"| {r['tokens']} tok | {r['schedulers']} | {r['offered_rps']:.0f} | "
            f"{r['achieved_rps']:.0f} | {r['errors']} | {_f(r['hop_p50_ms'])} | {_f(r['hop_p99_ms'])} | "
            f"{_f(r['scheduler_cpu_ms_per_req'], '{:.3f}')} | {_f(r['scheduler_cpu_us_per_token'], '{:.0f}')} | "
            f"{r['engines_cpu_s']:.1f} | {r['generators_cpu_s']:.1f} |"
        )
    lines += ["", "## Sustained 16-token rate (≥ 95 % completed, 0 errors, hop p50 ≤ 3 ms, p99 ≤ 10 ms)", ""]
    for k, v in report["sustained"].items():
        lines.append(f"- {k}: {v:.0f} req/s")
    if "paths" in report:
        lines += capacity_paths.markdown(report["paths"])
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = [r for r in report["steps"] if r["tokens"] == 16]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for procs in (1, 2):
        rows = sorted((r for r in sweep if r["schedulers"] == procs), key=lambda r: r["offered_rps"])
        if not rows:
            continue
        x = [r["offered_rps"] for r in rows]
        label = f"{procs} scheduler proc"
        axes[0].plot(x, [r["hop_p50_ms"] or np.nan for r in rows], "o-", label=f"{label} p50")
        axes[0].plot(x, [r["hop_p99_ms"] or np.nan for r in rows], "x--", label=f"{label} p99")
        axes[1].plot(x, [r["scheduler_cpu_ms_per_req"] or np.nan for r in rows], "o-", label=label)
    axes[0].set(xlabel="offered 16-token req/s", ylabel="hop ms", yscale="log", title="hop vs offered load")
    axes[0].axhline(HOP_P50_MS, color="grey", lw=0.5)
    axes[0].axhline(HOP_P99_MS, color="grey", lw=0.5, ls="--")
    axes[1].set(xlabel="offered 16-token req/s", ylabel="ms CPU / request", title="scheduler CPU per request")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "capacity.png", dpi=120)
    plt.close(fig)


def paths_section(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """The SDK, the HTTP and the front path alternating, ``--paths-rounds`` times (``capacity_paths``)."""
    rounds: list[dict[str, Any]] = []
    paths = [("sdk", cluster.addresses["scheduler"]), ("http", cluster.http)]
    if cluster.front:
        paths.append(("front", cluster.front))
    for _ in range(args.paths_rounds):
        for path, target in paths:
            front = path == "front"
            r = capacity_paths.run_round(
                path, target, SERVICE, PROMPT, 16, args.paths_concurrency, args.paths_requests,
                args.generators, lambda: cpu_seconds({"s": cluster.pids["scheduler"]}).get("s", 0.0),
                cluster.idle.get("scheduler", 0.0), cluster.front_cpu if front else None,
                cluster.idle.get("front", 0.0),
            )  # fmt: skip
            rounds.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "error_examples"}), flush=True)
    section = {
        "concurrency": args.paths_concurrency,
        "tokens": 16,
        "generators": args.generators,
        "rounds": rounds,
        "ratios": capacity_paths.compare(rounds),
    }
    print(json.dumps(section["ratios"]), flush=True)
    return section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".bench/capacity"))
    ap.add_argument("--rates", type=float, nargs="+", default=[50, 100, 200, 300, 400, 600, 800])
    ap.add_argument("--rate-1tok", type=float, default=100.0)
    ap.add_argument("--rate-64tok", type=float, default=50.0)
    ap.add_argument("--step-s", type=float, default=10.0)
    ap.add_argument("--generators", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=10.0, help="idle CPU measured first (subtracted)")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--hardware", default="A100-80GB")
    ap.add_argument("--two-processes", action="store_true", help="also sweep with 2 scheduler processes")
    ap.add_argument("--paths-rounds", type=int, default=3, help="SDK vs HTTP rounds (0: not measured)")
    ap.add_argument("--paths-requests", type=int, default=2000, help="requests per path per round")
    ap.add_argument("--paths-concurrency", type=int, default=100)
    ap.add_argument("--only-paths", action="store_true", help="only the SDK vs HTTP comparison")
    ap.add_argument("--front-workers", type=int, default=1, help="the OpenAI front's processes (0: no front)")
    ap.add_argument("--quick", action="store_true", help="CI size: 3 s steps, rates 20 and 60")
    args = ap.parse_args()
    if args.quick:
        args.rates, args.step_s, args.rate_1tok, args.rate_64tok = [20, 60], 3.0, 20.0, 10.0
        args.idle_s = 3.0
        args.paths_rounds, args.paths_requests = 1, 300
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.out, args.gpus, args.hardware, args.front_workers)
    steps: list[dict] = []
    report: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "cores": os.cpu_count(),
        "engines": f"{args.gpus}x{args.hardware} (emulated)",
        "args": {k: str(v) for k, v in vars(args).items()},
        "steps": steps,
    }

    def write() -> None:
        report["sustained"] = {
            f"{n} scheduler proc": sustained([r for r in steps if r["tokens"] == 16 and r["schedulers"] == n])
            for n in (1, 2)
        }
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "report.md").write_text(markdown(report))

    try:
        cluster.start()
        time.sleep(3)
        report["idle_cpu_per_s"] = cluster.measure_idle(args.idle_s)
        if args.paths_rounds:
            report["paths"] = paths_section(cluster, args)
            write()
        plan = (
            []
            if args.only_paths
            else [(1, args.rate_1tok), (64, args.rate_64tok), *[(16, r) for r in args.rates]]
        )
        for tokens, rate in plan:
            r = run_step(cluster, ["scheduler"], rate, tokens, args.step_s, args.generators)
            steps.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "cpu_by_process"}), flush=True)
            write()
        if args.two_processes and not args.only_paths:
            for rate in args.rates:
                r = run_step(
                    cluster, ["scheduler", "scheduler-2"], rate, 16, args.step_s, max(2, args.generators)
                )
                steps.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "cpu_by_process"}), flush=True)
                write()
    finally:
        cluster.stop()
    write()
    plot(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Requests wait for capacity, each scenario against a scheduler that does not wait in the same run
(``make bench-burst``): .bench/burst/ (report.json, report.md, PNGs).

The arm "today" is a scheduler that does not wait: ``scheduler: {binding: early, cold_start: false,
ready_when: started}`` in the cluster config and ``llmfleet up --ready-timeout 0``. The arm "new" is
the shipped default (late binding, cold starts held, ready = servable). Both arms run the shipped
``deploy/local/cluster.yaml`` (aladdin placement every 5 s, three CPU engines), changing only that.

Scenarios (``--only``):

* ``cold`` — ``llmfleet apply -f`` of a new service on a model no engine hosts (``tiny://mistral``),
  then 20 SDK requests at once (the SDK's default three retries): failures, and time to first token
  against the model's load time (apply → an engine reports it loaded).
* ``after_up`` — 200 requests sent at uniformly random times in the first 10 s after "llmfleet is up"
  (``endpoints.json`` written): failures.
* ``burst`` — 1,000 concurrent 48-token SDK requests to ``chat`` once the cluster is idle: the share
  each engine served, throughput, p50/p99 latency, errors, and the engines hosting ``chat`` over time.
  The CPU engines share this machine's cores, so throughput cannot grow with engines here.
* ``emulated`` — the same burst on emulated GPUs (``--emulate``; default three A100-80GB, then three
  L4), chat on llama2-7b, summarize on opt-6.7b: the goal is ≥ 1.8× the throughput and ≤ 0.6× the p99
  of early binding. The scheduler's CPU over the burst is recorded: it relays every token, so on fast
  GPUs it, not the engines, can bound the throughput (the L4 pool keeps the engines the bottleneck).
  ``llmfleet.sim`` runs the same burst (same services, placement, initial plan, binding, tp-1 engines)
  and is compared: engines hosting chat over time, and p50 latency (goal: within 15 %).
  ``--hetero SEED``: the emulated burst is of mixed lengths instead (log-normal prompts around 100
  tokens, outputs around 60, drawn with SEED; :func:`heterogeneous`, as ``burst_sim_factors --hetero``
  draws them), the same rows live and simulated.

Each figure is from one run on this machine (named in the report); ratios are taken within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import platform
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml
from llmfleet.client import AsyncClient, Client, LlmfleetError
from llmfleet.config import ClusterConfig
from llmfleet.policies.placement import InstancePlan
from llmfleet.sim.run import PolicyBundle, simulate
from llmfleet.sim.spec import ClusterSpec, SimSpec, from_cluster_config
from llmfleet.workload import Workload, WorkloadRequest

from tools.bench.burst_bench_report import markdown, plot
from tools.bench.local_up import ROOT, LocalUp

DEFAULT_CONFIG = ROOT / "deploy" / "local" / "cluster.yaml"
TODAY = {"binding": "early", "cold_start": False, "ready_when": "started"}
ARMS = ("today", "new")
BURST_ARMS = (*ARMS, "move_queued")  # the alternative: bind early, then move queued requests
QA = """
services:
  qa:
    model: tiny-mistral
    slo: {ttft_s: 3.0, tpot_s: 0.3}
    max_tokens: 16
models:
  tiny-mistral: {source: "tiny://mistral"}
"""
PROMPT = "Summarize the following text about fleets of language models serving many users at once"
EMULATED_MODELS = {
    "tiny-llama": {"source": "emulated://llama2-7b", "dtype": "float16", "sim_model": "llama2-7b"},
    "tiny-qwen2": {"source": "emulated://opt-6.7b", "dtype": "float16", "sim_model": "opt-6.7b"},
}


def arm_config(base: dict, arm: str) -> tuple[dict, list[str]]:
    """The cluster config and extra ``up`` flags of one arm."""
    cfg = copy.deepcopy(base)
    if arm == "today":
        cfg["scheduler"] = {**cfg.get("scheduler", {}), **TODAY}
        return cfg, ["--ready-timeout", "0"]
    if arm == "move_queued":
        cfg["scheduler"] = {**cfg.get("scheduler", {}), "binding": "early", "move_queued": True}
    return cfg, []


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


async def send_all(
    address: str,
    service: str,
    delays: list[float],
    max_tokens: int,
    prompt: str = PROMPT,
    rows: list[tuple[int, int]] | None = None,
) -> list[dict]:
    """One SDK request per delay (seconds from now), concurrently; each one's outcome. ``rows``: each
    request's (prompt, output) tokens (:func:`prompt_of` words, ``max_tokens`` its output) instead."""

    async with AsyncClient(address, timeout_s=600) as client:

        async def one(i: int, delay: float) -> dict:
            await asyncio.sleep(delay)
            text, cap = (prompt_of(rows[i][0], i), rows[i][1]) if rows else (f"{prompt} {i}", max_tokens)
            t0 = time.monotonic()
            try:
                r = await client.complete(text, service=service, max_tokens=cap)
            except LlmfleetError as e:
                return {"ok": False, "error": f"{type(e).__name__}: {e}"[:300], "sent": t0}
            u = r.usage
            return {
                "ok": True, "sent": t0, "done": time.monotonic(), "engine": u.engine_id,
                "tokens": u.completion_tokens, "ttft_s": u.ttft_s, "latency_s": u.latency_s,
            }  # fmt: skip

        return list(await asyncio.gather(*(one(i, d) for i, d in enumerate(delays))))


def prompt_of(tokens: int, i: int) -> str:
    """A prompt of ``tokens`` tokens for the emulated engines' word-level tokenizer (one per word),
    starting with the request's number, so that no two share a prefix block (the simulator's requests
    carry no content, so none of its prompts are found cached)."""
    words = PROMPT.split()
    return " ".join([str(i), *(words[k % len(words)] for k in range(max(0, tokens - 1)))])


def identical(n: int) -> list[tuple[int, int]]:
    """The burst's ``n`` identical requests: the prompt and its number, 48 output tokens."""
    return [(len(PROMPT.split()) + 1, 48)] * n


def heterogeneous(seed: int, n: int = 1000) -> list[tuple[int, int]]:
    """``n`` requests of mixed lengths: log-normal prompts around 100 tokens (4-1,000) and outputs
    around 60 (4-400), drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(np.log(100), 0.8, n), 4, 1000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(60), 0.8, n), 4, 400).astype(int)
    return list(zip(prompts.tolist(), outputs.tolist(), strict=True))


def outcome(results: list[dict]) -> dict[str, Any]:
    ok = [r for r in results if r["ok"]]
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            key = r["error"].split(":")[0] + ": " + r["error"].split(":", 2)[-1].strip()[:120]
            errors[key] = errors.get(key, 0) + 1
    lat = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok]
    per: dict[str, int] = {}
    for r in ok:
        per[r["engine"]] = per.get(r["engine"], 0) + 1
    out: dict[str, Any] = {
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok), "errors": errors,
        "latency_p50_s": pct(lat, 50), "latency_p99_s": pct(lat, 99),
        "ttft_p50_s": pct(ttft, 50), "ttft_max_s": max(ttft) if ttft else None, "per_engine": per,
    }  # fmt: skip
    if ok:
        span = max(r["done"] for r in ok) - min(r["sent"] for r in results)
        out["wall_s"] = span
        out["tokens_per_s"] = sum(r["tokens"] for r in ok) / span
        out["max_engine_share"] = max(per.values()) / len(ok)
    return out


class HostWatch:
    """Engines hosting ``service``'s model over time (ListServices every ``period_s``), in a thread."""

    def __init__(self, address: str, service: str, period_s: float = 0.5) -> None:
        self.address, self.service, self.period_s = address, service, period_s
        self.samples: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, t0: float) -> HostWatch:
        self.t0 = t0
        self._thread.start()
        return self

    def _run(self) -> None:
        with Client(self.address, timeout_s=5) as client:
            while not self._stop.is_set():
                try:
                    info = {s.name: s for s in client.list_services()}.get(self.service)
                    engines = sorted(info.engines) if info is not None else []
                    self.samples.append((time.monotonic() - self.t0, engines))
                except Exception:  # a slow answer under load: skip this sample
                    pass
                self._stop.wait(self.period_s)

    def stop(self) -> list[tuple[float, list[str]]]:
        self._stop.set()
        self._thread.join(10)
        return self.samples


def wait_loaded(up: LocalUp, services: list[str], timeout_s: float = 300.0) -> float:
    """Seconds until every one of ``services`` has an engine with its model loaded."""

    t0 = time.monotonic()
    with Client(up.scheduler, timeout_s=5) as client:
        while time.monotonic() - t0 < timeout_s:
            try:
                info = {s.name: s for s in client.list_services()}
                if all(info.get(s) is not None and info[s].engines for s in services):
                    return time.monotonic() - t0
            except Exception:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{services} not loaded after {timeout_s}s")


# ------------------------------------------------------------------------------------------ scenarios
def bench_cold(out: Path, base: dict, arm: str) -> dict:
    cfg, args = arm_config(base, arm)
    up = LocalUp(out / f"cold-{arm}", cfg, *args)
    up.start()
    try:
        wait_loaded(up, sorted(cfg["services"]))
        f = up.dir / "qa.yaml"
        f.write_text(QA)
        applied = up.cli("apply", "-f", str(f))
        if applied.returncode != 0:
            raise RuntimeError(applied.stdout + applied.stderr)
        loaded: dict[str, float] = {}  # seconds from the requests' sending until an engine has the model
        watcher = threading.Thread(target=lambda: loaded.update(s=wait_loaded(up, ["qa"])), daemon=True)
        watcher.start()
        results = asyncio.run(send_all(up.scheduler, "qa", [0.0] * 20, 8))
        watcher.join(300)
        report = outcome(results)
        report["model_loaded_after_s"] = loaded.get("s")
        return report
    finally:
        up.stop()


def bench_after_up(out: Path, base: dict, arm: str, n: int = 200, seed: int = 0) -> dict:
    cfg, args = arm_config(base, arm)
    up = LocalUp(out / f"after-up-{arm}", cfg, *args)
    t0 = up.start()
    try:
        up_s = time.monotonic() - t0
        rng = random.Random(seed)
        delays = sorted(rng.uniform(0.0, 10.0) for _ in range(n))
        services = sorted(cfg["services"])

        async def every_service() -> list[dict]:  # the requests alternate between the services
            parts = await asyncio.gather(
                *(send_all(up.scheduler, s, delays[k :: len(services)], 8) for k, s in enumerate(services))
            )
            return [r for part in parts for r in part]

        results = asyncio.run(every_service())
        report = outcome(results)
        report["up_after_s"] = up_s
        return report
    finally:
        up.stop()


def bench_burst(
    out: Path,
    base: dict,
    arm: str,
    n: int,
    emulate: str | None = None,
    rows: list[tuple[int, int]] | None = None,
) -> dict:
    """The burst of ``n`` identical requests, or of ``rows`` ((prompt, output) tokens) when given."""
    cfg, args = arm_config(base, arm)
    if emulate:
        args += ["--emulate", emulate]
    up = LocalUp(out / f"{f'emulated-{emulate}' if emulate else 'burst'}-{arm}", cfg, *args)
    up.start()
    try:
        wait_loaded(up, sorted(cfg["services"]))
        time.sleep(2.0)  # idle: the placement leader has planned at zero load
        before = {s: list(h) for s, h in _hosts(up).items()}
        sched = psutil.Process(up.endpoints["scheduler"]["pid"])
        cpu0 = sum(sched.cpu_times()[:2])
        lag0 = emulated_lag(up)
        t0 = time.monotonic()
        watch = HostWatch(up.scheduler, "chat").start(t0)
        delays = [0.0] * (len(rows) if rows is not None else n)
        results = asyncio.run(send_all(up.scheduler, "chat", delays, 48, rows=rows))
        timeline = watch.stop()
        # each request's times (from the burst's start), for a look at how each engine's batches formed
        (up.dir / "requests.json").write_text(
            json.dumps([{**r, "sent": r["sent"] - t0, "done": r.get("done", t0) - t0} for r in results])
            + "\n"
        )
        report = outcome(results)
        # the scheduler relays every token: its CPU over the burst against the burst's length shows
        # whether it (not the engines) bounds the throughput
        report["scheduler_cpu_s"] = sum(sched.cpu_times()[:2]) - cpu0
        if lag0 is not None:  # emulated engines: steps that ended late (this machine's CPU was short)
            lag1 = emulated_lag(up) or lag0
            report["emulated_lag"] = {k: lag1[k] - lag0[k] for k in lag0}
        report["hosts_before"] = before
        report["chat_engines_over_time"] = [(round(t, 2), len(e)) for t, e in timeline]
        report["placement_decisions"] = [
            line.split("placement decision", 1)[1].strip()[:300]
            for line in up.log_text("placement").splitlines()
            if "placement decision" in line
        ][-10:]
        return report
    finally:
        up.stop()


def emulated_lag(up: LocalUp) -> dict[str, float] | None:
    """Summed over the emulated engines: paced waits, those that ended late, and the lateness in
    seconds (``llmfleet_emulated_*``); None when the cluster has no emulated engine."""
    import urllib.request

    names = {"llmfleet_emulated_waits_total": "waits", "llmfleet_emulated_late_total": "late",
             "llmfleet_emulated_lag_seconds_total": "lag_s"}  # fmt: skip
    out = dict.fromkeys(names.values(), 0.0)
    rows = [r for n, r in up.endpoints.items() if n.startswith("emu") and r.get("metrics")]
    if not rows:
        return None
    for row in rows:
        host, ports = row["metrics"].rsplit(":", 1)
        lo, _, hi = ports.partition("..")
        for port in range(int(lo), int(hi or lo) + 1):
            text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name in names:
                    out[names[name]] += float(value)
    return out


def _hosts(up: LocalUp) -> dict[str, list[str]]:
    with Client(up.scheduler, timeout_s=5) as client:
        return {s.name: sorted(s.engines) for s in client.list_services()}


def burst_sim(cfg: dict, pool: str, plan: Any, rows: list[tuple[int, int]]) -> Any:
    """The burst ``rows`` ((prompt, output) tokens, all at t = 0, to ``chat``) in the simulator: the
    config's services and policy sections as the live fleet runs them, ``pool`` (``3xL4``) as tp-1
    engines, starting from ``plan`` (InstancePlans); the simulation's result."""

    config = ClusterConfig.model_validate(cfg)
    services, engine = from_cluster_config(config)
    cluster = ClusterSpec.parse(pool)
    spec = SimSpec(ClusterSpec(cluster.count, cluster.hw, engine_gpus=1), services, engine)  # tp-1 engines
    policies = config.policies()  # the cluster file's own sections, as the live fleet runs them
    bundle = PolicyBundle("live", policies.placement, "round_robin", "fcfs", capacity=policies.capacity)
    chat = config.models[config.services["chat"].model].sim_model
    work = Workload(tuple(WorkloadRequest(f"r{i}", 0.0, p, o, "chat", chat) for i, (p, o) in enumerate(rows)))
    return simulate(spec, work, bundle, plan=plan, samples=50).result


def simulate_burst(
    cfg: dict, gpus: int, hardware: str, hosts: dict[str, list[str]], rows: list[tuple[int, int]]
) -> dict:
    """The emulated burst ``rows`` in the simulator: the config's services and placement, the live
    initial plan (which models each engine hosted before the burst), late binding as configured."""

    config = ClusterConfig.model_validate(cfg)
    catalog = {name: config.models[s.model].sim_model for name, s in config.services.items()}
    by_engine: dict[str, list[str]] = {}
    for svc, engines in hosts.items():
        for e in engines:
            by_engine.setdefault(e, []).append(catalog[svc])
    plan = [InstancePlan(e, tuple(sorted(ms))) for e, ms in sorted(by_engine.items())]
    result = burst_sim(cfg, f"{gpus}x{hardware}", plan, rows)
    lat = [r.latency_s for r in result.records if r.done]
    over_time = [(round(d["t"], 2), _count(d["plan"], catalog["chat"])) for d in result.placement]
    return {
        "latency_p50_s": pct(lat, 50), "latency_p99_s": pct(lat, 99), "completed": len(lat),
        "chat_engines_over_time": [(0.0, len(hosts.get("chat", []))), *over_time],
        "decisions": [{k: d[k] for k in ("t", "plan", "status")} for d in result.placement],
    }  # fmt: skip


def _count(summary: str, model: str) -> int:
    """Instances hosting ``model`` in a plan summary (``2×tp1[llama2-7b] + tp1[llama2-13b]``)."""
    n = 0
    for m in re.finditer(r"(?:(\d+)×)?tp\d+\[([^\]]*)\]", summary):
        if model in m.group(2).split("+"):
            n += int(m.group(1) or 1)
    return n


# ----------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".bench" / "burst")
    ap.add_argument("--only", nargs="*", choices=("cold", "after_up", "burst", "emulated"), default=None)
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--burst", type=int, default=1000, help="concurrent requests of the burst (default 1000)")
    ap.add_argument(
        "--emulate", nargs="+", default=["3xA100-80GB", "3xL4"],
        help="emulated pools of the emulated burst, one scenario each (default 3xA100-80GB 3xL4)",
    )  # fmt: skip
    ap.add_argument(
        "--arms", nargs="+", choices=BURST_ARMS, default=None,
        help="run only these arms (default: all; a ratio needs today's arm in the same run)",
    )  # fmt: skip
    ap.add_argument(
        "--hetero", type=int, default=None, metavar="SEED",
        help="emulated: a burst of mixed lengths (log-normal, drawn with SEED) instead of identical requests",
    )  # fmt: skip
    args = ap.parse_args(argv)
    rows = heterogeneous(args.hetero, args.burst) if args.hetero is not None else identical(args.burst)
    only = set(args.only or ("cold", "after_up", "burst", "emulated"))
    args.out.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.config.read_text())
    report: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
        "config": str(args.config),
        "burst_size": args.burst,
        "emulated_lengths": f"heterogeneous, seed {args.hetero}" if args.hetero is not None else "identical",
    }
    logging.getLogger("llmfleet.client").setLevel(logging.ERROR)  # the SDK's retry notes
    scenarios = [n for n in ("cold", "after_up", "burst") if n in only]
    scenarios += [f"emulated-{pool}" for pool in args.emulate] if "emulated" in only else []
    for name in scenarios:
        report[name] = {}
        for arm in ARMS if name in ("cold", "after_up") else BURST_ARMS:
            if args.arms is not None and arm not in args.arms:
                continue
            print(f"[{name}] {arm} ...", flush=True)
            if name == "cold":
                r = bench_cold(args.out, base, arm)
            elif name == "after_up":
                r = bench_after_up(args.out, base, arm)
            elif name == "burst":
                r = bench_burst(args.out, base, arm, args.burst)
            else:
                pool = name.removeprefix("emulated-")
                emu = {**copy.deepcopy(base), "models": EMULATED_MODELS}
                r = bench_burst(args.out, emu, arm, args.burst, emulate=pool, rows=rows)
                if arm == "new":
                    count, hw = pool.split("x", 1)
                    r["sim"] = simulate_burst(
                        arm_config(emu, arm)[0], int(count), hw, r["hosts_before"], rows
                    )
            report[name][arm] = r
            print(json.dumps({k: v for k, v in r.items() if k != "placement_decisions"}, default=str)[:800])
        (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "report.md").write_text(markdown(report))
    plot(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

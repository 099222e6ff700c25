"""The live sections of ``make bench-prefix``: the multi-turn workload on an emulated fleet beside
``llmfleet sim`` (``emulated``), and on native CPU engines serving a small random llama (``native``)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from llmfleet.cli.compare import engine_ttft

from tools.bench.engine_bench import medium_llama
from tools.bench.fleet_common import BIN, Fleet, FleetSpec, compare, run_load, run_sim
from tools.bench.local_up import LocalUp
from tools.bench.prefix_bench_common import (
    PLACEMENT,
    Conversations,
    Setup,
    Users,
    pick_loads,
    ratio,
    window_rates,
)
from tools.bench.prefix_bench_metrics import Sampler, metrics_addresses
from tools.bench.prefix_bench_sim import CANDIDATE, REFERENCE, fleet_spec, sweep


def live_figures(report: Path, prefix: dict[str, float] | None = None) -> dict[str, Any]:
    """TTFT, throughput and failures of a ``llmfleet load`` (or sim) report.json, with the engines'
    prefix-cache counters when given. The engines' own TTFT (``engine_ttft_*``, from each engine's
    receipt of the request) is a live report's ``live.engine_ttft_s`` and a simulated report's TTFT (the
    simulator hands each request to its engine at its arrival)."""
    if not report.exists():
        return {"error": f"no report at {report}"}
    run = json.loads(report.read_text())["runs"][0]
    o, cl = run["overall"], run["cluster"]
    ttft = o.get("ttft_s") or {}
    doc = {
        "requests": o["requests"],
        "completed": o["completed"],
        "failed": o["failed"],
        "completed_rps": _r(cl.get("throughput_rps")),
        "output_tokens_per_s": _r(cl.get("throughput_tokens_per_s"), 1),
        "ttft_mean_s": _r(ttft.get("mean"), 4),
        "ttft_p50_s": _r(ttft.get("p50"), 4),
        "ttft_p99_s": _r(ttft.get("p99"), 4),
        "engine_ttft_mean_s": _r(engine_ttft("mean")(run), 4),
        "engine_ttft_p50_s": _r(engine_ttft("p50")(run), 4),
        "slo_attainment": _r((o.get("slo") or {}).get("aladdin"), 4),
    }
    if prefix:
        q, h = prefix["prefix_cache_queries"], prefix["prefix_cache_hits"]
        doc.update(prefix_queries=int(q), prefix_hits=int(h), hit_rate=_r(h / q, 4) if q else None)
    return doc


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(float(v), digits)


def emulated_run(
    out: Path,
    spec: FleetSpec,
    setup: Setup,
    workload: list[str],
    window: tuple[float, float],
    timeout_s: float,
) -> dict:
    """One setup live on the emulated fleet ``spec`` (``llmfleet load`` of the ``workload`` flags) and in
    ``llmfleet sim`` on the same workload and cluster file, compared by ``llmfleet compare`` (figures
    and requests paired); throughput in ``window``; the emulated GPUs' pacing after the load."""
    fleet = Fleet(out / setup.slug, spec)
    fleet.start()
    try:
        with Sampler(metrics_addresses(fleet.endpoints), window) as sampler:
            load = run_load(fleet, workload, fleet.dir / "live", timeout_s)
        pacing = fleet.emulated_pacing()
    finally:
        fleet.stop()
    sim_dir = fleet.dir / "sim"
    extra = ["--dispatch", setup.dispatch]
    sim_rc = run_sim(spec, fleet.config, workload, "fcfs-jsq", sim_dir, extra)
    cmp = compare(sim_dir, fleet.dir / "live", fleet.dir / "compare")
    live = live_figures(fleet.dir / "live" / "report.json", sampler.last())
    live["window_tokens_per_s"] = _r(sampler.window_tokens_per_s(), 1)
    sim = live_figures(sim_dir / "report.json")
    sim["window_tokens_per_s"], sim["window_offered_tokens_per_s"] = sim_window(sim_dir, window)
    row = {
        "load_rc": load.returncode,
        "sim_rc": sim_rc,
        "live": live,
        "sim": sim,
        "live_over_sim": {k: ratio(live.get(k), sim.get(k)) for k in LIVE_VS_SIM},
        # each request live against itself simulated (llmfleet compare's pairs), and the emulated GPUs'
        # pacing: how late their steps ran against the simulated clock
        "per_request": cmp.get("per_request"),
        "pacing": pacing,
        "compare": cmp.get("text", ""),
    }
    print(json.dumps({"setup": setup.name, **{k: v for k, v in row.items() if k != "compare"}}), flush=True)
    return row


LIVE_VS_SIM = (
    "ttft_p50_s", "output_tokens_per_s", "window_tokens_per_s", "ttft_mean_s", "engine_ttft_p50_s",
    "engine_ttft_mean_s",
)  # fmt: skip


def sim_window(sim_dir: Path, window: tuple[float, float]) -> tuple[float | None, float | None]:
    """Output tokens/s in the window, made and offered, from ``llmfleet sim --records``' requests.jsonl."""
    path = sim_dir / "requests.jsonl"
    if not path.exists():
        return None, None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    reqs = [(r["arrival_s"], r.get("first_token_s"), r.get("finish_s"), r["output_tokens"]) for r in rows]
    made, offered = window_rates(reqs, *window)
    return _r(made, 1), _r(offered, 1)


def bench_emulated(
    out: Path,
    gpus: int,
    conv: Conversations | Users,
    compared: list[Setup],
    rates: list[float],
    progress: Callable[[dict], None] = lambda doc: None,
    section: str = "emulated",
) -> dict:
    """The loads (conversations/s, or users) by the sim section's rule at ``gpus`` GPUs (a simulated
    sweep of ``compared``), then every setup live and simulated at JSQ's SLO load and at its own first
    saturated load (the goals' pair first, at both loads), under ``out / section``; ``progress`` gets
    the section so far after each live run."""
    d = out / section
    rows = sweep(d / "sweep", gpus, conv, compared, rates)
    loads = pick_loads(rows, REFERENCE.name)
    runs: dict[str, dict[str, dict]] = {"slo": {}, "saturation": {}}
    doc = {
        "gpus": gpus,
        "unit": conv.unit,
        "workload": conv.__dict__,
        "loads": loads,
        "sweep": {f"{r:g}": v for r, v in rows.items()},
    }
    sat = loads["saturation"]
    pair = [s for s in compared if s in (REFERENCE, CANDIDATE)]
    rest = [s for s in compared if s not in pair]
    plan = [
        (load, s, loads["slo"] if load == "slo" else sat.get(s.name))
        for group in (pair, rest)
        for load in ("slo", "saturation")
        for s in group
    ]
    for load, s, rate in plan:
        if rate is None:
            continue
        flags, timeout_s = conv.flags(rate), conv.span_s * 8 + 900
        run = emulated_run(d / f"{load}-{rate:g}", fleet_spec(gpus, s), s, flags, conv.window, timeout_s)
        runs[load][s.name] = {"rate": rate, **run}
        progress({**doc, "runs": runs, "ratios": _live_ratios(runs)})
    return {**doc, "runs": runs, "ratios": _live_ratios(runs)}


def _live_ratios(runs: dict[str, dict[str, dict]]) -> dict[str, float | None]:
    def fig(load: str, setup: Setup, key: str) -> float | None:
        return ((runs.get(load) or {}).get(setup.name) or {}).get("live", {}).get(key)

    return {
        "ttft_mean_slo": ratio(fig("slo", CANDIDATE, "ttft_mean_s"), fig("slo", REFERENCE, "ttft_mean_s")),
        "throughput_saturation": ratio(
            fig("saturation", CANDIDATE, "window_tokens_per_s"),
            fig("saturation", REFERENCE, "window_tokens_per_s"),
        ),
    }


def native_config(model_dir: Path, engines: int, setup: Setup, threads: int) -> dict[str, Any]:
    """A cluster file of ``engines`` native CPU engines serving one random llama as ``chat``."""
    return {
        "services": {
            "chat": {"model": "llama", "slo": {"ttft_s": 2.0, "tpot_s": 0.2}, "dispatch": setup.dispatch}
        },
        "models": {"llama": {"source": str(model_dir.resolve()), "sim_model": "tiny-llama"}},
        "placement": dict(PLACEMENT),
        "engines": {
            f"engine-{i}": {"models": ["llama"], "prefix_caching": setup.caching, "threads": threads}
            for i in range(engines)
        },
    }


def native_run(
    d: Path, model_dir: Path, engines: int, setup: Setup, conv: Conversations, rate: float, threads: int
) -> dict:
    up = start_serving(LocalUp(d / setup.slug, native_config(model_dir, engines, setup, threads)), engines)
    try:
        t0 = time.monotonic()
        with Sampler(metrics_addresses(up.endpoints), conv.window) as sampler:
            run = subprocess.run(
                [str(BIN / "llmfleet"), "load", *conv.flags(rate), "--scheduler", up.scheduler, "--etcd",
                 up.etcd, "--cluster-config", str(up.config), "--out", str(up.dir / "live"), "--no-plots"],
                capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
        wall = time.monotonic() - t0
    finally:
        up.stop()
    (up.dir / "live.out").write_text(run.stdout + run.stderr)
    row = {
        "load_rc": run.returncode,
        "wall_s": round(wall, 1),
        **live_figures(up.dir / "live" / "report.json", sampler.last()),
        "window_tokens_per_s": _r(sampler.window_tokens_per_s(), 1),
    }
    print(json.dumps({"setup": setup.name, **row}), flush=True)
    return row


def start_serving(up: LocalUp, engines: int, attempts: int = 3) -> LocalUp:
    """Start the cluster until every engine serves the model (a start that does not get there, e.g.
    a child that lost its port to another process on this shared machine, is stopped and retried)."""
    for attempt in range(attempts):
        up.start()
        try:
            _wait_served(up, engines, timeout_s=120.0)
            return up
        except RuntimeError:
            up.stop()
            if attempt == attempts - 1:
                raise
    return up


def _wait_served(up: LocalUp, engines: int, timeout_s: float) -> None:
    """Until every engine serves the model (the first plan loaded)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        status = up.status()
        served = [n for n in status.get("nodes", []) if n.get("role") == "engine" and n.get("models")]
        if len(served) >= engines:
            return
        time.sleep(1.0)
    raise RuntimeError(f"engines not serving after {timeout_s:.0f} s: {json.dumps(up.status())[:2000]}")


def bench_native(
    out: Path, engines: int, conv: Conversations, rate: float, compared: list[Setup], threads: int
) -> dict:
    d = out / "native"
    models = d / "models"
    models.mkdir(parents=True, exist_ok=True)
    medium_llama(models)  # builds models/medium-llama once (a random llama with its tokenizer)
    model_dir = models / "medium-llama"
    runs = {s.name: native_run(d, model_dir, engines, s, conv, rate, threads) for s in compared}
    (d / "cluster-example.yaml").write_text(
        yaml.safe_dump(native_config(model_dir, engines, compared[0], threads))
    )
    return {
        "engines": engines,
        "threads_per_engine": threads,
        "rate": rate,
        "workload": conv.__dict__,
        "runs": runs,
    }

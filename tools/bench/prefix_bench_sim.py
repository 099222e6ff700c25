"""The simulated sections of ``make bench-prefix``: the load sweep and the two loads, of an open stream
of conversations (``sim``, conversations/s) and of a closed population (``users``, N users), and the
same-prefix burst over 4 engines (``burst``, simulated and live on 4 emulated GPUs)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tools.bench.fleet_common import BIN, Fleet, FleetSpec
from tools.bench.prefix_bench_common import (
    CHAT,
    PLACEMENT,
    Conversations,
    Setup,
    Users,
    pick_loads,
    ratio,
    simulate,
    still_needed,
    summary,
    sustained,
)

REFERENCE = Setup("jsq", True)
CANDIDATE = Setup("prefix_affinity", True)


def cluster_file(path: Path, gpus: int, setup: Setup) -> Path:
    """The cluster config of one setup (an emulated pool of ``gpus`` A100-80GB serving ``chat``)."""
    spec = fleet_spec(gpus, setup)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec.config(), sort_keys=False))
    return path


def fleet_spec(gpus: int, setup: Setup) -> FleetSpec:
    engine = {"policy": setup.engine, "prefix_caching": setup.caching}
    return FleetSpec(gpus, dict(PLACEMENT), services=dict(CHAT), engine=engine, dispatch=setup.dispatch)


def sim_argv(config: Path, gpus: int, setup: Setup, workload: list[str]) -> list[str]:
    """``llmfleet sim`` flags of one setup: engines of one GPU each running the setup's local policy
    (the preset's would win over the cluster file's), the setup's dispatch, the cluster file's engine
    limits (prefix caching on or off)."""
    return [
        *workload, "--cluster", f"{gpus}xA100-80GB", "--cluster-config", str(config),
        "--policy", "fcfs-jsq", "--engine-policy", setup.engine, "--dispatch", setup.dispatch,
        "--engine-gpus", "1", "--no-plots",
    ]  # fmt: skip


def run_one(
    out: Path, gpus: int, setup: Setup, workload: list[str], window: tuple[float, float]
) -> dict[str, Any]:
    config = cluster_file(out / f"{setup.slug}.yaml", gpus, setup)
    e = simulate(sim_argv(config, gpus, setup, workload))
    row = summary(e, window)
    print(json.dumps({"setup": setup.name, **row}), flush=True)
    return row


def sweep(
    out: Path, gpus: int, conv: Conversations | Users, compared: list[Setup], rates: list[float]
) -> dict[float, dict[str, dict]]:
    """The setups at each load (conversations/s or users) in turn, each until it is saturated (see
    ``still_needed``)."""
    rows: dict[float, dict[str, dict]] = {}
    for rate in rates:
        todo = [s for s in compared if still_needed(rows, REFERENCE.name, s.name)]
        if not todo:
            break
        rows[rate] = {
            s.name: run_one(out / f"rate-{rate:g}", gpus, s, conv.flags(rate), conv.window) for s in todo
        }
    return rows


def at_saturation(rows: dict[float, dict[str, dict]]) -> dict[str, dict]:
    """Each setup's sustained row (``sustained``), for the setups that reached saturation."""
    names = sorted({n for r in rows for n in rows[r]})
    return {n: row for n in names if (row := sustained(rows, n)) is not None}


def bench_sim(
    out: Path, gpus: int, conv: Conversations | Users, compared: list[Setup], rates: list[float], section: str
) -> dict:
    rows = sweep(out / section, gpus, conv, compared, rates)
    loads = pick_loads(rows, REFERENCE.name)
    at = {
        "slo": rows[loads["slo"]] if loads["slo"] is not None else {},
        "saturation": at_saturation(rows),
    }
    ref, cand = REFERENCE.name, CANDIDATE.name

    def fig(load: str, name: str, key: str) -> float | None:
        return (at[load].get(name) or {}).get(key)

    ttft = ratio(fig("slo", cand, "ttft_mean_s"), fig("slo", ref, "ttft_mean_s"))
    thr = ratio(fig("saturation", cand, "window_tokens_per_s"), fig("saturation", ref, "window_tokens_per_s"))
    met = {
        "prefix_affinity mean TTFT <= 0.5x JSQ's at JSQ's SLO load": None if ttft is None else ttft <= 0.5,
        "prefix_affinity throughput >= 1.3x JSQ's at saturation": None if thr is None else thr >= 1.3,
    }
    return {
        "gpus": gpus,
        "engine_policy": sorted({s.engine for s in compared}),
        "workload": {**conv.__dict__, "unit": conv.unit},
        "rates": rates,
        "sweep": {f"{r:g}": v for r, v in rows.items()},
        "loads": loads,
        "at": at,
        "ratios": {"ttft_mean_slo": ttft, "throughput_saturation": thr},
        "goals": met,
    }


BURST_FLAGS = ["--synthetic", "500", "--rate", "500", "--system-prompt-tokens", "1000", "--seed", "0"]


def shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: round(v / total, 3) for k, v in sorted(counts.items())} if total else {}


def burst_result(counts: dict[str, int], engines: int) -> dict[str, Any]:
    sh = shares(counts)
    top = max(sh.values(), default=None)
    return {
        "requests": sum(counts.values()),
        "by_engine": dict(sorted(counts.items())),
        "shares": sh,
        "max_share": top,
        "engines_used": sum(1 for v in counts.values() if v),
        "engines": engines,
        "goal met (no engine > 50%)": None if top is None else top <= 0.5,
    }


def bench_burst(out: Path, live: bool) -> dict[str, Any]:
    """500 requests, each starting with one 1,000-token system prompt (the whole prompt when shorter),
    arriving within 1 s, over 4 engines with ``prefix_affinity`` and caching on."""
    d = out / "burst"
    config = cluster_file(d / "cluster.yaml", 4, CANDIDATE)
    e = simulate(sim_argv(config, 4, CANDIDATE, BURST_FLAGS)).experiment
    doc: dict[str, Any] = {
        "workload": " ".join(BURST_FLAGS),
        "sim": burst_result(dict(Counter(r.instance for r in e.result.records if r.instance)), 4),
    }
    if live:
        doc["live"] = burst_live(d / "live", config)
    return doc


def burst_live(d: Path, config: Path) -> dict[str, Any]:
    """The same burst sent by ``llmfleet load`` to 4 emulated A100-80GB."""
    import subprocess

    fleet = Fleet(d, fleet_spec(4, CANDIDATE))
    fleet.start()
    try:
        run = subprocess.run(
            [str(BIN / "llmfleet"), "load", *BURST_FLAGS, "--scheduler", fleet.scheduler, "--etcd", fleet.etcd,
             "--cluster-config", str(fleet.config), "--out", str(d / "load"), "--no-plots"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        fleet.stop()
    (d / "load.out").write_text(run.stdout + run.stderr)
    report = d / "load" / "report.json"
    if not report.exists():
        return {"error": (run.stdout + run.stderr)[-2000:]}
    live = json.loads(report.read_text())["runs"][0]
    doc = burst_result(live["live"]["engines"], 4)
    doc["errors"] = live["live"]["errors"]
    return doc

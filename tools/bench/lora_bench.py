"""``make bench-lora``: 32 LoRA adapters of one base on 4 shared engines against one engine group per
adapter, simulated at A100 scale.

Setup (every arm the same requests):

* **Model and hardware**: Llama-2-7B (the cost model's ``llama2-7b``, fp16) on A100-80GB, one GPU per
  engine (TP 1), the simulator's default cost source and engine limits (256 requests per batch,
  8,192 prefill tokens per step, prefix caching on), FCFS on each engine.
* **Adapters**: 32 adapters of rank 16 on all seven projections (76 MiB each), one service per
  adapter. Shared engines have ``--max-loras`` slots per engine (default 8: all 32 adapters fit once
  over the 4 engines, not on one). LoRA's costs are :mod:`llmfleet.costmodel.lora`'s: the rank-16
  matmuls of each step's adapter rows (padded to ``max_lora_rank`` 16) and a load of 4.5 ms per
  adapter put in a slot; a request takes its adapter's slot when its engine admits it into a step,
  and waits while every slot is held by other adapters' running requests.
* **Traffic**: Poisson arrivals at ``--rate`` requests/s (default 40; the shared arms also at each of
  ``--rates``, 16 to 64) for ``--duration-s`` seconds (300), each request's
  adapter drawn from a Zipf law over the 32 adapters (exponent ``--zipf``, default 1.0: the hottest
  adapter takes 25 % of the traffic, the coldest 0.8 %); prompts log-normal around 512 tokens (8 to
  2,048), outputs log-normal around 128 tokens (8 to 1,024).
* **SLO**: TTFT ≤ ``--ttft-slo`` (2 s) and mean time per output token ≤ ``--tpot-slo`` (0.1 s); a
  configuration *serves the workload within the SLO* when at least ``--target`` (95 %) of the requests
  meet both.

Arms:

* ``lora_affinity`` — the shipped scorer (``llmfleet.policies.dispatch.lora_affinity``): adapter
  resident, then room to load it, then must evict, within a load bound;
* ``lora_llmd`` — llm-d's rule (resident 1.0, room 0.8, waiting 0.6, plus a queue score);
* ``jsq`` — join the shortest queue, blind to adapters;
* ``dedicated`` — no sharing: each adapter on its own engines (its weights merged into the base, no
  LoRA cost), as few engines per adapter as meet the SLO on the adapter's own traffic (JSQ among
  them); its GPUs are the sum over adapters.

**Live** (``--live-arms``, default ``lora_affinity`` and ``jsq``; none: simulated only): the same
workload's requests at ``--live-rate`` (4 req/s) for ``--live-duration-s`` (60 s), small enough for a
2-core host, replayed with ``llmfleet load`` on ``llmfleet up --emulate 4xA100-80GB`` (emulated
engines with the same ``max_loras`` slots, pool rule and LoRA costs) beside ``llmfleet sim`` on the
same cluster file and trace (:mod:`tools.bench.lora_bench_live`); reported: live/sim ratios of
throughput and TTFT (goal: within 15 %). ``--live-only`` skips the simulated arms.

Reported per arm: throughput (output tokens/s and completed requests/s over the makespan: first
arrival to last finish), goodput (requests meeting the SLO per second of the arrival window), TTFT
p50/p99, SLO attainment, adapter loads (and evictions), and GPUs. Writes ``report.json``,
``report.md`` and ``lora.png`` to ``--out`` (default ``.bench/lora``).

Run: ``make bench-lora`` (``python -m tools.bench.lora_bench --out .bench/lora``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from llmfleet.costmodel import hardware
from llmfleet.policies.dispatch import make_dispatch_policy
from llmfleet.policies.placement.base import InstancePlan
from llmfleet.policies.request import Fcfs
from llmfleet.sim.cost import CostBook
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.simulator import Simulator
from llmfleet.sim.spec import ClusterSpec, EngineSettings, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import WorkloadRequest

from tools.bench.lora_bench_live import cluster_file, live_arm, write_trace
from tools.bench.path_split import PARTS

BASE = "llama2-7b"
HARDWARE = "A100-80GB"
SHARED_ARMS = ("lora_affinity", "lora_llmd", "jsq")
SWEEP_RATES = (16.0, 24.0, 32.0, 40.0, 48.0, 56.0, 64.0)  # requests/s of the shared arms' sweep
LIVE_ARMS = ("lora_affinity", "jsq")
LIVE_RATE, LIVE_DURATION_S = 4.0, 60.0  # the live load: what a 2-core host paces without falling behind
LIVE_TOLERANCE = 0.15  # live within 15 % of the simulator


@dataclass(frozen=True)
class Setup:
    adapters: int = 32
    engines: int = 4
    max_loras: int = 8
    rank: int = 16
    rate: float = 40.0
    duration_s: float = 300.0
    zipf: float = 1.0
    prompt_mean: int = 512
    output_mean: int = 128
    ttft_slo: float = 2.0
    tpot_slo: float = 0.1
    target: float = 0.95
    seed: int = 0
    affinity_options: tuple[tuple[str, Any], ...] = ()  # lora_affinity's options (default: its own)


def adapter_name(i: int) -> str:
    return f"a{i:02d}"


def service_name(i: int) -> str:
    return f"s{i:02d}"


def zipf_shares(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def _lognormal(rng: np.random.Generator, mean: int, lo: int, hi: int, n: int) -> np.ndarray:
    sigma = 0.8
    mu = np.log(mean) - sigma**2 / 2
    return np.clip(rng.lognormal(mu, sigma, n), lo, hi).astype(int)


def make_requests(setup: Setup, rate: float) -> list[WorkloadRequest]:
    """Poisson arrivals at ``rate`` over the duration, each of a Zipf-drawn adapter's service."""
    rng = np.random.default_rng(setup.seed)
    n = int(rate * setup.duration_s)
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    pick = rng.choice(setup.adapters, size=n, p=zipf_shares(setup.adapters, setup.zipf))
    prompts = _lognormal(rng, setup.prompt_mean, 8, 2048, n)
    outputs = _lognormal(rng, setup.output_mean, 8, 1024, n)
    return [
        WorkloadRequest(f"r{i}", float(t), int(p), int(o), service_name(int(k)))
        for i, (t, k, p, o) in enumerate(zip(times, pick, prompts, outputs, strict=True))
    ]


def slo(setup: Setup) -> Slo:
    return Slo(ttft_s=setup.ttft_slo, tpot_s=setup.tpot_slo)


def run_sim(
    setup: Setup,
    services: tuple[SimService, ...],
    engines: int,
    dispatch: str,
    requests: list[WorkloadRequest],
    max_loras: int,
    options: dict[str, Any] | None = None,
) -> tuple[list[RequestRecord], list[dict], float]:
    spec = SimSpec(
        ClusterSpec(engines, hardware(HARDWARE)),
        services,
        EngineSettings(max_loras=max_loras, max_lora_rank=setup.rank),
    )
    plan = [InstancePlan(f"e{i}", (BASE,), 1) for i in range(engines)]
    cost = CostBook.build(spec.cluster.hw, spec.archs(), (), spec.cost_source)
    sim = Simulator(spec, plan, Fcfs, make_dispatch_policy(dispatch, **(options or {})), cost)
    res = sim.run(requests, strict_services=True)
    return res.records, res.instances, res.wall_s


def metrics(setup: Setup, records: list[RequestRecord], window_s: float) -> dict[str, Any]:
    """Throughput over the makespan (first arrival to last finish: a backlog stretches it), goodput
    (requests meeting the SLO per second of the arrival window), TTFT and SLO attainment."""
    done = [r for r in records if r.done and not r.failed]
    ttft = np.array([r.ttft_s for r in done]) if done else np.array([np.nan])
    ok = sum(1 for r in done if r.ttft_s <= setup.ttft_slo and r.tpot_s <= setup.tpot_slo)
    start = min((r.arrival_s for r in records), default=0.0)
    makespan = max((r.finish_s or 0.0 for r in done), default=start) - start
    return {
        "requests": len(records),
        "completed": len(done),
        "makespan_s": makespan,
        "throughput_tok_s": sum(r.output_tokens for r in done) / makespan if makespan > 0 else 0.0,
        "throughput_req_s": len(done) / makespan if makespan > 0 else 0.0,
        "goodput_req_s": ok / window_s,
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "tpot_mean_s": float(np.mean([r.tpot_s for r in done])) if done else float("nan"),
        "slo_attainment": ok / len(records) if records else 0.0,
        "met_ok": ok,
    }


def shared_arm(setup: Setup, dispatch: str, requests: list[WorkloadRequest]) -> dict[str, Any]:
    services = tuple(
        SimService(service_name(i), BASE, slo(setup), adapter=adapter_name(i), lora_rank=setup.rank)
        for i in range(setup.adapters)
    )
    t0 = time.perf_counter()
    options = dict(setup.affinity_options) if dispatch == "lora_affinity" else None
    records, instances, _ = run_sim(
        setup, services, setup.engines, dispatch, requests, setup.max_loras, options
    )
    out = metrics(setup, records, setup.duration_s)
    out.update(
        arm=dispatch,
        gpus=setup.engines,
        adapter_loads=sum(d["adapter_loads"] for d in instances),
        adapter_evictions=sum(d["adapter_evictions"] for d in instances),
        wall_s=time.perf_counter() - t0,
    )
    return out


def dedicated_arm(setup: Setup, requests: list[WorkloadRequest], max_engines: int = 16) -> dict[str, Any]:
    """Each adapter alone (merged weights, no LoRA cost) on the fewest engines that meet the SLO."""
    t0 = time.perf_counter()
    records: list[RequestRecord] = []
    per_adapter = []
    gpus = 0
    for i in range(setup.adapters):
        name = service_name(i)
        mine = [r for r in requests if r.service == name]
        if not mine:
            continue
        services = (SimService(name, BASE, slo(setup)),)
        for n in range(1, max_engines + 1):
            recs, _, _ = run_sim(setup, services, n, "jsq", mine, 0)
            m = metrics(setup, recs, setup.duration_s)
            if m["slo_attainment"] >= setup.target:
                break
        gpus += n
        records.extend(recs)
        per_adapter.append({"adapter": adapter_name(i), "requests": len(mine), "engines": n})
    out = metrics(setup, records, setup.duration_s)
    out.update(
        arm="dedicated",
        gpus=gpus,
        adapter_loads=0,
        adapter_evictions=0,
        per_adapter=per_adapter,
        wall_s=time.perf_counter() - t0,
    )
    return out


def run(setup: Setup, rates: list[float]) -> dict[str, Any]:
    sweep = []
    for rate in rates:
        reqs = make_requests(setup, rate)
        for arm in SHARED_ARMS:
            row = shared_arm(setup, arm, reqs)
            row["rate"] = rate
            sweep.append(row)
            print(
                f"rate {rate:g} {arm}: attainment {row['slo_attainment']:.3f} ttft p99 {row['ttft_p99_s']:.2f}s "
                f"loads {row['adapter_loads']} ({row['wall_s']:.0f}s)",
                flush=True,
            )
    reqs = make_requests(setup, setup.rate)
    main = [r for r in sweep if r["rate"] == setup.rate]
    if not main:
        main = [dict(shared_arm(setup, arm, reqs), rate=setup.rate) for arm in SHARED_ARMS]
    ded = dict(dedicated_arm(setup, reqs), rate=setup.rate)
    print(
        f"rate {setup.rate:g} dedicated: {ded['gpus']} GPUs, attainment {ded['slo_attainment']:.3f}",
        flush=True,
    )
    best = max(main, key=lambda r: r["slo_attainment"])
    return {
        "setup": asdict(setup),
        "rates": rates,
        "main": [*main, ded],
        "sweep": sweep,
        "goal": {
            "shared_arm": best["arm"],
            "shared_gpus": best["gpus"],
            "shared_attainment": best["slo_attainment"],
            "dedicated_gpus": ded["gpus"],
            "gpu_ratio": best["gpus"] / ded["gpus"] if ded["gpus"] else float("nan"),
            "met": best["slo_attainment"] >= setup.target and best["gpus"] * 4 <= ded["gpus"],
        },
    }


def live(
    setup: Setup,
    out: Path,
    arms: list[str],
    rate: float,
    duration_s: float,
    host_processes: int = 0,
    load_interval_s: float | None = None,
) -> dict[str, Any]:
    """The live arms: the workload at ``rate`` for ``duration_s`` on the emulated fleet (on
    ``host_processes`` engine hosts) and in the simulator (same cluster file and trace), with the
    live/sim ratios."""
    small = replace(setup, duration_s=duration_s)
    out.mkdir(parents=True, exist_ok=True)
    trace = write_trace(out / "trace.csv", make_requests(small, rate))
    services = {service_name(i): adapter_name(i) for i in range(setup.adapters)}
    slo_doc = {"ttft_s": setup.ttft_slo, "tpot_s": setup.tpot_slo}
    rows = []
    for arm in arms:
        options = dict(setup.affinity_options) if arm == "lora_affinity" else {}
        cluster = cluster_file(services, setup.engines, HARDWARE, setup.max_loras, setup.rank, arm, slo_doc)
        if options:
            cluster["scheduler"]["dispatch"]["options"] = options
        if load_interval_s is not None:
            cluster["scheduler"]["load_interval_s"] = load_interval_s
        rows.append(live_arm(out, cluster, trace, arm, duration_s * 4 + 300, host_processes))
    return {
        "rate": rate,
        "duration_s": duration_s,
        "host_processes": host_processes,
        "load_interval_s": load_interval_s,
        "arms": rows,
        "within_15pct": within_tolerance(rows),
    }


def within_tolerance(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Per live/sim figure: whether every arm is within ``LIVE_TOLERANCE`` of the simulator."""
    keys = ("output_tokens_per_s", "ttft_p50_s", "engine_ttft_mean_s")
    return {
        k: all(
            r["live_over_sim"].get(k) is not None and abs(r["live_over_sim"][k] - 1) <= LIVE_TOLERANCE
            for r in rows
        )
        for k in keys
    }


def cpu_share(row: dict[str, Any], prefix: str) -> str:
    """CPU seconds of the fleet's processes named ``prefix…`` while the load ran ('-' if not recorded)."""
    cpu = row.get("cpu_s")
    if not cpu:
        return "-"
    return f"{sum(v for k, v in cpu.items() if k.startswith(prefix)):.1f}"


def path_parts(row: dict[str, Any]) -> str:
    """The path's three parts at p50 (ms) from the arm's ``path_ms`` ('-' if not recorded)."""
    path = row.get("path_ms")
    if not path:
        return "-"
    return " / ".join(str(path.get(f"{p}_p50_ms")) for p in PARTS)


def live_markdown(doc: dict[str, Any]) -> list[str]:
    lines = [
        f"Live (emulated, `llmfleet up --emulate`) vs simulated at {doc['rate']:g} req/s for "
        f"{doc['duration_s']:g} s:",
        "",
        "| dispatch | completed (live/sim) | tok/s live | tok/s sim | ratio | TTFT p50 live (s) | TTFT p50 sim (s) "
        "| ratio | TTFT p99 ratio | engines' TTFT mean / sim's | adapter loads live / sim "
        "| CPU-s scheduler / engine hosts | path p50 ms: client↔scheduler / scheduler / scheduler↔engine |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["arms"]:
        lv, sm, q = r["live"], r["sim"], r["live_over_sim"]
        loads = r.get("adapter_loads") or {}
        lines.append(
            f"| {r['dispatch']} | {lv.get('completed')}/{sm.get('completed')} | {lv.get('output_tokens_per_s')} | "
            f"{sm.get('output_tokens_per_s')} | {q.get('output_tokens_per_s')} | {lv.get('ttft_p50_s')} | "
            f"{sm.get('ttft_p50_s')} | {q.get('ttft_p50_s')} | {q.get('ttft_p99_s')} | "
            f"{q.get('engine_ttft_mean_s')} | {loads.get('live', '-')} / {loads.get('sim', '-')} | "
            f"{cpu_share(r, 'scheduler')} / {cpu_share(r, 'emu')} | {path_parts(r)} |"
        )
    within = doc["within_15pct"]
    if isinstance(within, bool):  # a report written before the per-figure verdicts
        within = within_tolerance(doc["arms"])
    names = {
        "output_tokens_per_s": "throughput",
        "ttft_p50_s": "client TTFT p50",
        "engine_ttft_mean_s": "engines' TTFT mean (engine arrival to first token)",
    }
    verdicts = [f"{names[k]} {'within' if ok else 'not within'} 15 %" for k, ok in within.items()]
    return [*lines, "", "Against the simulator: " + "; ".join(verdicts) + ".", ""]


def markdown(report: dict[str, Any]) -> str:
    s = report["setup"]
    if "main" not in report:  # --live-only
        return "\n".join(["# LoRA adapters: live arm", "", *live_markdown(report["live"])])
    lines = [
        f"# LoRA adapters: {s['adapters']} adapters of Llama-2-7B, {s['engines']} shared A100s vs dedicated",
        "",
        f"Rate {s['rate']:g} req/s for {s['duration_s']:g} s, Zipf {s['zipf']:g} over adapters, "
        f"max_loras {s['max_loras']}, rank {s['rank']}; SLO TTFT ≤ {s['ttft_slo']:g} s and TPOT ≤ "
        f"{s['tpot_slo']:g} s, target {s['target']:.0%}.",
        "",
        "| arm | GPUs | throughput (tok/s) | req/s | goodput (req/s) | TTFT p50 (s) | TTFT p99 (s) "
        "| SLO attainment | adapter loads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["main"]:
        lines.append(
            f"| {r['arm']} | {r['gpus']} | {r['throughput_tok_s']:.0f} | {r['throughput_req_s']:.2f} | "
            f"{r['goodput_req_s']:.2f} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['slo_attainment']:.3f} | {r['adapter_loads']} |"
        )
    g = report["goal"]
    lines += [
        "",
        f"Goal (≤ 1/4 of the dedicated GPUs within the SLO): {'met' if g['met'] else 'not met'} — "
        f"{g['shared_arm']} on {g['shared_gpus']} GPUs at {g['shared_attainment']:.3f} vs dedicated "
        f"{g['dedicated_gpus']} GPUs (ratio {g['gpu_ratio']:.3f}).",
        "",
    ]
    if len(report["rates"]) > 1:
        lines += [
            "Rate sweep (shared arms):",
            "",
            "| rate (req/s) | arm | SLO attainment | goodput (req/s) | TTFT p99 (s) | throughput (tok/s) "
            "| adapter loads |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in report["sweep"]:
            lines.append(
                f"| {r['rate']:g} | {r['arm']} | {r['slo_attainment']:.3f} | {r['goodput_req_s']:.2f} | "
                f"{r['ttft_p99_s']:.3f} | "
                f"{r['throughput_tok_s']:.0f} | {r['adapter_loads']} |"
            )
        lines.append("")
    if report.get("live"):
        lines += live_markdown(report["live"])
    return "\n".join(lines)


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in SHARED_ARMS:
        rows = [r for r in report["sweep"] if r["arm"] == arm]
        rates = [r["rate"] for r in rows]
        a1.plot(rates, [r["slo_attainment"] for r in rows], "o-", label=arm)
        a2.plot(rates, [r["ttft_p99_s"] for r in rows], "o-", label=arm)
    a1.axhline(report["setup"]["target"], color="grey", ls=":", lw=1)
    a1.set(xlabel="rate (req/s)", ylabel="SLO attainment", title=f"{report['setup']['engines']} shared A100s")
    a2.set(xlabel="rate (req/s)", ylabel="TTFT p99 (s)", yscale="log", title="TTFT p99")
    a1.legend()
    fig.tight_layout()
    fig.savefig(out / "lora.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    d = Setup()
    p.add_argument("--out", type=Path, default=Path(".bench/lora"))
    p.add_argument("--rate", type=float, default=d.rate, help="requests/s of the main comparison")
    p.add_argument(
        "--rates", type=float, nargs="*", default=list(SWEEP_RATES), help="rates of the shared arms' sweep"
    )
    p.add_argument("--duration-s", type=float, default=d.duration_s)
    p.add_argument("--adapters", type=int, default=d.adapters)
    p.add_argument("--engines", type=int, default=d.engines)
    p.add_argument("--max-loras", type=int, default=d.max_loras)
    p.add_argument("--zipf", type=float, default=d.zipf)
    p.add_argument("--ttft-slo", type=float, default=d.ttft_slo)
    p.add_argument("--tpot-slo", type=float, default=d.tpot_slo)
    p.add_argument("--target", type=float, default=d.target)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--affinity-options",
        type=json.loads,
        default={},
        help='lora_affinity\'s options as JSON, e.g. \'{"max_load_ratio": 1.1, "max_load_excess": 8}\'',
    )
    p.add_argument(
        "--live-arms",
        nargs="*",
        default=list(LIVE_ARMS),
        choices=list(SHARED_ARMS),
        help="dispatch policies run live on the emulated fleet beside the simulator (none: sim only)",
    )
    p.add_argument("--live-rate", type=float, default=LIVE_RATE, help="requests/s of the live arms")
    p.add_argument("--live-duration-s", type=float, default=LIVE_DURATION_S)
    p.add_argument("--live-only", action="store_true", help="the live arms only (no simulated sweep)")
    p.add_argument(
        "--live-load-interval-s",
        type=float,
        default=None,
        help="the schedulers' load-report interval in the live arms (default: the cluster file's)",
    )
    p.add_argument(
        "--live-host-processes",
        type=int,
        default=0,
        help="engine host processes of the emulated fleet (0: one per 16 GPUs)",
    )
    a = p.parse_args(argv)
    setup = Setup(
        adapters=a.adapters, engines=a.engines, max_loras=a.max_loras, rate=a.rate, duration_s=a.duration_s,
        zipf=a.zipf, ttft_slo=a.ttft_slo, tpot_slo=a.tpot_slo, target=a.target, seed=a.seed,
        affinity_options=tuple(sorted(a.affinity_options.items())),
    )  # fmt: skip
    rates = a.rates if a.rates else [a.rate]
    report: dict[str, Any] = {"setup": asdict(setup)}
    if not a.live_only:
        report = run(setup, sorted(set(rates) | {a.rate}))
    if a.live_arms:
        report["live"] = live(
            setup,
            a.out / "live",
            a.live_arms,
            a.live_rate,
            a.live_duration_s,
            a.live_host_processes,
            a.live_load_interval_s,
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "report.json").write_text(json.dumps(report, indent=2))
    (a.out / "report.md").write_text(markdown(report))
    if not a.live_only:
        plot(report, a.out)
    print(markdown(report))


if __name__ == "__main__":
    main()

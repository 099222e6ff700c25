"""The live control plane on emulated GPUs at fleet size (``make bench-fleet``): .bench/fleet/.

Sections (``--only``):

* ``startup`` — ``llmfleet up --emulate {N}xA100-80GB --emulate-processes K`` (N = 64, K = 4; ``--quick``:
  16, 2): seconds from launch until every emulated GPU is registered in etcd and the first plan is
  loaded, and the resident memory of every process of the cluster (etcd, schedulers, profiler,
  placement, migration, the engine hosts), summed. Goal (issue 22): ≤ 6 GiB and ≤ 60 s at 64 GPUs.
* ``replay`` — the conv trace (``--trace``, default ../shared/traces/azure_llm_2023_conv.csv) at the
  README's rate (4×) for 10 minutes (``--quick``: 2) on 32 emulated A100s (quick 16), once per preset
  (``--preset``, default ``vllm-v0.4`` and ``seallm``; seallm places with Algorithm 1, the ``seallm``
  planner): ``llmfleet load --trace`` against the live fleet and ``llmfleet sim`` on the same trace window
  and services (``--first-plan cold``: the simulated leader starts as the live one, with no request
  seen), compared by ``llmfleet compare`` (mean and p99 latency, GPUs in use, placement plans,
  failures). Needs the trace; skipped without it.

Each figure comes from one run on this machine; the machine is named in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil
from local_up import LocalUp

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"

SERVICES = {
    "services": {
        "chat": {"model": "llama2-7b", "slo": {"ttft_s": 2.0, "tpot_s": 0.1}},
        "code": {"model": "llama2-13b", "slo": {"ttft_s": 3.0, "tpot_s": 0.15}},
        "summarize": {"model": "opt-6.7b", "slo": {"ttft_s": 4.0, "tpot_s": 0.2}},
    },
    "models": {
        "llama2-7b": {"source": "emulated://llama2-7b", "dtype": "float16"},
        "llama2-13b": {"source": "emulated://llama2-13b", "dtype": "float16"},
        "opt-6.7b": {"source": "emulated://opt-6.7b", "dtype": "float16"},
    },
}


def _status(etcd: str) -> dict:
    env = os.environ | {"LLMFLEET_ETCD": etcd}
    out = subprocess.run(
        [str(BIN / "llmfleet"), "status", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    return json.loads(out.stdout) if out.returncode == 0 else {}


class Fleet(LocalUp):
    """``llmfleet up`` on an emulated pool, as a user starts it; stopped with Ctrl-C (SIGINT)."""

    def __init__(
        self,
        out: Path,
        gpus: int,
        processes: int,
        placement: dict,
        engine: dict | None = None,
        dispatch: str = "",
    ) -> None:
        services = {
            k: {**v, **({"dispatch": dispatch} if dispatch else {})} for k, v in SERVICES["services"].items()
        }
        pool = {"hardware": "A100-80GB", "count": gpus, **({"engine": engine} if engine else {})}
        cfg = {**SERVICES, "services": services, "placement": placement, "emulated": pool}
        emulate = ["--emulate", f"{gpus}xA100-80GB", "--emulate-processes", str(processes)]
        super().__init__(out / f"fleet-{gpus}", cfg, *emulate)
        self.gpus, self.processes = gpus, processes

    def engines(self) -> int:
        return sum(1 for n in _status(self.etcd).get("nodes", []) if n["role"] == "engine")

    def rss_bytes(self) -> dict[str, int]:
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        out = {}
        for p in [root, *root.children(recursive=True)]:
            try:
                name = " ".join(p.cmdline()[1:4]) if "python" in p.name() else p.name()
                out[f"{p.pid} {name}"] = p.memory_info().rss
            except psutil.Error:
                continue
        return out


def bench_startup(out: Path, gpus: int, processes: int) -> dict:
    placement = {"policy": "aladdin", "interval_s": 5, "window_s": 10, "confirm_intervals": 1}
    fleet = Fleet(out, gpus, processes, placement)
    t0 = fleet.start()
    try:
        healthy_s = time.monotonic() - t0
        while fleet.engines() < gpus:
            if time.monotonic() - t0 > 600:
                raise RuntimeError(f"only {fleet.engines()} of {gpus} engines registered")
            time.sleep(0.5)
        registered_s = time.monotonic() - t0
        while _status(fleet.etcd).get("fleet", {}).get("gpus_in_use", 0) < 3:
            if time.monotonic() - t0 > 600:
                raise RuntimeError("no plan loaded the three models")
            time.sleep(0.5)
        placed_s = time.monotonic() - t0
        time.sleep(5)  # settled: the engines' watches and leases running
        rss = fleet.rss_bytes()
    finally:
        fleet.stop()
    total = sum(rss.values())
    return {
        "gpus": gpus,
        "processes": processes,
        "healthy_s": round(healthy_s, 2),
        "registered_s": round(registered_s, 2),
        "placed_s": round(placed_s, 2),
        "rss_total_gib": round(total / 2**30, 3),
        "rss_by_process_mib": {k: round(v / 2**20, 1) for k, v in sorted(rss.items())},
        "goal": "<= 6 GiB and <= 60 s at 64 GPUs",
        "met": total <= 6 * 2**30 and registered_s <= 60 if gpus >= 64 else None,
    }


def preset_config(name: str, placement: str | None) -> tuple[dict, dict, str]:
    """The live settings of ``llmfleet sim``'s preset ``name``: (placement section, emulated engine
    section, services' dispatch). ``placement`` overrides the preset's planner, on both sides."""
    from llmfleet.sim.run import preset

    b = preset(name, placement=placement)
    section = {"policy": b.placement, "interval_s": 30, "window_s": 60, "confirm_intervals": 1}
    if b.placement_options:
        section["options"] = b.placement_options
    engine = {"policy": b.local, **({"policy_options": b.local_options} if b.local_options else {})}
    return section, engine, b.dispatch


def bench_replay(
    out: Path, gpus: int, trace: Path, rate_scale: float, duration_s: float, name: str, placement: str | None
) -> dict:
    """Live replay vs ``llmfleet sim`` on the same trace window and services (``llmfleet compare``):
    preset ``name`` (its placement planning every 30 s over the last 60 s, its dispatch and engine
    policy) on both sides, each starting as a live leader does (``--first-plan cold``)."""
    section, engine, dispatch = preset_config(name, placement)
    label = f"{name}+{section['policy']}"
    fleet = Fleet(out / label, gpus, max(1, gpus // 16), section, engine=engine, dispatch=dispatch)
    fleet.start()
    # duration_s of wall time: that much of the trace's time times the rate scale
    window = ["--trace", str(trace), "--rate-scale", str(rate_scale), "--end", str(duration_s * rate_scale)]
    try:
        run = subprocess.run(
            [str(BIN / "llmfleet"), "load", *window, "--scheduler", fleet.endpoints["scheduler"]["address"],
             "--etcd", fleet.etcd, "--cluster-config", str(fleet.config), "--out", str(fleet.dir / "live")],
            capture_output=True, text=True, timeout=duration_s * 3 + 600,
        )  # fmt: skip
        (fleet.dir / "load.out").write_text(run.stdout + run.stderr)
    finally:
        fleet.stop()
    sim = subprocess.run(
        [str(BIN / "llmfleet"), "sim", *window, "--cluster", f"{gpus}xA100-80GB", "--cluster-config",
         str(fleet.config), "--policy", name, "--placement", section["policy"], "--placement-interval-s", "30",
         "--placement-window-s", "60", "--engine-gpus", "1", "--first-plan", "cold", "--out", str(fleet.dir / "sim")],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    (fleet.dir / "sim.out").write_text(sim.stdout + sim.stderr)
    cmp = subprocess.run(
        [str(BIN / "llmfleet"), "compare", str(fleet.dir / "sim" / "report.json"),
         str(fleet.dir / "live" / "report.json"), "--out", str(fleet.dir / "compare")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return {
        "gpus": gpus,
        "preset": name,
        "placement": section["policy"],
        "load_rc": run.returncode,
        "sim_rc": sim.returncode,
        "compare": (cmp.stdout + cmp.stderr)[-6000:],
        "dir": str(fleet.dir),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".bench/fleet")
    ap.add_argument("--quick", action="store_true", help="16 GPUs in 2 processes; a 2-minute replay")
    ap.add_argument("--only", choices=("startup", "replay"), default=None)
    ap.add_argument("--gpus", type=int, default=None, help="startup: emulated GPUs (64; quick 16)")
    ap.add_argument("--processes", type=int, default=None, help="startup: engine processes (4; quick 2)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument(
        "--rate-scale", type=float, default=4.0, help="replay: the trace's rate × (the README's 4)"
    )
    ap.add_argument(
        "--preset",
        action="append",
        help="replay: llmfleet sim presets, live and simulated (vllm-v0.4 and seallm)",
    )
    ap.add_argument(
        "--placement", help="replay: override the presets' placement (default: seallm's is Algorithm 1)"
    )
    ap.add_argument("--duration", type=float, default=None, help="replay seconds (600; quick 120)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "machine": f"{platform.node()} {os.cpu_count()} cores {psutil.virtual_memory().total / 2**30:.0f} GiB"
    }
    if args.only in (None, "startup"):
        gpus = args.gpus or (16 if args.quick else 64)
        procs = args.processes or (2 if args.quick else 4)
        report["startup"] = bench_startup(out, gpus, procs)
        print(json.dumps(report["startup"], indent=1))
    if args.only in (None, "replay"):
        if not args.trace.exists():
            report["replay"] = {"skipped": f"no trace at {args.trace}"}
        else:
            report["replay"] = [
                bench_replay(
                    out,
                    args.gpus or (16 if args.quick else 32),
                    args.trace,
                    args.rate_scale,
                    args.duration or (120 if args.quick else 600),
                    name,
                    args.placement or ("seallm" if name == "seallm" else None),
                )
                for name in args.preset or ["vllm-v0.4", "seallm"]
            ]
        print(json.dumps(report["replay"], indent=1))
    (out / "fleet.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "fleet.md").write_text(markdown(report))
    plot(report, out)
    return 0


def markdown(report: dict) -> str:
    lines = ["# Emulated fleet (`make bench-fleet`)", "", f"Machine: {report['machine']}", ""]
    s = report.get("startup")
    if s:
        lines += [
            f"## Start-up: {s['gpus']} emulated A100-80GB in {s['processes']} processes + the control plane", "",
            "| figure | value |", "|---|---|",
            f"| healthy (every process answers) | {s['healthy_s']} s |",
            f"| every GPU registered in etcd | {s['registered_s']} s |",
            f"| first plan loaded | {s['placed_s']} s |",
            f"| resident memory, all processes | {s['rss_total_gib']} GiB |",
            f"| goal | {s['goal']}: {s['met']} |", "",
        ]  # fmt: skip
    r = report.get("replay")
    for run in r if isinstance(r, list) else [r] if r else []:
        title = (
            f"{run.get('preset')} (placement {run.get('placement')}) on {run.get('gpus')} emulated A100-80GB"
        )
        lines += [
            f"## Replay: live vs simulated, {title}",
            "",
            "```",
            run.get("compare", run.get("skipped", "")),
            "```",
            "",
        ]
    return "\n".join(lines)


def plot(report: dict, out: Path) -> None:
    s = report.get("startup")
    if not s:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(s["rss_by_process_mib"])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    ax.barh([n[:60] for n in names], [s["rss_by_process_mib"][n] for n in names])
    ax.set_xlabel("resident memory (MiB)")
    ax.set_title(f"{s['gpus']} emulated GPUs + control plane: {s['rss_total_gib']} GiB")
    fig.tight_layout()
    fig.savefig(out / "rss.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

"""What the ``make bench-fleet`` sections share: an emulated fleet started with ``llmfleet up --emulate``
as a user starts it, and one live-vs-simulated run (``llmfleet load`` against the fleet, ``llmfleet sim``
on the same trace window, services and policies, ``llmfleet compare`` of the two reports)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE

from tools.bench.local_up import LocalUp

BIN = Path(sys.executable).parent

MODELS = {
    "llama2-7b": {"source": "emulated://llama2-7b", "dtype": "float16"},
    "llama2-13b": {"source": "emulated://llama2-13b", "dtype": "float16"},
    "opt-6.7b": {"source": "emulated://opt-6.7b", "dtype": "float16"},
    "qwen3-32b": {"source": "emulated://qwen3-32b", "dtype": "bfloat16"},
}
# the conv trace's three services (k-means length clusters in this order, as ``llmfleet sim`` maps them)
CONV_SERVICES = {
    "chat": {"model": "llama2-7b", "slo": {"ttft_s": 2.0, "tpot_s": 0.1}},
    "code": {"model": "llama2-13b", "slo": {"ttft_s": 3.0, "tpot_s": 0.15}},
    "summarize": {"model": "opt-6.7b", "slo": {"ttft_s": 4.0, "tpot_s": 0.2}},
}


@dataclass
class FleetSpec:
    """One emulated fleet: its pool, services and control-plane policies (a cluster config)."""

    gpus: int
    placement: dict[str, Any]
    hardware: str = "A100-80GB"
    processes: int = 0  # engine host processes (0: one per 16 GPUs)
    services: dict[str, dict] = field(default_factory=lambda: dict(CONV_SERVICES))
    engine: dict[str, Any] = field(default_factory=dict)
    dispatch: str = ""
    migration: dict[str, Any] | None = None
    cost_source: str = DEFAULT_COST_SOURCE  # the emulated engines', the simulator's and the solo times'

    def config(self) -> dict[str, Any]:
        services = {
            k: {**v, **({"dispatch": self.dispatch} if self.dispatch else {})}
            for k, v in self.services.items()
        }
        models = {m: MODELS[m] for m in sorted({s["model"] for s in services.values()})}
        pool = {
            "hardware": self.hardware,
            "count": self.gpus,
            "cost_source": self.cost_source,
            **({"engine": self.engine} if self.engine else {}),
        }
        cfg: dict[str, Any] = {
            "services": services,
            "models": models,
            "placement": self.placement,
            "emulated": pool,
        }
        if self.migration:
            cfg["migration"] = self.migration
        return cfg

    @property
    def host_processes(self) -> int:
        return self.processes or max(1, self.gpus // 16)


class Fleet(LocalUp):
    """``llmfleet up`` on an emulated pool, as a user starts it; stopped with Ctrl-C (SIGINT)."""

    def __init__(self, directory: Path, spec: FleetSpec) -> None:
        emulate = [
            "--emulate",
            f"{spec.gpus}x{spec.hardware}",
            "--emulate-processes",
            str(spec.host_processes),
        ]
        super().__init__(directory, spec.config(), *emulate)
        self.spec = spec
        self.gpus, self.processes = spec.gpus, spec.host_processes

    def emulated_pacing(self) -> dict[str, float]:
        """Every emulated GPU's pacing counters (``llmfleet_emulated_*`` on its /metrics), summed; and
        the host's mean time per step from a step's due time to the next step's scheduling."""
        keys = ("waits", "late", "lag_seconds", "host_steps", "host_seconds")
        total = dict.fromkeys(keys, 0.0)
        host_max = 0.0
        for row in self.endpoints.values():
            if row.get("name", "").startswith("emu") and row.get("metrics"):
                for port in metrics_ports(row["metrics"]):
                    got = scrape(port)
                    for k in keys:
                        total[k] += got.get(f"llmfleet_emulated_{k}_total", 0.0)
                    host_max = max(host_max, got.get("llmfleet_emulated_host_max_seconds", 0.0))
        steps = total["host_steps"]
        return {
            **total,
            "host_max_s": host_max,
            "host_per_step_ms": 1e3 * total["host_seconds"] / steps if steps else None,
        }

    def cpu_seconds(self) -> dict[str, float]:
        """user + system CPU seconds so far, per process."""
        out = {}
        for name, p in self.processes_by_name().items():
            try:
                t = p.cpu_times()
                out[name] = t.user + t.system
            except psutil.Error:
                continue
        return out


def metrics_ports(metrics: str) -> list[str]:
    """``host:a..b`` (or ``host:a``) → ``host:a`` … ``host:b``."""
    host, _, ports = metrics.rpartition(":")
    lo, _, hi = ports.partition("..")
    return [f"{host}:{p}" for p in range(int(lo), int(hi or lo) + 1)]


def scrape(address: str) -> dict[str, float]:
    """``name`` -> value of one /metrics page (unlabelled samples; {} when it does not answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def run_load(fleet: Fleet, window: list[str], out: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """``llmfleet load`` of a trace window against the fleet (the SDK, both schedulers), with its requests
    (``requests.jsonl``: ``llmfleet compare`` pairs them with a simulation's ``--records``)."""
    run = subprocess.run(
        [str(BIN / "llmfleet"), "load", *window, "--scheduler", fleet.endpoints["scheduler"]["address"],
         "--etcd", fleet.etcd, "--cluster-config", str(fleet.config), "--out", str(out),
         "--cost-source", fleet.spec.cost_source, "--records"],
        capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    (out.parent / f"{out.name}.out").write_text(run.stdout + run.stderr)
    return run


def run_sim(
    spec: FleetSpec, config: Path, window: list[str], policy: str, out: Path, extra: list[str]
) -> int:
    """``llmfleet sim`` of the same window and cluster config, starting as the live leader does, with its
    requests (``requests.jsonl``)."""
    pl = spec.placement
    sim = subprocess.run(
        [str(BIN / "llmfleet"), "sim", *window, "--cluster", f"{spec.gpus}x{spec.hardware}", "--cluster-config",
         str(config), "--policy", policy, "--placement", pl["policy"],
         "--placement-interval-s", str(pl["interval_s"]), "--placement-window-s", str(pl.get("window_s") or 60),
         "--placement-confirm-intervals", str(pl.get("confirm_intervals", 2)),
         "--engine-gpus", "1", "--first-plan", "cold", "--cost-source", spec.cost_source, "--out", str(out),
         "--records", *extra],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    (out.parent / f"{out.name}.out").write_text(sim.stdout + sim.stderr)
    return sim.returncode


def compare(sim_dir: Path, live_dir: Path, out: Path) -> dict[str, Any]:
    """``llmfleet compare`` of the two reports; its rows by figure plus the text table."""
    cmp = subprocess.run(
        [str(BIN / "llmfleet"), "compare", str(sim_dir / "report.json"), str(live_dir / "report.json"), "--out",
         str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    doc: dict[str, Any] = {"text": (cmp.stdout + cmp.stderr)[-6000:], "rc": cmp.returncode}
    path = out / "compare.json"
    if cmp.returncode == 0 and path.exists():
        c = json.loads(path.read_text())
        doc["rows"] = {r["figure"]: {"sim": r["a"], "live": r["b"], "rel": r["rel"]} for r in c["rows"]}
        doc["same_plans"] = c["same_plans"]
        doc["per_request"] = c.get("per_request")  # the requests paired (both runs write requests.jsonl)
        doc["plans"] = {"sim": c["plans_a"], "live": c["plans_b"]}
    return doc


def gpu_series(report: Path) -> list[tuple[float, int]]:
    """GPUs in use over time, (t, count) change points, from a report.json (sim's first run or load's)."""
    doc = json.loads(report.read_text())
    run = doc["runs"][0] if "runs" in doc else doc
    return [(float(t), int(n)) for t, n in (run.get("cluster") or {}).get("gpus_in_use") or []]


def at(series: list[tuple[float, int]], t: float) -> int:
    """The series' value at time t (its last change point at or before t; 0 before the first)."""
    v = 0
    for ts, n in series:
        if ts > t:
            break
        v = n
    return v


def follows(sim: list[tuple[float, int]], live: list[tuple[float, int]], tol_s: float, end_s: float) -> dict:
    """Does live follow the simulator's GPU count within ``tol_s``? At each second t, live(t) must equal
    sim(t') for some t' within ±tol_s. Returns the share of seconds that do, and the worst miss."""
    checked = ok = 0
    worst = 0
    t = 0.0
    while t <= end_s:
        near = {at(sim, t + d) for d in (-tol_s, -tol_s / 2, 0.0, tol_s / 2, tol_s)}
        near |= {n for ts, n in sim if t - tol_s <= ts <= t + tol_s}
        lv = at(live, t)
        checked += 1
        if lv in near:
            ok += 1
        else:
            worst = max(worst, min(abs(lv - n) for n in near))
        t += 1.0
    return {
        "seconds": checked,
        "within": ok,
        "share": round(ok / max(checked, 1), 3),
        "worst_gpus_off": worst,
    }


def wait_until(predicate, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - t0

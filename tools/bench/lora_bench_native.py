"""The native CPU arm of ``make bench-lora``: the Zipf adapter workload live on native engines serving
a real (random) base model and real PEFT adapters, shared against dedicated adapter groups.

- **Model**: ``engine_bench.medium_llama`` (a random llama, 4 layers, hidden 512, fp32), so a step
  is real compute; ``--adapters`` random PEFT adapters of rank ``--native-rank`` on every linear
  projection (``lora_engine.make_adapters``: saved in PEFT's format, read back by the engines).
- **Engines**: ``--engines`` native engines, one torch thread each, on this machine's cores.
- **Arms**, on the same engines and the same trace:
  - ``lora_affinity`` and ``jsq``: every engine hosts the base with ``max_loras`` adapter slots; any
    adapter may run anywhere (shared);
  - ``dedicated``: one engine per adapter group, no sharing: the adapters split into ``engines``
    groups of consecutive ranks (the Zipf law makes the first group the hottest), group ``g``'s
    adapters on a base entry of its own served by engine ``g`` only, with a slot for each of them (no
    adapter is ever evicted), JSQ within the group (one engine).
- **Workload**: the simulated arms' generator (Poisson arrivals, Zipf over the adapters, log-normal
  lengths) at ``--native-rate`` for ``--native-duration-s``, with prompts around 64 tokens and
  outputs around 32 (a CPU engine's scale), written as a trace CSV with a ``Service`` column and
  replayed by ``llmfleet load``.

Reported per arm: TTFT p50/p99, throughput, SLO attainment (the bench's TTFT SLO, TPOT 0.5 s on CPU)
and the engines' adapter loads (from each engine's load report). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc

from tools.bench.engine_bench import medium_llama
from tools.bench.fleet_common import BIN
from tools.bench.local_up import LocalUp
from tools.bench.lora_bench import Setup, adapter_name, make_requests, service_name
from tools.bench.lora_bench_live import write_trace
from tools.bench.lora_engine import ALL_LINEAR, make_adapters
from tools.bench.prefix_bench_live import live_figures, start_serving

NATIVE_ARMS = ("lora_affinity", "jsq", "dedicated")
BASE = "medium-llama"
PROMPT_MEAN, OUTPUT_MEAN = 64, 32  # a CPU engine's scale
TPOT_SLO_S = 0.5  # CPU steps, not GPU ones


def native_cluster(
    setup: Setup, base_dir: Path, adapter_dirs: list[Path], arm: str, rank: int
) -> dict[str, Any]:
    """The cluster file of one arm (see the module docstring)."""
    slo = {"ttft_s": setup.ttft_slo, "tpot_s": TPOT_SLO_S}
    n, engines = len(adapter_dirs), setup.engines
    if arm == "dedicated":
        size = -(-n // engines)
        bases = [f"{BASE}-g{g}" for g in range(engines)]
        models: dict[str, Any] = {b: {"source": str(base_dir), "sim_model": "tiny-llama"} for b in bases}
        base_of = [bases[i // size] for i in range(n)]
        hosts = {f"engine-{g}": [bases[g]] for g in range(engines)}
        slots, dispatch = size, "jsq"
    else:
        models = {BASE: {"source": str(base_dir), "sim_model": "tiny-llama"}}
        base_of = [BASE] * n
        hosts = {f"engine-{g}": [BASE] for g in range(engines)}
        slots, dispatch = setup.max_loras, arm
    for i, d in enumerate(adapter_dirs):
        models[adapter_name(i)] = {"base": base_of[i], "adapter": str(d)}
    return {
        "services": {
            service_name(i): {"model": adapter_name(i), "slo": slo, "dispatch": dispatch} for i in range(n)
        },
        "models": models,
        "placement": {"policy": "static"},
        "engines": {
            e: {"models": ms, "max_loras": slots, "max_lora_rank": rank, "threads": 1}
            for e, ms in hosts.items()
        },
    }


async def _adapter_loads(addresses: list[str]) -> dict[str, int]:
    """Per engine: adapters loaded into its pool so far (its load report's ``adapter_loads``)."""
    out = {}
    for address in addresses:
        async with grpc.aio.insecure_channel(address) as ch:
            stream = engine_pb2_grpc.EngineStub(ch).WatchLoad(engine_pb2.WatchLoadRequest(interval_s=1.0))
            snap = await stream.read()
            stream.cancel()
            out[snap.engine_id] = sum(m.adapter_loads for m in snap.models)
    return out


def native_arm(
    out: Path, config: dict[str, Any], trace: Path, arm: str, engines: int, timeout_s: float
) -> dict:
    up = start_serving(LocalUp(out / arm, config), engines)
    try:
        run = subprocess.run(
            [str(BIN / "llmfleet"), "load", "--trace", str(trace), "--scheduler", up.scheduler, "--etcd", up.etcd,
             "--cluster-config", str(up.config), "--out", str(up.dir / "live"), "--no-plots"],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        addresses = [e["address"] for name, e in up.endpoints.items() if name.startswith("engine-")]
        loads = asyncio.run(_adapter_loads(addresses))
    finally:
        up.stop()
    (up.dir / "live.out").write_text(run.stdout + run.stderr)
    row = {
        "arm": arm,
        "load_rc": run.returncode,
        **live_figures(up.dir / "live" / "report.json"),
        "adapter_loads": sum(loads.values()),
        "adapter_loads_by_engine": dict(sorted(loads.items())),
    }
    print(json.dumps(row), flush=True)
    return row


def native(
    setup: Setup, out: Path, arms: list[str], rate: float, duration_s: float, rank: int
) -> dict[str, Any]:
    """Every arm on the same native engines and trace (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    medium_llama(out / "models")  # builds models/medium-llama once (a random llama with its tokenizer)
    base_dir = out / "models" / "medium-llama"
    adapters = out / "adapters"
    dirs = (
        sorted((adapters / f"a{i}" for i in range(setup.adapters)), key=lambda p: int(p.name[1:]))
        if (adapters / f"a{setup.adapters - 1}").exists()
        else make_adapters(base_dir, adapters, setup.adapters, rank, ALL_LINEAR.split(","))
    )
    small = replace(setup, duration_s=duration_s, prompt_mean=PROMPT_MEAN, output_mean=OUTPUT_MEAN)
    trace = write_trace(out / "trace.csv", make_requests(small, rate))
    rows = [
        native_arm(
            out,
            native_cluster(setup, base_dir, dirs, arm, rank),
            trace,
            arm,
            setup.engines,
            duration_s * 6 + 600,
        )
        for arm in arms
    ]
    return {
        "rate": rate,
        "duration_s": duration_s,
        "engines": setup.engines,
        "max_loras": setup.max_loras,
        "rank": rank,
        "prompt_mean": PROMPT_MEAN,
        "output_mean": OUTPUT_MEAN,
        "arms": rows,
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# LoRA adapters on native CPU engines (`make bench-lora`, native arm)",
        "",
        f"{doc['engines']} native engines (one torch thread each), medium llama, {len(doc['arms'])} arms on one "
        f"trace: {doc['rate']:g} req/s for {doc['duration_s']:g} s, prompts ~{doc['prompt_mean']} and outputs "
        f"~{doc['output_mean']} tokens, adapters of rank {doc['rank']}, {doc['max_loras']} slots per shared engine.",
        "",
        "| arm | completed | failed | req/s | out tok/s | TTFT p50 s | TTFT p99 s | SLO | adapter loads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["arms"]:
        cells = [r.get(k) for k in ("completed", "failed", "completed_rps", "output_tokens_per_s")]
        cells += [r.get(k) for k in ("ttft_p50_s", "ttft_p99_s", "slo_attainment", "adapter_loads")]
        lines.append(f"| {r['arm']} | " + " | ".join("—" if v is None else f"{v:g}" for v in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    d = Setup()
    p.add_argument("--out", type=Path, default=Path(".bench/lora/native"))
    p.add_argument("--arms", nargs="+", default=list(NATIVE_ARMS), choices=list(NATIVE_ARMS))
    p.add_argument("--rate", type=float, default=3.0, help="requests/s (3)")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--adapters", type=int, default=d.adapters)
    p.add_argument("--engines", type=int, default=d.engines)
    p.add_argument("--max-loras", type=int, default=d.max_loras)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args(argv)
    setup = replace(d, adapters=a.adapters, engines=a.engines, max_loras=a.max_loras, seed=a.seed)
    doc = native(setup, a.out, a.arms, a.rate, a.duration_s, a.rank)
    (a.out / "native.json").write_text(json.dumps(doc, indent=2))
    (a.out / "native.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()

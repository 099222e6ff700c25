"""``make bench-load-reports``: what the engines' load reports cost, per report interval.

Every engine streams a load snapshot (``WatchLoad``) to each scheduler and to the migration leader
every ``load_interval_s``; dispatch reads the latest one plus what it sent since (``LoadBook``). A
shorter interval gives dispatch fresher adapter residency and load (``docs/benchmarks/lora.md``: at
40 req/s on 4 emulated A100s, ``lora_affinity`` loads 165 adapters live at 0.5 s against the
simulator's 117, and 112 at 0.05 s) at the price of more snapshots built, sent and parsed. This
benchmark measures that price on the real stream:

- an **engines process** serves ``--engines`` real ``EngineServicer`` s over gRPC on loopback, each on
  its own port, whose backend answers ``load_snapshot()`` with a fixed snapshot of a busy engine
  (``--requests`` requests held over 4 models, 8 adapters resident): the servicer's own
  ``WatchLoad`` loop builds and sends it;
- a **scheduler process** runs the real ``LoadMonitor`` feeding a ``LoadBook``, as
  ``llmfleet-scheduler`` does, following every engine at the interval under test;
- for ``--seconds`` each, both processes' CPU time (user + system) is read, and the reports the book
  received are counted. Each process reads its own (``getrusage``, microseconds): the kernel's
  per-process figures elsewhere (``/proc``, ``psutil``) count 10 ms ticks, coarser than a short row's
  engine CPU.

Per (engines, requests, interval) it reports reports/s, CPU seconds per second of each process (the
share of one core), CPU per report on each side, and the wire bytes/s. Nothing is asserted: the
numbers feed the choice of the default interval (``scheduler.load_interval_s``, docs/benchmarks/
load-reports.md). Two cores are shared by both processes, so a row's CPU is what each process used,
not what it waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

INTERVALS = (0.5, 0.2, 0.1, 0.05)
MODELS = ("llama2-7b", "llama2-13b", "opt-6.7b", "qwen3-32b")


def busy_snapshot(requests: int) -> Any:
    """A loaded engine's snapshot: ``requests`` requests spread over 4 models (a quarter waiting),
    the first model a LoRA base with 8 adapters resident, prefix caching on."""
    from llmfleet_engine.outputs import LoadSnapshot, ModelLoad, PrefixCacheLoad, RequestLoads

    models = [MODELS[i % len(MODELS)] for i in range(requests)]
    phases = ["waiting" if i % 4 == 0 else "decode" for i in range(requests)]
    adapters = tuple(f"adapter-{i}" for i in range(8))
    return LoadSnapshot(
        timestamp=time.time(),
        running=requests - requests // 4,
        waiting=requests // 4,
        kv_used_bytes=40 << 30,
        kv_capacity_bytes=60 << 30,
        tokens_per_s=4000.0,
        models=tuple(
            ModelLoad(
                model=m,
                running=requests // 4,
                waiting=requests // 16,
                kv_tokens=100_000,
                kv_used_bytes=10 << 30,
                kv_blocks=6_000,
                tokens_per_block=16,
                adapters=adapters if i == 0 else (),
                adapter_slots=8 if i == 0 else 0,
            )
            for i, m in enumerate(MODELS)
        ),
        kv_blocks_used=24_000,
        kv_blocks_total=36_000,
        requests=RequestLoads(
            request_ids=[f"req-{i:08d}-{'x' * 24}" for i in range(requests)],
            models=models,
            tokens=[1_000 + i for i in range(requests)],
            kv_bytes=[(1_000 + i) * 524_288 for i in range(requests)],
            phases=phases,
            adapters=[adapters[i % 8] if m == MODELS[0] else "" for i, m in enumerate(models)],
        ),
        max_running=256,
        prefix_cache=PrefixCacheLoad(blocks=30_000, idle_blocks=6_000, queries=10**7, hits=4 * 10**6),
    )


@dataclass
class FixedLoad:
    """The part of an engine backend ``WatchLoad`` reads: a fixed snapshot; no KV transfer."""

    snapshot: Any
    migration: None = None

    def load_snapshot(self) -> Any:
        return self.snapshot


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def answer_cpu_s(asked: Connection) -> None:
    """Answers each message on ``asked`` with this process's CPU seconds, blocked (no CPU) between."""
    while True:
        asked.recv()
        asked.send(cpu_s())


def serve_engines(engines: int, requests: int, ports: Any, stop: Any, cpu: Connection) -> None:
    """The engines process: ``engines`` servicers, their ports put on ``ports``, until ``stop``;
    answers each message on ``cpu`` with its CPU seconds so far."""
    from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
    from llmfleet.rpc.server import GrpcServer, service_name
    from llmfleet_engine.servicer import EngineServicer

    async def main() -> None:
        load = FixedLoad(busy_snapshot(requests))
        servers = []
        for i in range(engines):
            servicer = EngineServicer(load, f"emu-{i}")  # type: ignore[arg-type]
            add = engine_pb2_grpc.add_EngineServicer_to_server
            servers.append(await GrpcServer([(add, servicer, service_name(engine_pb2, "Engine"))]).start())
        ports.put([s.port for s in servers])
        threading.Thread(target=answer_cpu_s, args=(cpu,), daemon=True).start()
        while not stop.is_set():
            await asyncio.sleep(0.1)

    asyncio.run(main())


class CountingBook:
    """A ``LoadBook`` that counts the reports it hears."""

    def __init__(self) -> None:
        from llmfleet.load.book import LoadBook

        self.book = LoadBook()
        self.reports = 0

    def report(self, engine_id: str, report: Any) -> None:
        self.reports += 1
        self.book.report(engine_id, report)

    def forget(self, engine_id: str) -> None:
        self.book.forget(engine_id)


def ask_cpu_s(engines: Connection) -> float:
    engines.send(None)
    return float(engines.recv())


async def follow(
    ports: list[int], interval_s: float, seconds: float, engines: Connection
) -> dict[str, float]:
    """The scheduler side: a ``LoadMonitor`` at ``interval_s`` over every engine for ``seconds``;
    ``engines`` answers with the engines process's CPU seconds."""
    from llmfleet.load.monitor import LoadMonitor
    from llmfleet.types import ENGINE_ROLE, NodeRecord

    book = CountingBook()
    monitor = LoadMonitor(interval_s=interval_s, listeners=[book])
    monitor.reconcile(
        {f"emu-{i}": NodeRecord(f"emu-{i}", ENGINE_ROLE, f"127.0.0.1:{p}") for i, p in enumerate(ports)}
    )
    await asyncio.sleep(max(1.0, 2 * interval_s))  # streams open, first snapshots in
    e0 = await asyncio.to_thread(ask_cpu_s, engines)
    s0, r0, t0 = cpu_s(), book.reports, time.monotonic()
    await asyncio.sleep(seconds)
    s1, r1, t1 = cpu_s(), book.reports, time.monotonic()
    e1 = await asyncio.to_thread(ask_cpu_s, engines)
    await monitor.close()
    wall, n = t1 - t0, r1 - r0
    return {
        "reports_per_s": n / wall,
        "scheduler_cpu_per_s": (s1 - s0) / wall,
        "engines_cpu_per_s": (e1 - e0) / wall,
        "scheduler_us_per_report": 1e6 * (s1 - s0) / n if n else float("nan"),
        "engine_us_per_report": 1e6 * (e1 - e0) / n if n else float("nan"),
    }


def measure(engines: int, requests: int, interval_s: float, seconds: float) -> dict[str, Any]:
    from llmfleet_engine.servicer import snapshot_to_proto

    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    here, there = ctx.Pipe()
    proc = ctx.Process(target=serve_engines, args=(engines, requests, ports, stop, there), daemon=True)
    proc.start()
    try:
        got = asyncio.run(follow(ports.get(timeout=120), interval_s, seconds, here))
    finally:
        stop.set()
        proc.join(timeout=10)
    size = snapshot_to_proto(busy_snapshot(requests), "emu-0").ByteSize()
    row = {"engines": engines, "requests": requests, "interval_s": interval_s, "snapshot_bytes": size}
    return {
        **row,
        **{k: round(v, 4) for k, v in got.items()},
        "bytes_per_s": round(size * got["reports_per_s"]),
    }


def markdown(rows: list[dict[str, Any]], seconds: float) -> str:
    lines = [
        "# Load reports: what each interval costs",
        "",
        f"Real `WatchLoad` streams on loopback, {seconds:g} s per row (`tools/bench/load_report_cost.py`).",
        "",
        "| engines | requests held | interval (s) | reports/s | scheduler CPU (cores) | engines' CPU (cores) "
        "| µs/report scheduler | µs/report engine | snapshot bytes | MB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engines']} | {r['requests']} | {r['interval_s']:g} | {r['reports_per_s']:.0f} | "
            f"{r['scheduler_cpu_per_s']:.3f} | {r['engines_cpu_per_s']:.3f} | {r['scheduler_us_per_report']:.0f} | "
            f"{r['engine_us_per_report']:.0f} | {r['snapshot_bytes']:,} | {r['bytes_per_s'] / 1e6:.2f} |"
        )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(".bench/load-reports"))
    p.add_argument("--engines", type=int, nargs="+", default=[16, 64])
    p.add_argument("--requests", type=int, nargs="+", default=[16, 256], help="requests each engine holds")
    p.add_argument("--intervals", type=float, nargs="+", default=list(INTERVALS))
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per row")
    a = p.parse_args(argv)
    rows = []
    for engines in a.engines:
        for requests in a.requests:
            for interval in a.intervals:
                row = measure(engines, requests, interval, a.seconds)
                print(json.dumps(row), flush=True)
                rows.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "load_reports.json").write_text(json.dumps({"seconds": a.seconds, "rows": rows}, indent=2))
    (a.out / "load_reports.md").write_text(markdown(rows, a.seconds))
    print(markdown(rows, a.seconds))


if __name__ == "__main__":
    main()

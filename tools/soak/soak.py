"""``make soak``: many concurrent streams through the HTTP API and the SDK on a local cluster, no faults.

The cluster is the chaos suite's (``tools/chaos/chaos.py``: etcd, two scheduler replicas with HTTP,
profiler, placement and migration with a standby each, ``--engines`` CPU engines hosting the tiny llama
without EOS, so every request generates exactly its ``max_tokens``). ``--concurrency`` closed-loop
streams (half SDK with both replicas, half ``POST /v1/completions`` with ``stream: true`` alternating
replicas) issue ``--requests`` requests in all, greedy, ``max_tokens`` from ``--lengths`` (short: the
engines' work is scaled down so that a small machine measures the serving path, not the model); every
output is checked against a reference computed once per (prompt, length).

Reports errors (goal 0; a 429 / RESOURCE_EXHAUSTED retried after the server's pushback is a retry,
not an error), p50 / p99 TTFT and latency per path, and the resident memory (``/proc/<pid>/status``
VmRSS, a process's descendants included) of every process and of this load generator at the start,
after ``--warmup`` requests and at the end (goal: flat within 10 % from warm-up to the end).
Writes ``soak.json`` and ``soak.md`` to ``--out`` (default ``.bench/soak``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmfleet.config import DEFAULT_TTL_S

from tools.chaos.chaos_cluster import ChaosCluster
from tools.chaos.chaos_load import Load, compute_reference
from tools.chaos.chaos_outcomes import Outcome, Reference, counts
from tools.soak.soak_report import markdown, stats
from tools.toolkit.procs import rss_kib

log = logging.getLogger("soak")


def _rss_all(cluster: ChaosCluster, child: subprocess.Popen | None = None) -> dict[str, int]:
    out = cluster.rss_kib()
    for name, pid in (("load-generator", os.getpid()), ("load-generator-http", child and child.pid)):
        rss = rss_kib(pid) if pid else None
        if rss is not None:
            out[name] = rss
    return out


async def _http_worker(spec_path: Path) -> None:
    """``--http-worker SPEC``: the HTTP half of the load in its own process (see ``run_soak``)."""
    spec = json.loads(spec_path.read_text())
    reference = Reference(text={(p, n): t for p, n, t in spec["reference"]})
    load = Load(
        ["unused:0"],
        spec["http"],
        reference,
        concurrency=spec["concurrency"],
        lengths=spec["lengths"],
        clients=spec["clients"],
        max_requests=spec["requests"],
        request_timeout_s=spec["timeout"],
        http_retries=10,
        http_share=1.0,
    )
    await load.start()
    await load.all_done.wait()
    await load.stop(drain_s=60)
    Path(spec["out"]).write_text(json.dumps([asdict(o) for o in load.outcomes]))


@dataclass(frozen=True)
class SoakSettings:
    """What ``run_soak`` is asked for (see its flags in :func:`main`)."""

    concurrency: int
    requests: int
    warmup: int
    lengths: Sequence[int]
    clients: int
    request_timeout_s: float
    http_share: float
    split: bool


@dataclass
class SoakLoad:
    """The load of this process and, when the HTTP half runs in a child, that child's spec file."""

    load: Load
    warmup: int  # requests of this process's load before the warm-up RSS sample
    spec_path: Path | None = None  # the child's spec (``--http-worker``); None: one process
    outcomes_path: Path | None = None  # where the child writes its outcomes


def _plan_load(cluster: ChaosCluster, reference: Reference, s: SoakSettings) -> SoakLoad:
    """This process's load and, with ``split``, the spec of the child that carries the HTTP half."""
    n_http = round(s.concurrency * s.http_share)
    r_http = round(s.requests * s.http_share)
    common: dict[str, Any] = {
        "lengths": s.lengths,
        "clients": s.clients,
        "request_timeout_s": s.request_timeout_s,
    }
    if s.split and n_http and n_http < s.concurrency:
        # the HTTP half in its own process: in one event loop, hundreds of busy httpx streams starved
        # the SDK's grpc.aio streams (first tokens only once the HTTP load stopped)
        tmp = Path(tempfile.mkdtemp(prefix="soak-http-"))
        spec = {
            "http": cluster.http_addresses,
            "concurrency": n_http,
            "requests": r_http,
            "lengths": list(s.lengths),
            "clients": s.clients,
            "timeout": s.request_timeout_s,
            "reference": [[p, n, t] for (p, n), t in reference.text.items()],
            "out": str(tmp / "outcomes.json"),
        }
        (tmp / "spec.json").write_text(json.dumps(spec))
        load = Load.on(
            cluster,
            reference,
            concurrency=s.concurrency - n_http,
            max_requests=s.requests - r_http,
            http_share=0.0,
            **common,
        )
        return SoakLoad(load, round(s.warmup * (1 - s.http_share)), tmp / "spec.json", Path(spec["out"]))
    load = Load.on(
        cluster,
        reference,
        concurrency=s.concurrency,
        max_requests=s.requests,
        http_retries=10,
        http_share=s.http_share,
        **common,
    )
    return SoakLoad(load, s.warmup)


async def _watch(
    cluster: ChaosCluster,
    plan: SoakLoad,
    child: subprocess.Popen | None,
    requests: int,
    t0: float,
    report_s: float,
) -> tuple[float | None, dict[str, int]]:
    """Until every request is done: take the RSS sample at the end of the warm-up (then count later
    requests as phase 1) and log progress every ``report_s``; returns (warm-up end, its sample)."""
    load = plan.load
    rss_warm: dict[str, int] = {}
    t_warm = None
    last_report = t0
    while not load.all_done.is_set() or (child is not None and child.poll() is None):
        await asyncio.sleep(0.5)
        done = sum(o.status != "running" for o in load.outcomes)
        if t_warm is None and done >= plan.warmup:
            t_warm = time.monotonic()
            rss_warm = _rss_all(cluster, child)
            load.phase = 1
            log.info("warm-up done: %d requests in %.1fs", done, t_warm - t0)
        if time.monotonic() - last_report >= report_s:
            last_report = time.monotonic()
            errors = sum(o.status not in ("ok", "running") for o in load.outcomes)
            log.info(
                "%.0fs: %d/%d done, %d open, %d not ok",
                last_report - t0,
                done,
                requests,
                sum(o.status == "running" for o in load.outcomes),
                errors,
            )
    return t_warm, rss_warm


def _child_outcomes(child: subprocess.Popen, path: Path, t_warm: float | None) -> list[Outcome]:
    """The HTTP child's outcomes, each in phase 1 when it started after the warm-up."""
    if child.returncode != 0:
        raise RuntimeError(f"the HTTP load process failed (exit {child.returncode})")
    out = []
    for d in json.loads(path.read_text()):
        o = Outcome(**d)
        o.phase = 1 if t_warm is not None and o.started >= t_warm else 0
        out.append(o)
    return out


async def run_soak(
    cluster: ChaosCluster,
    *,
    concurrency: int,
    requests: int,
    warmup: int,
    lengths: Sequence[int],
    clients: int,
    request_timeout_s: float,
    report_s: float = 10.0,
    http_share: float = 0.5,
    split: bool = True,
) -> dict[str, Any]:
    """The reference, then ``requests`` requests at ``concurrency`` streams; returns the report dict."""
    await cluster.wait_routed()
    reference = await compute_reference(cluster.sdk_addresses[0], lengths)
    settings = SoakSettings(
        concurrency, requests, warmup, lengths, clients, request_timeout_s, http_share, split
    )
    plan = _plan_load(cluster, reference, settings)
    load, child = plan.load, None
    rss_start = _rss_all(cluster)
    t0 = time.monotonic()
    if load.max_requests is not None and load.max_requests < requests:
        child = subprocess.Popen(
            [sys.executable, "-m", "tools.soak.soak", "--http-worker", str(plan.spec_path)]
        )
    await load.start()
    t_warm, rss_warm = await _watch(cluster, plan, child, requests, t0, report_s)
    elapsed = time.monotonic() - t0
    rss_end = _rss_all(cluster, child)  # the child's last sample is the one at warm-up if it exited
    await load.stop(drain_s=60)
    outcomes = load.outcomes
    if child is not None:
        assert plan.outcomes_path is not None
        outcomes += _child_outcomes(child, plan.outcomes_path, t_warm)
    growth = {
        name: round(rss_end[name] / rss_warm[name] - 1, 4)
        for name in rss_end
        if name in rss_warm and rss_warm[name] > 0
    }
    return {
        "config": {
            "concurrency": concurrency,
            "requests": requests,
            "warmup": warmup,
            "lengths": list(lengths),
            "clients": clients,
            "http_share": http_share,
            "http_in_own_process": child is not None,
            "engines": cluster.engine_ids,
            "ttl_s": cluster.ttl,
            "host": platform.node(),
            "cpus": os.cpu_count(),
        },
        "elapsed_s": round(elapsed, 1),
        "throughput_rps": round(len(outcomes) / elapsed, 1),
        "warmup_s": None if t_warm is None else round(t_warm - t0, 1),
        "counts": counts(outcomes),
        "all": stats(outcomes),
        "sdk": stats([o for o in outcomes if o.path == "sdk"]),
        "http": stats([o for o in outcomes if o.path == "http"]),
        "after_warmup": stats([o for o in outcomes if o.phase == 1]),
        "rss_kib": {"start": rss_start, "after_warmup": rss_warm, "end": rss_end},
        "rss_growth_after_warmup": growth,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=2000, help="concurrent streams (half SDK, half HTTP)")
    p.add_argument("--requests", type=int, default=20000, help="requests in all")
    p.add_argument("--warmup", type=int, default=None, help="requests before the warm-up RSS (default 10%%)")
    p.add_argument("--lengths", default="2,4,8", help="max_tokens choices (short: CPU engines)")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--clients", type=int, default=16, help="SDK clients and HTTP connection pools each")
    p.add_argument("--request-timeout-s", type=float, default=300)
    p.add_argument("--http-share", type=float, default=0.5, help="the share of streams through HTTP")
    p.add_argument(
        "--same-process",
        action="store_true",
        help="run the HTTP and SDK load in one event loop (default: the HTTP half in a child process)",
    )
    p.add_argument(
        "--front-workers",
        type=int,
        default=0,
        help="the HTTP half through the OpenAI front with N workers (0: the schedulers' own API)",
    )
    p.add_argument("--http-worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", default=".bench/soak")
    args = p.parse_args(argv)
    if args.http_worker is not None:
        logging.getLogger("httpx").setLevel(logging.WARNING)
        asyncio.run(_http_worker(args.http_worker))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("llmfleet", "httpx", "chaos"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    root = Path(tempfile.mkdtemp(prefix="llmfleet-soak-"))
    cluster = ChaosCluster(root, engines=args.engines, ttl=DEFAULT_TTL_S, front_workers=args.front_workers)
    try:
        cluster.start()
        report = asyncio.run(
            run_soak(
                cluster,
                concurrency=args.concurrency,
                requests=args.requests,
                warmup=args.warmup if args.warmup is not None else args.requests // 10,
                lengths=[int(x) for x in args.lengths.split(",")],
                clients=args.clients,
                request_timeout_s=args.request_timeout_s,
                http_share=args.http_share,
                split=not args.same_process,
            )
        )
    finally:
        cluster.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    (out / "soak.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'soak.json'} and {out / 'soak.md'}; logs under {root / 'logs'}")
    shutil.rmtree(root / "etcd", ignore_errors=True)
    c = report["counts"]
    return 0 if c["error"] + c["lost"] + c["duplicated"] + c["gapped"] + c["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

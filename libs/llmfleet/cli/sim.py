"""Simulate a workload on a GPU cluster with the shipped policy code.

  llmfleet sim --trace ../shared/traces/azure_llm_2023_conv.csv --cluster 32xA100-80GB \\
      --services services.yaml --policy seallm --out .sim/seallm
  llmfleet sim --trace trace.csv --compare vllm alpaserve muxserve seallm --out .sim/compare

  llmfleet sim --synthetic 2000 --cluster-config deploy/local/cluster.yaml --policy seallm

The workload is an Azure-format trace (TIMESTAMP,ContextTokens,GeneratedTokens), ``--synthetic N``
Poisson requests with lengths drawn from ``--lengths-from`` (a trace), or ``--conversations N``
multi-turn conversations (each turn resends the history; ``llmfleet.workload.conversations``);
``--system-prompt-tokens K`` starts every prompt with its service's system prompt. ``--services`` is a YAML list of
services (name, model, slo: {ttft_s, tpot_s, latency_scale, deadline_s}, max_tokens) with an optional
``engine:`` mapping of engine settings; ``--cluster-config`` reads the services (with their SLOs) and
the engine limits of a live cluster config instead, each model simulated as its ``sim_model`` (or its
own name, when that is a catalog name). With several services the requests are split by k-means over
their lengths, shortest cluster to the first service. ``--profile`` takes fitted cost-model records
(JSON written by the profiler) to replace the roofline defaults; ``--cost-source vidur`` uses measured
GPU operator timings (``llmfleet.costmodel.vidur``) instead of the roofline for the others.

Without ``--policy``/``--compare``, ``--cluster-config`` runs the cluster file's own policy sections
(engine, dispatch, placement, migration, capacity: :mod:`llmfleet.spec`), as ``llmfleet up`` would
with the same file; each policy flag below overrides one field of one section (``--engine-policy``,
``--dispatch``, ``--placement-interval-s``, ...; see :mod:`llmfleet.cli.sim_args`).

``--placement NAME`` replaces the preset's placement planner; with ``--placement-interval-s`` it also
runs during the simulation, every interval over the last ``--placement-window-s`` of the workload
(``--adaptive-interval``: SeaLLM's Eq. 8 adapts the interval), and its plans are applied with load,
move and drain times (report.json: ``placement`` decisions, ``cluster.gpu_seconds``, GPUs in use).
Planners that score plans by simulation (seallm) simulate on ``--placement-processes`` processes,
spawned once for the whole run.

``--migration mell|llumnix_lb|none`` runs a request-migration policy every ``--migration-epoch-s``
(moves travel by ``--transfer hybrid|kv|tokens``); with ``--dispatch mell`` arrivals go where Mell's
Allocate would put them. The report gains ``migration`` and ``cluster.fluid_bound_gpus``.

  llmfleet sim --trace trace.csv --services services.yaml --policy seallm --placement seallm \
      --placement-interval-s 60 --adaptive-interval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmfleet.cli.sim_args import (
    add_policy_arguments,
    add_system_arguments,
    bundles,
    describe,
    sim_spec,
)
from llmfleet.cli.workload_args import (
    DEFAULT_SYNTHETIC_RATE,
    add_workload_arguments,
    build_workload,
    describe_source,
    workload_source,
)
from llmfleet.config import ClusterConfig
from llmfleet.costmodel import load_record
from llmfleet.costmodel.sources import COST_SOURCES, DEFAULT_COST_SOURCE
from llmfleet.policies.placement import POLICIES as PLACEMENT
from llmfleet.rpc.cli_args import positive_float
from llmfleet.sim.partition import auto_workers
from llmfleet.sim.plan_eval import PlanWorkers, evaluator_factory
from llmfleet.sim.report import markdown_table, write_report
from llmfleet.sim.run import PRESETS, simulate


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p, required=False)  # required unless --list-policies (checked in _prepare)
    p.add_argument("--rate", type=positive_float, default=DEFAULT_SYNTHETIC_RATE,
                   help="synthetic arrival rate, req/s; with --conversations, conversations/s (default 10)")  # fmt: skip
    add_system_arguments(p)
    add_policy_arguments(p)
    add_run_arguments(p)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Costs, outputs and processes."""
    p.add_argument(
        "--profile", type=Path, action="append", default=[], help="fitted ProfileRecord JSON (repeatable)"
    )
    p.add_argument(
        "--cost-source",
        choices=COST_SOURCES,
        default=None,
        help="iteration costs of models without --profile (default: a --cluster-config's emulated.cost_source, "
        f"else {DEFAULT_COST_SOURCE}): calibrated "
        "(measured A100-80GB/H100 operator timings from Microsoft Vidur plus the fitted per-iteration CPU "
        "overhead; elsewhere the roofline scaled by fitted factors), vidur (the measured operators with a "
        "fixed 2 ms overhead; elsewhere the roofline) or roofline (datasheet peaks, no overhead)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(".sim"), help="output directory (default .sim)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--records", action="store_true", help="also write requests.jsonl")
    p.add_argument("--list-policies", action="store_true", help="print the presets and exit")
    p.add_argument(
        "--workers",
        default="auto",
        help="processes to split a run across when the result stays exact (load-blind dispatch such as "
        "round robin); 'auto' (default): the CPUs available for runs of 20,000+ requests, else 1",
    )


def _workers(value: str, n_requests: int) -> int:
    if value == "auto":
        return auto_workers(n_requests)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--workers must be 'auto' or a positive integer, got {value!r}")
    return n


def _list_policies() -> int:
    for b in PRESETS.values():
        print(describe(b))
    print(f"placement planners (--placement): {', '.join(sorted(PLACEMENT))}")
    return 0


def _prepare(args: argparse.Namespace):
    """(spec, bundles, profile records, workload, workers) from the flags; ValueError naming a bad one."""

    if workload_source(args) is None:
        raise ValueError(
            "give the workload: --trace FILE, --synthetic N, --conversations N, --users N or --shared-prefix N"
        )
    if args.placement_processes < 1:
        raise ValueError(f"--placement-processes must be >= 1, got {args.placement_processes}")
    config = ClusterConfig.load(args.cluster_config) if args.cluster_config is not None else None
    spec = sim_spec(args, config)  # its errors name the file and the key
    runs = bundles(args, config)
    records = [load_record(p) for p in args.profile]
    workload = build_workload(args)
    return spec, runs, records, workload, _workers(args.workers, len(workload))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    if args.list_policies:
        return _list_policies()
    try:
        spec, runs, records, workload, workers = _prepare(args)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"llmfleet sim: {e}", file=sys.stderr)
        return 2
    console.print(
        f"{len(workload)} requests over {workload.duration_s:.0f} s ({workload.rate_rps:.2f} req/s) on "
        f"{spec.cluster}; services: {', '.join(f'{s.name}→{s.model}' for s in spec.services)}"
    )
    try:
        experiments = _simulate_all(args, spec, runs, records, workload, workers, console)
    except ValueError as err:  # placement infeasible, model does not fit, ...
        print(f"llmfleet sim: {err}", file=sys.stderr)
        return 2
    return _write(args, spec, workload, experiments, console)


def _simulate_all(args, spec, runs, records, workload, workers, console) -> list:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    experiments = []
    with Progress(TextColumn("{task.description:18}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("sim t={task.fields[now]:.0f}s"), TimeElapsedColumn(), console=console) as bar, \
            PlanWorkers(args.placement_processes) as plan_workers:  # fmt: skip
        for b in runs:
            task = bar.add_task(b.name, total=len(workload), now=0.0)
            try:
                e = simulate(
                    spec, workload, b, records=records,
                    progress=lambda done, now, task=task: bar.update(task, completed=done, now=now),
                    workers=workers,
                    evaluator_factory=evaluator_factory(b, records=records, workers=plan_workers),
                )  # fmt: skip
            except ValueError as err:
                raise ValueError(f"policy {b.name}: {err}") from None
            experiments.append(e)
    return experiments


def _write(args, spec, workload, experiments, console) -> int:
    source = f", {describe_source(args)}"
    context = (
        f"{len(workload)} requests, {spec.cluster}, services "
        + ", ".join(f"{s.name}→{s.model}" for s in spec.services)
        + source
        + f", costs: {spec.cost_source}"
    )
    paths = write_report(experiments, args.out, title="llmfleet sim", context=context,
                         records=args.records, plots=not args.no_plots)  # fmt: skip
    print(markdown_table(experiments))
    failed = sum(e.report["overall"]["failed"] for e in experiments)
    if failed:
        console.print(f"[yellow]{failed} request(s) could not be served (see report.json: failed)[/]")
    console.print(f"report: {paths['markdown']}  json: {paths['json']}  plots: {args.out}/*.png")
    return 0

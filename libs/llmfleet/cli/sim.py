"""Simulate a workload on a GPU cluster with the shipped policy code.

  llmfleet sim --trace ../shared/traces/azure_llm_2023_conv.csv --cluster 32xA100-80GB \\
      --services services.yaml --policy seallm --out .sim/seallm
  llmfleet sim --trace trace.csv --compare vllm alpaserve muxserve seallm --out .sim/compare

  llmfleet sim --synthetic 2000 --cluster-config deploy/local/cluster.yaml --policy seallm

The workload is an Azure-format trace (TIMESTAMP,ContextTokens,GeneratedTokens) or ``--synthetic N``
Poisson requests with lengths drawn from ``--lengths-from`` (a trace). ``--services`` is a YAML list of
services (name, model, slo: {ttft_s, tpot_s, latency_scale, deadline_s}, max_tokens) with an optional
``engine:`` mapping of engine settings; ``--cluster-config`` reads the services (with their SLOs) and
the engine limits of a live cluster config instead, each model simulated as its ``sim_model`` (or its
own name, when that is a catalog name). With several services the requests are split by k-means over
their lengths, shortest cluster to the first service. ``--profile`` takes fitted cost-model records
(JSON written by the profiler) to replace the roofline defaults; ``--cost-source vidur`` uses measured
GPU operator timings (``llmfleet.costmodel.vidur``) instead of the roofline for the others.

``--placement NAME`` replaces the preset's placement planner; with ``--placement-interval-s`` it also
runs during the simulation, every interval over the last ``--placement-window-s`` of the workload
(``--adaptive-interval``: SeaLLM's Eq. 8 adapts the interval), and its plans are applied with load,
move and drain times (report.json: ``placement`` decisions, ``cluster.gpu_seconds``, GPUs in use).
Planners that score plans by simulation (seallm) simulate on ``--placement-processes`` processes.

``--migration mell|llumnix_lb|none`` runs a request-migration policy every ``--migration-epoch-s``
(moves travel by ``--transfer hybrid|kv|tokens``); with ``--dispatch mell`` arrivals go where Mell's
Allocate would put them. The report gains ``migration`` and ``cluster.fluid_bound_gpus``.

  llmfleet sim --trace trace.csv --services services.yaml --policy seallm --placement seallm \
      --placement-interval-s 60 --adaptive-interval
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from llmfleet.cli.workload_args import (
    DEFAULT_SYNTHETIC_RATE,
    add_workload_arguments,
    build_workload,
)
from llmfleet.rpc.cli_args import positive_float

NAME = "sim"
HELP = "simulate a workload on a cluster with the shipped policies (and compare policies)"
DEFAULT_COMPARE = ("vllm", "alpaserve", "muxserve", "seallm", "fcfs-jsq", "fcfs-p2c", "sls")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p, required=True)
    p.add_argument(
        "--rate",
        type=positive_float,
        default=DEFAULT_SYNTHETIC_RATE,
        help="synthetic arrival rate, req/s (default 10)",
    )
    p.add_argument("--cluster", default="32xA100-80GB", help="COUNTxHARDWARE (default 32xA100-80GB)")
    svc = p.add_mutually_exclusive_group()
    svc.add_argument("--services", type=Path, help="services YAML (default: one service of --model)")
    svc.add_argument(
        "--cluster-config",
        type=Path,
        help="take the services, SLOs and engine limits of a live cluster config (deploy/local/cluster.yaml)",
    )
    p.add_argument("--model", default="llama2-7b", help="model of the default service (default llama2-7b)")
    p.add_argument("--policy", default="vllm", help="policy preset (default vllm); see --list-policies")
    p.add_argument(
        "--compare",
        nargs="*",
        metavar="POLICY",
        help=f"run several presets (default {' '.join(DEFAULT_COMPARE)})",
    )
    p.add_argument("--dispatch", help="override the preset's dispatch policy")
    p.add_argument(
        "--local", help="override the preset's engine-local policy (request policy or static batcher)"
    )
    p.add_argument("--placement", help="override the preset's placement planner")
    p.add_argument(
        "--placement-interval-s",
        type=float,
        help="re-run the placement planner every S simulated seconds (default: place once)",
    )
    p.add_argument(
        "--placement-window-s",
        type=float,
        help="recent workload each placement reads (default: the interval)",
    )
    p.add_argument(
        "--adaptive-interval",
        action="store_true",
        help="adapt the placement interval (SeaLLM Eq. 8) starting from --placement-interval-s",
    )
    p.add_argument(
        "--placement-confirm-intervals",
        type=int,
        help="apply a changed plan once proposed this many intervals in a row (the live leader's "
        "hysteresis; default 1: at once)",
    )
    p.add_argument(
        "--placement-processes",
        type=int,
        default=1,
        help="processes simulating candidate plans, for planners that score plans by simulation (default 1)",
    )
    p.add_argument(
        "--migration",
        help="run a request-migration policy every epoch: mell (KV packing), llumnix_lb, none "
        "(report.json: migration, cluster.fluid_bound_gpus)",
    )
    p.add_argument(
        "--engine-gpus",
        type=int,
        help="instances are at most this many GPUs, as in a live fleet of fixed-size engines (llmfleet up "
        "--emulate: 1); default: up to a node",
    )
    p.add_argument(
        "--binding",
        choices=("early", "late"),
        help="late: arrivals wait in the scheduler while every instance of their model is saturated, as "
        "the live scheduler's --binding late (default early: each arrival is dispatched at once)",
    )
    p.add_argument(
        "--first-plan",
        choices=("oracle", "cold"),
        help="the plan in force at the start: oracle (default) = planned on the workload's own demand; cold "
        "= as a live placement leader starts, with no request seen yet (compare with llmfleet load)",
    )
    p.add_argument(
        "--move-queued",
        action="store_true",
        default=None,
        help="every migration epoch, move requests not started off instances past their room onto "
        "instances with room (the live scheduler's --move-queued)",
    )
    p.add_argument(
        "--no-cold-start",
        dest="cold_start",
        action="store_false",
        default=None,
        help="a request for a model no instance serves fails at once instead of waiting for the "
        "placement loop to load it",
    )
    p.add_argument("--transfer", help="how migrations travel: hybrid (default), kv, tokens")
    p.add_argument("--migration-epoch-s", type=float, help="migration epoch in simulated seconds (default 1)")
    p.add_argument(
        "--profile", type=Path, action="append", default=[], help="fitted ProfileRecord JSON (repeatable)"
    )
    p.add_argument(
        "--cost-source",
        choices=("roofline", "vidur"),
        default="roofline",
        help="iteration costs of models without --profile: roofline (default, datasheet peaks) or vidur "
        "(measured A100-80GB/H100 operator timings from Microsoft Vidur, roofline attention; other "
        "hardware falls back to the roofline)",
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
    from llmfleet.sim.partition import auto_workers

    if value == "auto":
        return auto_workers(n_requests)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--workers must be 'auto' or a positive integer, got {value!r}")
    return n


def _spec(args):
    from llmfleet.config import ClusterConfig
    from llmfleet.sim.spec import (
        ClusterSpec,
        EngineSettings,
        SimService,
        SimSpec,
        from_cluster_config,
        load_services,
    )

    cluster = ClusterSpec.parse(args.cluster)
    if args.services is not None:
        services, engine = load_services(args.services)
    elif args.cluster_config is not None:
        config = ClusterConfig.load(args.cluster_config)  # its errors name the file and the key
        try:
            services, engine = from_cluster_config(config)
        except ValueError as e:
            raise ValueError(f"cluster config {args.cluster_config}: {e}") from None
    else:
        services, engine = (SimService("default", args.model),), EngineSettings()
    if getattr(args, "engine_gpus", None) is not None:
        cluster = dataclasses.replace(cluster, engine_gpus=args.engine_gpus)
    return SimSpec(cluster, services, engine, cost_source=getattr(args, "cost_source", "roofline"))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from llmfleet.costmodel import load_record
    from llmfleet.sim.plan_eval import evaluator_factory
    from llmfleet.sim.report import markdown_table, write_report
    from llmfleet.sim.run import PRESETS, preset, simulate

    console = Console(stderr=True)
    if args.list_policies:
        for b in PRESETS.values():
            print(f"{b.name:18} {b.placement:15} {b.dispatch:14} {b.local:16} {b.description}")
        from llmfleet.policies.placement import POLICIES as PLACEMENT

        print(f"placement planners (--placement): {', '.join(sorted(PLACEMENT))}")
        return 0
    try:
        names = list(args.compare or DEFAULT_COMPARE) if args.compare is not None else [args.policy]
        if args.placement_processes < 1:
            raise ValueError(f"--placement-processes must be >= 1, got {args.placement_processes}")
        bundles = [
            preset(
                n, dispatch=args.dispatch, local=args.local, placement=args.placement,
                placement_interval_s=args.placement_interval_s, placement_window_s=args.placement_window_s,
                adaptive_interval=args.adaptive_interval or None,
                placement_confirm_intervals=args.placement_confirm_intervals,
                migration=args.migration, transfer=args.transfer, migration_epoch_s=args.migration_epoch_s,
                binding=args.binding, cold_start=args.cold_start, move_queued=args.move_queued,
                first_plan=args.first_plan,
            )
            for n in names
        ]  # fmt: skip
        spec = _spec(args)
        if args.cluster_config is not None and args.binding is None:  # the live schedulers' setting
            from llmfleet.config import ClusterConfig

            sched = ClusterConfig.load(args.cluster_config).scheduler
            bundles = [
                dataclasses.replace(
                    b, binding=sched.binding,
                    binding_options={"queue_slack": sched.queue_slack, "kv_fraction": sched.kv_room_fraction},
                    cold_start=sched.cold_start if args.cold_start is None else args.cold_start,
                    move_queued=sched.move_queued if args.move_queued is None else args.move_queued,
                )
                for b in bundles
            ]  # fmt: skip
        records = [load_record(p) for p in args.profile]
        workload = build_workload(args)
        workers = _workers(args.workers, len(workload))
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"llmfleet sim: {e}", file=sys.stderr)
        return 2
    console.print(
        f"{len(workload)} requests over {workload.duration_s:.0f} s ({workload.rate_rps:.2f} req/s) on "
        f"{spec.cluster}; services: {', '.join(f'{s.name}→{s.model}' for s in spec.services)}"
    )
    experiments = []
    with Progress(TextColumn("{task.description:18}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("sim t={task.fields[now]:.0f}s"), TimeElapsedColumn(), console=console) as bar:  # fmt: skip
        for b in bundles:
            task = bar.add_task(b.name, total=len(workload), now=0.0)
            try:
                e = simulate(
                    spec, workload, b, records=records,
                    progress=lambda done, now, task=task: bar.update(task, completed=done, now=now),
                    workers=workers,
                    evaluator_factory=evaluator_factory(b, records=records, processes=args.placement_processes),
                )  # fmt: skip
            except ValueError as err:  # placement infeasible, model does not fit, ...
                print(f"llmfleet sim: policy {b.name}: {err}", file=sys.stderr)
                return 2
            experiments.append(e)
    context = (
        f"{len(workload)} requests, {spec.cluster}, services "
        + ", ".join(f"{s.name}→{s.model}" for s in spec.services)
        + (
            f", trace {args.trace.name} ×{args.rate_scale}"
            if args.trace
            else f", synthetic {args.rate} req/s"
        )
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

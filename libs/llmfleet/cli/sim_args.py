"""``llmfleet sim``'s flags, and the policy bundles and spec they build.

Every policy flag names a field of a spec section (:mod:`llmfleet.spec`): ``--engine-policy`` is
``engine.policy``, ``--placement-interval-s`` is ``placement.interval_s``, ``--migration-epoch-s`` is
``migration.epoch_s``, ``--binding`` is ``capacity.binding``. With ``--cluster-config`` and no
``--policy``/``--compare``, the run is the cluster file's own sections (bundle ``cluster``), so
``llmfleet sim --cluster-config F`` and ``llmfleet up -c F`` build the same policies with the same
options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmfleet.costmodel.sources import DEFAULT_COST_SOURCE
from llmfleet.rpc.cli_args import json_object, positive_float
from llmfleet.spec.defaults import BINDINGS
from llmfleet.spec.renamed import SIM_FLAGS, add_renamed_flags

if TYPE_CHECKING:
    from llmfleet.config import ClusterConfig
    from llmfleet.sim.bundle import PolicyBundle
    from llmfleet.sim.spec import SimSpec

DEFAULT_COMPARE = ("vllm", "alpaserve", "muxserve", "seallm", "fcfs-jsq", "fcfs-p2c", "sls")
DEFAULT_PRESET = "vllm"
CLUSTER_BUNDLE = "cluster"  # the bundle of a cluster file's own sections


def add_system_arguments(p: argparse.ArgumentParser) -> None:
    """The cluster, the services, and the presets to run."""
    p.add_argument("--cluster", default="32xA100-80GB", help="COUNTxHARDWARE (default 32xA100-80GB)")
    svc = p.add_mutually_exclusive_group()
    svc.add_argument("--services", type=Path, help="services YAML (default: one service of --model)")
    svc.add_argument(
        "--cluster-config",
        type=Path,
        help="a live cluster file (deploy/local/cluster.yaml): its services, SLOs, engine limits and, without "
        "--policy/--compare, its own engine/dispatch/placement/migration/capacity sections",
    )
    p.add_argument("--model", default="llama2-7b", help="model of the default service (default llama2-7b)")
    p.add_argument(
        "--policy",
        help=f"policy preset (default {DEFAULT_PRESET}, or the cluster file's); see --list-policies",
    )
    p.add_argument("--compare", nargs="*", metavar="POLICY",
                   help=f"run several presets (default {' '.join(DEFAULT_COMPARE)})")  # fmt: skip
    p.add_argument(
        "--engine-gpus",
        type=int,
        help="instances are at most this many GPUs, as in a live fleet of fixed-size engines (llmfleet up "
        "--emulate: 1); default: up to a node",
    )


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides of the engine, dispatch and capacity sections."""
    p.add_argument("--engine-policy", help="engine.policy: the engine-local request policy or static batcher")
    add_renamed_flags(p, SIM_FLAGS)
    p.add_argument("--engine-options", type=json_object, help="engine.options (JSON object)")
    p.add_argument(
        "--dispatch", help="dispatch.policy (with --dispatch mell arrivals go where Mell's Allocate would)"
    )
    p.add_argument("--dispatch-options", type=json_object, help="dispatch.options (JSON object)")
    p.add_argument("--binding", choices=BINDINGS,
                   help="capacity.binding: late = arrivals wait in the scheduler while every instance of their "
                        "model is saturated (presets: early)")  # fmt: skip
    p.add_argument("--move-queued", action="store_true", default=None,
                   help="capacity.move_queued: each migration epoch, move requests not started off instances "
                        "past their room")  # fmt: skip
    p.add_argument("--no-cold-start", dest="cold_start", action="store_false", default=None,
                   help="capacity.cold_start off: a request for a model no instance serves fails at once")  # fmt: skip
    p.add_argument("--first-plan", choices=("oracle", "cold"),
                   help="the plan in force at the start: oracle (presets) = planned on the workload's own demand; "
                        "cold (cluster files) = as a live leader starts, with no request seen yet")  # fmt: skip


def add_loop_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides of the placement and migration sections."""
    p.add_argument("--placement", help="placement.policy: the planner")
    p.add_argument("--placement-options", type=json_object, help="placement.options (JSON object)")
    p.add_argument("--placement-interval-s", type=float,
                   help="placement.interval_s: re-plan every S simulated seconds (presets: place once)")  # fmt: skip
    p.add_argument("--placement-window-s", type=float,
                   help="placement.window_s: recent workload each plan reads (default: the interval)")  # fmt: skip
    p.add_argument("--adaptive-interval", action="store_true", default=None,
                   help="placement.adaptive_interval: SeaLLM Eq. 8 adapts the interval")  # fmt: skip
    p.add_argument("--placement-confirm-intervals", type=int,
                   help="placement.confirm_intervals: apply a changed plan once proposed this often in a row")  # fmt: skip
    p.add_argument("--placement-processes", type=int, default=1,
                   help="processes simulating candidate plans, for planners that score plans by simulation")  # fmt: skip
    p.add_argument("--migration", help="migration.policy: mell (KV packing), llumnix_lb, none")
    p.add_argument("--migration-options", type=json_object, help="migration.options (JSON object)")
    p.add_argument("--transfer", help="migration.transfer: hybrid (default), kv, tokens")
    p.add_argument("--migration-epoch-s", type=positive_float, help="migration.epoch_s (default 1)")


def _fields(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any] | None:
    """The section fields whose flags were given (flag dest -> field), or None when none was."""
    out = {
        field: getattr(args, dest) for dest, field in names.items() if getattr(args, dest, None) is not None
    }
    return out or None


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The section overrides the flags give (:meth:`PolicyBundle.with_overrides`)."""
    return {
        "engine": _fields(args, {"engine_policy": "policy", "engine_options": "options"}),
        "dispatch": _fields(args, {"dispatch": "policy", "dispatch_options": "options"}),
        "placement": _fields(args, {
            "placement": "policy", "placement_options": "options", "placement_interval_s": "interval_s",
            "placement_window_s": "window_s", "adaptive_interval": "adaptive_interval",
            "placement_confirm_intervals": "confirm_intervals",
        }),
        "migration": _fields(args, {"migration": "policy", "migration_options": "options", "transfer": "transfer",
                                    "migration_epoch_s": "epoch_s"}),
        "capacity": _fields(args, {"binding": "binding", "move_queued": "move_queued", "cold_start": "cold_start"}),
        "first_plan": args.first_plan,
    }  # fmt: skip


def bundles(args: argparse.Namespace, config: ClusterConfig | None) -> list[PolicyBundle]:
    """The bundles to run: the presets named (each with the flags' overrides; with a cluster file, its
    capacity section too, as its schedulers run), or the cluster file's own sections."""
    from llmfleet.sim.bundle import PolicyBundle
    from llmfleet.sim.run import preset

    given = overrides(args)
    if config is not None and args.policy is None and args.compare is None:
        base = PolicyBundle.of(CLUSTER_BUNDLE, config.policies(), first_plan="cold",
                               description=f"the sections of {args.cluster_config}")  # fmt: skip
        return [_applied(base, given)]
    names = (
        list(args.compare or DEFAULT_COMPARE) if args.compare is not None else [args.policy or DEFAULT_PRESET]
    )
    out = []
    for name in names:
        b = preset(name)
        if config is not None:  # the live schedulers' capacity setting
            b = b.with_overrides(capacity=config.scheduler.model_dump(exclude={"dispatch", "ready_when"}))
        out.append(_applied(b, given))
    return out


def _applied(b: PolicyBundle, given: dict[str, Any]) -> PolicyBundle:
    try:
        return b.with_overrides(**given)
    except ValueError as e:
        raise ValueError(f"policy {b.name}: {e}") from None


def sim_spec(args: argparse.Namespace, config: ClusterConfig | None) -> SimSpec:
    """The cluster and services the flags name (``--services`` YAML, a cluster file, or ``--model``)."""
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
    elif config is not None:
        try:
            services, engine = from_cluster_config(config)
        except ValueError as e:
            raise ValueError(f"cluster config {args.cluster_config}: {e}") from None
    else:
        services, engine = (SimService("default", args.model),), EngineSettings()
    if getattr(args, "engine_gpus", None) is not None:
        cluster = dataclasses.replace(cluster, engine_gpus=args.engine_gpus)
    return SimSpec(cluster, services, engine, cost_source=getattr(args, "cost_source", DEFAULT_COST_SOURCE))


def describe(b: PolicyBundle) -> str:
    """One line per preset for ``--list-policies``."""
    engine = b.engine.policy + (json.dumps(b.engine.options) if b.engine.options else "")
    return f"{b.name:18} {b.placement.policy:15} {b.dispatch.policy:14} {engine:16} {b.description}"

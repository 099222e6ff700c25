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
from llmfleet.renamed import SIM_FLAGS, add_renamed_flags
from llmfleet.sim.bundle import PolicyBundle
from llmfleet.sim.run import preset
from llmfleet.sim.spec import (
    ClusterSpec,
    EngineSettings,
    SimService,
    SimSpec,
    from_cluster_config,
    load_services,
)
from llmfleet.spec.flags import SectionFlags
from llmfleet.spec.sections import FleetPolicies

if TYPE_CHECKING:
    from llmfleet.config import ClusterConfig

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


# every field of every policy section, each flag overriding one field of the preset's (or the cluster
# file's) section: --engine-policy is engine.policy, --placement-interval-s placement.interval_s
POLICY_FLAGS = SectionFlags(
    FleetPolicies,
    names={
        "dispatch.policy": "dispatch",
        "placement.policy": "placement",
        "placement.adaptive_interval": "adaptive-interval",
        "migration.policy": "migration",
        "migration.transfer": "transfer",
        "capacity": "",
    },
    overrides=True,
    title="policy sections (each flag overrides one field)",
)


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides of the engine, dispatch, placement, migration and capacity sections, and how the
    first plan is made."""
    POLICY_FLAGS.add(p)
    add_renamed_flags(p, SIM_FLAGS)
    p.add_argument("--first-plan", choices=("oracle", "cold"),
                   help="the plan in force at the start: oracle (presets) = planned on the workload's own demand; "
                        "cold (cluster files) = as a live leader starts, with no request seen yet")  # fmt: skip
    p.add_argument("--placement-processes", type=int, default=1,
                   help="processes simulating candidate plans, for planners that score plans by simulation")  # fmt: skip


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The section overrides the flags give (:meth:`PolicyBundle.with_overrides`)."""
    return {**POLICY_FLAGS.given(args), "first_plan": args.first_plan}


def bundles(args: argparse.Namespace, config: ClusterConfig | None) -> list[PolicyBundle]:
    """The bundles to run: the presets named (each with the flags' overrides; with a cluster file, its
    capacity section too, as its schedulers run), or the cluster file's own sections."""

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
            b = b.with_overrides(capacity=config.scheduler.capacity())
        out.append(_applied(b, given))
    return out


def _applied(b: PolicyBundle, given: dict[str, Any]) -> PolicyBundle:
    try:
        return b.with_overrides(**given)
    except ValueError as e:
        raise ValueError(f"policy {b.name}: {e}") from None


def sim_spec(args: argparse.Namespace, config: ClusterConfig | None) -> SimSpec:
    """The cluster and services the flags name (``--services`` YAML, a cluster file, or ``--model``)."""

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
    return SimSpec(cluster, services, engine, cost_source=cost_source(args, config))


def cost_source(args: argparse.Namespace, config: ClusterConfig | None) -> str:
    """``--cost-source`` when given, else the cluster file's emulated pool's (the costs its emulated
    engines run on), else the default."""
    given = getattr(args, "cost_source", None)
    if given is not None:
        return given
    return (
        config.emulated.cost_source
        if config is not None and config.emulated is not None
        else DEFAULT_COST_SOURCE
    )


def describe(b: PolicyBundle) -> str:
    """One line per preset for ``--list-policies``."""
    engine = b.engine.policy + (json.dumps(b.engine.options) if b.engine.options else "")
    return f"{b.name:18} {b.placement.policy:15} {b.dispatch.policy:14} {engine:16} {b.description}"

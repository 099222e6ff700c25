"""``llmfleet-engine``: an engine node: serves Engine, registers under nodes/{id}, follows placement."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.coord import node_view, placement_view
from llmfleet.coord.desired import model_view
from llmfleet.metrics.engine import engine_metrics
from llmfleet.renamed import ENGINE_FLAGS as RENAMED_ENGINE_FLAGS
from llmfleet.renamed import add_renamed_flags
from llmfleet.rpc.cli_args import add_common_args, etcd_settings, node_id, positive_int
from llmfleet.rpc.node import ServiceNode, run_service
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.spec.defaults import DEFAULT_MAX_TOKENS
from llmfleet.spec.engines import EMULATED_FLAGS, ENGINE_FLAGS, NATIVE_ONLY, PREEMPTION_FLAGS, EngineConfig
from llmfleet.spec.sizes import size_bytes
from llmfleet.spec.vllm import VllmSettings
from llmfleet.types import ModelSpec, NodeRecord
from prometheus_client import CollectorRegistry

from llmfleet_engine.backend import EngineBackend, LoraBackend
from llmfleet_engine.catalog_adapters import CatalogAdapters
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.emulated.catalog import check_sim_models
from llmfleet_engine.emulated.host import EngineGroup, build_group
from llmfleet_engine.emulated.shared import SharedEtcd
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.hardware import detect_hardware, hardware_name, tp_degree
from llmfleet_engine.migrations import DEFAULT_MAX_MIGRATIONS
from llmfleet_engine.placement_follower import DRAIN_MODES, DrainSettings, PlacementFollower
from llmfleet_engine.servicer import EngineServicer

ROLE = "engine"


def make_executor(args: argparse.Namespace) -> EngineBackend:
    """The backend named by ``--backend``: the native paged executor, or vLLM (imported lazily)."""
    entry: EngineConfig = args.engine_config
    if args.backend == "vllm":
        from llmfleet_engine.vllm_backend import VllmConfig, VllmExecutor  # vLLM: only for this backend

        # vLLM picks its GPU from CUDA_VISIBLE_DEVICES; the native knobs (pool, policy) do not apply.
        return VllmExecutor(
            VllmConfig(
                settings=entry.vllm or VllmSettings(),
                device=args.device,
                cache_dir=args.models_dir,
                allow_download=not args.offline,
                tensor_parallel_size=args.tp,
                **lora_settings(entry),
            )
        )
    common = {
        "policy": entry.policy,
        "options": entry.options,
        "stream_interval_s": entry.stream_interval_s,
        "preemption": args.preemption.rule(),  # llmfleet up resolves its fairness by scheduler.fairness
        **entry.limits(),
        **({"memory_budget_bytes": args.memory_budget} if args.memory_budget is not None else {}),
    }
    if args.backend == "emulated":
        return EmulatedExecutor(
            EmulatedConfig(
                hardware=args.hardware,
                tp=args.tp,
                mem_fraction=args.mem_fraction,
                cost_source=args.cost_source,
                sim_models=dict(args.sim_model),
                link_bytes_per_s=args.link_bandwidth,
                **lora_settings(entry),
                **common,
            )
        )
    return Executor(
        ExecutorConfig(
            device=args.device,
            cache_dir=args.models_dir,
            num_threads=entry.threads,
            allow_download=not args.offline,
            **lora_settings(entry),
            **common,
        )
    )


def lora_settings(entry: EngineConfig) -> dict[str, Any]:
    """``max_loras`` and ``max_lora_rank`` where the engine entry sets them: both backends read them."""
    return {k: v for k in ("max_loras", "max_lora_rank") if (v := getattr(entry, k)) is not None}


def build_node(
    args: argparse.Namespace,
    *,
    nid: str | None = None,
    port: int | None = None,
    shared: SharedEtcd | None = None,
) -> tuple[ServiceNode, EngineServicer]:
    """One engine node. ``nid``/``port`` override the flags'; ``shared``: the etcd client and views of
    a process hosting several engines (``--engines N``), whose metrics then go to a registry of their own."""
    nid = nid or node_id(args, ROLE)
    executor = make_executor(args)
    for name, base, path in args.adapter:  # registered when their base is loaded (adapters follow it)
        if not isinstance(executor, LoraBackend):
            raise SystemExit(f"--adapter {name}: this backend serves no LoRA adapters")
        executor.adapters.add(name, base, path)
    # vllm:* metrics on the process registry (served by the shell's /metrics): counters and histograms
    # hooked where each backend sees tokens and ends, gauges from its load snapshot
    registry = CollectorRegistry(auto_describe=True) if shared is not None else None
    executor.attach_metrics(engine_metrics(registry))
    servicer = EngineServicer(
        executor, nid, default_max_tokens=args.default_max_tokens, max_migrations=args.max_migrations
    )
    server = GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))],
        host=args.host,
        port=args.port if port is None else port,
    )
    node = ServiceNode(
        ROLE,
        nid,
        etcd_settings(args),
        server,
        advertise=args.advertise if shared is None else None,
        describe=_describer(args, executor),
        metrics_registry=registry,
    )
    if shared is not None:
        node.etcd, node.shared_etcd_ready = shared.client, shared.ready

    async def republish_on_model_change(n: ServiceNode) -> None:
        loop = asyncio.get_running_loop()
        # The model set changes in the executor's thread; republish nodes/{id} from the event loop.
        executor.host.on_models_changed.append(
            lambda _names: loop.call_soon_threadsafe(lambda: n.spawn(n.update_record(), "republish"))
        )
        await n.update_record()  # a preload may have finished before the callback was in place

    async def preload(n: ServiceNode) -> None:
        for spec in args.model:
            name, _, source = spec.partition("=")
            await asyncio.to_thread(executor.host.load, ModelSpec(name=name, source=source or name))

    node.on_start.append(preload)  # --model preloads do not wait for etcd
    node.on_etcd.extend([republish_on_model_change, _placement_following(args, nid, executor, shared)])
    if isinstance(executor, LoraBackend) and args.engine_config.max_loras:
        node.on_etcd.append(_catalog_following(args, executor, shared))
    node.on_stop.append(executor.aclose)
    return node, servicer


def _describer(args: argparse.Namespace, executor: EngineBackend) -> Callable[[NodeRecord], NodeRecord]:
    """What the node record says of this engine: hardware, device, memory and the models it serves."""
    hw = args.hardware or detect_hardware(str(executor.device), executor.memory_bytes, args.tp)

    def describe(r: NodeRecord) -> NodeRecord:
        return replace(
            r,
            hardware=hw,
            tp=args.tp,
            device=executor.device,
            memory_bytes=executor.memory_bytes,
            kv_capacity_bytes=executor.host.kv_capacity_bytes,
            # a draining model is not advertised: schedulers stop routing to it at once; an
            # engine's LoRA adapters are advertised with their base
            models=executor.adapters.serving(executor.host.serving_model_names())
            if isinstance(executor, LoraBackend)
            else executor.host.serving_model_names(),
        )

    return describe


def _catalog_following(
    args: argparse.Namespace, executor: LoraBackend, shared: SharedEtcd | None
) -> Callable[[ServiceNode], Awaitable[None]]:
    """The node's etcd hook that declares the model catalog's adapter entries (``llmfleet apply``
    adds them at runtime) on a LoRA engine, beside the ones its ``--adapter`` flags declared (over the
    process's shared catalog view when it hosts several engines)."""

    async def follow_catalog(n: ServiceNode) -> None:
        if shared is not None:
            view = await shared.catalog()
        else:
            view = model_view(n.etcd)
            await view.start()
            n.on_stop.append(view.stop)
        flags = {name: (base, path) for name, base, path in args.adapter}
        follower = CatalogAdapters(
            executor.adapters, flags, forgotten=lambda: n.spawn(n.update_record(), "republish")
        )
        n.spawn(follower.run(view), "adapter-catalog")

    return follow_catalog


def _placement_following(
    args: argparse.Namespace, nid: str, executor: EngineBackend, shared: SharedEtcd | None
) -> Callable[[ServiceNode], Awaitable[None]]:
    """The node's etcd hook that starts its placement follower (over the process's shared views when
    it hosts several engines)."""

    async def follow_placement(n: ServiceNode) -> None:
        if shared is not None:  # one watch per prefix for the whole process, not one per engine
            view, nodes = await shared.views()
        else:
            view = placement_view(n.etcd)
            await view.start()
            n.on_stop.append(view.stop)
            nodes = node_view(n.etcd)  # other engines: hand-off check and migration destinations
            await nodes.start()
            n.on_stop.append(nodes.stop)
        drain = DrainSettings(
            mode=args.drain_mode, timeout_s=args.drain_timeout_s, handoff_timeout_s=args.handoff_timeout_s
        )
        follower = PlacementFollower(nid, executor.host, executor.migration, drain=drain, nodes=nodes)
        n.spawn(follower.run(view), "placement-follower")

    return follow_placement


def _bytes(text: str) -> int:
    """An argparse ``type``: ``65536``, ``64KiB``, ``2GiB``, ``1.5GB`` -> bytes."""
    try:
        return size_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _name_arch(text: str) -> tuple[str, str]:
    name, sep, arch = text.partition("=")
    if not sep or not name or not arch:
        raise argparse.ArgumentTypeError(f"expected NAME=ARCH, got {text!r}")
    return name, arch


class _Parser(argparse.ArgumentParser):
    """Checks the flags together once all are in (``--policy`` may come after its options) and reads
    the engine entry they give (``ns.engine_config``)."""

    # typeshed's overloads give back the namespace type the caller passes; this one an argparse.Namespace
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        given = {a.split("=", 1)[0] for a in (sys.argv[1:] if args is None else args) if a.startswith("--")}
        given |= {"--" + a.removeprefix("--no-") for a in given if a.startswith("--no-")}  # a switch off
        if ns.tp > 1 and ns.backend == "native":
            self.error(
                f"--tp {ns.tp}: the native backend runs on one device (tensor parallel: --backend vllm)"
            )
        if ns.backend == "emulated":
            check_emulated(self, ns, given)
        else:
            for flag in sorted(given & set(EMULATED_ONLY)):
                self.error(f"{flag} applies to --backend emulated only")
        if ns.backend == "vllm":
            for flag in sorted(given & set(NATIVE_CORE_ONLY)):
                self.error(f"{flag} does not apply to --backend vllm (vLLM schedules and pages itself)")
        elif "--vllm-options" in given:
            self.error("--vllm-options applies to --backend vllm only")
        try:  # a bad policy, option or limit is a usage error, not a crash later
            ns.engine_config = ENGINE_FLAGS.read(ns, backend="vllm" if ns.backend == "vllm" else "native")
            ns.preemption = PREEMPTION_FLAGS.read(ns).preemption
        except ValueError as e:
            self.error(str(e))
        return ns, rest


# flags of the native engine core (policy, pool, limits), which a vLLM engine has no use for
NATIVE_CORE_ONLY = (
    "--memory-budget",
    *(ENGINE_FLAGS.option(k) for k in NATIVE_ONLY),
    *(f.option for f in PREEMPTION_FLAGS.flags),
)
# flags an emulated engine has no use for (it runs no model and no device): refused, never ignored
NO_DEVICE = ("--device", "--models-dir", "--threads", "--offline")
EMULATED_ONLY = (
    "--engines",
    "--sim-model",
    *(f.option for f in EMULATED_FLAGS.flags),
    "--link-bandwidth",
    ENGINE_FLAGS.option("block_tokens"),
)


def check_emulated(parser: argparse.ArgumentParser, ns: argparse.Namespace, given: set[str]) -> None:
    """``--backend emulated``: a catalog ``--hardware`` is required, the ``--sim-model`` architectures
    must be catalog names, and native-only flags are refused (they would silently do nothing)."""

    for flag in NO_DEVICE:
        if flag in given:
            parser.error(f"{flag} does not apply to --backend emulated (it runs no model on a device)")
    if ns.hardware is None:
        parser.error("--backend emulated needs --hardware (a catalog GPU, e.g. A100-80GB)")
    if ns.hardware == "cpu":
        parser.error("--backend emulated emulates a catalog GPU; --hardware cpu is the native backend")
    try:
        check_sim_models(dict(ns.sim_model))
    except ValueError as e:
        parser.error(str(e))


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="llmfleet-engine", description=__doc__)
    add_common_args(ap, ROLE, default_port=50061)
    _add_device_flags(ap)
    ENGINE_FLAGS.add(ap)
    PREEMPTION_FLAGS.add(ap)
    add_renamed_flags(ap, RENAMED_ENGINE_FLAGS)
    _add_emulated_flags(ap)
    _add_node_flags(ap)
    return ap


def _add_device_flags(ap: argparse.ArgumentParser) -> None:
    """Where the engine runs: device, model cache, memory budget, backend, hardware and TP."""
    ap.add_argument(
        "--device", default=os.environ.get("LLMFLEET_DEVICE", "cpu"), help="cpu, cuda, cuda:1, ..."
    )
    ap.add_argument("--models-dir", default=os.environ.get("LLMFLEET_MODEL_CACHE", ".llmfleet/models"))
    ap.add_argument(
        "--memory-budget", type=_bytes, default=None, help="weights + activations + KV pool, e.g. 2GiB"
    )
    ap.add_argument(
        "--backend",
        default="native",
        choices=["native", "vllm", "emulated"],
        help="executor backend (emulated: a catalog GPU priced by the simulator's cost model)",
    )
    ap.add_argument(
        "--hardware",
        type=hardware_name,
        default=None,
        help="catalog hardware name registered for the engine pool (default: cpu on CPU, else guessed "
        "from the GPU's name)",
    )
    ap.add_argument("--tp", type=tp_degree, default=1, help="GPUs of the engine (vLLM tensor parallel size)")


def _add_emulated_flags(ap: argparse.ArgumentParser) -> None:
    """``--backend emulated``: the catalog architectures, engines per process, costs and link."""
    EMULATED_FLAGS.add(ap)
    g = ap.add_argument_group("emulated backend: the node")
    g.add_argument(
        "--sim-model",
        type=_name_arch,
        action="append",
        default=[],
        metavar="NAME=ARCH",
        help="serve model NAME as catalog architecture ARCH (else a source emulated://ARCH or NAME itself)",
    )
    g.add_argument(
        "--engines",
        type=positive_int,
        default=1,
        help="emulated GPUs hosted by this process: ids ID-0..ID-(N-1), ports --port+i (0: any free)",
    )
    g.add_argument(
        "--link-bandwidth",
        type=_bytes,
        default=None,
        help="KV transfer link in B/s (default: the GPU's intra-node link at its all-reduce efficiency)",
    )


def _add_node_flags(ap: argparse.ArgumentParser) -> None:
    """Requests, migrations, downloads, draining and preloaded models."""
    ap.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    ap.add_argument(
        "--max-migrations",
        type=positive_int,
        default=DEFAULT_MAX_MIGRATIONS,
        help="Migrate calls in flight at once on this engine (as source); one more is RESOURCE_EXHAUSTED",
    )
    ap.add_argument("--offline", action="store_true", help="never download from the hub")
    ap.add_argument(
        "--drain-mode",
        choices=DRAIN_MODES,
        default="wait",
        help="a model leaving this engine (placement): its running requests finish here for up to "
        "--drain-timeout-s, then move (wait), or move at once (migrate); moving = KV migration to an "
        "engine hosting the model, else resumed elsewhere by re-prefill",
    )
    ap.add_argument(
        "--drain-timeout-s", type=float, default=30.0, help="longest wait for a leaving model's requests"
    )
    ap.add_argument(
        "--handoff-timeout-s",
        type=float,
        default=60.0,
        help="a leaving model keeps serving until its new engine advertises it, at most this long",
    )
    ap.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=SOURCE",
        help="load at start (in addition to the placement in etcd); repeatable",
    )
    ap.add_argument(
        "--adapter",
        action="append",
        default=[],
        type=adapter_flag,
        metavar="NAME=BASE:DIR",
        help="serve the LoRA adapter in DIR (PEFT's saved format) as model NAME on model BASE, registered "
        "whenever BASE is loaded here (needs --max-loras); repeatable",
    )


def adapter_flag(text: str) -> tuple[str, str, str]:
    """``--adapter NAME=BASE:DIR`` as (name, base, directory)."""
    name, _, rest = text.partition("=")
    base, _, path = rest.partition(":")
    if not (name and base and path):
        raise argparse.ArgumentTypeError(f"expected NAME=BASE:DIR, got {text!r}")
    return name, base, path


def build(args: argparse.Namespace) -> ServiceNode | EngineGroup:
    """One engine node, or ``--engines N`` of them (emulated) sharing the process."""
    if args.engines == 1:
        return build_node(args)[0]
    base = args.id or f"emulated-{socket.gethostname()}-{os.getpid()}"
    return build_group(args, base, build_node, etcd_settings(args))


def main(argv: list[str] | None = None) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run_service(ROLE, build_parser(), build, argv)


if __name__ == "__main__":
    main()

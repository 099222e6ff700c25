"""``llmfleet up``: run a whole local cluster (etcd, control plane, engines) until Ctrl-C.

Starts a local etcd (unless ``--etcd`` points at one), then the scheduler (base port), profiler
(+1), placement (+2), migration (+3) and one engine per ``engines`` entry of the cluster config
(its ``port`` or base+10+i), each a child process logging to ``<state-dir>/logs/<name>.log``. Waits
for every child's grpc.health.v1 to answer SERVING, prints the endpoints (also written to
``<state-dir>/endpoints.json``) and supervises: a child that dies is reported with its log tail while
the rest keep running. Ctrl-C or SIGTERM stops everything (reverse start order) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmfleet.cli.up_ready import wait_servable
from llmfleet.config import (
    DEFAULT_CONFIG,
    DEFAULT_PREFIX,
    DEFAULT_TTL_S,
    ClusterConfig,
    EmulatedPool,
    validation_message,
)
from llmfleet.metrics.server import METRICS_PORT_OFFSET
from llmfleet.supervisor import ProcessGroup, SupervisorError, describe_returncode
from llmfleet.supervisor_restart import Decision, RestartPolicy, Restarts

NAME = "up"
HELP = "start etcd, the control plane and the engines locally; Ctrl-C stops everything"

# (child name, console script, module with main(), port offset from --base-port)
CONTROL_PLANE: tuple[tuple[str, str, str, int], ...] = (
    ("scheduler", "llmfleet-scheduler", "llmfleet_scheduler.main", 0),
    ("profiler", "llmfleet-profiler", "llmfleet_profiler.main", 1),
    ("placement", "llmfleet-placement", "llmfleet_placement.main", 2),
    ("migration", "llmfleet-migration", "llmfleet_migration.main", 3),
)
ENGINE_SCRIPT = ("llmfleet-engine", "llmfleet_engine.main")
ENGINE_PORT_OFFSET = 10
SCHEDULER_REPLICA_OFFSET = 5  # scheduler-1 on base port + 5 (HTTP API on --http-port + 1), ...
DEFAULT_HTTP_PORT = 8000  # the OpenAI-compatible API of the scheduler


@dataclass(frozen=True)
class ServicePlan:
    """One child to start: its command line, gRPC address and log file."""

    name: str
    argv: list[str]
    address: str
    log_path: Path
    metrics: str = ""  # host:port of its Prometheus /metrics
    http: str = ""  # host:port of the OpenAI-compatible HTTP API (the scheduler)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=os.environ.get("LLMFLEET_CONFIG", DEFAULT_CONFIG),
        help=f"cluster config (env LLMFLEET_CONFIG, default {DEFAULT_CONFIG})",
    )
    p.add_argument("--etcd", default=None, help="use this etcd (host:port[,...]) instead of starting one")
    p.add_argument("--etcd-port", type=int, default=2379, help="client port of the local etcd (0 = any)")
    p.add_argument("--state-dir", default=".llmfleet", help="etcd data, logs and models live here")
    p.add_argument("--host", default="127.0.0.1", help="address every service binds to")
    p.add_argument("--base-port", type=int, default=50051, help="scheduler port; others follow it")
    p.add_argument(
        "--http-port", type=int, default=DEFAULT_HTTP_PORT,
        help=f"the scheduler's OpenAI-compatible API port (default {DEFAULT_HTTP_PORT}; -1: none)",
    )  # fmt: skip
    p.add_argument("--prefix", default=None, help="etcd key prefix (default /llmfleet)")
    p.add_argument("--ttl", type=int, default=DEFAULT_TTL_S, help="node lease TTL in seconds")
    p.add_argument("--log-level", default="INFO", help="log level of the services")
    p.add_argument(
        "--health-timeout", type=float, default=180.0, help="seconds to wait for all to be healthy"
    )
    p.add_argument(
        "--ready-timeout", type=float, default=300.0,
        help="seconds to wait, once every process is healthy, until every service has an engine with its "
        "model loaded (0: do not wait; 'llmfleet is up' then means started, not servable)",
    )  # fmt: skip
    p.add_argument("--grace", type=float, default=10.0, help="seconds each child gets to stop on SIGTERM")
    p.add_argument(
        "--schedulers", type=int, default=2,
        help="scheduler replicas (default 2: scheduler on --base-port, scheduler-1 on +5; clients list both)",
    )  # fmt: skip
    p.add_argument(
        "--no-restart", dest="restart", action="store_false",
        help="leave a crashed child stopped (default: restart it with backoff, like systemd's "
        "Restart=on-failure, and give up after 5 failures within 60 s)",
    )  # fmt: skip
    p.add_argument(
        "--restart-backoff-s",
        type=float,
        default=1.0,
        help="first restart delay (doubles per failure, max 30 s)",
    )
    p.add_argument(
        "--emulate", default=None, metavar="NxHARDWARE",
        help="serve on N emulated GPUs of a catalog hardware (e.g. 32xA100-80GB) instead of the config's "
        "engines: (its emulated: section's settings apply; README 'Emulated fleet')",
    )  # fmt: skip
    p.add_argument(
        "--emulate-processes", type=int, default=None, metavar="K",
        help="processes hosting the emulated GPUs (default: the config's emulated.processes, else 1)",
    )  # fmt: skip
    p.add_argument(
        "--tls", action="store_true",
        help="TLS on every gRPC hop and HTTPS on the OpenAI API, mutual TLS between services, with a "
        "development CA and certificate made under STATE_DIR/tls (llmfleet certs)",
    )  # fmt: skip
    p.add_argument(
        "--api-keys", default=None,
        help="the scheduler (gRPC and HTTP) accepts only these API keys (YAML file, see README)",
    )  # fmt: skip


def _security_env(args: argparse.Namespace, state: Path) -> dict[str, str]:
    """``--tls``: a development CA + certificate under ``state/tls`` (made once), given to every child
    (mutual TLS between services; the scheduler, the users' entry point, asks no client certificate)
    and used by ``up``'s own health checks. ``--api-keys`` is checked
    here so a bad file fails before anything starts."""
    from llmfleet.security import SecuritySettings, configure
    from llmfleet.security.certs import write_dev_certs

    if args.api_keys:
        SecuritySettings(api_keys_file=str(Path(args.api_keys).resolve())).validated()
    if not args.tls:
        return {}
    tls = state / "tls"
    if not (tls / "server.pem").exists():
        hosts = list(
            dict.fromkeys([args.host if args.host != "0.0.0.0" else "127.0.0.1", "127.0.0.1", "localhost"])
        )
        write_dev_certs(tls, hosts)
    settings = SecuritySettings(
        tls_cert=str(tls / "server.pem"),
        tls_key=str(tls / "server-key.pem"),
        tls_ca=str(tls / "ca.pem"),
        tls_client_auth=True,
    ).validated()
    configure(settings)
    env = settings.to_env()
    # for the CLI and SDK in another shell: `. .llmfleet/tls/env` (add LLMFLEET_API_KEY yourself)
    client = {k: v for k, v in env.items() if k != "LLMFLEET_TLS_CLIENT_AUTH"}
    (tls / "env").write_text("".join(f"export {k}={v}\n" for k, v in sorted(client.items())))
    return env


def service_command(script: str, module: str) -> list[str]:
    """The console script from this interpreter's environment, else PATH, else ``python -c``."""
    local = Path(sys.executable).parent / script
    if local.exists():
        return [str(local)]
    found = shutil.which(script)
    if found:
        return [found]
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


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
) -> list[ServicePlan]:
    """The children ``up`` starts, in start order (pure: nothing is started). ``http_port``: the
    scheduler's OpenAI-compatible API (-1: none); ``api_keys``: the keys file the scheduler enforces;
    ``reseed``: the placement leader replaces etcd's services/ and models/ with the config's (``up`` with
    its own etcd: the local file stays the truth from one run to the next); ``schedulers``: scheduler
    replicas (``scheduler``, ``scheduler-1``, ...; clients fail over between them)."""
    state = Path(state_dir)
    logs = state / "logs"

    def common(name: str, port: int) -> list[str]:
        argv = ["--id", name, "--host", host, "--port", str(port), "--etcd", etcd, "--ttl", str(ttl)]
        argv += ["--metrics-port", str(port + METRICS_PORT_OFFSET)]
        if prefix:
            argv += ["--prefix", prefix]
        return [*argv, "--log-level", log_level]

    plans = []
    replicas = [(f"scheduler-{i}", SCHEDULER_REPLICA_OFFSET + i - 1, i) for i in range(1, schedulers)]
    control = [(name, script, module, offset, 0) for name, script, module, offset in CONTROL_PLANE]
    control[1:1] = [(name, *CONTROL_PLANE[0][1:3], offset, i) for name, offset, i in replicas]
    for name, script, module, offset, replica in control:
        port = base_port + offset
        http = http_port + replica if http_port > 0 else http_port
        extra = {
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
    if config.emulated is not None:
        return plans + emulated_plans(config, config.emulated, common, host, base_port, state, used)
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
                    *(
                        ["--threads", str(threads)]
                        if engine.threads is None and engine.device == "cpu"
                        else []
                    ),
                ],
                address=f"{host}:{port}",
                log_path=logs / f"{engine_id}.log",
                metrics=f"{host}:{port + METRICS_PORT_OFFSET}",
            )
        )
    return plans


def forget_nodes(etcd: Any, prefix: str | None) -> None:
    """Drop the node records a previous ``up`` left in its own etcd. etcd restores leases with a fresh
    TTL when it restarts, so the last run's engines would look alive, with their models loaded, for a
    whole TTL: the scheduler would call the cluster servable before any engine of this run exists.
    Every process of that run is gone (``up`` stopped them), so their records are stale."""
    import subprocess

    from llmfleet.coord.keys import Keys

    key = Keys(prefix or DEFAULT_PREFIX).nodes
    subprocess.run(
        [str(etcd.etcdctl_path()), "--endpoints", etcd.endpoint, "del", "--prefix", key],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip


def cpu_threads_each(config: ClusterConfig, cores: int | None = None) -> int:
    """Torch threads for each CPU engine ``up`` starts without its own ``threads``: the host's cores
    shared among the CPU engines, at least one each. Each engine taking every core (torch's default)
    oversubscribes the host: on 2 cores, two engines ran a burst 3.4x slower than one (README
    "Requests wait for capacity")."""
    n = sum(1 for e in config.engines.values() if e.device == "cpu")
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, cores // max(1, n))


def emulated_plans(
    config: ClusterConfig,
    pool: EmulatedPool,
    common: Any,
    host: str,
    base_port: int,
    state: Path,
    used: set[int],
) -> list[ServicePlan]:
    """``pool.processes`` engine processes hosting ``pool.count`` emulated GPUs (``emu{p}-{i}``, ports
    from base + 10 on, one per GPU; /metrics 1000 above each)."""
    argv = [
        "--backend", "emulated", "--hardware", pool.hardware, "--tp", str(pool.tp),
        "--cost-source", pool.cost_source, "--mem-fraction", f"{pool.mem_fraction:g}",
    ]  # fmt: skip
    for name, arch in sorted(config.catalog_models().items()):
        argv += ["--sim-model", f"{name}={arch}"]
    argv += pool.engine.engine_args()
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
        from llmfleet.sim.spec import ClusterSpec

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


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _warn_exit(
    console: Console, name: str, pid: int, rc: int | None, log_path: Path, log_tail: str, decision: Decision
) -> None:
    console.print(
        f"[bold red]warning:[/] {escape(name)} (pid {pid}) exited with {describe_returncode(rc)}; "
        f"{escape(decision.reason)}; the rest keep running. Last lines of {escape(str(log_path))}:"
    )
    console.print(escape(log_tail), style="dim", highlight=False)


def _write_endpoints(state: Path, rows: list[dict[str, Any]]) -> None:
    tmp = state / "endpoints.json.tmp"  # renamed into place: a reader never sees half of it
    tmp.write_text(json.dumps({r["name"]: r for r in rows}, indent=2) + "\n")
    tmp.replace(state / "endpoints.json")


def endpoints_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="llmfleet is up", title_justify="left")
    for col in ("name", "address", "metrics", "pid", "status"):
        table.add_column(col, no_wrap=True)
    table.add_column("log", overflow="fold")
    for r in rows:
        colour = {"healthy": "green", "external": "cyan"}.get(r["status"], "red")
        table.add_row(
            r["name"],
            r["address"],
            r.get("metrics") or "-",
            str(r["pid"] or "-"),
            f"[{colour}]{r['status']}[/]",
            escape(r["log"] or "-"),
        )
    return table


def run(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=True)
    try:
        config = ClusterConfig.load(args.config)
        config = apply_emulate(config, args.emulate, args.emulate_processes)
    except (ValueError, KeyError, ValidationError) as e:
        if isinstance(e, ValidationError):
            e = ValueError(validation_message(e))
        elif isinstance(e, KeyError):
            e = ValueError(e.args[0])
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 2
    if args.schedulers < 1:
        console.print(f"[red]error:[/] --schedulers must be >= 1, got {args.schedulers}")
        return 2
    state = Path(args.state_dir).resolve()
    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "models").mkdir(parents=True, exist_ok=True)
    try:
        child_env = _security_env(args, state)
    except (ValueError, OSError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 2

    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    group = ProcessGroup(log_dir=state / "logs")
    etcd = None
    try:
        try:
            if args.etcd:
                endpoint = args.etcd
                etcd_row = {
                    "name": "etcd",
                    "address": endpoint,
                    "pid": None,
                    "status": "external",
                    "log": None,
                }
            else:
                from llmfleet.coord.local_etcd import LocalEtcd

                etcd = LocalEtcd(state / "etcd", client_port=args.etcd_port)
                console.print(f"starting etcd on {etcd.endpoint} (data {state / 'etcd'}) ...")
                try:
                    etcd.start(timeout=30)
                except RuntimeError as e:
                    console.print(f"[red]error:[/] etcd did not start: {escape(str(e))}")
                    return 1
                endpoint = etcd.endpoint
                forget_nodes(etcd, args.prefix)
                etcd_row = {
                    "name": "etcd",
                    "address": endpoint,
                    "pid": etcd.pid,
                    "status": "healthy",
                    "log": str(etcd.log_path),
                }
            try:
                plans = plan_services(
                    config,
                    Path(args.config).resolve(),
                    etcd=endpoint,
                    state_dir=state,
                    host=args.host,
                    base_port=args.base_port,
                    prefix=args.prefix,
                    ttl=args.ttl,
                    log_level=args.log_level,
                    http_port=args.http_port,
                    api_keys=str(Path(args.api_keys).resolve()) if args.api_keys else None,
                    reseed=not args.etcd,
                    schedulers=args.schedulers,
                )
                for plan in plans:
                    env = dict(child_env)
                    if env and plan.name.startswith(
                        "scheduler"
                    ):  # users' entry point: TLS + API keys, no client cert
                        env["LLMFLEET_TLS_CLIENT_AUTH"] = "0"
                    group.spawn(plan.name, plan.argv, env=env, log_path=plan.log_path)
            except (ValueError, SupervisorError) as e:
                console.print(f"[red]error:[/] {escape(str(e))}")
                return 1
            console.print(f"started {len(plans)} services; waiting for them to be healthy ...")

            reported: set[int] = set()
            rows = [etcd_row]
            deadline = time.monotonic() + args.health_timeout
            for plan in plans:
                child = group[plan.name]
                try:
                    group.wait_healthy(child, plan.address, timeout=max(0.5, deadline - time.monotonic()))
                    status = "healthy"
                except SupervisorError as e:
                    status = "exited" if not child.alive else "unhealthy"
                    if not child.alive:
                        reported.add(child.pid)
                    console.print(f"[bold red]warning:[/] {escape(str(e).splitlines()[0])}")
                    console.print(escape(child.log_tail()), style="dim", highlight=False)
                rows.append(
                    {
                        "name": plan.name,
                        "address": plan.address,
                        "metrics": plan.metrics,
                        **({"http": plan.http} if plan.http else {}),
                        "pid": child.pid,
                        "status": status,
                        "log": str(plan.log_path),
                    }
                )
            scheds = [p for p in plans if p.name.startswith("scheduler")]
            if args.ready_timeout > 0 and all(r["status"] == "healthy" for r in rows):
                console.print("every process is healthy; waiting until every service can be served ...")
                ready, missing = wait_servable(
                    scheds[0].address,
                    args.ready_timeout,
                    alive=lambda: group[scheds[0].name].alive,
                    show=lambda line: console.print(escape(line), highlight=False),
                )
                if not ready:
                    console.print(
                        f"[bold red]warning:[/] not servable after {args.ready_timeout:g}s; no engine serves "
                        f"{escape(', '.join(missing) or '?')} (see {escape(str(state / 'logs'))}/placement.log)"
                    )
            console.print(endpoints_table(rows))
            _write_endpoints(state, rows)
            scheme = "https" if args.tls else "http"
            http = f"   openai: {scheme}://{scheds[0].http}/v1" if scheds[0].http else ""
            addresses = ",".join(p.address for p in scheds)
            console.print(f"etcd: {endpoint}   scheduler: {addresses}{http}   Ctrl-C to stop")

            restarts = Restarts(RestartPolicy(backoff_s=args.restart_backoff_s)) if args.restart else None
            due: dict[str, float] = {}  # child -> when to start it again
            by_name = {r["name"]: r for r in rows}
            while True:
                for child in group.poll_exited():
                    if child.pid in reported:
                        continue
                    reported.add(child.pid)
                    rc = child.returncode if child.returncode is not None else -1
                    decision = (
                        restarts.on_exit(child.name, rc, time.monotonic(), time.time() - child.started_at)
                        if restarts is not None
                        else Decision(None, "restarts off (--no-restart)")
                    )
                    _warn_exit(console, child.name, child.pid, rc, child.log_path, child.log_tail(), decision)
                    if decision.restart_at is not None:
                        due[child.name] = decision.restart_at
                    elif decision.gave_up:
                        by_name[child.name]["status"] = "gave up"
                        _write_endpoints(state, rows)
                for name, at in list(due.items()):
                    if time.monotonic() >= at:
                        del due[name]
                        try:
                            child = group.respawn(name)
                        except SupervisorError as e:
                            console.print(
                                f"[bold red]error:[/] cannot restart {escape(name)}: {escape(str(e))}"
                            )
                            continue
                        console.print(f"restarted {escape(name)} (pid {child.pid}, restart {child.restarts})")
                        by_name[name].update(pid=child.pid, status="restarted", restarts=child.restarts)
                        _write_endpoints(state, rows)
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        console.print("stopping ...")
        try:
            group.stop_all(grace=args.grace)
        except KeyboardInterrupt:  # a second Ctrl-C: no more patience
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            group.stop_all(grace=0)
        console.print("stopped")
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        group.stop_all(grace=0)  # no-op when already stopped; covers early returns and errors
        if etcd is not None:
            etcd.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

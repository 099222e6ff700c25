"""``llmfleet up``: run a whole local cluster (etcd, control plane, engines) until Ctrl-C.

Starts a local etcd (unless ``--etcd`` points at one), then the scheduler (base port), profiler
(+1), placement (+2), migration (+3) and one engine per ``engines`` entry of the cluster config
(its ``port`` or base+10+i), each a child process logging to ``<state-dir>/logs/<name>.log``. Waits
for every child's grpc.health.v1 to answer SERVING, prints the endpoints (also written to
``<state-dir>/endpoints.json``) and supervises: a child that dies is reported with its log tail while
the rest keep running. Ctrl-C or SIGTERM stops everything (reverse start order) and exits 0.

What is started is planned in :mod:`llmfleet.cli.up_plan`, the start-up steps are in
:mod:`llmfleet.cli.up_start`, the supervision after it in :mod:`llmfleet.cli.up_supervise`.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from types import FrameType

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from llmfleet.cli.up_plan import (
    CONTROL_PLANE,
    DEFAULT_HTTP_PORT,
    ENGINE_PORT_OFFSET,
    ENGINE_SCRIPT,
    SCHEDULER_REPLICA_OFFSET,
    ServicePlan,
    apply_emulate,
    cpu_threads_each,
    emulated_plans,
    plan_services,
    require_backends,
    service_command,
)
from llmfleet.cli.up_security import child_env
from llmfleet.cli.up_security import security_env as _security_env
from llmfleet.cli.up_start import (
    UpSession,
    announce,
    endpoints_table,
    forget_nodes,
    start_etcd,
    wait_healthy,
    wait_ready,
)
from llmfleet.cli.up_supervise import Supervision
from llmfleet.config import DEFAULT_CONFIG, DEFAULT_TTL_S, ClusterConfig
from llmfleet.spec.validation import validation_message
from llmfleet.supervisor import ProcessGroup, SupervisorError
from llmfleet.supervisor_restart import RestartPolicy, Restarts

__all__ = [  # the planning and start-up helpers are importable from here too
    "CONTROL_PLANE",
    "DEFAULT_HTTP_PORT",
    "ENGINE_PORT_OFFSET",
    "ENGINE_SCRIPT",
    "SCHEDULER_REPLICA_OFFSET",
    "ServicePlan",
    "add_arguments",
    "apply_emulate",
    "cpu_threads_each",
    "emulated_plans",
    "endpoints_table",
    "forget_nodes",
    "plan_services",
    "run",
    "service_command",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c",
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
        help=f"the OpenAI-compatible API port (default {DEFAULT_HTTP_PORT}; -1: none)",
    )  # fmt: skip
    p.add_argument(
        "--front-workers", type=int, default=1,
        help="processes of the OpenAI front serving --http-port (default 1; 0: no front, each scheduler "
        "serves the API itself, replica i on --http-port + i)",
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
        "engines: (its emulated: section's settings apply; docs/engine.md)",
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
        help="the scheduler (gRPC and HTTP) accepts only these API keys (YAML file, see docs/api.md)",
    )  # fmt: skip


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _load_config(args: argparse.Namespace, console: Console) -> ClusterConfig | None:
    """The cluster config with ``--emulate`` applied; None after saying what is wrong with it."""
    try:
        config = apply_emulate(ClusterConfig.load(args.config), args.emulate, args.emulate_processes)
        require_backends(config)
        config.check_live()
        return config
    except (ValueError, KeyError, ValidationError) as e:
        if isinstance(e, ValidationError):
            e = ValueError(validation_message(e))
        elif isinstance(e, KeyError):
            e = ValueError(e.args[0])
        console.print(f"[red]error:[/] {escape(str(e))}")
        return None


def _start(args: argparse.Namespace, config: ClusterConfig, s: UpSession, env: dict[str, str]) -> int:
    """Start etcd and every child, wait until they are healthy and servable, show the endpoints;
    0, or 1 when something could not be started."""
    endpoint = start_etcd(s, args)
    if endpoint is None:
        return 1
    try:
        plans = plan_services(
            config,
            Path(args.config).resolve(),
            etcd=endpoint,
            state_dir=s.state,
            host=args.host,
            base_port=args.base_port,
            prefix=args.prefix,
            ttl=args.ttl,
            log_level=args.log_level,
            http_port=args.http_port,
            api_keys=str(Path(args.api_keys).resolve()) if args.api_keys else None,
            reseed=not args.etcd,
            schedulers=args.schedulers,
            front_workers=args.front_workers,
        )
        for plan in plans:
            s.group.spawn(plan.name, plan.argv, env=child_env(env, plan.name), log_path=plan.log_path)
    except (ValueError, SupervisorError) as e:
        s.console.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    s.console.print(f"started {len(plans)} services; waiting for them to be healthy ...")
    wait_healthy(s, plans, args.health_timeout)
    schedulers = [p for p in plans if p.name.startswith("scheduler")]
    wait_ready(s, schedulers[0], args.ready_timeout)
    announce(s, endpoint, schedulers, args.tls, next((p.http for p in plans if p.http), ""))
    return 0


def _stop(s: UpSession, grace: float) -> None:
    s.console.print("stopping ...")
    try:
        s.group.stop_all(grace=grace)
    except KeyboardInterrupt:  # a second Ctrl-C: no more patience
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        s.group.stop_all(grace=0)
    s.console.print("stopped")


def run(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=True)
    config = _load_config(args, console)
    if config is None:
        return 2
    if args.schedulers < 1:
        console.print(f"[red]error:[/] --schedulers must be >= 1, got {args.schedulers}")
        return 2
    if args.front_workers < 0:
        console.print(f"[red]error:[/] --front-workers must be >= 0, got {args.front_workers}")
        return 2
    state = Path(args.state_dir).resolve()
    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "models").mkdir(parents=True, exist_ok=True)
    try:
        env = _security_env(args, state)
    except (ValueError, OSError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 2

    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    s = UpSession(console, state, ProcessGroup(log_dir=state / "logs"))
    try:
        try:
            code = _start(args, config, s, env)
            if code:
                return code
            restarts = Restarts(RestartPolicy(backoff_s=args.restart_backoff_s)) if args.restart else None
            Supervision(s, restarts).run_forever()
        except KeyboardInterrupt:
            pass
        _stop(s, args.grace)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        s.group.stop_all(grace=0)  # no-op when already stopped; covers early returns and errors
        if s.etcd is not None:
            s.etcd.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

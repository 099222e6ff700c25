"""``llmfleet load``: open-loop Poisson load on a running cluster, phase by phase, with a report.

Each phase sends one service requests at a rate for a while (``--phase SERVICE:RATE:SECONDS``,
repeatable, run in order; or ``--service/--rate/--duration`` for one phase). Arrivals are Poisson
(seeded): a request is sent when its time comes whether or not earlier ones finished, as real
traffic does. Every ``--report-s`` a line gives what completed in that interval (TTFT and latency
percentiles, errors, and which engines served it: a scale-out shows as a new engine id); the end
prints the totals (``--json`` writes them). Exit 0 when every request completed, 1 otherwise.

Replay (``--trace FILE``, ``--synthetic N``, ``--conversations N`` or ``--shared-prefix N``, with ``llmfleet sim``'s workload
flags: ``--rate``, ``--rate-scale``, ``--lengths-from``, ``--start``, ``--end``, ``--limit``,
``--system-prompt-tokens``, ``--mean-turns``, ``--think-s``, ``--seed``): each request is
sent at its arrival time to the service ``llmfleet sim`` assigns it (``--cluster-config``, ``--services``
FILE|NAME,..., default every live service), with a prompt of exactly its prompt-token count and
``max_tokens`` = its output length, through the SDK or the OpenAI HTTP API (``--via sdk|http``). A
progress bar and interval lines show the run; etcd is sampled every ``--sample-s``; ``--out`` gets
``llmfleet sim``'s report schema (``report.json``, ``report.md``, ``gpus_in_use.png``) for
``llmfleet compare``. See ``llmfleet.cli.load_replay``.

  llmfleet load --trace trace.csv --rate-scale 2 --cluster-config deploy/local/cluster.yaml --out .load
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape

from llmfleet.cli.load_lines import Outcome, interval_line, pct
from llmfleet.cli.load_replay import run_replay
from llmfleet.cli.workload_args import add_workload_arguments, workload_source
from llmfleet.client import AsyncClient, LlmfleetError
from llmfleet.costmodel import hardware
from llmfleet.costmodel.sources import COST_SOURCES, DEFAULT_COST_SOURCE
from llmfleet.rpc.cli_args import positive_float
from llmfleet.sim.spec import ClusterSpec

DEFAULT_PROMPT = "Once upon a time there was a fleet of models"


@dataclass(frozen=True)
class Phase:
    """``rate_rps`` requests per second to ``service`` for ``duration_s`` seconds."""

    service: str
    rate_rps: float
    duration_s: float

    @classmethod
    def parse(cls, text: str) -> Phase:
        parts = text.split(":")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(
                f"--phase {text!r}: expected SERVICE:RATE:SECONDS, e.g. chat:4:60"
            )
        service, rate, duration = parts
        try:
            r, d = float(rate), float(duration)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--phase {text!r}: RATE and SECONDS must be numbers") from None
        if not service or r < 0 or d <= 0:
            raise argparse.ArgumentTypeError(
                f"--phase {text!r}: needs a service name, RATE >= 0 and SECONDS > 0"
            )
        return cls(service, r, d)


def arrival_times(phases: list[Phase], seed: int) -> list[tuple[float, str]]:
    """(offset from the start in seconds, service) of every request: a Poisson process per phase."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float, str]] = []
    start = 0.0
    for ph in phases:
        t = start
        while ph.rate_rps > 0:
            t += float(rng.exponential(1.0 / ph.rate_rps))
            if t >= start + ph.duration_s:
                break
            out.append((t, ph.service))
        start += ph.duration_s
    return out


@dataclass
class Summary:
    """Totals of a run (``--json``): per-service counts and percentiles, engines, errors."""

    sent: int = 0
    completed: int = 0
    errors: int = 0
    services: dict[str, dict[str, float]] = field(default_factory=dict)
    engines: dict[str, int] = field(default_factory=dict)
    error_messages: dict[str, int] = field(default_factory=dict)


def summarize(outcomes: list[Outcome], sent: int) -> Summary:
    s = Summary(sent=sent, completed=sum(o.ok for o in outcomes))
    s.errors = len(outcomes) - s.completed
    for name in sorted({o.service for o in outcomes}):
        ok = [o for o in outcomes if o.service == name and o.ok]
        ttft, lat = [o.ttft_s for o in ok], [o.latency_s for o in ok]
        s.services[name] = {
            "completed": len(ok),
            "errors": sum(1 for o in outcomes if o.service == name and not o.ok),
            "ttft_p50_s": pct(ttft, 50),
            "ttft_p99_s": pct(ttft, 99),
            "latency_p50_s": pct(lat, 50),
            "latency_p99_s": pct(lat, 99),
        }
    s.engines = dict(sorted(Counter(o.engine_id or "?" for o in outcomes if o.ok).items()))
    s.error_messages = dict(Counter(o.error for o in outcomes if not o.ok))
    return s


async def _one(client: AsyncClient, prompt: str, service: str, max_tokens: int | None) -> Outcome:
    try:
        done = await client.complete(prompt, service, max_tokens=max_tokens)
    except LlmfleetError as e:
        return Outcome(service, False, error=f"{e.code.name}: {e.message}")
    u = done.usage
    return Outcome(service, True, u.ttft_s, u.latency_s, u.engine_id)


async def drive(args: argparse.Namespace, phases: list[Phase], out: Console) -> Summary:
    arrivals = arrival_times(phases, args.seed)
    total_s = sum(p.duration_s for p in phases)
    out.print(
        f"{len(arrivals)} requests over {total_s:g}s: "
        + "; ".join(f"{p.service} {p.rate_rps:g} req/s for {p.duration_s:g}s" for p in phases),
        highlight=False,
    )
    outcomes: list[Outcome] = []
    window: list[Outcome] = []
    tasks: set[asyncio.Task[Outcome]] = set()

    def finished(t: asyncio.Task[Outcome]) -> None:
        tasks.discard(t)
        o = t.result()
        outcomes.append(o)
        window.append(o)

    async with AsyncClient(args.scheduler, retries=args.retries, timeout_s=args.timeout) as client:
        start = time.monotonic()
        next_report = args.report_s
        pending = iter(arrivals)
        nxt = next(pending, None)
        while nxt is not None or tasks:
            now = time.monotonic() - start
            while nxt is not None and nxt[0] <= now:
                task = asyncio.create_task(_one(client, args.prompt, nxt[1], args.max_tokens))
                task.add_done_callback(finished)
                tasks.add(task)
                nxt = next(pending, None)
            if now >= next_report:
                out.print(escape(interval_line(now, window, len(tasks))), highlight=False)
                window.clear()
                next_report += args.report_s
            wake = min(x for x in (nxt[0] if nxt else None, next_report) if x is not None)
            await asyncio.sleep(max(0.0, min(wake - (time.monotonic() - start), 0.5)))
        if window:
            out.print(escape(interval_line(time.monotonic() - start, window, 0)), highlight=False)
    return summarize(outcomes, len(arrivals))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--phase",
        type=Phase.parse,
        action="append",
        default=None,
        metavar="SERVICE:RATE:SECONDS",
        help="a phase of load (repeatable; run in order), e.g. --phase chat:4:60 --phase chat:0.2:60",
    )
    p.add_argument("--service", "-s", help="one phase's service (instead of --phase)")
    p.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        help="one phase's rate in req/s (default 1); with --synthetic its arrival rate, with --conversations "
        "conversations/s (default 10)",
    )
    p.add_argument("--duration", type=float, default=30.0, help="one phase's length in seconds (default 30)")
    p.add_argument(
        "--scheduler",
        default=os.environ.get("LLMFLEET_SCHEDULER", "127.0.0.1:50051,127.0.0.1:50056"),
        help="scheduler replicas host:port[,host:port] (env LLMFLEET_SCHEDULER; default: the two `llmfleet up` starts)",
    )
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-tokens", type=int, default=None, help="default: the service's default")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times (and replay prompts)")
    p.add_argument("--report-s", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument("--timeout", type=float, default=300.0, help="deadline of each request in seconds")
    p.add_argument("--retries", type=int, default=3, help="retries when the scheduler is unavailable")
    p.add_argument(
        "--json", type=Path, default=None, help="write the summary (replay: the report) here as JSON"
    )
    add_replay_arguments(p)
    p.set_defaults(load_parser=p)


def _services_arg(text: str) -> Path | list[str]:
    """``--services``: a services YAML (as ``llmfleet sim`` reads it) or ``NAME[,NAME...]``."""
    path = Path(text)
    if path.suffix in (".yaml", ".yml", ".json") or path.is_file():
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"no such services file: {text}")
        return path
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected a services YAML or NAME[,NAME...], got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a service is named twice in {text!r}")
    return names


def _hardware_arg(text: str) -> str:
    """``--cluster``: ``COUNTxHARDWARE`` (as ``llmfleet sim``) or ``HARDWARE`` -> the catalog hardware name."""

    try:
        return ClusterSpec.parse(text).hw.name if text[:1].isdigit() else hardware(text).name
    except (KeyError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e.args[0] if e.args else e)) from None


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    """``--trace``/``--synthetic`` and what a replay needs (``llmfleet.cli.load_replay``)."""
    g = p.add_argument_group("replay a workload (instead of --phase)")
    add_workload_arguments(g, required=False)
    svc = g.add_mutually_exclusive_group()
    svc.add_argument(
        "--services",
        type=_services_arg,
        help="services YAML (as llmfleet sim) or NAME[,NAME...]: the targets, in the order length clusters "
        "map onto (default: every live service, by name)",
    )
    svc.add_argument(
        "--cluster-config", type=Path, help="take the services and SLOs of a cluster config (as llmfleet sim)"
    )
    g.add_argument(
        "--via", choices=("sdk", "http"), default="sdk", help="send through the SDK (gRPC) or the HTTP API"
    )
    g.add_argument(
        "--http",
        default=os.environ.get("LLMFLEET_HTTP", "127.0.0.1:8000"),
        help="host:port of the OpenAI-compatible API for --via http (env LLMFLEET_HTTP; default 127.0.0.1:8000)",
    )
    g.add_argument("--etcd", default=None, help="etcd endpoints host:port[,host:port] (env LLMFLEET_ETCD)")
    g.add_argument("--prefix", default=None, help="etcd key prefix (env LLMFLEET_PREFIX, default /llmfleet)")
    g.add_argument(
        "--sample-s", type=positive_float, default=1.0, help="seconds between etcd samples (default 1)"
    )
    g.add_argument(
        "--cluster",
        type=_hardware_arg,
        help="COUNTxHARDWARE or HARDWARE: the cost model's hardware for solo times when an engine's is not a "
        "catalog name",
    )
    g.add_argument(
        "--cost-source", choices=COST_SOURCES, default=DEFAULT_COST_SOURCE, help="solo times' cost model"
    )
    g.add_argument("--out", type=Path, default=Path(".load"), help="report directory (default .load)")
    g.add_argument(
        "--records",
        action="store_true",
        help="also write requests.jsonl: every request as llmfleet sim --records writes it, with the engine's "
        "and the scheduler's TTFT (llmfleet compare pairs the two runs' requests)",
    )
    g.add_argument("--no-plots", action="store_true")


def phases_of(args: argparse.Namespace) -> list[Phase]:
    if args.phase and args.service:
        raise SystemExit("llmfleet load: give --phase or --service/--rate/--duration, not both")
    if args.phase:
        return list(args.phase)
    if not args.service:
        raise SystemExit(
            "llmfleet load: give --service (with --rate/--duration), --phase, --trace or --synthetic"
        )
    rate = args.rate if args.rate is not None else 1.0
    return [Phase.parse(f"{args.service}:{rate}:{args.duration}")]


def replay_usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with a replay's flags, argparse style (``argument --flag: ...``), or None."""
    source = workload_source(args)
    if args.phase:
        return f"argument --phase: not allowed with argument {source}"
    if args.service:
        return f"argument --service/-s: not allowed with argument {source} (use --services)"
    if args.trace is not None and args.rate is not None:
        return "argument --rate: not allowed with argument --trace (use --rate-scale)"
    if args.trace is not None and not args.trace.is_file():
        return f"argument --trace: no such file: {args.trace}"
    if args.lengths_from is not None and not args.lengths_from.is_file():
        return f"argument --lengths-from: no such file: {args.lengths_from}"
    if args.end is not None and args.end <= args.start:
        return f"argument --end: must be > --start ({args.start:g}), got {args.end:g}"
    if args.cluster_config is not None and not args.cluster_config.is_file():
        return f"argument --cluster-config: no such file: {args.cluster_config}"
    if args.report_s <= 0:
        return "argument --report-s: must be > 0"
    return None


def run(args: argparse.Namespace) -> int:
    if workload_source(args) is not None:
        problem = replay_usage_error(args)
        if problem is not None:
            parser = getattr(args, "load_parser", None)
            if parser is not None:
                parser.error(problem)  # exits 2 with the usage line
            raise SystemExit(f"llmfleet load: error: {problem}")

        return run_replay(args)
    phases = phases_of(args)
    if args.report_s <= 0:
        raise SystemExit("llmfleet load: --report-s must be > 0")
    out = Console(soft_wrap=True)
    try:
        summary = asyncio.run(drive(args, phases, out))
    except KeyboardInterrupt:
        out.print("[yellow]interrupted[/]")
        return 130
    for name, st in summary.services.items():
        out.print(
            f"{name}: {st['completed']:.0f} completed, {st['errors']:.0f} errors; "
            f"TTFT p50 {st['ttft_p50_s']:.3f}s p99 {st['ttft_p99_s']:.3f}s; "
            f"latency p50 {st['latency_p50_s']:.3f}s p99 {st['latency_p99_s']:.3f}s",
            highlight=False,
        )
    out.print(f"engines: {summary.engines}", highlight=False)
    for msg, n in summary.error_messages.items():
        out.print(f"[red]{n} × {escape(msg)}[/]", highlight=False)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(summary), indent=2))
    return 0 if summary.completed == summary.sent else 1

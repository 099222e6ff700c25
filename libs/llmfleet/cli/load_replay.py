"""``llmfleet load --trace FILE | --synthetic N``: replay a workload against the live cluster and write
``llmfleet sim``'s report (``OUT/report.json``, ``report.md``, ``gpus_in_use.png``).

Each request is sent at its arrival time (× ``--rate-scale``), whether or not earlier ones finished
(a closed-loop turn, as in ``--conversations``: its think time after the turn it follows finished),
to the service ``llmfleet sim`` would give it, with a prompt of exactly its prompt-token count and
``max_tokens`` = its output length. etcd is read every ``--sample-s`` (GPUs in use, placement plans,
migration state) and the migration leader every 5 s (its epochs and moves).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from llmfleet.cli.compare import plot_gpus
from llmfleet.cli.load_lines import Outcome, interval_line
from llmfleet.cli.load_sampler import FleetSampler
from llmfleet.cli.load_senders import Send, http_sender, sdk_sender
from llmfleet.cli.workload_args import build_workload, describe_source
from llmfleet.client import AsyncClient
from llmfleet.config import ClusterConfig, EtcdSettings
from llmfleet.coord import EtcdClient
from llmfleet.coord.desired import ModelEntry
from llmfleet.replay.migration import migration_summary
from llmfleet.replay.report import LiveOutcome, LiveRun, SoloTimes, live_report
from llmfleet.replay.requests import ReplayRequest, replay_requests
from llmfleet.replay.targets import (
    UnknownService,
    config_targets,
    file_targets,
    live_targets,
    model_names,
)
from llmfleet.sim.report import markdown_table
from llmfleet.sim.spec import SimService, load_services
from llmfleet.spec.services import ServiceSpec
from llmfleet.workload.followups import PREDECESSOR_FAILED, FollowUps

DEFAULT_OUT = Path(".load")


class UsageError(Exception):
    """Bad input found at start (after argparse): ``flag`` names the option."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


@dataclass
class Plan:
    """What the replay sends, to which services, and the names that make live plans read as sim plans."""

    requests: list[ReplayRequest]
    services: list[SimService]
    names: dict[str, str]  # live model -> catalog name


async def _live_services(client: Any) -> tuple[dict, dict[str, str | None]]:
    """etcd's ``services/`` (ServiceSpec by name) and ``models/`` (sim_model by model name)."""

    (svc, _), (models, _) = await asyncio.gather(
        client.get_prefix(client.keys.services), client.get_prefix(client.keys.models)
    )
    live = {s.name: s for s in (ServiceSpec.from_json(v) for v in svc.values())}
    sims = {m.name: m.sim_model for m in (ModelEntry.from_json(v) for v in models.values())}
    return live, sims


def plan_replay(
    args: argparse.Namespace, workload: Any, live: dict, sim_models: dict[str, str | None]
) -> Plan:
    """Targets from the flags (validated against the live services) and the requests to send."""

    names = model_names(live, sim_models)
    try:
        if args.cluster_config is not None:
            services = config_targets(ClusterConfig.load(args.cluster_config), live)
        elif isinstance(args.services, Path):
            services = file_targets(load_services(args.services)[0], live)
        else:
            services = live_targets(args.services, live, names)
    except UnknownService as e:
        raise UsageError(e.flag, str(e)) from None
    if not services:
        raise UsageError("--services", "the cluster serves no service (etcd's services/ is empty)")
    return Plan(replay_requests(workload, services), services, names)


def _interval(now: float, window: Sequence[LiveOutcome], in_flight: int) -> str:
    return interval_line(now, [_outcome(o) for o in window], in_flight)


def _outcome(o: LiveOutcome) -> Any:
    """A replay outcome as ``llmfleet.cli.load_lines.Outcome`` (its interval line)."""

    if not o.ok:
        return Outcome(o.service, False, engine_id=o.engine_id, error=o.error)
    return Outcome(
        o.service, True, (o.first_s or 0.0) - o.arrival_s, (o.finish_s or 0.0) - o.arrival_s, o.engine_id
    )


async def _safe(send: Send, r: ReplayRequest, prompt: str, t0: float) -> LiveOutcome:
    """``send``, with any unexpected exception recorded as the request's failure."""
    try:
        return await send(r, prompt)
    except Exception as e:
        now = time.monotonic() - t0
        return LiveOutcome(
            r.request_id,
            r.service,
            r.arrival_s,
            now,
            r.prompt_tokens,
            r.max_tokens,
            error=f"{type(e).__name__}: {e}",
        )


async def send_all(
    requests: Sequence[ReplayRequest],
    send: Send,
    t0: float,
    *,
    seed: int = 0,
    report_s: float = 5.0,
    console: Console | None = None,
) -> list[LiveOutcome]:
    """Send each request at ``t0 + arrival_s`` (one task each; a closed-loop turn its think time after
    the turn it follows finished), with a progress bar and a line every ``report_s``; returns the
    outcomes in workload order."""
    outcomes: dict[int, LiveOutcome] = {}
    window: list[LiveOutcome] = []
    tasks: set[asyncio.Task[LiveOutcome]] = set()
    position = {r.request_id: k for k, r in enumerate(requests)}
    released: list[tuple[float, int, ReplayRequest]] = []  # (send at, position, turn): a heap
    follow = FollowUps.of(
        requests, lambda turn: heapq.heappush(released, (turn.arrival_s, position[turn.request_id], turn))
    )
    session_of = {r.request_id: r.session for r in requests}
    # a turn that continues its conversation (it follows a request of the same session, or neither names
    # one) resends that request's prompt and answer; one that opens another (a user's next) only waits
    continuing = {r.request_id for r in requests if r.follows and session_of[r.follows] == r.session}
    turns_after: Counter[str] = Counter()  # resent request id -> its continuing turns not sent yet
    for r in requests:
        if follow is not None and r.follows:
            follow.read(r)
            if r.request_id in continuing:
                turns_after[r.follows] += 1
    opening = [k for k, r in enumerate(requests) if follow is None or not r.follows]
    sent_prompts: dict[str, str] = {}  # a resent request's prompt, until it finishes
    histories: dict[str, str] = {}  # a finished resent request's prompt and answer, until its turns are sent

    def prompt_of(r: ReplayRequest) -> str:
        """A continuing turn resends the prompt and the answer of the turn before, as sent and received."""
        if r.request_id not in continuing:
            return r.prompt(seed)
        history = histories[r.follows]
        turns_after[r.follows] -= 1
        if not turns_after[r.follows]:
            del histories[r.follows], turns_after[r.follows]
        return r.next_prompt(history)

    console = console or Console(soft_wrap=True)
    columns = (
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} done"),
        TextColumn("sent {task.fields[sent]}, in flight {task.fields[inflight]}, failed {task.fields[failed]}"),
        TimeElapsedColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console, transient=False) as bar:
        task_id = bar.add_task("replay", total=len(requests), sent=0, inflight=0, failed=0)
        failed = 0

        def finished(k: int, t: asyncio.Task[LiveOutcome]) -> None:
            nonlocal failed
            tasks.discard(t)
            o = t.result()
            outcomes[k] = o
            window.append(o)
            failed += not o.ok
            prompt = sent_prompts.pop(o.request_id, None)
            if prompt is not None and o.ok:
                histories[o.request_id] = " ".join(x for x in (prompt, o.text.strip()) if x)
            if follow is not None and o.ok:
                follow.ended(o.request_id, time.monotonic() - t0)
            o.text = ""  # the report keeps no completion text
            bar.update(task_id, advance=1, inflight=len(tasks), failed=failed)

        def start(k: int, r: ReplayRequest) -> None:
            prompt = prompt_of(r)
            if r.request_id in turns_after:
                sent_prompts[r.request_id] = prompt
            task = asyncio.create_task(_safe(send, r, prompt, t0))
            task.add_done_callback(lambda t: finished(k, t))
            tasks.add(task)

        next_report = report_s
        i = sent = 0
        while i < len(opening) or tasks or released:
            now = time.monotonic() - t0
            while i < len(opening) and requests[opening[i]].arrival_s <= now:
                start(opening[i], requests[opening[i]])
                i, sent = i + 1, sent + 1
            while released and released[0][0] <= now:
                _, k, turn = heapq.heappop(released)
                start(k, turn)
                sent += 1
            bar.update(task_id, sent=sent, inflight=len(tasks))
            if now >= next_report:
                bar.console.print(escape(_interval(now, window, len(tasks))), highlight=False)
                window.clear()
                next_report += report_s
            wake = min(
                requests[opening[i]].arrival_s if i < len(opening) else next_report,
                released[0][0] if released else next_report,
                next_report,
            )
            await asyncio.sleep(max(0.0, min(wake - (time.monotonic() - t0), 0.25)))
        for r in follow.stranded() if follow is not None else ():  # the turns after a failed turn
            k = position[r.request_id]
            outcomes[k] = LiveOutcome(
                r.request_id, r.service, r.arrival_s, r.arrival_s, r.prompt_tokens, r.max_tokens,
                error=PREDECESSOR_FAILED,
            )  # fmt: skip
            window.append(outcomes[k])
            bar.update(task_id, advance=1, failed=failed + 1)
            failed += 1
        if window:
            bar.console.print(escape(_interval(time.monotonic() - t0, window, 0)), highlight=False)
    return [outcomes[k] for k in sorted(outcomes)]


async def _open_sender(args: argparse.Namespace, t0: float) -> tuple[Send, Any]:
    """The sender for ``--via`` and the client to close; checks the scheduler answers first."""
    if args.via == "http":
        import openai

        api_key = os.environ.get("LLMFLEET_API_KEY") or "unused"
        client = openai.AsyncOpenAI(
            base_url=f"http://{args.http}/v1", api_key=api_key, timeout=args.timeout, max_retries=args.retries
        )
        await client.models.list()
        return http_sender(client, t0), client

    sdk = AsyncClient(args.scheduler, retries=args.retries, timeout_s=args.timeout)
    await sdk.list_services(timeout_s=10)
    return sdk_sender(sdk, t0), sdk


async def replay(args: argparse.Namespace, workload: Any, console: Console) -> LiveRun:
    """Connect, plan, send while sampling etcd, and build the report (one run of the sim schema) and
    the requests' rows."""

    settings = EtcdSettings.from_env(endpoints=args.etcd, prefix=args.prefix)
    etcd = EtcdClient(settings)
    try:
        try:
            await asyncio.wait_for(etcd.connect(wait=False), 10)
            live, sim_models = await _live_services(etcd)
        except Exception as e:
            raise UsageError(
                "--etcd", f"cannot read the cluster from etcd {','.join(settings.endpoints)}: {e}"
            ) from e
        plan = plan_replay(args, workload, live, sim_models)
        console.print(
            f"{len(plan.requests)} requests over {workload.duration_s:.0f} s ({workload.rate_rps:.2f} req/s) via "
            f"{args.via}; services: {', '.join(f'{s.name}→{s.model}' for s in plan.services)}",
            highlight=False,
        )
        t0 = time.monotonic() + 0.5
        try:
            send, client = await _open_sender(args, t0)
        except Exception as e:
            flag = "--http" if args.via == "http" else "--scheduler"
            raise UsageError(flag, f"the scheduler does not answer: {e}") from e
        sampler = FleetSampler(etcd, t0, period_s=args.sample_s)
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        await sampler.sample()
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        wall = time.monotonic()
        try:
            outcomes = await send_all(
                plan.requests, send, t0, seed=args.seed, report_s=args.report_s, console=console
            )
        finally:
            stop.set()
            await sampling
            await client.close()
        wall = time.monotonic() - wall
        await sampler.finish()
    finally:
        await etcd.close()
    hw = args.cluster  # a catalog name (checked by argparse) or None
    migration = None
    if sampler.migration_policy not in ("", "none"):  # as llmfleet sim: only when a policy runs
        migration = migration_summary(
            sampler.migration_policy, sampler.migration_epoch_s, sampler.epochs, sampler.moves,
            t0_unix=time.time() - (time.monotonic() - t0),
        )  # fmt: skip
    last = sampler.samples[-1] if sampler.samples else None
    policy = {
        "placement": next((s.plan_policy for s in reversed(sampler.samples) if s.plan_policy), ""),
        "migration": last.migration_policy if last else "",
        "description": f"live replay via {args.via}",
    }
    extra = {"via": args.via, "sample_errors": sampler.errors, "migration_error": sampler.migration_error}
    return live_report(
        outcomes, sampler.samples, plan.services, solo=SoloTimes(hw, args.cost_source), names=plan.names,
        migration=migration, policy=policy, wall_s=wall, extra=extra,
    )  # fmt: skip


@dataclass(frozen=True)
class _Named:
    name: str


@dataclass(frozen=True)
class _Run:
    """What ``llmfleet.sim.report.markdown_table`` reads of an experiment."""

    policy: _Named
    report: dict


def write_live_report(
    report: dict,
    out: Path,
    context: str,
    plots: bool = True,
    records: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Path]:
    """``report.json`` (``{"title", "context", "runs": [report]}``, as ``llmfleet sim`` writes it),
    ``report.md``, ``gpus_in_use.png`` and, given ``records``, ``requests.jsonl`` (one row each)."""

    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "markdown": out / "report.md"}
    if records is not None:
        paths["requests"] = out / "requests.jsonl"
        paths["requests"].write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = {"title": "llmfleet load", "context": context, "runs": [report]}
    paths["json"].write_text(json.dumps(doc, indent=1, default=float))
    table = markdown_table([_Run(_Named("live"), report)])
    lines = ["# llmfleet load", "", context, "", table, ""]
    for d in report.get("placement", []):
        lines.append(
            f"- t={d['t']:.1f}s plan #{d.get('plan_id')}: {d['plan']} ({'; '.join(d['changes']) or '–'})"
        )
    paths["markdown"].write_text("\n".join(lines) + "\n")
    if plots:
        end = report["cluster"]["makespan_s"]
        paths["gpus"] = plot_gpus({"live": (report["cluster"]["gpus_in_use"], end)}, out / "gpus_in_use.png")
    return paths


def _engines_ttft(d: dict) -> str:
    return f" (the engines' own {d['p50']:.3f}s over {d['n']})" if d["n"] else ""


def _cached(d: dict) -> str:
    share = d["cached_share"]
    return f"; prompt tokens found cached {share:.1%}" if share is not None else ""


def run_replay(args: argparse.Namespace) -> int:
    """The replay subcommand's body (flags already checked by ``llmfleet.cli.load``)."""

    console = Console(soft_wrap=True)
    try:
        workload = build_workload(args)
    except (ValueError, FileNotFoundError) as e:  # the trace's file and line
        console.print(f"[red]llmfleet load:[/] {escape(str(e))}", highlight=False)
        return 2
    if not len(workload):
        console.print("[red]llmfleet load:[/] the workload has no requests", highlight=False)
        return 2
    try:
        run = asyncio.run(replay(args, workload, console))
    except UsageError as e:
        console.print(f"[red]llmfleet load: error: argument {e.flag}:[/] {escape(str(e))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130
    report = run.report
    source = describe_source(args)
    context = f"{len(workload)} requests, {source}, live via {args.via}, cluster {report['cluster']['spec']}"
    rows = run.rows if args.records else None
    paths = write_live_report(report, args.out, context, plots=not args.no_plots, records=rows)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(paths["json"].read_text())
    o = report["overall"]
    console.print(
        f"{o['completed']} of {o['requests']} completed, {o['failed']} failed; latency mean "
        f"{o['latency_s']['mean']:.3f}s p99 {o['latency_s']['p99']:.3f}s; TTFT p50 {o['ttft_s']['p50']:.3f}s"
        f"{_engines_ttft(report['live']['engine_ttft_s'])}; "
        f"GPUs mean {report['cluster']['mean_gpus_in_use']:.2f} peak {report['cluster']['peak_gpus_in_use']}"
        f"{_cached(o['prefix_cache'])}",
        highlight=False,
    )
    for msg, n in report["live"]["errors"].items():
        console.print(f"[red]{n} × {escape(msg)}[/]", highlight=False)
    written = "  ".join(str(paths[k]) for k in ("json", "markdown", "requests") if k in paths)
    console.print(f"report: {written}", highlight=False)
    return 0 if o["failed"] == 0 and o["completed"] == o["requests"] else 1

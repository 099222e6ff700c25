"""What the ``make bench-prefix`` sections share: the compared setups (dispatch policy × engine prefix
caching), the multi-turn workload's flags, the rate-finding rule, and ``llmfleet sim`` run in this
process (the CLI's own argument parsing, spec and workload builders and ``simulate``), so that a run's
per-instance prefix-cache counters and per-request records are at hand beside its ``report.json``."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.cli.sim import add_arguments
from llmfleet.cli.sim_args import bundles, sim_spec
from llmfleet.cli.workload_args import build_workload
from llmfleet.config import ClusterConfig
from llmfleet.sim.report import write_report
from llmfleet.sim.run import Experiment
from llmfleet.sim.run import simulate as run

POLICIES = ("round_robin", "jsq", "prefix_affinity")
CHAT = {"chat": {"model": "llama2-7b", "slo": {"ttft_s": 2.0, "tpot_s": 0.1}}}  # the conv trace's chat
# re-planned every 10 s: an engine that registers after the first plan (none yet) is placed on soon
PLACEMENT = {"policy": "dedicated_even", "interval_s": 10, "window_s": 10, "confirm_intervals": 1}
SLO_ATTAINMENT = 0.99  # "meets its SLO": 99% of requests within TTFT and TPOT SLO (Aladdin's P99)
TTFT_SLO_S = CHAT["chat"]["slo"]["ttft_s"]  # "saturated": mean TTFT past it (queueing sets TTFT)
PLATEAU = 1.25  # "saturated": the window's output tokens/s rose less than this when the rate doubled


@dataclass(frozen=True)
class Setup:
    """One compared setup: a dispatch policy, whether the engines cache prefixes, and the engines' local
    request policy (with its default options; the same for every setup of a run, so not in the name)."""

    dispatch: str
    caching: bool
    engine: str = "fcfs"

    @property
    def name(self) -> str:
        return f"{self.dispatch}/{'cache' if self.caching else 'nocache'}"

    @property
    def slug(self) -> str:
        return self.name.replace("/", "-")


def setups(
    dispatch: tuple[str, ...] = POLICIES, caching: tuple[bool, ...] = (True, False), engine: str = "fcfs"
) -> list[Setup]:
    return [Setup(d, c, engine) for d in dispatch for c in caching]


@dataclass(frozen=True)
class ChatShape:
    """The multi-turn workload's shape (``llmfleet.workload.conversations``): each turn resends the
    system prompt and the history; ``span_s`` seconds of load."""

    system_tokens: int
    mean_turns: float
    think_s: float
    max_context: int
    span_s: float
    seed: int = 0

    @property
    def window(self) -> tuple[float, float]:
        """Where throughput is measured: the span without its first quarter (the histories have built
        up; after the span the load thins out as conversations end)."""
        return 0.25 * self.span_s, self.span_s

    def shape_flags(self) -> list[str]:
        return [
            "--system-prompt-tokens", str(self.system_tokens), "--mean-turns", f"{self.mean_turns:g}",
            "--think-s", f"{self.think_s:g}", "--max-context", str(self.max_context), "--seed", str(self.seed),
        ]  # fmt: skip


@dataclass(frozen=True)
class Conversations(ChatShape):
    """An open stream: conversations start at ``rate`` per second for ``span_s`` seconds."""

    unit = "conv/s"

    def count(self, rate: float) -> int:
        return max(1, round(rate * self.span_s))

    def flags(self, rate: float) -> list[str]:
        """``llmfleet sim``/``llmfleet load`` workload flags at ``rate`` conversations per second."""
        return ["--conversations", str(self.count(rate)), "--rate", f"{rate:g}", *self.shape_flags()]


@dataclass(frozen=True)
class Users(ChatShape):
    """A closed population (``llmfleet.workload.conversations.users``): N users, each holding one
    conversation after another for ``span_s`` seconds (all of them started within the first think
    time, and active up to the span's end); the load is N."""

    unit = "users"

    def flags(self, n: float) -> list[str]:
        """``llmfleet sim``/``llmfleet load`` workload flags for ``n`` users."""
        return ["--users", str(max(1, round(n))), "--span", f"{self.span_s:g}", *self.shape_flags()]


def sweep_rates(start: float, factor: float, steps: int) -> list[float]:
    return [round(start * factor**k, 3) for k in range(steps)]


def meets_slo(row: dict[str, Any]) -> bool:
    return (row.get("slo_attainment") or 0.0) >= SLO_ATTAINMENT


def saturated(row: dict[str, Any], before: dict[str, Any] | None) -> bool:
    """Past capacity at this rate: the window's output tokens/s rose less than ``PLATEAU``× from the
    rate before (half this one), or the queue sets TTFT (mean TTFT past the TTFT SLO). Completed
    req/s against offered does not tell: the conversations' last turns arrive sparsely for minutes
    after the span, a backlog drains then, and every run completes at nearly the offered rate."""
    if (row.get("ttft_mean_s") or 0.0) > TTFT_SLO_S:
        return True
    now, prev = row.get("window_tokens_per_s"), (before or {}).get("window_tokens_per_s")
    return bool(now and prev) and now < PLATEAU * prev


def window_rates(
    requests: list[tuple[float, float | None, float | None, int]], t0: float, t1: float
) -> tuple[float, float]:
    """(output tokens generated in [t0, t1], output tokens of the requests arriving in it) per second,
    from (arrival, first token, finish, output tokens) per request: the first token at its time and
    the others spread evenly up to the finish."""
    made = offered = 0.0
    for arrival, first, finish, n in requests:
        if t0 <= arrival < t1:
            offered += n
        if first is None:
            continue
        made += 1.0 if t0 <= first < t1 else 0.0
        if n > 1 and finish is not None and finish > first:
            made += (n - 1) * max(0.0, min(finish, t1) - max(first, t0)) / (finish - first)
    span = t1 - t0
    return made / span, offered / span


def pick_loads(rows: dict[float, dict[str, dict]], reference: str) -> dict[str, Any]:
    """From a sweep (rate -> setup name -> row, rates doubling): ``slo``, the highest rate at which
    ``reference`` meets its SLO, and ``saturation``, per setup the lowest rate at which it is
    saturated (None: not reached)."""
    rates = sorted(rows)
    slo = [r for r in rates if reference in rows[r] and meets_slo(rows[r][reference])]
    names = sorted({n for r in rates for n in rows[r]})
    return {"slo": max(slo) if slo else None, "saturation": {n: first_saturated(rows, n) for n in names}}


def first_saturated(rows: dict[float, dict[str, dict]], name: str) -> float | None:
    before = None
    for rate in sorted(rows):
        row = rows[rate].get(name)
        if row is None:
            continue
        if saturated(row, before):
            return rate
        before = row
    return None


def still_needed(rows: dict[float, dict[str, dict]], reference: str, name: str) -> bool:
    """Does setup ``name`` run at the next rate of the sweep? Up to one rate past its first saturated
    one (its plateau), and at every rate while ``reference`` still meets its SLO (so that every setup
    has a row at the SLO load)."""
    rates = sorted(rows)
    if not rates:
        return True
    last = rows[rates[-1]]
    if reference in last and meets_slo(last[reference]):
        return True
    first = first_saturated(rows, name)
    return first is None or not any(r > first and name in rows[r] for r in rates)


def sustained(rows: dict[float, dict[str, dict]], name: str) -> dict[str, Any] | None:
    """What setup ``name`` sustains: its row with the most output tokens/s in the window at or past
    its first saturated rate, with that rate (None before saturation)."""
    first = first_saturated(rows, name)
    if first is None:
        return None
    past = [(r, rows[r][name]) for r in sorted(rows) if r >= first and name in rows[r]]
    rate, row = max(past, key=lambda x: x[1].get("window_tokens_per_s") or 0.0)
    return {"rate": rate, **row}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmfleet sim")
    add_arguments(p)
    return p


@dataclass(frozen=True)
class SimRun:
    """One simulated run: the experiment (plan, result with per-instance stats and records, report)
    and the request rate its workload offered."""

    experiment: Experiment
    offered_rps: float


def simulate(argv: list[str], out: Path | None = None) -> SimRun:
    """``llmfleet sim ARGV`` in this process; with ``out``, its ``report.json`` and ``report.md`` as the
    CLI writes them."""

    args = sim_parser().parse_args(argv)
    config = ClusterConfig.load(args.cluster_config) if args.cluster_config is not None else None
    spec = sim_spec(args, config)
    (bundle,) = bundles(args, config)
    workload = build_workload(args)
    e = run(spec, workload, bundle, workers=1)
    if out is not None:
        context = f"{len(workload)} requests, {spec.cluster}, bench-prefix: {' '.join(argv)}"
        write_report([e], out, title="llmfleet sim", context=context, plots=False)
    return SimRun(e, workload.rate_rps)


def summary(sim: SimRun, window: tuple[float, float]) -> dict[str, Any]:
    """The figures the bench reports of one simulated run."""
    e = sim.experiment
    o, cl = e.report["overall"], e.report["cluster"]
    reqs = [(r.arrival_s, r.first_token_s, r.finish_s, r.output_tokens) for r in e.result.records]
    made, offered = window_rates(reqs, *window)
    sent = sum(r.prompt_tokens for r in e.result.records if r.done)
    # a preempted request's prompt is looked up again when it is admitted again: hit rate and computed
    # tokens count the engines' lookups, as the live engines' vllm:prefix_cache_* counters do
    queried = sum(i.get("prefix_queries", 0) for i in e.result.instances)
    hits = sum(i.get("prefix_hits", 0) for i in e.result.instances)
    ttft = o.get("ttft_s") or {}
    return {
        "requests": o["requests"],
        "completed": o["completed"],
        "offered_rps": round(sim.offered_rps, 3),
        "completed_rps": _r(cl.get("throughput_rps")),
        "output_tokens_per_s": _r(cl.get("throughput_tokens_per_s"), 1),
        "window_tokens_per_s": _r(made, 1),
        "window_offered_tokens_per_s": _r(offered, 1),
        "ttft_mean_s": _r(ttft.get("mean"), 4),
        "ttft_p50_s": _r(ttft.get("p50"), 4),
        "ttft_p99_s": _r(ttft.get("p99"), 4),
        "slo_attainment": _r((o.get("slo") or {}).get("aladdin"), 4),
        "prompt_tokens_sent": sent,
        "prompt_tokens_computed": queried - hits,
        "hit_rate": _r(hits / queried, 4) if queried else None,
        "sim_wall_s": _r(cl.get("wall_s"), 1),
    }


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), digits)

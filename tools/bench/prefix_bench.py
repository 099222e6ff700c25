"""Prefix caching and cache-aware dispatch on a multi-turn workload (``make bench-prefix``): .bench/prefix/.

**Setups.** Dispatch ``round_robin``, ``jsq`` and ``prefix_affinity``, each with the engines' prefix
caching on and off (the per-engine ``prefix_caching`` limit: the emulated pool's ``engine:`` block of
the cluster file, which ``llmfleet sim --cluster-config`` applies to every simulated instance; the
dispatch policy is the service's ``dispatch:``, and ``--dispatch`` in the simulator). Engines run FCFS,
one GPU each, one service ``chat`` (Llama-2-7B, SLO TTFT 2 s and TPOT 0.1 s, the conv trace's chat).

**Workload** (``llmfleet.workload.conversations``, ``--conversations`` of ``llmfleet sim``/``load``):
conversations start as a Poisson process for ``--span`` seconds (30; quick 20); each turn resends the
service's system prompt (1,000 tokens, an assumption: one shared prefix per service) and the whole
history; user and answer lengths have LMSYS-Chat-1M's means; 3.7 turns per conversation on average
(CachedAttention's 73% multi-turn ShareGPT conversations as a geometric mean, 1 / (1 − 0.73)), 10 s
of think time between turns, at most 4,096 tokens of context. The workload is fixed before any run;
only the rate changes.

**Throughput** is output tokens generated in a window, from a quarter of the span to its end (the
histories have built up): simulated from each request's first-token and finish times, live from the
engines' ``vllm:generation_tokens`` sampled every 0.5 s. The whole run's tokens/s does not tell the
setups apart: the conversations' last turns arrive sparsely long after the span, a backlog drains
then, and every setup completes at nearly the offered rate.

**Loads, one rule for every setup.** A sweep doubles the conversation rate from ``--start-rate``
(scaled by GPUs / 32): every setup runs at each rate while ``jsq``/cache meets its SLO, then each
setup up to one rate past its first *saturated* one (the window's tokens/s rose less than 1.25× from
the rate before, or the mean TTFT is past the 2 s TTFT SLO). *JSQ's SLO load* is the highest swept
rate at which ``jsq``/cache has ≥ 99% of its requests within both SLOs (Aladdin's P99); at
*saturation* each setup is reported at its most window tokens/s at or past its first saturated rate
(what it sustains).

Sections (``--only``):

* ``sim`` — ``llmfleet sim`` at 32 A100-80GB (run in this process with the CLI's own parsing and
  builders, so each instance's ``prefix_queries``/``prefix_hits`` are at hand): every setup over the
  sweep; reported at both loads: TTFT mean/p50/p99, completed req/s, output tokens/s (whole run and
  window), prompt tokens sent vs computed (hit rate), SLO attainment.
* ``users`` — the same conversations held by a closed population (``llmfleet sim --users N``, span
  ``--users-span`` 60 s, quick 40 s): N users, each opening a new conversation a think time after the
  last one ended, as multi-turn serving benchmarks load a server (vLLM's ``benchmarks/multi_turn``,
  ``--num-clients``). The sweep doubles N from ``--start-users`` (512 at 32 GPUs, scaled by GPUs /
  32) with the same saturation rule; ``round_robin``, ``jsq`` and ``prefix_affinity``, caching on. An
  open stream past capacity holds mostly first turns, whose only shared prefix is the system prompt
  (docs/benchmarks/prefix.md, "What the saturated window holds"); a population past capacity slows
  its users down instead, and its turns keep the workload's mix. Both sections report the goals.
* ``emulated`` — the same workload live (``llmfleet load --conversations``) on ``llmfleet up --emulate
  NxA100-80GB`` beside ``llmfleet sim`` of the same cluster file and workload (``llmfleet compare``),
  every setup at JSQ's SLO load and at its own first saturated rate (not one past it: a live run that
  far past capacity drains for many minutes here), both found by the same rule in a simulated sweep
  at N GPUs (the goals' pair, ``jsq`` and ``prefix_affinity`` with caching, first, at both loads;
  quick: only they). N is 8 (quick 4), not 32: 32 emulated GPUs at their saturation rate need more
  than this machine's two shared cores for the scheduler, the load generator and the engine hosts
  together, so the live side would measure the host, not the policies; and six setups at two loads
  are twelve live runs of two to three minutes each. Live hit rates are the engines'
  ``vllm:prefix_cache_*``.
* ``emulated-users`` — the ``users`` section's closed population live the same way (``llmfleet load
  --users``), ``jsq`` and ``prefix_affinity`` with caching at JSQ's SLO load and at saturation, found
  by a simulated sweep of N users from ``--start-users`` scaled to the emulated GPUs.
* ``native`` — live on ``--native-engines`` (2) native CPU engines, each one torch thread, serving a
  random llama with 16 KiB of KV per token (4 layers, hidden 512: ``engine_bench.medium_llama``), so
  a prefill's cost is real compute: ``jsq`` and ``prefix_affinity``, caching on and off, a small
  multi-turn load (``--native-rate`` 0.2 conversations/s for 60 s, quick 20 s; a 200-token system
  prompt and at most 1,200 tokens of context in workload words, which the tiny tokenizer splits into
  about 3 tokens each, within the model's 4,096 positions); TTFT mean/p50/p99, throughput, hit rate.
* ``groups`` — llm-d's prefix-cache benchmark workload (inference-perf's ``shared_prefix``: 150 groups
  of 5 prompts, a 6,000-token system prompt, a 1,200-token question, 1,000 output tokens) on 16
  simulated H200 serving Qwen3-32B: ``round_robin``, ``jsq`` and ``prefix_affinity`` with caching,
  the same sweep and saturation rule (``prefix_bench_groups``).
* ``burst`` — 500 requests starting with one 1,000-token system prompt, arriving within 1 s, over 4
  engines with ``prefix_affinity``: each engine's share, in the simulator and live on 4 emulated GPUs.

Goals (issue "Prefix caching in the unified KV pool, and dispatch that knows where prefixes are
cached", ratios within one run), quoted:

- "Multi-turn workload at a load where JSQ meets its SLO: `prefix_affinity` mean TTFT ≤ 0.5× of JSQ,
  and at saturation ≥ 1.3× JSQ's throughput, in the simulator and on the emulated fleet."
- "A burst of 500 requests sharing one prefix over 4 engines: no engine gets more than 50% of it."
- "Live (emulated) within 15% of simulated on TTFT p50 and throughput."

Nothing is asserted: every figure is measured once on this machine and printed beside its goal.

    .venv/bin/python -m tools.bench.prefix_bench --quick --out .bench/prefix
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import psutil
from llmfleet.policies.request import POLICIES as REQUEST_POLICIES

from tools.bench.prefix_bench_common import Conversations, Setup, Users, setups, sweep_rates
from tools.bench.prefix_bench_groups import REQUESTS, bench_groups
from tools.bench.prefix_bench_live import bench_emulated, bench_native
from tools.bench.prefix_bench_report import markdown, plot
from tools.bench.prefix_bench_sim import CANDIDATE, REFERENCE, bench_burst, bench_sim

SECTIONS = ("sim", "users", "groups", "emulated", "emulated-users", "native", "burst")
SYSTEM_TOKENS, MEAN_TURNS, THINK_S, MAX_CONTEXT = 1000, 3.7, 10.0, 4096


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".bench/prefix"))
    ap.add_argument("--quick", action="store_true", help="shorter spans, 4 emulated GPUs, fewer live setups")
    ap.add_argument(
        "--only", choices=SECTIONS, action="append", help="sections to run (repeatable; default all)"
    )
    ap.add_argument("--gpus", type=int, default=32, help="sim: A100-80GB GPUs (32)")
    ap.add_argument("--span", type=float, default=None, help="seconds of conversation starts (30; quick 20)")
    ap.add_argument("--start-rate", type=float, default=16.0, help="sweep: first conversations/s at 32 GPUs")
    ap.add_argument("--steps", type=int, default=8, help="sweep: at most this many doublings")
    ap.add_argument("--start-users", type=int, default=512, help="users: the sweep's first N at 32 GPUs")
    ap.add_argument(
        "--users-span", type=float, default=None, help="users: seconds the users converse (60; quick 40)"
    )
    ap.add_argument("--groups-start-rate", type=float, default=2.5, help="groups: first req/s of the sweep")
    ap.add_argument(
        "--groups-requests", type=int, default=REQUESTS, help=f"groups: requests per run ({REQUESTS})"
    )
    ap.add_argument(
        "--groups-live-requests",
        type=int,
        default=None,
        help="groups: also run JSQ and prefix_affinity live at JSQ's SLO load, N requests each (default: not)",
    )
    ap.add_argument("--emulated-gpus", type=int, default=None, help="emulated: GPUs (8; quick 4)")
    ap.add_argument("--native-engines", type=int, default=2)
    ap.add_argument("--native-rate", type=float, default=0.2, help="native: conversations/s (0.2)")
    ap.add_argument("--no-live-burst", action="store_true", help="burst: the simulator only")
    ap.add_argument(
        "--engine-policy",
        choices=sorted(REQUEST_POLICIES),
        default="fcfs",
        help="sim: every engine's local request policy, with its default options (fcfs)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "prefix.json"  # --only updates those sections of an earlier report
    report: dict = json.loads(previous.read_text()) if previous.exists() else {}
    report["machine"] = (
        f"{platform.node()} {os.cpu_count()} cores {psutil.virtual_memory().total / 2**30:.0f} GiB"
    )
    report["quick"] = args.quick
    span = args.span or (20.0 if args.quick else 30.0)
    conv = Conversations(SYSTEM_TOKENS, MEAN_TURNS, THINK_S, MAX_CONTEXT, span)
    only = set(args.only or SECTIONS)
    if "sim" in only:
        rates = sweep_rates(args.start_rate * args.gpus / 32, 2.0, args.steps)
        report["sim"] = bench_sim(out, args.gpus, conv, setups(engine=args.engine_policy), rates, "sim")
        save(out, report)
    population = Users(
        SYSTEM_TOKENS, MEAN_TURNS, THINK_S, MAX_CONTEXT, args.users_span or (40.0 if args.quick else 60.0)
    )
    if "users" in only:
        counts = sweep_rates(args.start_users * args.gpus / 32, 2.0, args.steps)
        compared = setups(caching=(True,), engine=args.engine_policy)
        report["users"] = bench_sim(out, args.gpus, population, compared, counts, "users")
        save(out, report)
    if "groups" in only:
        rates = sweep_rates(args.groups_start_rate, 2.0, args.steps)
        report["groups"] = bench_groups(out, rates, args.groups_requests, args.groups_live_requests)
        save(out, report)
    if "burst" in only:
        report["burst"] = bench_burst(out, live=not args.no_live_burst)
        save(out, report)
    if "native" in only:
        native = Conversations(200, MEAN_TURNS, THINK_S, 1200, 20.0 if args.quick else 60.0)
        compared = setups(("jsq", "prefix_affinity"))
        report["native"] = bench_native(out, args.native_engines, native, args.native_rate, compared, 1)
        save(out, report)
    gpus = args.emulated_gpus or (4 if args.quick else 8)
    first = [REFERENCE, CANDIDATE]  # the goals' pair first: a run cut short keeps them
    live = first if args.quick else first + [s for s in setups() if s not in first]
    emulated: dict[str, tuple[Conversations | Users, list[float], list[Setup]]] = {
        "emulated": (conv, sweep_rates(args.start_rate * gpus / 32, 2.0, args.steps), live),
        "emulated-users": (population, sweep_rates(args.start_users * gpus / 32, 2.0, args.steps), first),
    }
    for section, (shape, loads, compared) in emulated.items():
        if section not in only:
            continue

        def progress(doc: dict, section: str = section) -> None:
            report[section] = doc
            save(out, report)

        report[section] = bench_emulated(out, gpus, shape, compared, loads, progress, section)
        save(out, report)
    return 0


def save(out: Path, report: dict) -> None:
    """prefix.json, prefix.md and the plots, after every section (a later failure keeps the earlier ones)."""
    (out / "prefix.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "prefix.md").write_text(markdown(report))
    plot(report, out)


if __name__ == "__main__":
    sys.exit(main())

"""Simulator fidelity: one small workload through the live local cluster and the simulator.

    python -m tools.bench.sim_fidelity --out .bench      # writes sim_fidelity.json and .md

1. **Cluster.** A real local cluster exactly as ``llmfleet up`` plans it (``llmfleet.cli.up.
   plan_services``: etcd, scheduler, profiler, placement, migration, engines as child processes) with
   ONE CPU engine hosting ONE model, the tiny llama without EOS (every request generates exactly
   ``max_tokens``), FCFS, and fixed knobs appended to the engine's command line
   (``--max-running = --max-batch-requests``, ``--max-prefill-tokens``, ``--threads``, pool size).
2. **Cost model.** The engine's ``Profile`` RPC sweeps prefill (batch x input length) and decode
   (batch x context); ``fit_engine_profile`` -> ``record_from_fit`` gives the Aladdin forms
   t_pre = k1*T + c1 and t_d = (k2*l + c2)*b + c3 that the simulator's ``CostBook`` uses.
3. **Calibration** (separate requests, never the workload). The sweep times the bare forward pass;
   a serving iteration also plans the batch, samples, detokenizes and streams, and on this machine
   it shares two cores with the scheduler, the client and other users. Groups of b identical
   requests (b = 1, 2, 4, 8) are sent together straight to the engine's ``Generate``, one group at a
   time, before, between and after the live runs; the engine's own Usage (its clock: arrival ->
   first / last token) gives the live decode iteration (latency - ttft) / (out - 1). Its excess over
   the fitted t_d(b, l) is fitted as o3 + o2*b (added to c3 and c2), the lone requests' TTFT minus
   t_pre as o1 (added to c1). (The scheduler's Usage cannot serve here: it times the relay, whose
   token bursts after a stall of the scheduler process look like impossibly fast iterations.)
   **As deployed**: the same groups also go through the SDK and the scheduler, timed on the client
   (whole requests, so relay bursts average out): their decode excess gives o3, o2 with the control
   plane sharing the cores, and the lone requests' TTFT minus the engine-side one is the hop, a
   constant delay added to every simulated first token and finish.
4. **Live runs.** A seeded Poisson workload (``llmfleet.workload.poisson``; prompts 16-256 tokens,
   outputs 8-64) is submitted with ``AsyncClient`` at the planned times, per request the send,
   first-token and finish times on the client. The identical workload runs ``--live-runs`` times
   (default 2): their spread is the noise floor of the machine at the time.
5. **Simulation.** The identical workload (planned arrivals, the engine-reported prompt lengths, the
   output lengths) on one simulated ``cpu`` instance with the same policy, knobs and KV pool, once per
   cost model: the raw fit, the calibrated one and the one calibrated as deployed.
   Diagnostic: the workload once more straight to the engine (no scheduler, no SDK), timed by the
   engine itself, which is what the simulator models (``--no-direct`` skips it).
6. **Report** (``sim_fidelity.json`` / ``.md``): live vs sim mean / p99 latency, TTFT, TPOT and
   throughput with relative differences, the live run-to-run spread, the fitted coefficients, the
   calibration, the settings and the wall time of each phase.

The simulator only ever sees numbers measured before or beside the workload (the profile sweep and
the calibration groups), never the timings of the workload it is compared against.

Modules: ``workload`` (settings, the planned workload, prompts), ``metrics`` (summaries and
comparisons), ``cluster`` (starting the live cluster, the profile sweep), ``calibrate`` (calibration
groups and the overhead fits), ``replay`` (running the workload live, straight to the engine and
simulated), ``analysis`` (fits + simulations -> the report), ``report`` (markdown and files) and
``cli`` (arguments, the measurement phases, ``main``).
"""

from __future__ import annotations

from .analysis import analyse
from .calibrate import (
    CalibrationGroup,
    Overhead,
    calibrate,
    calibrate_cluster,
    deployed_overhead,
    fit_overhead,
    with_overhead,
)
from .cli import main, measure, parse_args, stderr_log
from .cluster import (
    LocalCluster,
    engine_flags,
    profile_engine,
    scheduler_flags,
    start_cluster,
    wait_ready,
)
from .metrics import (
    COMPARED,
    HEADLINE,
    compare,
    little_latency,
    mean_summary,
    percentile,
    rel_diff,
    spread,
    summarize,
    summarize_usage,
)
from .replay import (
    Streamed,
    engine_generate,
    replay,
    replay_direct,
    run_one,
    simulate,
    stream_request,
    watch_load,
)
from .report import explain, little_lines, pct, render_markdown, write_report
from .workload import (
    ENGINE_ID,
    GOAL,
    HARDWARE,
    MODEL,
    PROMPT_ALPHABET,
    SERVICE,
    VARIANTS,
    PlannedRequest,
    Settings,
    make_prompt,
    plan_workload,
)

__all__ = [
    "COMPARED",
    "ENGINE_ID",
    "GOAL",
    "HARDWARE",
    "HEADLINE",
    "MODEL",
    "PROMPT_ALPHABET",
    "SERVICE",
    "VARIANTS",
    "CalibrationGroup",
    "LocalCluster",
    "Overhead",
    "PlannedRequest",
    "Settings",
    "Streamed",
    "analyse",
    "calibrate",
    "calibrate_cluster",
    "compare",
    "deployed_overhead",
    "engine_flags",
    "engine_generate",
    "explain",
    "fit_overhead",
    "little_latency",
    "little_lines",
    "main",
    "make_prompt",
    "mean_summary",
    "measure",
    "parse_args",
    "pct",
    "percentile",
    "plan_workload",
    "profile_engine",
    "rel_diff",
    "render_markdown",
    "replay",
    "replay_direct",
    "run_one",
    "scheduler_flags",
    "simulate",
    "spread",
    "start_cluster",
    "stderr_log",
    "stream_request",
    "summarize",
    "summarize_usage",
    "wait_ready",
    "watch_load",
    "with_overhead",
    "write_report",
]

"""``make chaos``: kill, freeze and cut parts of a live local cluster under steady streaming load, and
count what the clients saw.

The cluster is the one ``llmfleet up`` plans (``llmfleet.cli.up.plan_services``: etcd, two scheduler
replicas with their OpenAI-compatible HTTP APIs, profiler, placement, migration, engines), plus a
standby placement and migration replica (``placement-1``, ``migration-1``) so that killing a leader
tests the election. Every engine hosts the tiny llama **without EOS** (each request generates exactly
``max_tokens``), greedy, so every output is checked against a reference computed once per
(prompt, length) before the load starts.

Load: ``--concurrency`` closed-loop workers, half through the SDK (``AsyncClient`` given both
replicas, half of them in each order, so both replicas carry live streams), half through the HTTP
API (``POST /v1/completions`` with ``stream: true``, alternating between the two replicas' ports).
An HTTP stream cut by a replica's death cannot resume: the worker retries the request on the other
replica (counted as a retry; it is an error only when its retries run out).

Faults (``--faults``, in order; each: inject, wait, heal, wait until the cluster is whole again, settle):

===================  =====================================================================================
``engine``           kill -9 ``engine-0``; restarted after ``--restart-delay-s`` (``up``'s first backoff)
``scheduler``        kill -9 the replica ``scheduler``; restarted likewise
``profiler``         kill -9 the profiler; restarted likewise
``placement-leader`` kill -9 whichever placement replica holds ``leaders/placement``; restarted
``migration-leader`` kill -9 whichever migration replica holds ``leaders/migration``; restarted
``etcd-kill``        kill -9 etcd; restarted from its data dir after ``--restart-delay-s``
``etcd-freeze``      SIGSTOP etcd for 1.5 lease TTLs, then SIGCONT (every lease expires meanwhile)
``engine-freeze``    "cut one engine off the network", approximated by SIGSTOP of ``engine-1`` for 1.5
                     TTLs (a frozen host: its sockets stay open but nothing answers), then SIGCONT
===================  =====================================================================================

"Whole again": every process is registered under etcd ``nodes/`` with a live lease, placement and
migration each have a leader, and both scheduler replicas route the service to every engine (gRPC
``ListServices``) and answer HTTP ``/health``.

Per fault (requests are attributed to the phase they started in): requests started / completed /
lost (no outcome by the end of the drain, or a stream that ended without its final chunk),
duplicated / gapped / wrong tokens (SDK: chunk indices and token ids against the reference; HTTP: the
text against the reference text and ``usage.completion_tokens``), client-visible errors (after the
SDK's own retries; HTTP after ``--http-retries``), retries (SDK: attempts - 1), the recovery time
(inject -> whole, heal -> whole) and the longest stall of the token flow (no token reached any
client). Writes ``chaos.json`` and ``chaos.md`` to ``--out`` (default ``.bench/chaos``).

The parts, beside this entry point: ``chaos_cluster`` (the cluster and its health), ``chaos_load``
(the SDK and HTTP workers), ``chaos_outcomes`` (what each request got, and the tallies),
``chaos_faults`` (inject and heal), ``chaos_run`` (the phases of a run) and ``chaos_report``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from llmfleet.config import DEFAULT_TTL_S

from tools.chaos.chaos_cluster import MODEL, SERVICE, ChaosCluster, Node
from tools.chaos.chaos_faults import ALL_FAULTS, FaultResult, inject
from tools.chaos.chaos_load import LENGTHS, PROMPTS, Load, compute_reference
from tools.chaos.chaos_outcomes import Outcome, Reference, counts, judge, max_stall
from tools.chaos.chaos_report import goals, markdown
from tools.chaos.chaos_run import run_chaos

__all__ = [
    "ALL_FAULTS",
    "LENGTHS",
    "MODEL",
    "PROMPTS",
    "SERVICE",
    "ChaosCluster",
    "FaultResult",
    "Load",
    "Node",
    "Outcome",
    "Reference",
    "compute_reference",
    "counts",
    "goals",
    "inject",
    "judge",
    "main",
    "markdown",
    "max_stall",
    "run_chaos",
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--faults",
        default=",".join(ALL_FAULTS),
        help=f"comma-separated, in order (default: all): {','.join(ALL_FAULTS)}",
    )
    p.add_argument(
        "--duration", type=float, default=None, help="seconds of settled load after each fault (default 10)"
    )
    p.add_argument("--baseline", type=float, default=10.0, help="seconds of load before the first fault")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent streams, half SDK, half HTTP")
    p.add_argument(
        "--ttl", type=int, default=None, help="lease TTL of every process (default: the product default)"
    )
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--restart-delay-s", type=float, default=1.0, help="kill -> restart (up's first backoff)")
    p.add_argument("--whole-timeout-s", type=float, default=120.0)
    p.add_argument("--drain-s", type=float, default=120.0)
    p.add_argument(
        "--sdk-retries", type=int, default=None, help="the SDK's retries (default: its own default)"
    )
    p.add_argument("--http-retries", type=int, default=5)
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=".bench/chaos")
    p.add_argument("--keep", action="store_true", help="keep the cluster's state dir")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("llmfleet").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for f in faults:
        if f not in ALL_FAULTS:
            p.error(f"unknown fault {f!r}; known: {', '.join(ALL_FAULTS)}")
    root = Path(tempfile.mkdtemp(prefix="llmfleet-chaos-"))
    cluster = ChaosCluster(root, engines=args.engines, ttl=args.ttl or DEFAULT_TTL_S)
    try:
        cluster.start()
        report = asyncio.run(
            run_chaos(
                cluster,
                faults,
                concurrency=args.concurrency,
                baseline_s=args.baseline,
                settle_s=args.duration if args.duration is not None else 10.0,
                restart_delay_s=args.restart_delay_s,
                whole_timeout_s=args.whole_timeout_s,
                drain_s=args.drain_s,
                sdk_retries=args.sdk_retries,
                http_retries=args.http_retries,
                lengths=[int(x) for x in args.lengths.split(",")],
                seed=args.seed,
            )
        )
    finally:
        cluster.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report["state_dir"] = str(root)
    (out / "chaos.json").write_text(json.dumps(report, indent=2))
    (out / "chaos.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'chaos.json'} and {out / 'chaos.md'}; logs under {root / 'logs'}")
    if not args.keep:
        import shutil

        shutil.rmtree(root / "etcd", ignore_errors=True)
    return 0 if all(goals(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())

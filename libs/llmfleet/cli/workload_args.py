"""The workload flags ``llmfleet sim`` and ``llmfleet load`` share: ``--trace FILE`` or ``--synthetic N``,
with ``--rate-scale``, ``--lengths-from``, ``--start``/``--end``/``--limit``, and the workload they build.

``--rate`` (synthetic arrivals per second) and ``--seed`` are each command's own flags (``load`` also
uses them for its Poisson phases); :func:`build_workload` reads them from the namespace.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from llmfleet.rpc.cli_args import nonnegative_float, positive_float, positive_int

if TYPE_CHECKING:
    from llmfleet.workload import Workload

DEFAULT_SYNTHETIC_RATE = 10.0  # req/s of --synthetic when --rate is not given


def add_workload_arguments(p: argparse.ArgumentParser, *, required: bool) -> None:
    """``--trace`` | ``--synthetic`` (mutually exclusive) and the options that shape the workload."""
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument(
        "--trace", type=Path, help="Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)"
    )
    src.add_argument(
        "--synthetic", type=positive_int, metavar="N", help="N Poisson requests at --rate (seeded by --seed)"
    )
    p.add_argument("--lengths-from", type=Path, help="trace CSV to sample synthetic lengths from")
    p.add_argument(
        "--rate-scale",
        type=positive_float,
        default=1.0,
        help="multiply the workload's arrival rate (default 1)",
    )
    p.add_argument("--start", type=nonnegative_float, default=0.0, help="trace window start, seconds")
    p.add_argument("--end", type=positive_float, help="trace window end, seconds")
    p.add_argument("--limit", type=positive_int, help="keep the first N requests")


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload the flags describe (raises ValueError/FileNotFoundError naming the file and line)."""
    from llmfleet.workload import Workload, WorkloadRequest, load_azure_trace, poisson

    if args.trace is not None:
        return load_azure_trace(
            args.trace, start_s=args.start, end_s=args.end, limit=args.limit, rate_scale=args.rate_scale
        )
    if args.synthetic < 1:
        raise ValueError("--synthetic needs N >= 1")
    import numpy as np

    rate = args.rate if args.rate is not None else DEFAULT_SYNTHETIC_RATE
    rng = np.random.default_rng(args.seed)
    if args.lengths_from is not None:
        lengths = [(r.prompt_tokens, r.output_tokens) for r in load_azure_trace(args.lengths_from).requests]
    else:  # the conv trace's rough shape: log-normal prompts ~1k, outputs ~200
        lengths = list(
            zip(
                rng.lognormal(6.5, 0.8, 4096).astype(int) + 1,
                rng.lognormal(5.0, 0.9, 4096).astype(int) + 1,
                strict=True,
            )
        )
    times = poisson(rate * args.rate_scale, n=args.synthetic, seed=args.seed)
    pick = rng.integers(0, len(lengths), size=args.synthetic)
    return Workload(tuple(
        WorkloadRequest(f"syn-{i}", float(t), int(lengths[j][0]), max(1, int(lengths[j][1])))
        for i, (t, j) in enumerate(zip(times, pick, strict=True))
    ))  # fmt: skip

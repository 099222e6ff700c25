"""The workload flags ``llmfleet sim`` and ``llmfleet load`` share: ``--trace FILE``, ``--synthetic N`` or
``--conversations N`` or ``--users N`` (with ``--span``), with ``--rate-scale``, ``--lengths-from``, ``--start``/``--end``/``--limit``,
``--system-prompt-tokens``, ``--mean-turns``/``--think-s``, ``--shared-prefix N`` with its group shape, and the
workload they build.

``--rate`` (synthetic arrivals per second) and ``--seed`` are each command's own flags (``load`` also
uses them for its Poisson phases); :func:`build_workload` reads them from the namespace.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

from llmfleet.rpc.cli_args import nonnegative_float, positive_float, positive_int
from llmfleet.workload import Workload, WorkloadRequest, load_azure_trace, poisson
from llmfleet.workload.conversations import LMSYS_CHAT_1M, MAX_CONTEXT, SPAN_S, THINK_S, conversations, users
from llmfleet.workload.prompts import with_system_prompts
from llmfleet.workload.shared_prefix import (
    GROUPS,
    OUTPUT_TOKENS,
    PROMPTS_PER_GROUP,
    QUESTION_TOKENS,
    SYSTEM_TOKENS,
    shared_prefix,
)

WORKLOAD_SOURCES = (
    "--trace",
    "--synthetic",
    "--conversations",
    "--users",
    "--shared-prefix",
)  # one of them, exclusive
DEFAULT_SYNTHETIC_RATE = 10.0
# the group shape of --shared-prefix: (flag, default, what it sets)
_SHARED_PREFIX_FLAGS = (
    ("--prefix-groups", GROUPS, "groups"),
    ("--prompts-per-group", PROMPTS_PER_GROUP, "questions per group"),
    ("--prefix-tokens", SYSTEM_TOKENS, "tokens of a group's system prompt"),
    ("--question-tokens", QUESTION_TOKENS, "tokens of a question"),
    ("--output-tokens", OUTPUT_TOKENS, "output tokens of every request"),
)  # req/s of --synthetic (conversations/s of --conversations) without --rate


class _TakesArguments(Protocol):
    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


class ArgumentContainer(_TakesArguments, Protocol):
    """What the workload flags are added to: an ``argparse`` parser or an argument group."""

    def add_mutually_exclusive_group(self, *, required: bool = ...) -> _TakesArguments: ...


def add_workload_arguments(p: ArgumentContainer, *, required: bool) -> None:
    """``--trace`` | ``--synthetic`` (mutually exclusive) and the options that shape the workload."""
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument(
        "--trace", type=Path, help="Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)"
    )
    src.add_argument(
        "--synthetic", type=positive_int, metavar="N", help="N Poisson requests at --rate (seeded by --seed)"
    )
    src.add_argument(
        "--conversations",
        type=positive_int,
        metavar="N",
        help="N multi-turn conversations starting at --rate per second, each turn resending the history "
        "(LMSYS-Chat-1M's turn and length means; llmfleet.workload.conversations)",
    )
    src.add_argument(
        "--users",
        type=positive_int,
        metavar="N",
        help="a closed population of N users, each holding --conversations-like conversations one after "
        "another for --span seconds (llmfleet.workload.conversations.users)",
    )
    src.add_argument(
        "--shared-prefix",
        type=positive_int,
        metavar="N",
        help="N Poisson requests at --rate over groups of prompts sharing a system prompt (inference-perf's "
        "shared_prefix, llm-d's prefix-cache benchmark; llmfleet.workload.shared_prefix)",
    )
    for flag, default, what in _SHARED_PREFIX_FLAGS:
        p.add_argument(
            flag, type=positive_int, default=default, help=f"--shared-prefix: {what} (default {default})"
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
    p.add_argument(
        "--system-prompt-tokens",
        type=positive_int,
        metavar="K",
        help="every prompt starts with its service's system prompt of K tokens (shared prefixes)",
    )
    p.add_argument(
        "--span",
        type=positive_float,
        default=SPAN_S,
        metavar="SECONDS",
        help=f"--users: seconds the users keep opening turns (default {SPAN_S:g})",
    )
    p.add_argument(
        "--mean-turns",
        type=_at_least_one,
        help=f"--conversations/--users: mean turns per conversation (default {LMSYS_CHAT_1M.mean_turns:g}, LMSYS-Chat-1M's)",
    )
    p.add_argument(
        "--think-s",
        type=nonnegative_float,
        default=THINK_S,
        help=f"--conversations/--users: mean seconds between a conversation's turns (default {THINK_S:g})",
    )
    p.add_argument(
        "--max-context",
        type=positive_int,
        default=MAX_CONTEXT,
        metavar="TOKENS",
        help=f"--conversations/--users: a conversation ends before its prompt plus answer would pass TOKENS "
        f"(default {MAX_CONTEXT}; the model's context, in the engines' tokens)",
    )


def workload_source(args: argparse.Namespace) -> str | None:
    """The workload source flag given (one of ``WORKLOAD_SOURCES``), or None."""
    return next(
        (f for f in WORKLOAD_SOURCES if getattr(args, f.removeprefix("--").replace("-", "_")) is not None),
        None,
    )


def describe_source(args: argparse.Namespace) -> str:
    """The workload source in words, for a report's context line."""
    if args.trace is not None:
        return f"trace {args.trace.name} ×{args.rate_scale}"
    if args.conversations is not None:
        return f"{args.conversations} conversations at {args.rate} conversations/s"
    if args.users is not None:
        return f"{args.users} users for {args.span:g} s"
    if args.shared_prefix is not None:
        return f"{args.shared_prefix} shared-prefix requests at {args.rate} req/s"
    return f"synthetic {args.synthetic} requests at {args.rate} req/s"


def _at_least_one(text: str) -> float:
    v = positive_float(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload the flags describe (raises ValueError/FileNotFoundError naming the file and line)."""

    workload = _requests(args)
    if args.system_prompt_tokens is not None:
        workload = with_system_prompts(workload, args.system_prompt_tokens, seed=args.seed)
    return workload


def _requests(args: argparse.Namespace) -> Workload:
    if args.trace is not None:
        return load_azure_trace(
            args.trace, start_s=args.start, end_s=args.end, limit=args.limit, rate_scale=args.rate_scale
        )
    if args.conversations is None and args.users is None and args.mean_turns is not None:
        raise ValueError("--mean-turns needs --conversations or --users")
    if args.users is not None:
        if args.lengths_from is not None:
            raise ValueError(
                "--lengths-from: users' conversations draw their lengths from LMSYS-Chat-1M's means"
            )
        if args.think_s <= 0:
            raise ValueError("--think-s: --users needs a think time > 0")
        workload = users(
            args.users, span_s=args.span, stats=LMSYS_CHAT_1M, mean_turns=args.mean_turns,
            system_tokens=args.system_prompt_tokens or 0, think_s=args.think_s, max_context=args.max_context,
            seed=args.seed,
        )  # fmt: skip
        return workload.head(args.limit) if args.limit is not None else workload
    if args.conversations is not None:
        if args.lengths_from is not None:
            raise ValueError("--lengths-from: conversations draw their lengths from LMSYS-Chat-1M's means")

        rate = args.rate if args.rate is not None else DEFAULT_SYNTHETIC_RATE
        workload = conversations(
            args.conversations, rate=rate * args.rate_scale, stats=LMSYS_CHAT_1M, mean_turns=args.mean_turns,
            system_tokens=args.system_prompt_tokens or 0, think_s=args.think_s, max_context=args.max_context,
            seed=args.seed,
        )  # fmt: skip
        return workload.head(args.limit) if args.limit is not None else workload
    if args.shared_prefix is not None:
        if args.lengths_from is not None:
            raise ValueError("--lengths-from: --shared-prefix requests have the group shape's lengths")
        rate = args.rate if args.rate is not None else DEFAULT_SYNTHETIC_RATE
        workload = shared_prefix(
            args.shared_prefix, rate=rate * args.rate_scale, groups=args.prefix_groups,
            prompts_per_group=args.prompts_per_group, system_tokens=args.prefix_tokens,
            question_tokens=args.question_tokens, output_tokens=args.output_tokens, seed=args.seed,
        )  # fmt: skip
        return workload.head(args.limit) if args.limit is not None else workload
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

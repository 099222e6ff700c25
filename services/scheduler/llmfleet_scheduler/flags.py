"""Command-line flags of ``llmfleet-scheduler``, one argument group per concern: the cluster file's
``scheduler:`` section (dispatch policy, capacity, readiness: generated from the spec), dispatch's
engine-side settings, engine load and predictions, admission, and serving (HTTP API, statistics)."""

from __future__ import annotations

import argparse

from llmfleet.spec.flags import json_object
from llmfleet.spec.live_loops import SCHEDULER_FLAGS

from llmfleet_scheduler.admission import DEFAULT_MAX_QUEUED_TOKENS, DEFAULT_MAX_WAITING


def positive(text: str) -> int:
    """An argparse ``type``: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def add_dispatch_flags(ap: argparse.ArgumentParser) -> None:
    SCHEDULER_FLAGS.add(ap)
    g = ap.add_argument_group("dispatch")
    g.add_argument("--max-attempts", type=int, default=3, help="engines tried per request on failure")
    g.add_argument("--hardware", default="cpu", help="catalog hardware of the engines (cost-model policies)")
    g.add_argument(
        "--rebalance-interval-s",
        type=float,
        default=1.0,
        help="epoch of Aladdin's Algorithm 2 for dispatch policies that rebalance (aladdin_bestfit): "
        "not-started requests move between engines (0 = off); also the epoch of --move-queued",
    )
    g.add_argument(
        "--scls-options",
        type=json_object,
        default={},
        help="SCLS central scheduling (services with dispatch: scls_central), a JSON object: slice_iterations "
        "(S, 128), lam (λ, 0.5), gamma_s (Γ, 6.0: the paper's HF value), zeta (0.9), max_batch (256), cost",
    )


def add_load_flags(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("engine load and output-length predictions")
    g.add_argument(
        "--predict",
        choices=("auto", "always", "never"),
        default="auto",
        help="ask the profiler for output lengths before dispatch: auto = for services with "
        "`predict: true` or whose dispatch policy reads predictions (default)",
    )
    g.add_argument(
        "--no-predict", dest="predict", action="store_const", const="never", help="= --predict never"
    )
    g.add_argument(
        "--predict-window-s", type=float, default=0.002, help="requests within this window share one Predict"
    )
    g.add_argument(
        "--no-load-monitor",
        dest="load_monitor",
        action="store_false",
        help="follow no engine load: dispatch sees only this scheduler's own outstanding requests, and "
        "policies that read load (jsq, least_loaded, ...) are refused",
    )


def add_capacity_flags(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("admission")
    g.add_argument(
        "--max-waiting",
        type=positive,
        default=DEFAULT_MAX_WAITING,
        help="per service: requests admitted without a first token yet; past it RESOURCE_EXHAUSTED / 429 "
        "(a service's max_waiting overrides)",
    )
    g.add_argument(
        "--max-queued-tokens",
        type=positive,
        default=DEFAULT_MAX_QUEUED_TOKENS,
        help="per service: their estimated prompt tokens + max_tokens (a service's max_queued_tokens overrides)",
    )


def add_serving_flags(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("serving: HTTP API, client leaving, statistics")
    g.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="port of the OpenAI-compatible HTTP API (0: pick a free one, logged; -1: no HTTP API)",
    )
    g.add_argument("--http-host", default=None, help="bind address of the HTTP API (default: --host)")
    g.add_argument(
        "--orphan-grace-s", type=float, default=2.0, help="cancel a request this long after its client left"
    )
    g.add_argument(
        "--stats-interval-s",
        type=float,
        default=2.0,
        help="stream per-service statistics to the placement leader this often (0: never)",
    )

"""Command-line flags of ``llmfleet-scheduler``, one argument group per concern: dispatch, engine
load and predictions, capacity (late binding, admission), and serving (HTTP API, readiness, stats)."""

from __future__ import annotations

import argparse

from llmfleet.policies.capacity import BINDINGS
from llmfleet.policies.dispatch import POLICIES
from llmfleet.rpc.cli_args import json_object
from llmfleet.spec import defaults

from llmfleet_scheduler.admission import DEFAULT_MAX_QUEUED_TOKENS, DEFAULT_MAX_WAITING


def positive(text: str) -> int:
    """An argparse ``type``: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def add_dispatch_flags(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("dispatch")
    g.add_argument(
        "--dispatch", default=defaults.DISPATCH_POLICY, choices=sorted(POLICIES), help="dispatch policy"
    )
    g.add_argument(
        "--dispatch-options",
        type=json_object,
        default={},
        metavar="JSON",
        help="constructor options of the --dispatch policy, a JSON object (e.g. '{\"seed\": 7}' for "
        "power_of_two); services whose config names their own dispatch get theirs without options",
    )
    g.add_argument("--max-attempts", type=int, default=3, help="engines tried per request on failure")
    g.add_argument("--hardware", default="cpu", help="catalog hardware of the engines (cost-model policies)")
    g.add_argument(
        "--rebalance-interval-s",
        type=float,
        default=1.0,
        help="epoch of Aladdin's Algorithm 2 for dispatch policies that rebalance (aladdin_bestfit): "
        "not-started requests move between engines (0 = off)",
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
        "--load-interval-s", type=float, default=0.5, help="WatchLoad snapshot interval of the load monitor"
    )
    g.add_argument(
        "--no-load-monitor",
        dest="load_monitor",
        action="store_false",
        help="follow no engine load: dispatch sees only this scheduler's own outstanding requests, and "
        "policies that read load (jsq, least_loaded, ...) are refused",
    )


def add_capacity_flags(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("capacity: late binding, cold starts, admission")
    g.add_argument(
        "--binding",
        choices=BINDINGS,
        default=defaults.BINDING,
        help="late: hold a request in the scheduler while every engine hosting its model is saturated "
        "(its queue past its batch + --queue-slack, or its KV past --kv-room-fraction), and dispatch it "
        "when one has room; early: bind every request to an engine on arrival (the queue stays there)",
    )
    g.add_argument(
        "--move-queued",
        action="store_true",
        help="every --rebalance-interval-s, move requests that have not started off engines past their "
        "room (batch + --queue-slack) onto engines of the same model with room, for any dispatch policy "
        "(the alternative to --binding late)",
    )
    g.add_argument(
        "--queue-slack",
        type=int,
        default=defaults.QUEUE_SLACK,
        help="late binding: requests an engine may queue beyond its batch",
    )
    g.add_argument(
        "--kv-room-fraction",
        type=float,
        default=defaults.KV_ROOM_FRACTION,
        help="late binding: an engine whose KV (used + queued prompts) is past this share has no room",
    )
    g.add_argument(
        "--no-cold-start",
        dest="cold_start",
        action="store_false",
        help="fail a request for a model no engine hosts at once (UNAVAILABLE) instead of holding it "
        "until placement loads the model (the service's cold_start_timeout_s)",
    )
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
    g = ap.add_argument_group("serving: HTTP API, readiness, client leaving, statistics")
    g.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="port of the OpenAI-compatible HTTP API (0: pick a free one, logged; -1: no HTTP API)",
    )
    g.add_argument("--http-host", default=None, help="bind address of the HTTP API (default: --host)")
    g.add_argument(
        "--ready-when",
        choices=("servable", "started"),
        default="servable",
        help="when the Scheduler service's gRPC health (and HTTP /ready) says SERVING: servable = every "
        "service not marked scale_to_zero has an engine with its model loaded; started = at once",
    )
    g.add_argument(
        "--orphan-grace-s", type=float, default=2.0, help="cancel a request this long after its client left"
    )
    g.add_argument(
        "--stats-interval-s",
        type=float,
        default=2.0,
        help="stream per-service statistics to the placement leader this often (0: never)",
    )

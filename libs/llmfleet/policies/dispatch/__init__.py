"""Cluster dispatch policies: choose an engine for a request among those hosting its model."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.dispatch.aladdin_bestfit import AladdinBestFit
from llmfleet.policies.dispatch.aladdin_options import AladdinBestFitOptions
from llmfleet.policies.dispatch.base import (
    AdapterPoolView,
    CountsInfeasible,
    DispatchContext,
    DispatchNeeds,
    DispatchPolicy,
    DispatchRequest,
    EngineCandidate,
    FinishListener,
    HostList,
    NoCandidate,
    Rebalancer,
    RequestProgress,
    check_context,
)
from llmfleet.policies.dispatch.best_fit_kv import BestFitKv
from llmfleet.policies.dispatch.jsq import JoinShortestQueue
from llmfleet.policies.dispatch.least_loaded import LeastLoaded
from llmfleet.policies.dispatch.lora_affinity import LoraAffinity
from llmfleet.policies.dispatch.lora_llmd import LlmdLoraAffinity
from llmfleet.policies.dispatch.mell import MellDispatch
from llmfleet.policies.dispatch.power_of_two import PowerOfTwo, PowerOfTwoOptions
from llmfleet.policies.dispatch.prefix_affinity import PrefixAffinity
from llmfleet.policies.dispatch.round_robin import RoundRobin
from llmfleet.policies.dispatch.scls_maxmin import SclsMaxMin, SclsMaxMinOptions, adaptive_interval
from llmfleet.policies.dispatch.worst_fit_kv import WorstFitKv, WorstFitKvOptions
from llmfleet.policies.registry import instantiate, lookup

POLICIES: dict[str, type[DispatchPolicy]] = {
    "round_robin": RoundRobin,
    "jsq": JoinShortestQueue,
    "mell": MellDispatch,
    "power_of_two": PowerOfTwo,
    "least_loaded": LeastLoaded,
    "best_fit_kv": BestFitKv,
    "worst_fit_kv": WorstFitKv,
    "scls_maxmin": SclsMaxMin,
    "aladdin_bestfit": AladdinBestFit,
    "prefix_affinity": PrefixAffinity,
    "lora_affinity": LoraAffinity,
    "lora_llmd": LlmdLoraAffinity,
}


def dispatch_needs(name: str) -> DispatchNeeds:
    """What the registered policy ``name`` reads (ValueError for an unknown name)."""
    return lookup("dispatch", POLICIES, name).needs


def make_dispatch_policy(name: str, ctx: DispatchContext | None = None, **options: Any) -> DispatchPolicy:
    """A new policy object by registry name with its options record built from ``options``.

    With a context, a policy that reads load where ``ctx`` has no load source is refused (ValueError
    naming the policy and what it reads), and a policy that ``reads_costs`` gets the context's
    ``latency_models`` and ``slos`` unless ``options`` give them."""
    needs = dispatch_needs(name)
    if ctx is not None:
        check_context(name, needs, ctx)
        if needs.reads_costs:
            options.setdefault("latency_models", ctx.latency_models)
            options.setdefault("slos", ctx.slos)
    return instantiate("dispatch", POLICIES, name, options)


__all__ = [
    "POLICIES",
    "SCHEDULER_MODES",
    "AdapterPoolView",
    "AladdinBestFit",
    "AladdinBestFitOptions",
    "BestFitKv",
    "CountsInfeasible",
    "DispatchContext",
    "DispatchNeeds",
    "DispatchPolicy",
    "DispatchRequest",
    "EngineCandidate",
    "FinishListener",
    "HostList",
    "JoinShortestQueue",
    "LeastLoaded",
    "LlmdLoraAffinity",
    "LoraAffinity",
    "MellDispatch",
    "NoCandidate",
    "PowerOfTwo",
    "PowerOfTwoOptions",
    "PrefixAffinity",
    "Rebalancer",
    "RequestProgress",
    "RoundRobin",
    "SclsMaxMin",
    "SclsMaxMinOptions",
    "WorstFitKv",
    "WorstFitKvOptions",
    "adaptive_interval",
    "check_context",
    "dispatch_needs",
    "make_dispatch_policy",
]


def __getattr__(name: str) -> Any:
    """``SCHEDULER_MODES``: service dispatch values that are scheduler modes, not per-request policies (the
    scheduler pools the service's requests and schedules them in rounds: ``llmfleet.policies.central``).
    Defined with the central policies, read lazily: they import this package."""
    if name == "SCHEDULER_MODES":
        from llmfleet.policies.central.scls_central import CENTRAL_MODES  # scls_central imports this package

        return CENTRAL_MODES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

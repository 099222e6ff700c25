"""Cluster dispatch policies: choose an engine for a request among those hosting its model."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.dispatch.aladdin_bestfit import AladdinBestFit
from llmfleet.policies.dispatch.base import (
    DispatchPolicy,
    DispatchRequest,
    EngineCandidate,
    HostList,
    NoCandidate,
)
from llmfleet.policies.dispatch.best_fit_kv import BestFitKv
from llmfleet.policies.dispatch.jsq import JoinShortestQueue
from llmfleet.policies.dispatch.least_loaded import LeastLoaded
from llmfleet.policies.dispatch.power_of_two import PowerOfTwo
from llmfleet.policies.dispatch.round_robin import RoundRobin
from llmfleet.policies.dispatch.scls_maxmin import SclsMaxMin, adaptive_interval
from llmfleet.policies.dispatch.worst_fit_kv import WorstFitKv
from llmfleet.policies.registry import instantiate

POLICIES: dict[str, type] = {
    "round_robin": RoundRobin,
    "jsq": JoinShortestQueue,
    "power_of_two": PowerOfTwo,
    "least_loaded": LeastLoaded,
    "best_fit_kv": BestFitKv,
    "worst_fit_kv": WorstFitKv,
    "scls_maxmin": SclsMaxMin,
    "aladdin_bestfit": AladdinBestFit,
}


def make_dispatch_policy(name: str, **kwargs: Any) -> DispatchPolicy:
    """A new policy object by registry name; options go to its constructor."""
    return instantiate("dispatch", POLICIES, name, kwargs)


__all__ = [
    "POLICIES",
    "AladdinBestFit",
    "BestFitKv",
    "DispatchPolicy",
    "DispatchRequest",
    "EngineCandidate",
    "HostList",
    "JoinShortestQueue",
    "LeastLoaded",
    "NoCandidate",
    "PowerOfTwo",
    "RoundRobin",
    "SclsMaxMin",
    "WorstFitKv",
    "adaptive_interval",
    "make_dispatch_policy",
]

"""Engine-local request scheduling policies: which requests of one model run in the next iteration."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.registry import instantiate
from llmfleet.policies.request.base import (
    Batch,
    BatchLimits,
    BatchPhase,
    Phase,
    PoolView,
    RequestPolicy,
    SchedRequest,
    admission_blocks,
    stuck_requests,
)
from llmfleet.policies.request.doubling_budget import DoublingBudget, DoublingBudgetOptions
from llmfleet.policies.request.fcfs import Fcfs, FcfsOptions
from llmfleet.policies.request.longest_prefix import LongestPrefix, LongestPrefixOptions
from llmfleet.policies.request.muxserve_rr import MuxServeRR
from llmfleet.policies.request.service_stats import ServiceStats

POLICIES: dict[str, type] = {
    "fcfs": Fcfs,
    "doubling_budget": DoublingBudget,
    "muxserve_rr": MuxServeRR,
    "longest_prefix": LongestPrefix,
}


def make_request_policy(name: str, **kwargs: Any) -> RequestPolicy:
    """A new policy object by registry name with its options record built from ``kwargs``."""
    return instantiate("request", POLICIES, name, kwargs)


__all__ = [
    "POLICIES",
    "Batch",
    "BatchLimits",
    "BatchPhase",
    "DoublingBudget",
    "DoublingBudgetOptions",
    "Fcfs",
    "FcfsOptions",
    "LongestPrefix",
    "LongestPrefixOptions",
    "MuxServeRR",
    "Phase",
    "PoolView",
    "RequestPolicy",
    "SchedRequest",
    "ServiceStats",
    "admission_blocks",
    "make_request_policy",
    "stuck_requests",
]

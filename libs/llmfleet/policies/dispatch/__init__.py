"""Cluster dispatch policies: choose an engine for a request among those hosting its model."""

from llmfleet.policies.dispatch.base import DispatchPolicy, EngineCandidate, NoCandidate
from llmfleet.policies.dispatch.round_robin import RoundRobin

POLICIES: dict[str, type] = {"round_robin": RoundRobin}


def make_dispatch_policy(name: str) -> DispatchPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown dispatch policy {name!r}; valid: {sorted(POLICIES)}") from None


__all__ = [
    "POLICIES",
    "DispatchPolicy",
    "EngineCandidate",
    "NoCandidate",
    "RoundRobin",
    "make_dispatch_policy",
]

"""Queued requests count as demand: a burst that arrived within one planning interval is
a small rate over the monitor's 60 s window, but every one of its requests waits now. A service with
``queued`` requests not started is planned for ``rate_rps + queued / drain_s``: the arrival rate
plus the rate that serves the queue within ``drain_s`` (the planner's interval), so the plan made
right after a burst scales out for it. A service no engine hosts (cold requests) gets at least that
rate, so any planner gives it an instance. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from llmfleet.policies.placement.base import ServiceLoad


def with_backlog(loads: Iterable[ServiceLoad], drain_s: float) -> list[ServiceLoad]:
    """``loads`` with each service's queue added to its rate (``drain_s`` > 0)."""
    if drain_s <= 0:
        raise ValueError(f"drain_s must be > 0, got {drain_s}")
    return [replace(s, rate_rps=s.rate_rps + s.queued / drain_s) if s.queued > 0 else s for s in loads]

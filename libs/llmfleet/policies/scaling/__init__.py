"""Scaling policies: how many workers a model needs for an arrival rate."""

from __future__ import annotations

from llmfleet.policies.scaling.aladdin_linear import AladdinLinearScaler

__all__ = ["AladdinLinearScaler"]

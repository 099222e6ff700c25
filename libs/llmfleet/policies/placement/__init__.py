"""Placement policies: which engine hosts which models."""

from llmfleet.policies.placement.static_config import StaticConfigPlacement

__all__ = ["StaticConfigPlacement"]

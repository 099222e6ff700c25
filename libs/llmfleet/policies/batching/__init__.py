"""Static batchers (SLS baseline; SCLS and UELLM batchers in later files)."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.batching.base import (
    StaticBatch,
    StaticBatchPolicy,
    padded_blocks,
    padded_tokens,
    padding_tokens,
)
from llmfleet.policies.batching.static_sls import StaticSls

POLICIES: dict[str, type] = {"static_sls": StaticSls}


def make_batching_policy(name: str, **kwargs: Any) -> StaticBatchPolicy:
    """A new static batcher by registry name; options go to its constructor."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown batching policy {name!r}; valid: {sorted(POLICIES)}") from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad options for batching policy {name!r}: {e}") from None


__all__ = [
    "POLICIES",
    "StaticBatch",
    "StaticBatchPolicy",
    "StaticSls",
    "make_batching_policy",
    "padded_blocks",
    "padded_tokens",
    "padding_tokens",
]

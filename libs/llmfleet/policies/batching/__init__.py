"""Static batchers: SLS baseline, SCLS slice DP, UELLM SLO-ODBS (and variants), S³-style, and the
batches a scheduler formed (``given``: SCLS central scheduling)."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.batching.base import (
    StaticBatch,
    StaticBatchPolicy,
    padded_blocks,
    padded_tokens,
    padding_tokens,
)
from llmfleet.policies.batching.fifo_cm import FifoCm
from llmfleet.policies.batching.given_batches import GivenBatches, GivenBatchesOptions
from llmfleet.policies.batching.s3_batching import S3Batching
from llmfleet.policies.batching.scls_dp import SclsOptions, SclsSliceBatcher, dp_batches
from llmfleet.policies.batching.slo_odbs import Odbs, SloDbs, SloOdbs, SloOdbsOptions
from llmfleet.policies.batching.static_sls import StaticSls, StaticSlsOptions
from llmfleet.policies.registry import instantiate

POLICIES: dict[str, type] = {
    "static_sls": StaticSls,
    "scls": SclsSliceBatcher,
    "slo_odbs": SloOdbs,
    "fifo_cm": FifoCm,
    "slo_dbs": SloDbs,
    "odbs": Odbs,
    "s3": S3Batching,
    "given": GivenBatches,
}


def make_batching_policy(name: str, **kwargs: Any) -> StaticBatchPolicy:
    """A new static batcher by registry name with its options record built from ``kwargs``."""
    return instantiate("batching", POLICIES, name, kwargs)


__all__ = [
    "POLICIES",
    "FifoCm",
    "GivenBatches",
    "GivenBatchesOptions",
    "Odbs",
    "S3Batching",
    "SclsOptions",
    "SclsSliceBatcher",
    "SloDbs",
    "SloOdbs",
    "SloOdbsOptions",
    "StaticBatch",
    "StaticBatchPolicy",
    "StaticSls",
    "StaticSlsOptions",
    "dp_batches",
    "make_batching_policy",
    "padded_blocks",
    "padded_tokens",
    "padding_tokens",
]

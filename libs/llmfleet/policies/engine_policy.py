"""The engine's local policy by name: a request policy (continuous batching) or a static batcher run
through :class:`~llmfleet.policies.request.static_batches.StaticBatches`."""

from __future__ import annotations

from typing import Any

from llmfleet.policies.batching import POLICIES as BATCHING
from llmfleet.policies.batching import make_batching_policy
from llmfleet.policies.request import POLICIES as REQUEST
from llmfleet.policies.request import RequestPolicy, make_request_policy
from llmfleet.policies.request.static_batches import StaticBatches

ENGINE_POLICIES: tuple[str, ...] = tuple(sorted({*REQUEST, *BATCHING}))


def make_engine_policy(name: str, **kwargs: Any) -> RequestPolicy:
    """``keep_kv`` (static batchers only, default True) selects keep-KV or recompute slice ends."""
    if name in REQUEST:
        return make_request_policy(name, **kwargs)
    if name in BATCHING:
        keep_kv = bool(kwargs.pop("keep_kv", True))
        return StaticBatches(make_batching_policy(name, **kwargs), keep_kv=keep_kv)
    raise ValueError(f"unknown engine policy {name!r}; valid: {list(ENGINE_POLICIES)}")

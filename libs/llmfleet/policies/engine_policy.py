"""The engine's local policy by name: a request policy (continuous batching) or a static batcher.

A static batcher runs in one of two ways (``keep_kv``, default True):

* ``keep_kv=True`` — :class:`~llmfleet.policies.request.static_batches.StaticBatches` over continuous
  batching: batches are the batcher's, members keep their KV across slices and nothing is padded.
* ``keep_kv=False`` — the batcher itself, which the engine core runs in its *static mode*: HF
  ``generate``-style padded rows, recompute at a slice end (the papers' setting; the simulator's
  static batching is the same code path).
"""

from __future__ import annotations

from typing import Any

from llmfleet.policies.batching import POLICIES as BATCHING
from llmfleet.policies.batching import StaticBatchPolicy, make_batching_policy
from llmfleet.policies.request import POLICIES as REQUEST
from llmfleet.policies.request import RequestPolicy, make_request_policy
from llmfleet.policies.request.static_batches import StaticBatches

ENGINE_POLICIES: tuple[str, ...] = tuple(sorted({*REQUEST, *BATCHING}))


def make_engine_policy(name: str, **kwargs: Any) -> RequestPolicy | StaticBatchPolicy:
    """A new local policy object by registry name; options go to its constructor."""
    if name in REQUEST:
        return make_request_policy(name, **kwargs)
    if name in BATCHING:
        keep_kv = kwargs.pop("keep_kv", True)
        if not isinstance(keep_kv, bool):
            raise ValueError(
                f"bad options for batching policy {name!r}: keep_kv must be a bool, got {keep_kv!r}"
            )
        batcher = make_batching_policy(name, **kwargs)
        return StaticBatches(batcher) if keep_kv else batcher
    raise ValueError(f"unknown engine policy {name!r}; valid: {list(ENGINE_POLICIES)}")

"""The engine's local policy by name: a request policy (continuous batching) or a static batcher.

A static batcher ends a slice in one of two ways (option ``slice_end``, default
:data:`llmfleet.spec.defaults.SLICE_END`):

* ``slice_end="keep"`` — :class:`~llmfleet.policies.request.static_batches.StaticBatches` over
  continuous batching: batches are the batcher's, members keep their KV across slices and nothing is
  padded.
* ``slice_end="recompute"`` — the batcher itself, which the engine core runs with its static stepper:
  HF ``generate``-style padded rows, recompute at a slice end (the papers' setting; the simulator's
  static batching is the same code path).
"""

from __future__ import annotations

from typing import Any

from llmfleet.policies.batching import POLICIES as BATCHING
from llmfleet.policies.batching import StaticBatchPolicy, make_batching_policy
from llmfleet.policies.request import POLICIES as REQUEST
from llmfleet.policies.request import RequestPolicy, make_request_policy
from llmfleet.policies.request.static_batches import StaticBatches
from llmfleet.renamed import ENGINE_POLICY_OPTIONS, refuse_renamed
from llmfleet.spec.defaults import SLICE_END, SLICE_END_MODES, SliceEnd

ENGINE_POLICIES: tuple[str, ...] = tuple(sorted({*REQUEST, *BATCHING}))


def pop_slice_end(name: str, options: dict[str, Any]) -> SliceEnd:
    """Take a static batcher's ``slice_end`` out of ``options``, checked; the default when unset."""
    slice_end = options.pop("slice_end", SLICE_END)
    if slice_end not in SLICE_END_MODES:
        raise ValueError(
            f"bad options for batching policy {name!r}: slice_end must be one of {list(SLICE_END_MODES)}, "
            f"got {slice_end!r}"
        )
    return slice_end


def make_engine_policy(name: str, **kwargs: Any) -> RequestPolicy | StaticBatchPolicy:
    """A new local policy object by registry name; options go to its constructor (a static batcher's
    ``slice_end`` chooses how it runs, see the module docstring)."""
    try:
        refuse_renamed(kwargs, ENGINE_POLICY_OPTIONS)
    except ValueError as e:
        raise ValueError(f"bad options for engine policy {name!r}: {e}") from None
    if name in REQUEST:
        return make_request_policy(name, **kwargs)
    if name in BATCHING:
        slice_end = pop_slice_end(name, kwargs)
        batcher = make_batching_policy(name, **kwargs)
        return StaticBatches(batcher) if slice_end == "keep" else batcher
    raise ValueError(f"unknown engine policy {name!r}; valid: {list(ENGINE_POLICIES)}")

"""Scale from zero: a request for a model that no engine hosts waits (bounded) while placement loads
it, instead of failing at once (KServe's activator, llm-d's scale-from-zero).

The bound is the service's ``cold_start_timeout_s``, by default ten times its TTFT SLO, at most
:data:`DEFAULT_COLD_START_CAP_S`. A model that cannot be placed on any engine (its weights exceed
the largest engine's memory) does not wait: :func:`unplaceable` says why. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_COLD_START_CAP_S = 120.0
TTFT_MULTIPLE = 10.0


class Unplaceable(LookupError):
    """No engine can ever host the model (FAILED_PRECONDITION, not a wait)."""


def cold_start_timeout_s(explicit_s: float, ttft_s: float | None) -> float:
    """How long a request may wait for its model to be loaded: ``explicit_s`` when > 0 (the service's
    ``cold_start_timeout_s``), else min(10 x TTFT SLO, 120 s) (120 s without a TTFT SLO)."""
    if explicit_s > 0:
        return float(explicit_s)
    if ttft_s is None or ttft_s <= 0:
        return DEFAULT_COLD_START_CAP_S
    return min(TTFT_MULTIPLE * ttft_s, DEFAULT_COLD_START_CAP_S)


@dataclass(frozen=True)
class EngineSize:
    """An engine as placement sizes it: id and device memory (bytes, all its GPUs; 0: unknown)."""

    engine_id: str
    memory_bytes: int


def unplaceable(model: str, weight_bytes: int, engines: Iterable[EngineSize]) -> str | None:
    """Why ``model`` (``weight_bytes`` of weights, 0: unknown) fits on no engine, or None when it may
    fit somewhere (or the sizes are unknown: then placement decides)."""
    sized = [e for e in engines if e.memory_bytes > 0]
    if weight_bytes <= 0 or not sized:
        return None
    largest = max(sized, key=lambda e: (e.memory_bytes, e.engine_id))
    if weight_bytes <= largest.memory_bytes:
        return None
    gib = 1 << 30
    return (
        f"model {model!r} needs {weight_bytes / gib:.1f} GiB of weights; the largest engine, "
        f"{largest.engine_id}, has {largest.memory_bytes / gib:.1f} GiB"
    )

"""One settings vocabulary for an engine's iteration loop, live and simulated.

``EngineLimits`` is read by the engine core (admission room, batch limits, watermark), by the live
executor's ``ExecutorConfig``, by the cluster config's ``engines:`` entries and by the simulator's
``EngineSettings``: the same names and defaults everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self

from llmfleet.policies.request.base import BatchLimits


@dataclass(frozen=True)
class EngineLimits:
    """Per-engine limits (vLLM names in brackets).

    * ``max_running`` — admission room: requests holding KV at once; the policy is shown at most
      ``max_running − running`` waiting requests.
    * ``max_batch_requests`` [max_num_seqs] — requests in one iteration.
    * ``max_prefill_tokens`` [max_num_batched_tokens] — prompt tokens of the prefills in one iteration
      (a single longer prompt still runs alone).
    * ``watermark`` — fraction of the KV blocks kept free when admitting new requests.
    * ``block_tokens`` — tokens per merged KV block of the largest model (the simulator's pool layout);
      ``block_bytes`` — the live engine's fixed merged-block size (None: derived from ``block_tokens``).
    * ``prefix_caching`` [enable_prefix_caching] — a prompt starting with cached full blocks of its
      model takes them and prefills only the tokens after them (continuous batching).
    """

    max_running: int = 256
    max_batch_requests: int = 256
    max_prefill_tokens: int = 8192
    watermark: float = 0.01
    block_tokens: int = 16
    block_bytes: int | None = None
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in ("max_running", "max_batch_requests", "max_prefill_tokens", "block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.block_bytes is not None and (self.block_bytes < 16 or self.block_bytes % 16):
            raise ValueError(f"block_bytes must be a positive multiple of 16, got {self.block_bytes}")
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching must be a bool, got {self.prefix_caching!r}")

    @property
    def limits(self) -> EngineLimits:
        """Just the shared limits (subclasses such as ``ExecutorConfig`` add their own knobs)."""
        return EngineLimits(**{f.name: getattr(self, f.name) for f in fields(EngineLimits)})

    @property
    def batch(self) -> BatchLimits:
        """What a request policy is handed each iteration."""
        return BatchLimits(self.max_batch_requests, self.max_prefill_tokens)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "engine limits") -> Self:
        """Build from a mapping; unknown keys are an error naming the valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = set(d) - valid
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(valid)}")
        return cls(**d)

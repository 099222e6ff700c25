"""A split-phase decode worker's latency model: a model's decode iterations, and no prefill.

A decode worker of split-phase serving (Splitwise, DistServe; Aladdin §5.1, Fig. 5) receives each
request with its prompt's KV from a prefill worker and runs only decode iterations
(``llmfleet.sim.decode_only``), so a policy pricing work on it, as Aladdin's decode scheduler does with
"a learned performance model" of the decode workers (§5.1), prices every prefill at 0 s and each decode
iteration as the model's own. :func:`decode_worker` wraps any latency model with ``.prefill`` and
``.decode`` (``AladdinModel``, ``RooflineModel``, ``latency_model``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NoPrefill:
    """A prefill that a decode worker never runs: 0 s for any number of tokens."""

    def predict(self, total_tokens: float) -> float:
        del total_tokens
        return 0.0


@dataclass(frozen=True)
class DecodeWorkerLatency:
    """``base``'s decode iterations (``.decode``) with :class:`NoPrefill` as ``.prefill``."""

    base: Any
    prefill: NoPrefill = NoPrefill()

    @property
    def decode(self) -> Any:
        return self.base.decode


def decode_worker(base: Any) -> DecodeWorkerLatency:
    """The latency model of a decode worker running ``base``'s model (see the module docstring)."""
    return DecodeWorkerLatency(base)

"""Per-engine cost models for the computation boundary of hybrid transfer.

For each (model, hardware) the profiler's fitted record in etcd (``profiles/{model}/{hardware}``,
written by ``Characterize``) when there is one, else the default cost source (``costmodel.sources``, what
the simulator and the emulated engines charge) of the catalog model on the catalog hardware, else none
(the coordinator then uses ``--prefill-tokens-per-epoch``). Records are re-read
every ``ttl_s`` (a new characterization takes effect without a restart).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from llmfleet.coord import EtcdClient
from llmfleet.costmodel import (
    DEFAULT_COST_SOURCE,
    LinearCost,
    UnknownHardware,
    UnknownModel,
    cost_of,
    fitted_cost,
    hardware,
    model_arch,
)
from llmfleet.costmodel.serialize import ProfileRecord

log = logging.getLogger(__name__)


@dataclass
class CostModels:
    etcd: EtcdClient
    ttl_s: float = 60.0
    _cache: dict[tuple[str, str], tuple[float, LinearCost | None]] = field(default_factory=dict)

    def get(self, model: str, hw: str) -> LinearCost | None:
        """The cached model (None: unknown, or not fetched yet)."""
        hit = self._cache.get((model, hw))
        return hit[1] if hit is not None else None

    async def refresh(self, pairs: set[tuple[str, str]], now: float | None = None) -> None:
        """Fetch the pairs not cached or older than ``ttl_s`` (errors keep the previous value)."""
        now = time.monotonic() if now is None else now
        for model, hw in sorted(pairs):
            hit = self._cache.get((model, hw))
            if hit is not None and now - hit[0] < self.ttl_s:
                continue
            try:
                self._cache[(model, hw)] = (now, await self._load(model, hw))
            except Exception as e:  # etcd down: keep what we had, try again next epoch
                log.warning("cost model of %s on %s: %s", model, hw, e)

    async def _load(self, model: str, hw: str) -> LinearCost | None:
        raw = await self.etcd.get(self.etcd.keys.profile(model, hw))
        if raw is not None:
            try:
                return fitted_cost(ProfileRecord.from_json(raw.decode()))
            except (ValueError, KeyError, TypeError) as e:
                log.warning("profiles/%s/%s is unreadable (%s); using the default cost source", model, hw, e)
        try:
            return cost_of(DEFAULT_COST_SOURCE, model_arch(model), hardware(hw))
        except (UnknownModel, UnknownHardware):
            return None  # not in the catalog

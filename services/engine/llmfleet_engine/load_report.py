"""The executor's load report (``load_snapshot``): per-model running/waiting, KV use and tokens/s, and
each request's context tokens, KV bytes and phase."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from llmfleet.engine_core import EngineCore
from llmfleet.kvblocks import BlockAllocator

from llmfleet_engine.delivery import RateWindow
from llmfleet_engine.memory import MemoryPlan
from llmfleet_engine.outputs import LoadSnapshot, ModelLoad, RequestLoads

if TYPE_CHECKING:
    from llmfleet_engine.model_host import HostedModel


class LoadReport:
    """Mixin of :class:`~llmfleet_engine.executor.Executor` (uses its lock, core, pool and models)."""

    allocator: BlockAllocator
    core: EngineCore
    plan: MemoryPlan
    _cond: threading.Condition
    _models: dict[str, HostedModel]
    _generated: RateWindow
    _reserved_blocks: int
    _prefilling: frozenset[str] | set[str]

    def load_snapshot(self) -> LoadSnapshot:
        now = time.monotonic()
        with self._cond:
            stats = self.allocator.stats()
            per: dict[str, list[int]] = {n: [0, 0] for n in self._models}
            bpt = {n: m.shape.bytes_per_token for n, m in self._models.items()}
            seqs = self.allocator
            prefilling = self._prefilling  # the prefills of the step in flight
            # per request, one column each (no object per request; see RequestLoads)
            ids: list[str] = []
            mods: list[str] = []
            toks: list[int] = []
            kvb: list[int] = []
            phases: list[str] = []
            for i, queue in enumerate((self.core.running, self.core.waiting)):
                for rid, r in queue.items():
                    model = r.sched.model
                    if model in per:
                        per[model][i] += 1
                    ids.append(rid)
                    mods.append(model)
                    toks.append(r.prompt + r.produced)
                    kvb.append(seqs.num_tokens(rid) * bpt.get(model, 0) if rid in seqs else 0)
                    phases.append("waiting" if i else "prefill" if rid in prefilling else "decode")
            tokens_per_s = self._generated.per_second(now)
            running, waiting = len(self.core.running), len(self.core.waiting)
            models = []
            for name, m in sorted(self._models.items()):
                st = stats.models.get(name)
                tokens = st.tokens if st is not None else 0
                models.append(
                    ModelLoad(
                        model=name,
                        running=per[name][0],
                        waiting=per[name][1],
                        kv_tokens=tokens,
                        kv_used_bytes=tokens * m.shape.bytes_per_token,
                        kv_blocks=st.blocks if st is not None else 0,
                        tokens_per_block=m.tokens_per_block,
                    )
                )
            reserved = self._reserved_blocks
        return LoadSnapshot(
            timestamp=time.time(),
            running=running,
            waiting=waiting,
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=(self.plan.num_blocks - reserved) * self.plan.block_bytes,
            tokens_per_s=tokens_per_s,
            models=tuple(models),
            kv_blocks_used=stats.used_blocks - reserved,
            kv_blocks_total=self.plan.num_blocks - reserved,
            preemptions=self.core.preemptions,
            kv_fragmentation=stats.fragmentation,
            requests=RequestLoads(ids, mods, toks, kvb, phases),
            # what runs at once: admitted (max_running) and stepped together (max_batch_requests)
            max_running=min(self.core.limits.max_running, self.core.limits.max_batch_requests),
        )

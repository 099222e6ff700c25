"""The executor's load report (``load_snapshot``), a part of :class:`~llmfleet_engine.executor.Executor`:
per-model running/waiting, KV use and tokens/s, each request's context tokens, KV bytes and phase, and
the prefix cache. A block several requests share counts once: in its model's KV use, and in the KV
bytes of the request that computed it, not of those that found it cached."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmfleet.engine_core import EngineCore

from llmfleet_engine.delivery import RateWindow
from llmfleet_engine.lora.hosting import pool_of
from llmfleet_engine.outputs import LoadSnapshot, ModelLoad, PrefixCacheLoad, RequestLoads

if TYPE_CHECKING:
    from llmfleet_engine.memory import KvPool
    from llmfleet_engine.model_host import ModelHost
    from llmfleet_engine.request_table import RequestTable


@dataclass(eq=False)
class LoadReport:
    """Reads the core's queues, the pool's use and the hosted models under the request table's lock;
    ``generated`` is the executor's window of tokens produced."""

    table: RequestTable
    core: EngineCore
    pool: KvPool
    host: ModelHost
    generated: RateWindow

    def load_snapshot(self) -> LoadSnapshot:
        now = time.monotonic()
        with self.table.cond:
            stats = self.pool.allocator.stats()
            per: dict[str, list[int]] = {n: [0, 0] for n in self.host.hosted}
            bpt = {n: m.shape.bytes_per_token for n, m in self.host.hosted.items()}
            seqs = self.pool.allocator
            prefilling = self.table.prefilling  # the prefills of the step in flight
            # per request, one column each (no object per request; see RequestLoads)
            ids: list[str] = []
            mods: list[str] = []
            toks: list[int] = []
            kvb: list[int] = []
            phases: list[str] = []
            adapters: list[str] = []
            for i, queue in enumerate((self.core.running, self.core.waiting)):
                for rid, r in queue.items():
                    model = r.sched.model
                    if model in per:
                        per[model][i] += 1
                    ids.append(rid)
                    mods.append(model)
                    toks.append(r.prompt + r.produced)
                    kvb.append(seqs.own_tokens(rid) * bpt.get(model, 0) if rid in seqs else 0)
                    phases.append("waiting" if i else "prefill" if rid in prefilling else "decode")
                    adapters.append(r.adapter or "")
            tokens_per_s = self.generated.per_second(now)
            running, waiting = len(self.core.running), len(self.core.waiting)
            models = []
            for name, m in sorted(self.host.hosted.items()):
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
                        adapters=pool.slots.resident if (pool := pool_of(m)) is not None else (),
                        adapter_loads=pool.slots.loads if pool is not None else 0,
                        adapter_slots=pool.slots.slots if pool is not None else 0,
                    )
                )
            reserved = self.host.reserved_blocks
            cache = None
            if self.core.prefix_caching:
                pc = seqs.prefix_cache_stats()
                q, h = self.core.prefix_queries, self.core.prefix_hits
                cache = PrefixCacheLoad(pc.blocks, pc.idle_blocks, q, h)
        return LoadSnapshot(
            timestamp=time.time(),
            running=running,
            waiting=waiting,
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=(self.pool.plan.num_blocks - reserved) * self.pool.plan.block_bytes,
            tokens_per_s=tokens_per_s,
            models=tuple(models),
            kv_blocks_used=stats.used_blocks - reserved,
            kv_blocks_total=self.pool.plan.num_blocks - reserved,
            preemptions=self.core.preemptions,
            kv_fragmentation=stats.fragmentation,
            requests=RequestLoads(ids, mods, toks, kvb, phases, adapters),
            # what runs at once: admitted (max_running) and stepped together (max_batch_requests)
            max_running=min(self.core.limits.max_running, self.core.limits.max_batch_requests),
            prefix_cache=cache,
        )

"""The vLLM backend: the executor interface of ``executor.Executor`` on top of vLLM's V1 async engine.

One vLLM ``AsyncLLM`` per loaded model, each driven from its own event-loop thread (so a blocking
load or shutdown of one model never stalls another model's streams, and ``load``/``unload`` can block
from any thread). vLLM is imported lazily: this module imports without it, and constructing
``VllmExecutor`` without it raises ``BackendUnavailable`` with the install command.

What differs from the native executor:

* no unified KV pool and no KV export/import (``migration`` is None): a migrated or resumed
  request is re-prefilled from ``prompt_token_ids + resume_token_ids`` (token transfer), which vLLM's
  automatic prefix caching shortens where the prefix is still cached; a model leaving the node drains
  (``vllm_drains``): its requests finish, or are evicted and resumed elsewhere by the scheduler;
* the load snapshot's running and waiting counts and its KV in use are vLLM's own, from the scheduler
  stats vLLM hands a stat logger after each step (``vllm_stats``); its KV capacity is vLLM's block count
  times its block size; with prefix caching on, the blocks its prefix cache holds are counted from
  vLLM's KV-cache events (``vllm_kv_events``), so cache-aware dispatch sees what vLLM evicted. Per
  request, the KV bytes are the adapter's count (prompt + generated tokens times the model's bytes
  per token): vLLM does not report a request's blocks.

Completion text is not vLLM's: token ids come from vLLM (cumulative ``RequestOutput``s turned into
deltas), text and stop strings go through the same ``TextStream`` as the native executor, so both
backends produce the same text for the same tokens, including across a resume. Stop strings are also
given to vLLM so it stops in-engine; whichever side sees a stop first ends the stream.

What the backend reads from vLLM is in ``vllm_compat``, the configuration in ``vllm_config``, the
scheduler numbers in ``vllm_stats``, the model lifecycle in ``vllm_models`` and the request lifecycle
in ``vllm_requests``, the LoRA adapters in ``vllm_adapters`` (``adapters``: declared with their base,
checked as the native engine checks them, handed to vLLM as LoRA requests), ``vllm_lora_residency``
(what vLLM holds) and ``vllm_zero_adapter`` (the base rows' zero adapter on vLLM's CPU build);
``VllmExecutor`` (here) puts them together.

The executor surface is ``backend.EngineBackend``, as the native ``executor.Executor`` has it:
requests ``submit``/``cancel`` (+ ``attach``/``cancel_if_unattached`` for migrated-in requests: never
any here); info ``backend``, ``device``, ``memory_bytes``; load ``load_snapshot``; lifecycle
``close``/``aclose``; the models (``backend.ModelHosting``: ``load``/``unload``/``reconcile``,
``kv_capacity_bytes``, ``models``, ``model_names``, ``on_models_changed``, the drains) in ``host``,
which is the executor itself (its models, requests and drains share one lock); no KV
export/import/migrate (``migration`` is None).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from llmfleet_engine.model_host import DrainBook
from llmfleet_engine.outputs import (
    ExecutorClosedError,
    LoadSnapshot,
    ModelLoad,
    PrefixCacheLoad,
    RequestLoads,
)
from llmfleet_engine.vllm_adapters import VllmAdapters
from llmfleet_engine.vllm_compat import BackendUnavailable, import_vllm, total_gpu_memory_bytes
from llmfleet_engine.vllm_config import BACKEND, VllmConfig
from llmfleet_engine.vllm_drains import VllmDrains
from llmfleet_engine.vllm_models import ModelRuntime, VllmLoadedModel, VllmModels
from llmfleet_engine.vllm_requests import ActiveRequest, VllmRequests
from llmfleet_engine.vllm_stats import SchedulerView

__all__ = ["BACKEND", "BackendUnavailable", "VllmConfig", "VllmExecutor", "VllmLoadedModel"]

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

log = logging.getLogger(__name__)


class VllmExecutor(VllmModels, VllmRequests, VllmDrains):
    """The engine executor interface on vLLM: one async engine per model, requests streamed as chunks.

    Thread-safe like ``executor.Executor``: ``load``/``unload``/``reconcile``/``close`` block (call them
    via ``asyncio.to_thread``); ``submit`` must be called from a running event loop, whose thread then
    receives the chunks.
    """

    migration: None = None  # no KV transfer: a request moves by re-prefill

    def __init__(self, config: VllmConfig | None = None) -> None:
        self._api = import_vllm()
        self.config = config or VllmConfig()
        self.device = self.config.device
        self.backend = BACKEND
        self.memory_bytes = _device_memory_bytes(self.config.device) * self.config.tensor_parallel_size
        self.on_models_changed: list[Callable[[tuple[str, ...]], None]] = []
        self._runtimes: dict[str, ModelRuntime] = {}
        self._events_dir: str | None = None
        self._requests: dict[str, ActiveRequest] = {}
        self._drains = DrainBook()  # draining models and evicted requests, as the native engine keeps them
        self._generated: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._closed = False
        self._sequence = itertools.count(1)
        self.metrics: EngineMetrics | None = None  # attach_metrics
        self.adapters = VllmAdapters(
            self,
            max_loras=self.config.max_loras,
            max_rank=self.config.max_lora_rank,
            lora_request_cls=self._api.lora_request_cls,
            zero_dir=Path(tempfile.mkdtemp(prefix="llmfleet-lora-zero-"))
            if self.config.zero_adapter
            else None,
        )
        log.info("vLLM backend: vllm %s on %s", self._api.version, self.device)

    @property
    def host(self) -> VllmExecutor:
        """The models part (``backend.ModelHosting``): this executor, whose models, requests and drains
        share its lock."""
        return self

    def attach_metrics(self, metrics: EngineMetrics) -> None:
        """Export ``vllm:*`` metrics on ``metrics`` (before any model loads): gauges from the load
        snapshot (vLLM's scheduler numbers), prefix-cache and preemption counters from vLLM's stats,
        the rest from each request's outputs (first token, tokens, inter-token gaps, its end)."""
        metrics.attach(self.load_snapshot)
        self.metrics = metrics

    def load_snapshot(self) -> LoadSnapshot:
        """Per model, vLLM's running and waiting requests and KV in use; per request, the adapter's
        token count (see the module docstring)."""
        now = time.monotonic()
        with self._lock:
            runtimes = dict(self._runtimes)
            ids: list[str] = []
            mods: list[str] = []
            toks: list[int] = []
            kvb: list[int] = []
            phases: list[str] = []
            adapters: list[str] = []
            for state in self._requests.values():
                req = state.req
                runtime = state.runtime  # an adapter's request runs on its base
                if runtimes.get(runtime.model.name) is not runtime:
                    continue
                tokens = req.prompt_tokens + len(state.assembler.tokens)
                started = state.first_token_s is not None
                ids.append(req.request_id)
                mods.append(runtime.model.name)
                toks.append(tokens)
                kvb.append(tokens * runtime.model.kv_bytes_per_token if started else 0)
                phases.append("decode" if started else "waiting")
                adapters.append(req.model if req.model != runtime.model.name else "")
            self._trim_window(now)
            generated = sum(n for _, n in self._generated)
        models = tuple(
            _model_load(name, rt, self.adapters.name_of, self.config.max_loras)
            for name, rt in sorted(runtimes.items())
        )
        views = [rt.stats.view() for rt in runtimes.values()]
        counts = [rt.cached.count() if rt.cached is not None else None for rt in runtimes.values()]
        known = None not in counts  # every model's cache counted (vacuously so with no model)
        return LoadSnapshot(
            timestamp=time.time(),
            running=sum(m.running for m in models),
            waiting=sum(m.waiting for m in models),
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=sum(rt.kv_capacity_bytes for rt in runtimes.values()),
            tokens_per_s=generated / self.config.throughput_window_s,
            models=models,
            requests=RequestLoads(ids, mods, toks, kvb, phases, adapters),
            # the blocks vLLM caches when its KV events counted them all (else the total is left 0: no size
            # reported); its lookups and hits; its block hashes are its own, so none are reported. With
            # prefix caching off there is no cache to report.
            kv_blocks_total=sum(rt.kv_blocks for rt in runtimes.values()) if known else 0,
            prefix_cache=PrefixCacheLoad(
                blocks=sum(c or 0 for c in counts) if known else 0,
                queries=sum(v.prefix_queries for v in views),
                hits=sum(v.prefix_hits for v in views),
            )
            if self.config.settings.enable_prefix_caching
            else None,
        )

    def scheduler_view(self, model: str) -> SchedulerView:
        """vLLM's last scheduler numbers for ``model`` and its totals (KeyError if it is not loaded)."""
        with self._lock:
            runtime = self._runtimes[model]
        return runtime.stats.view()

    def close(self, timeout_s: float | None = None) -> None:
        """Cancel every request and shut every engine down (each within ``timeout_s``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            names = list(self._runtimes)
        for name in names:
            self._unload(name, timeout_s)
        self.adapters.close()
        if self._events_dir is not None:
            shutil.rmtree(self._events_dir, ignore_errors=True)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosedError("executor is closed")


def _model_load(
    name: str, runtime: ModelRuntime, adapter_name: Callable[[int], str | None], max_loras: int
) -> ModelLoad:
    """One model's load as vLLM's scheduler last reported it, with the LoRA adapters its engine holds
    (vLLM's ``list_loras``, least recently used first)."""
    view = runtime.stats.view()
    tokens = round(view.kv_usage * runtime.kv_capacity_tokens)
    loras = runtime.loras
    adapters = [] if loras is None else [adapter_name(i) for i in loras.resident()]
    return ModelLoad(
        model=name,
        running=view.running,
        waiting=view.waiting,
        kv_tokens=tokens,
        kv_used_bytes=tokens * runtime.model.kv_bytes_per_token,
        adapters=tuple(a for a in adapters if a is not None),
        adapter_loads=0 if loras is None else loras.loads,
        adapter_slots=max_loras if loras is not None else 0,
    )


def _device_memory_bytes(device: str) -> int:
    """The GPU's memory, or on CPU the host's (vLLM's CPU build keeps weights and KV there)."""
    if device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total_gpu_memory_bytes()

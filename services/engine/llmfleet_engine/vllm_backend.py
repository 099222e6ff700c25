"""Optional vLLM backend: the executor interface of ``executor.Executor`` on top of vLLM async engines.

One vLLM async engine per loaded model, each driven from its own event-loop thread (so a blocking
load or shutdown of one model never stalls another model's streams, and ``load``/``unload`` can block
from any thread). vLLM is imported lazily: this module imports without it, and constructing
``VllmExecutor`` without it raises ``BackendUnavailable``.

What differs from the native executor:

* no unified KV pool and no KV export/import (``supports_kv_transfer = False``): a migrated or resumed
  request is re-prefilled from ``prompt_token_ids + resume_token_ids`` (token transfer);
* ``load_snapshot`` KV numbers are adapter-side estimates (prompt + generated tokens of requests that
  have produced output, times the model's bytes per token), not vLLM's block usage; a request counts
  as *waiting* until its first output arrives and as *running* afterwards (per request: phase
  "waiting", then "decode"; no "prefill");
* ``kv_capacity_bytes`` is ``num_gpu_blocks * block_size * kv_bytes_per_token`` when the installed vLLM
  exposes the block count after start-up, else the estimate ``memory share - weights``.

Completion text is not vLLM's: token ids come from vLLM (cumulative ``RequestOutput``s turned into
deltas), text and stop strings go through the same ``TextStream`` as the native executor, so both
backends produce the same text for the same tokens, including across a resume. Stop strings are also
given to vLLM so it stops in-engine; whichever side sees a stop first ends the stream.

The vLLM version shims are in ``vllm_compat``, the configuration in ``vllm_config``, the model
lifecycle in ``vllm_models`` and the request lifecycle in ``vllm_requests``; ``VllmExecutor`` (here)
puts them together.

The executor surface, grouped as the backends line up (the native ``executor.Executor`` has the same
names): requests ``submit``/``cancel`` (+ ``attach``/``cancel_if_unattached`` for migrated-in
requests: never any here); models ``load``/``load_async``/``unload``/``reconcile``; info ``backend``,
``device``, ``memory_bytes``, ``kv_capacity_bytes``, ``models``, ``model_names``,
``on_models_changed``, ``supports_kv_transfer``; load ``load_snapshot``; lifecycle
``close``/``aclose``. No KV export/import/migrate (``supports_kv_transfer = False``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmfleet_engine.outputs import ExecutorClosedError, LoadSnapshot, ModelLoad, RequestLoads
from llmfleet_engine.vllm_compat import BackendUnavailable, import_vllm, total_gpu_memory_bytes
from llmfleet_engine.vllm_config import BACKEND, VllmConfig
from llmfleet_engine.vllm_models import ModelRuntime, VllmLoadedModel, VllmModels
from llmfleet_engine.vllm_requests import ActiveRequest, VllmRequests

__all__ = ["BACKEND", "BackendUnavailable", "VllmConfig", "VllmExecutor", "VllmLoadedModel"]

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics

log = logging.getLogger(__name__)


class VllmExecutor(VllmModels, VllmRequests):
    """The engine executor interface on vLLM: one async engine per model, requests streamed as chunks.

    Thread-safe like ``executor.Executor``: ``load``/``unload``/``reconcile``/``close`` block (call them
    via ``asyncio.to_thread``); ``submit`` must be called from a running event loop, whose thread then
    receives the chunks.
    """

    supports_kv_transfer = False

    def __init__(self, config: VllmConfig | None = None) -> None:
        self._api = import_vllm()
        self.config = config or VllmConfig()
        self.device = self.config.device
        self.backend = BACKEND
        self.memory_bytes = total_gpu_memory_bytes() * self.config.tensor_parallel_size
        self.on_models_changed: list[Callable[[tuple[str, ...]], None]] = []
        self._runtimes: dict[str, ModelRuntime] = {}
        self._requests: dict[str, ActiveRequest] = {}
        self._generated: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._closed = False
        self._sequence = itertools.count(1)
        self.metrics: EngineMetrics | None = None  # attach_metrics
        log.info("vLLM backend: vllm %s (V1 engine by default: %s)", self._api.version, self._api.v1_default)

    def attach_metrics(self, metrics: EngineMetrics) -> None:
        """Export ``vllm:*`` metrics on ``metrics``: gauges from the load snapshot, counters and
        histograms from each request's outputs (first token, tokens, inter-token gaps, its end)."""
        metrics.attach(self.load_snapshot)
        self.metrics = metrics

    def load_snapshot(self) -> LoadSnapshot:
        """Requests per model; KV numbers are adapter estimates (see the module docstring)."""
        now = time.monotonic()
        with self._lock:
            per_model = {name: [0, 0, 0] for name in self._runtimes}  # running, waiting, kv tokens
            bpt = {name: rt.model.kv_bytes_per_token for name, rt in self._runtimes.items()}
            ids: list[str] = []
            mods: list[str] = []
            toks: list[int] = []
            kvb: list[int] = []
            phases: list[str] = []
            for state in self._requests.values():
                req = state.req
                counts = per_model.get(req.model)
                if counts is None:
                    continue
                tokens = req.prompt_tokens + len(state.assembler.tokens)
                ids.append(req.request_id)
                mods.append(req.model)
                toks.append(tokens)
                if state.first_token_s is None:
                    counts[1] += 1
                    kvb.append(0)
                    phases.append("waiting")
                else:
                    counts[0] += 1
                    counts[2] += tokens
                    kvb.append(tokens * bpt[req.model])
                    phases.append("decode")
            self._trim_window(now)
            generated = sum(n for _, n in self._generated)
            capacity = sum(rt.kv_capacity_bytes for rt in self._runtimes.values())
        models = tuple(
            ModelLoad(model=name, running=r, waiting=w, kv_tokens=kv, kv_used_bytes=kv * bpt[name])
            for name, (r, w, kv) in sorted(per_model.items())
        )
        return LoadSnapshot(
            timestamp=time.time(),
            running=sum(m.running for m in models),
            waiting=sum(m.waiting for m in models),
            kv_used_bytes=sum(m.kv_used_bytes for m in models),
            kv_capacity_bytes=capacity,
            tokens_per_s=generated / self.config.throughput_window_s,
            models=models,
            requests=RequestLoads(ids, mods, toks, kvb, phases),
        )

    def close(self, timeout_s: float | None = None) -> None:
        """Cancel every request and shut every engine down (each within ``timeout_s``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            names = list(self._runtimes)
        for name in names:
            self._unload(name, timeout_s)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosedError("executor is closed")

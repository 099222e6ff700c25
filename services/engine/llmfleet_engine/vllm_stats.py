"""vLLM's own scheduler numbers for one model: a stat logger that vLLM's ``AsyncLLM`` calls after each
engine step with its ``SchedulerStats`` and ``IterationStats``.

The load report reads requests running and waiting and the KV cache's use from here, and ``/metrics``
counts vLLM's prefix-cache queries and hits and its preemptions, so both say what vLLM's scheduler
says rather than what the adapter estimates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmfleet.metrics.engine import EngineMetrics


@dataclass(frozen=True)
class SchedulerView:
    """The last step's scheduler numbers of one model's vLLM engine, and totals since it started."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of the KV cache's blocks in use, 0..1
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which were cached
    preemptions: int = 0
    steps: int = 0  # steps that reported scheduler stats


class ModelStats:
    """Receives one model engine's stats (on the thread running its event loop); read from any."""

    def __init__(self, model: str, metrics: EngineMetrics | None) -> None:
        self.model = model
        self._metrics = metrics
        self._lock = threading.Lock()
        self._view = SchedulerView()

    def view(self) -> SchedulerView:
        with self._lock:
            return self._view

    def record(self, scheduler: Any, iteration: Any) -> None:
        """One step's ``SchedulerStats`` and ``IterationStats`` (either may be None)."""
        queries = hits = preempted = 0
        with self._lock:
            view = self._view
            if scheduler is not None:
                prefix = scheduler.prefix_cache_stats
                queries, hits = int(prefix.queries), int(prefix.hits)
                view = replace(
                    view,
                    running=int(scheduler.num_running_reqs),
                    waiting=int(scheduler.num_waiting_reqs) + int(scheduler.num_skipped_waiting_reqs),
                    kv_usage=float(scheduler.kv_cache_usage),
                    prefix_queries=view.prefix_queries + queries,
                    prefix_hits=view.prefix_hits + hits,
                    steps=view.steps + 1,
                )
            if iteration is not None:
                preempted = int(iteration.num_preempted_reqs)
                view = replace(view, preemptions=view.preemptions + preempted)
            self._view = view
        if self._metrics is not None:
            self._metrics.prefix_cache(self.model, queries, hits)
            if preempted:
                self._metrics.preempted(self.model, preempted)


def stat_logger_factory(base: type, stats: ModelStats) -> Callable[..., Any]:
    """A vLLM stat logger class (``base`` is vLLM's ``StatLoggerBase``) that feeds ``stats``; vLLM
    builds one per engine core with ``(vllm_config, engine_index)``."""

    class ModelStatLogger(base):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            stats.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return ModelStatLogger

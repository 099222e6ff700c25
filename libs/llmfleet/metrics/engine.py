"""An engine's metrics, under vLLM's names (``vllm:*``, label ``model_name``), so dashboards and
autoscalers written for vLLM read an llmfleet engine unchanged.

Counters: prometheus-client appends ``_total`` in the exposition, exactly as vLLM's own exposition does
(``vllm:num_preemptions`` is scraped as ``vllm:num_preemptions_total``, ``vllm:prompt_tokens`` as
``vllm:prompt_tokens_total``, ``vllm:generation_tokens`` as ``vllm:generation_tokens_total``,
``vllm:request_success`` as ``vllm:request_success_total{finished_reason}``). The gauges
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, 0..1) are
read from the backend's load snapshot at scrape time.

``finished_reason``: ``stop`` (EOS or a stop string), ``length``, ``abort`` (cancelled), ``error``, and
llmfleet's ``migrated`` (the request left for another engine and continues there).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LABEL = "model_name"
# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# llmfleet FinishReason name -> vLLM finished_reason label
FINISHED_REASONS = {
    "EOS": "stop",
    "STOP": "stop",
    "LENGTH": "length",
    "CANCELLED": "abort",
    "ERROR": "error",
    "MIGRATED": "migrated",
}


class _LoadCollector(Collector):
    """The gauges, from ``snapshot()`` (a backend's ``load_snapshot``) at each scrape."""

    def __init__(self) -> None:
        self.snapshot: Callable[[], Any] | None = None

    def describe(self) -> list:
        return []  # unchecked: the families only exist once a backend is attached

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fn = self.snapshot
        if fn is None:
            return
        try:
            snap = fn()
        except Exception:  # a scrape must never break the engine
            log.exception("metrics: load snapshot failed")
            return
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=[LABEL]
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=[LABEL]
        )
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=[LABEL]
        )
        cap = snap.kv_capacity_bytes
        for m in snap.models:
            running.add_metric([m.model], m.running)
            waiting.add_metric([m.model], m.waiting)
            # the pool is shared by every model: each model's share of it
            usage.add_metric([m.model], min(1.0, m.kv_used_bytes / cap) if cap > 0 else 0.0)
        yield running
        yield waiting
        yield usage


class EngineMetrics:
    """The ``vllm:*`` metrics of one engine process. Hooks are cheap and never raise."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._load = _LoadCollector()
        registry.register(self._load)
        self.num_preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemptions.", [LABEL], registry=registry
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", [LABEL], registry=registry
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", [LABEL], registry=registry
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of finished requests by finished reason.",
            [LABEL, "finished_reason"],
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            [LABEL],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            [LABEL],
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            [LABEL],
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=registry,
        )
        self.request_queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            [LABEL],
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=registry,
        )

    def attach(self, snapshot: Callable[[], Any]) -> None:
        """Read the gauges from ``snapshot()`` (an ``EngineBackend.load_snapshot``) at each scrape."""
        self._load.snapshot = snapshot

    # -- hooks (the executor's worker thread) --------------------------------------------------------
    def preempted(self, model: str, n: int = 1) -> None:
        self.num_preemptions.labels(model).inc(n)

    def first_token(self, model: str, prompt_tokens: int, ttft_s: float) -> None:
        self.prompt_tokens.labels(model).inc(prompt_tokens)
        self.time_to_first_token.labels(model).observe(max(0.0, ttft_s))

    def tokens(self, model: str, n: int) -> None:
        if n:
            self.generation_tokens.labels(model).inc(n)

    def inter_token(self, model: str, seconds: float) -> None:
        self.inter_token_latency.labels(model).observe(max(0.0, seconds))

    def finished(self, model: str, reason: str, queue_s: float, latency_s: float, counted: bool) -> None:
        """A request ended with FinishReason ``reason`` (its name); ``counted``: it was admitted (it has
        a queue time and an end-to-end latency here)."""
        self.request_success.labels(model, FINISHED_REASONS.get(reason, reason.lower())).inc()
        if counted and reason != "MIGRATED":
            self.request_queue_time.labels(model).observe(max(0.0, queue_s))
            self.e2e_request_latency.labels(model).observe(max(0.0, latency_s))


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def engine_metrics(registry: CollectorRegistry | None = None) -> EngineMetrics:
    """The engine metrics on ``registry`` (default: the process's), created once per registry."""
    from llmfleet.metrics.server import process_registry

    reg = registry or process_registry()
    with _lock:
        m = _by_registry.get(reg)
        if m is None:
            m = _by_registry[reg] = EngineMetrics(reg)
        return m

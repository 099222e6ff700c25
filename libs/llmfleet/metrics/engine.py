"""An engine's metrics, under vLLM's names (``vllm:*``, label ``model_name``), so dashboards and
autoscalers written for vLLM read an llmfleet engine unchanged.

Counters: prometheus-client appends ``_total`` in the exposition, exactly as vLLM's own exposition does
(``vllm:num_preemptions`` is scraped as ``vllm:num_preemptions_total``, ``vllm:prompt_tokens`` as
``vllm:prompt_tokens_total``, ``vllm:generation_tokens`` as ``vllm:generation_tokens_total``,
``vllm:request_success`` as ``vllm:request_success_total{finished_reason}``). The gauges
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, 0..1) are
read from the backend's load snapshot at scrape time; on the vLLM backend that snapshot holds vLLM's
own scheduler numbers, and ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` count vLLM's
prefix-cache lookups.

``finished_reason``: ``stop`` (EOS or a stop string), ``length``, ``abort`` (cancelled), ``error``, and
llmfleet's ``migrated`` (the request left for another engine and continues there).
"""

from __future__ import annotations

import logging
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from llmfleet.metrics.server import process_registry

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

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
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
        adapter_loads = CounterMetricFamily(
            "llmfleet_lora_adapter_loads",
            "LoRA adapters copied into a base model's adapter slots (slot misses).",
            labels=[LABEL],
        )
        cap = snap.kv_capacity_bytes
        for m in snap.models:
            running.add_metric([m.model], m.running)
            waiting.add_metric([m.model], m.waiting)
            # the pool is shared by every model: each model's share of it
            usage.add_metric([m.model], min(1.0, m.kv_used_bytes / cap) if cap > 0 else 0.0)
            if m.adapter_slots:
                adapter_loads.add_metric([m.model], m.adapter_loads)
        yield running
        yield waiting
        yield usage
        if adapter_loads.samples:
            yield adapter_loads


class _Counter:
    """A labelled counter in plain numbers (one float per label tuple), exported at scrape time: an
    update is a dict update, where a prometheus-client ``Counter`` takes a label lookup and a lock."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, key: tuple[str, ...], n: float) -> None:
        self.values[key] = self.values.get(key, 0.0) + n

    def family(self) -> CounterMetricFamily:
        f = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, v in list(self.values.items()):
            f.add_metric(list(key), v)
        return f


class _Histogram:
    """A labelled histogram in plain numbers: per label tuple, the count of each bucket (not cumulative,
    the last one +Inf) and the sum; ``observe`` takes a count, so a step's equal values are one call."""

    def __init__(self, name: str, documentation: str, labels: list[str], buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.bounds = tuple(float(b) for b in buckets)
        self.le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        self.series: dict[tuple[str, ...], list[float]] = {}  # bucket counts..., sum

    def observe(self, key: tuple[str, ...], value: float, n: int = 1) -> None:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [0.0] * (len(self.bounds) + 2)
        s[bisect_left(self.bounds, value)] += n  # the first bucket with value <= le, as prometheus-client
        s[-1] += value * n

    def family(self) -> HistogramMetricFamily:
        f = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, s in list(self.series.items()):
            s = list(s)
            f.add_metric(list(key), list(zip(self.le, accumulate(s[:-1]), strict=True)), s[-1])
        return f


class _Accumulated(Collector):
    """The counters and histograms of :class:`EngineMetrics`, read under its lock at each scrape."""

    def __init__(self, lock: threading.Lock, metrics: list[_Counter | _Histogram]) -> None:
        self.lock, self.metrics = lock, metrics

    def describe(self) -> list:
        return [
            (CounterMetricFamily if isinstance(m, _Counter) else HistogramMetricFamily)(
                m.name, m.documentation, labels=m.labels
            )
            for m in self.metrics
        ]

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        with self.lock:
            families = [m.family() for m in self.metrics]
        yield from families


class EngineMetrics:
    """The ``vllm:*`` metrics of one engine process. Hooks are cheap and never raise.

    The hooks run in the engine's loop, once per token: they only add to plain numbers under one lock.
    prometheus-client's ``labels().inc()`` / ``observe()`` took about 1 us each, 2.2 us per token: ~8% of
    the tiny llama's ~35,000 tok/s on a CPU (``make bench-metrics``). The exposition is built from those
    numbers at scrape time, identical to prometheus-client's ``Counter`` / ``Histogram``;
    :meth:`decode_step` records a whole step's tokens in one call."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._load = _LoadCollector()
        registry.register(self._load)
        self.num_preemptions = _Counter("vllm:num_preemptions", "Cumulative number of preemptions.", [LABEL])
        self.prompt_tokens = _Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [LABEL])
        self.generation_tokens = _Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", [LABEL]
        )
        self.request_success = _Counter(
            "vllm:request_success",
            "Count of finished requests by finished reason.",
            [LABEL, "finished_reason"],
        )
        self.time_to_first_token = _Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            [LABEL],
            TTFT_BUCKETS,
        )
        self.inter_token_latency = _Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            [LABEL],
            ITL_BUCKETS,
        )
        self.e2e_request_latency = _Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            [LABEL],
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_queue_time = _Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            [LABEL],
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefix_cache_queries = _Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [LABEL],
        )
        self.prefix_cache_hits = _Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", [LABEL]
        )
        registry.register(
            _Accumulated(
                self._lock,
                [
                    self.num_preemptions,
                    self.prefix_cache_queries,
                    self.prefix_cache_hits,
                    self.prompt_tokens,
                    self.generation_tokens,
                    self.request_success,
                    self.time_to_first_token,
                    self.inter_token_latency,
                    self.e2e_request_latency,
                    self.request_queue_time,
                ],
            )
        )

    def attach(self, snapshot: Callable[[], Any]) -> None:
        """Read the gauges from ``snapshot()`` (an ``EngineBackend.load_snapshot``) at each scrape."""
        self._load.snapshot = snapshot

    # -- hooks (the executor's worker thread) --------------------------------------------------------
    def preempted(self, model: str, n: int = 1) -> None:
        with self._lock:
            self.num_preemptions.add((model,), n)

    def prefix_cache(self, model: str, queries: int, hits: int) -> None:
        """Prompt tokens looked up in a prefix cache, and how many of them were cached."""
        if queries:
            with self._lock:
                self.prefix_cache_queries.add((model,), queries)
                self.prefix_cache_hits.add((model,), hits)

    def first_token(self, model: str, prompt_tokens: int, ttft_s: float) -> None:
        key = (model,)
        with self._lock:
            self.prompt_tokens.add(key, prompt_tokens)
            self.time_to_first_token.observe(key, max(0.0, ttft_s))

    def tokens(self, model: str, n: int) -> None:
        if n:
            with self._lock:
                self.generation_tokens.add((model,), n)

    def inter_token(self, model: str, seconds: float) -> None:
        with self._lock:
            self.inter_token_latency.observe((model,), max(0.0, seconds))

    def decode_step(self, model: str, now: float, previous: dict[float, int], tokens: int) -> None:
        """One step gave ``model``'s requests ``tokens`` tokens at ``now``; ``previous`` maps the time of
        a request's previous token to how many of them had it then (their inter-token latency is
        ``now`` - that time; in a steady batch, one entry for the whole step)."""
        key = (model,)
        with self._lock:
            if tokens:
                self.generation_tokens.add(key, tokens)
            observe = self.inter_token_latency.observe
            for t, n in previous.items():
                observe(key, max(0.0, now - t), n)

    def finished(self, model: str, reason: str, queue_s: float, latency_s: float, counted: bool) -> None:
        """A request ended with FinishReason ``reason`` (its name); ``counted``: it was admitted (it has
        a queue time and an end-to-end latency here)."""
        key = (model,)
        with self._lock:
            self.request_success.add((model, FINISHED_REASONS.get(reason, reason.lower())), 1)
            if counted and reason != "MIGRATED":
                self.request_queue_time.observe(key, max(0.0, queue_s))
                self.e2e_request_latency.observe(key, max(0.0, latency_s))


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def engine_metrics(registry: CollectorRegistry | None = None) -> EngineMetrics:
    """The engine metrics on ``registry`` (default: the process's), created once per registry."""

    reg = registry or process_registry()
    with _lock:
        m = _by_registry.get(reg)
        if m is None:
            m = _by_registry[reg] = EngineMetrics(reg)
        return m

"""Prometheus metrics (prometheus-client) for every llmfleet process.

Each process exports its metrics on ONE :class:`~prometheus_client.CollectorRegistry` of its own
(:func:`process_registry`), never on prometheus-client's global default registry, so tests can build
several in one interpreter. Engines export vLLM's metric names (``vllm:*``, :mod:`.engine`); the control
plane exports ``llmfleet_*`` (:mod:`.control`). :mod:`.server` serves ``/metrics``.
"""

from llmfleet.metrics.server import (
    MetricsServer,
    add_metrics_arg,
    metrics_port,
    process_registry,
    start_metrics_server,
)

__all__ = ["MetricsServer", "add_metrics_arg", "metrics_port", "process_registry", "start_metrics_server"]

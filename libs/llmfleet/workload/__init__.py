"""Workloads for the simulator: timed requests with known lengths, from traces or synthesized.

- ``request``: ``WorkloadRequest`` / ``Workload`` (sorted, windowed, JSONL round trip, summary).
- ``azure_trace``: the Azure LLM inference trace CSV loader.
- ``arrivals``: seeded arrival processes (Poisson, Gamma, replay, piecewise Poisson/Gamma,
  thinned/sinusoid, one per service with ``per_service_arrivals``).
- ``synthesis``: SeaLLM-style multi-service synthesis by k-means over (prompt, output) lengths.
- ``datasets``: (prompt, output) token lengths from Alpaca-style data sets.
"""

from llmfleet.workload.arrivals import (
    SeedLike,
    gamma,
    per_service_arrivals,
    piecewise_gamma,
    piecewise_poisson,
    poisson,
    replay,
    sinusoid_poisson,
    thinned_poisson,
)
from llmfleet.workload.azure_trace import (
    AZURE_COLUMNS,
    TraceFormatError,
    TraceRecord,
    load_azure_trace,
    read_azure_trace,
)
from llmfleet.workload.datasets import alpaca_lengths, approx_token_count
from llmfleet.workload.request import Workload, WorkloadRequest
from llmfleet.workload.synthesis import (
    ServiceCluster,
    ServiceMix,
    assign_models,
    from_lengths,
    length_features,
    synthesize,
)

__all__ = [
    "AZURE_COLUMNS",
    "SeedLike",
    "ServiceCluster",
    "ServiceMix",
    "TraceFormatError",
    "TraceRecord",
    "Workload",
    "WorkloadRequest",
    "alpaca_lengths",
    "approx_token_count",
    "assign_models",
    "from_lengths",
    "gamma",
    "length_features",
    "load_azure_trace",
    "per_service_arrivals",
    "piecewise_gamma",
    "piecewise_poisson",
    "poisson",
    "read_azure_trace",
    "replay",
    "sinusoid_poisson",
    "synthesize",
    "thinned_poisson",
]

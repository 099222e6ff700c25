"""Workloads for the simulator: timed requests with known lengths, from traces or synthesized.

- ``request``: ``WorkloadRequest`` / ``Workload`` (sorted, windowed, JSONL round trip, summary).
- ``azure_trace``: the Azure LLM inference trace CSV loader.
- ``arrivals``: seeded arrival processes (Poisson, Gamma, replay, piecewise Poisson/Gamma,
  thinned/sinusoid, one per service with ``per_service_arrivals``).
- ``synthesis``: SeaLLM-style multi-service synthesis by k-means over (prompt, output) lengths.
- ``datasets``: (prompt, output) token lengths from Alpaca-style data sets.
- ``popularity``: function popularity (MAF counts file or a Zipf law) dealt round-robin to services.
- ``paperlike``: lengths from published statistics (ShareGPT-like, LongBench-like) and merged
  per-service bursty (Gamma, CV > 1) arrival processes.
- ``prompts``: a request's prompt content (its service's system prompt, seeded segments) as token ids
  or text; ``with_system_prompts`` gives plain requests per-service system prompts.
- ``conversations``: multi-turn conversations, each turn resending the history (LMSYS-Chat-1M's
  means), ``users`` (a closed population of users, each holding one conversation after another), and
  ``deal_sessions`` to label them with services whole.
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
from llmfleet.workload.conversations import (
    LMSYS_CHAT_1M,
    ConversationStats,
    conversations,
    deal_sessions,
    users,
)
from llmfleet.workload.datasets import alpaca_lengths, approx_token_count
from llmfleet.workload.paperlike import (
    LONGBENCH_SEALLM,
    SHAREGPT_VLLM,
    LengthStats,
    lognormal_lengths,
    longbench_like_lengths,
    multi_service_workload,
    sharegpt_like_lengths,
)
from llmfleet.workload.popularity import (
    Popularity,
    PopularityFormatError,
    load_function_counts,
    round_robin_shares,
    zipf_exponent_for,
    zipf_popularity,
)
from llmfleet.workload.prompts import prompt_text, prompt_token_ids, with_system_prompts
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
    "LMSYS_CHAT_1M",
    "LONGBENCH_SEALLM",
    "SHAREGPT_VLLM",
    "ConversationStats",
    "LengthStats",
    "Popularity",
    "PopularityFormatError",
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
    "conversations",
    "deal_sessions",
    "from_lengths",
    "gamma",
    "length_features",
    "load_azure_trace",
    "load_function_counts",
    "lognormal_lengths",
    "longbench_like_lengths",
    "multi_service_workload",
    "per_service_arrivals",
    "piecewise_gamma",
    "piecewise_poisson",
    "poisson",
    "prompt_text",
    "prompt_token_ids",
    "read_azure_trace",
    "replay",
    "round_robin_shares",
    "sharegpt_like_lengths",
    "sinusoid_poisson",
    "synthesize",
    "thinned_poisson",
    "users",
    "with_system_prompts",
    "zipf_exponent_for",
    "zipf_popularity",
]

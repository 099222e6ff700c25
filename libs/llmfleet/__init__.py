"""llmfleet: serve many LLMs on a shared GPU cluster under per-model latency SLOs."""

__version__ = "0.1.0"

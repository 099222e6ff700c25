"""Native torch executor pieces: paged attention over the unified KV pool for the Llama family."""

from llmfleet_engine.native.runner import PagedRunner, SeqStep, UnsupportedModelError, kv_shape_of

__all__ = ["PagedRunner", "SeqStep", "UnsupportedModelError", "kv_shape_of"]

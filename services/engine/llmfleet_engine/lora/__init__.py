"""LoRA adapters on the native engine: reading PEFT adapters, the bounded adapter pool of a base model
and the Linear modules that add each token's adapter delta in one batched computation."""

from llmfleet_engine.lora.adapter import AdapterError, LoraAdapter, load_adapter
from llmfleet_engine.lora.linear import LoraLinear, StepMask
from llmfleet_engine.lora.pool import DEFAULT_TARGETS, AdapterPool, pool_bytes

__all__ = [
    "DEFAULT_TARGETS",
    "AdapterError",
    "AdapterPool",
    "LoraAdapter",
    "LoraLinear",
    "StepMask",
    "load_adapter",
    "pool_bytes",
]

"""A model an engine hosts: the loaded model, its runner, its KV shape and its reservation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfleet.kvblocks import KvShape

from llmfleet_engine.models import LoadedModel


@dataclass(eq=False)
class HostedModel:
    loaded: LoadedModel
    runner: Any  # PagedRunner (native) or the emulated engine's step pricer
    shape: KvShape
    tokens_per_block: int
    reserved_bytes: int

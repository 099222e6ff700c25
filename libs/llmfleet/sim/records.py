"""Per-request outcome of a simulation (the raw material of every metric)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    service: str
    model: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    instance: str = ""
    first_token_s: float | None = None
    finish_s: float | None = None
    produced: int = 0  # output tokens generated so far (kept across preemptions)
    solo_s: float = 0.0  # execution time alone at the model's reference TP (Fleet.solo_time)
    preemptions: int = 0
    moves: int = 0
    requeues: int = 0  # static batching: times it went back to the queue/pool unfinished (slice or OOM end)
    failed: str = ""  # why the request could not be served ("" = served)
    tenant: str = ""  # the API key it comes from (fair queueing while it is held)
    priority: int | None = None  # its own priority (None: its service's)
    adapter: str = ""  # the LoRA adapter it names ("" : its model itself); it runs on ``model``, the base
    # prompt tokens its first prefill found in the prefix cache (None: not prefilled yet, or not told)
    cached_tokens: int | None = None
    # when it first went to an engine: its arrival, or the end of its hold in the scheduler (None: not yet)
    dispatched_s: float | None = None
    # the workload request, when it says what its prompt holds (prefix caching hashes its token ids)
    content: Any = field(default=None, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.finish_s is not None

    @property
    def latency_s(self) -> float:
        assert self.finish_s is not None
        return self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        assert self.first_token_s is not None
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (Aladdin's ATGT); 0 for one-token outputs."""
        assert self.finish_s is not None and self.first_token_s is not None
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["content"]
        return out

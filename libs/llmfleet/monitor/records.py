"""What the service monitor is fed: one :class:`Completion` per finished request (plain data)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request of ``service``: times in seconds on the recorder's clock.

    ``ok`` is False for a request that failed (it misses every SLO; its latencies are not in the
    distributions). ``tpot_s`` is (finish − first token) / (output_tokens − 1), 0 for one token.
    """

    service: str
    model: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    latency_s: float
    ok: bool = True

    @property
    def finish_s(self) -> float:
        return self.arrival_s + self.latency_s

    @classmethod
    def timed(
        cls,
        service: str,
        model: str,
        arrival_s: float,
        first_token_s: float | None,
        finish_s: float,
        prompt_tokens: int,
        output_tokens: int,
        ok: bool = True,
    ) -> Completion:
        """From timestamps (a request that produced no token has ttft = latency)."""
        first = finish_s if first_token_s is None else first_token_s
        tpot = (finish_s - first) / (output_tokens - 1) if output_tokens > 1 else 0.0
        return cls(
            service, model, arrival_s, prompt_tokens, output_tokens, first - arrival_s, max(tpot, 0.0),
            finish_s - arrival_s, ok,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestSample:
    """A completed request of the recent workload, enough to replay it: its arrival time (on the
    holder's clock) and its prompt and output lengths."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int

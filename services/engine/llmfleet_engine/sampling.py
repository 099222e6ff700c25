"""Token selection: greedy argmax and seeded temperature + top-p (nucleus) sampling.

Pure functions over a 1-D logits tensor. Sampling draws on the CPU from a per-request
``torch.Generator`` so a seed reproduces the same tokens whatever device produced the logits.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Validated sampling parameters of one request (``temperature == 0`` means greedy)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed``, or with a fresh random seed when ``seed`` is None."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(secrets.randbits(63) if seed is None else int(seed))
    return gen


def position_seed(seed: int, index: int) -> int:
    """The generator seed of output token ``index`` of a request seeded with ``seed``: each token's draw
    depends on (seed, position) alone, so a request resumed elsewhere from its first ``index`` tokens
    (engine failover, a scheduler replica taking over) continues exactly as it would have."""
    return (int(seed) * 0x9E3779B97F4A7C15 + int(index)) % (1 << 63)


def greedy(logits: torch.Tensor) -> int:
    """The index of the largest logit (first one on ties, like ``torch.argmax``)."""
    return int(torch.argmax(logits, dim=-1).item())


def top_p_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Float32 CPU probabilities after temperature scaling and nucleus truncation (renormalised).

    Keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (always at least one).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = torch.softmax(logits.detach().float().cpu() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum()


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """Draw one token id from ``top_p_probs(logits, ...)`` using ``generator``."""
    probs = top_p_probs(logits, temperature, top_p)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def select_token(logits: torch.Tensor, params: SamplingConfig, generator: torch.Generator | None) -> int:
    """Greedy when ``params.temperature == 0``, otherwise seeded nucleus sampling."""
    if params.greedy:
        return greedy(logits)
    if generator is None:
        raise ValueError("sampling needs a generator (see make_generator)")
    return sample(logits, params.temperature, params.top_p, generator)

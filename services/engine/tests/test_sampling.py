"""Greedy selection and seeded nucleus sampling."""

from __future__ import annotations

import pytest
import torch
from llmfleet_engine.sampling import SamplingConfig, greedy, make_generator, sample, select_token, top_p_probs


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert greedy(logits) == 1
    assert select_token(logits, SamplingConfig(max_tokens=1), None) == 1


def test_top_p_keeps_smallest_nucleus() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = top_p_probs(probs.log(), temperature=1.0, top_p=0.8)
    assert torch.allclose(kept, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)
    assert top_p_probs(probs.log(), 1.0, 0.01).tolist() == [1.0, 0.0, 0.0, 0.0]  # always one token
    assert torch.allclose(top_p_probs(probs.log(), 1.0, 1.0), probs)


def test_temperature_sharpens() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0])
    cold, hot = top_p_probs(logits, 0.1, 1.0), top_p_probs(logits, 10.0, 1.0)
    assert cold[2] > 0.99 and hot.max() < 0.4


def test_seeded_sampling_is_reproducible() -> None:
    logits = torch.randn(512, generator=torch.Generator().manual_seed(0))

    def draw(seed: int | None) -> list[int]:
        gen = make_generator(seed)
        return [sample(logits, 1.0, 0.95, gen) for _ in range(32)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    assert draw(None) != draw(None)


def test_invalid_parameters() -> None:
    with pytest.raises(ValueError):
        top_p_probs(torch.zeros(3), 0.0, 1.0)
    with pytest.raises(ValueError):
        top_p_probs(torch.zeros(3), 1.0, 0.0)
    with pytest.raises(ValueError):
        select_token(torch.zeros(3), SamplingConfig(max_tokens=1, temperature=1.0), None)

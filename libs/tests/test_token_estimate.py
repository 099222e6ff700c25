"""The scheduler's prompt-token estimate: the regex count, scaled per model by what engines counted."""

from __future__ import annotations

import pytest
from llmfleet.token_estimate import MAX_SCALE, PromptTokens, approx_token_count
from llmfleet.workload.prompts import segment_text


def test_the_raw_estimate_counts_short_words_once_and_bytes_not_characters() -> None:
    assert approx_token_count("") == 0
    assert approx_token_count("abcd " * 10) == 10  # ten short words: one token each
    assert approx_token_count("é") == 1


def test_the_raw_estimate_reads_the_emulated_words_as_two_tokens_each() -> None:
    text = segment_text(7, 1000)  # 1,000 words t0 … t99: one token each to the emulated tokenizer
    assert approx_token_count(text) == 2000


def test_a_model_is_scaled_by_its_own_engines_counts_only() -> None:
    est = PromptTokens()
    assert est.estimate("emu", 2000) == 2000  # nothing counted yet: the raw estimate
    est.observe("emu", 2000, 1000)
    est.observe("emu", 400, 200)
    assert est.scale("emu") == pytest.approx(0.5) and est.estimate("emu", 2000) == 1000
    assert est.estimate("other", 2000) == 2000  # another model's tokenizer is not assumed alike
    assert est.estimate("emu", 1) == 1 and est.estimate("emu", 0) == 0  # a non-empty prompt: ≥ 1


def test_the_ratio_weighs_tokens_and_follows_a_change_of_traffic() -> None:
    est = PromptTokens(half_life=10)
    est.observe("m", 10_000, 10_000)  # one long prompt counted as estimated
    est.observe("m", 10, 30)  # a short one at 3x weighs as its tokens, not as one request of two
    assert est.scale("m") == pytest.approx((10_000 * 0.5**0.1 + 30) / (10_000 * 0.5**0.1 + 10))
    for _ in range(200):  # the traffic changes: the old prompts' weight decays away
        est.observe("m", 100, 200)
    assert est.scale("m") == pytest.approx(2.0, rel=1e-3)


def test_the_scale_is_bounded_and_nonsense_is_ignored() -> None:
    est = PromptTokens()
    est.observe("m", 1, 10_000)
    assert est.scale("m") == MAX_SCALE
    est.observe("n", 10_000, 1)
    assert est.scale("n") == 1 / MAX_SCALE
    est.observe("z", 0, 5)
    est.observe("z", 5, 0)
    assert est.scale("z") == 1.0
    with pytest.raises(ValueError, match="half_life"):
        PromptTokens(half_life=0)

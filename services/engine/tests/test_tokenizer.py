"""The embedded byte-level BPE tokenizer: round trips, determinism, save/load through AutoTokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmfleet_engine import tokenizer as tk
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "héllo wörld — naïve café, 日本語のテキスト 🙂👍🏽",
    "  leading spaces\n\nnew lines\ttabs   trailing  ",
    "def f(x):\n    return x ** 2  # squares",
    "",
]


def test_vocab_and_special_tokens() -> None:
    tok = tk.build_tokenizer()
    assert 512 <= len(tok) <= 1024
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id] == [0, 1, 2]
    vocab = tok.get_vocab()
    assert all(ch in vocab for ch in pre_tokenizers.ByteLevel.alphabet())  # all 256 byte symbols
    assert tok("hi")["input_ids"][0] == tok.bos_token_id


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(text: str) -> None:
    tok = tk.build_tokenizer()
    ids = tok(text)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_merges_compress_english() -> None:
    tok = tk.build_tokenizer()
    text = "the weather in the morning"
    assert len(tok(text, add_special_tokens=False)["input_ids"]) < len(text.encode()) / 2


def test_deterministic_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert tk.train_tokenizer().to_str() == tk.train_tokenizer().to_str()  # training is deterministic
    tk.save_tokenizer(a)
    tk.save_tokenizer(b)
    names = sorted(p.name for p in a.iterdir())
    assert "tokenizer.json" in names
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_auto_tokenizer_loads_saved_copy(tmp_path: Path) -> None:
    built = tk.save_tokenizer(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(loaded) == len(built)
    for text in TEXTS:
        assert loaded(text)["input_ids"] == built(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text

"""(prompt, output) token lengths from instruction data sets, for ``synthesis.from_lengths``.

``alpaca_lengths`` reads an Alpaca-style JSON list of ``{"instruction", "input", "output"}`` objects
(``input`` may be missing). The prompt text is built as in ``llmfleet.predict.dataset``: the
instruction, plus ``"\\n" + input`` when the input is non-empty.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

from llmfleet.predict.dataset import prompt_text

Tokenizer = Callable[[str], int]

_PIECES = re.compile(r"[A-Za-z]+|\d+|\S")


def approx_token_count(text: str) -> int:
    """An APPROXIMATE token count from a regex, not a real tokenizer; pass one when counts matter.

    Runs of ASCII letters count one token per started 6 letters (common English words are one BPE
    token, long rare words several), runs of digits one per started 3 digits, and every other
    non-space character one token (punctuation; each CJK or accented character, which overcounts
    Latin text with accents). It ignores the tokenizer's vocabulary, so it can be off by tens of
    percent on code, numbers or non-English text.
    """
    n = 0
    for m in _PIECES.finditer(text):
        piece = m.group()
        if piece[0].isascii() and piece[0].isalpha():
            n += math.ceil(len(piece) / 6)
        elif piece[0].isascii() and piece[0].isdigit():
            n += math.ceil(len(piece) / 3)
        else:
            n += 1
    return n


def _count(tokenizer: Tokenizer, text: str, where: str) -> int:
    n = tokenizer(text)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{where}: tokenizer must return an int >= 0, got {n!r}")
    return n


def alpaca_lengths(path: str | Path, tokenizer: Tokenizer | None = None) -> list[tuple[int, int]]:
    """(prompt_tokens, output_tokens) per item, counted with ``tokenizer`` (str → int) or, by default,
    ``approx_token_count``. An empty output counts as 1 token: every request generates at least one."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Alpaca data set not found: {p}")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from e
    if not isinstance(raw, list):
        raise ValueError(f"{p}: expected a JSON list of {{instruction, input, output}} objects")
    count = tokenizer or approx_token_count
    out = []
    for i, rec in enumerate(raw):
        where = f"{p}: item {i}"
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
        missing = [k for k in ("instruction", "output") if k not in rec]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}; found {sorted(rec)}")
        for key in ("instruction", "input", "output"):
            value = rec.get(key)
            if not isinstance(value, str) and not (key == "input" and value is None):
                raise ValueError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
        prompt = prompt_text(rec["instruction"], rec.get("input") or "")
        out.append((_count(count, prompt, where), max(1, _count(count, rec["output"], where))))
    return out

"""(prompt, output) token lengths from instruction data sets, for ``synthesis.from_lengths``.

``alpaca_lengths`` reads an Alpaca-style JSON list of ``{"instruction", "input", "output"}`` objects
(``input`` may be missing). The prompt text is built as in ``llmfleet.predict.dataset``: the
instruction, plus ``"\\n" + input`` when the input is non-empty.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from llmfleet.predict.dataset import prompt_text
from llmfleet.token_estimate import approx_token_count

Tokenizer = Callable[[str], int]


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

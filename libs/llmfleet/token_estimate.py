"""The one prompt-token estimator for components that hold no tokenizer (the scheduler's admission,
dispatch and SCLS pool; synthetic workloads). Engines count real tokens and report them."""

from __future__ import annotations

import math
import re

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

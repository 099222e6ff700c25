"""The one prompt-token estimator for components that hold no tokenizer (the scheduler's admission,
dispatch and SCLS pool; synthetic workloads). Engines count real tokens and report them."""

from __future__ import annotations

import re
import string

_PIECES = re.compile(r"[A-Za-z]+|\d+|\S")
_LETTERS = frozenset(string.ascii_letters)
_DIGITS = frozenset(string.digits)


def approx_token_count(text: str) -> int:
    """An APPROXIMATE token count from a regex, not a real tokenizer; pass one when counts matter.

    Runs of ASCII letters count one token per started 6 letters (common English words are one BPE
    token, long rare words several), runs of digits one per started 3 digits, and every other
    non-space character one token (punctuation; each CJK or accented character, which overcounts
    Latin text with accents). It ignores the tokenizer's vocabulary, so it can be off by tens of
    percent on code, numbers or non-English text.
    """
    n = 0
    for piece in _PIECES.findall(text):  # strings, not match objects: a scheduler runs this per request
        if piece[0] in _LETTERS:
            n += (len(piece) + 5) // 6
        elif piece[0] in _DIGITS:
            n += (len(piece) + 2) // 3
        else:
            n += 1
    return n

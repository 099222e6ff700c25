"""The one prompt-token estimator for components that hold no tokenizer (the scheduler's admission,
dispatch and SCLS pool; synthetic workloads). Engines count real tokens and report them."""

from __future__ import annotations

import re

# one match per estimated token: a run of ASCII letters splits into pieces of up to 6, a run of ASCII
# digits into pieces of up to 3, and every other non-space character is a piece of its own
_TOKENS = re.compile(r"[A-Za-z]{1,6}|[0-9]{1,3}|[^\sA-Za-z0-9]")


def approx_token_count(text: str) -> int:
    """An APPROXIMATE token count from a regex, not a real tokenizer; pass one when counts matter.

    Runs of ASCII letters count one token per started 6 letters (common English words are one BPE
    token, long rare words several), runs of ASCII digits one per started 3 digits, and every other
    non-space character one token (punctuation; each CJK, accented or non-ASCII digit character, which
    overcounts Latin text with accents). It ignores the tokenizer's vocabulary, so it can be off by tens
    of percent on code, numbers or non-English text.
    """
    # subn counts the matches without a list of them (a scheduler runs this once per request)
    return _TOKENS.subn("", text)[1]

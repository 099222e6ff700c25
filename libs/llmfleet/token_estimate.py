"""The one prompt-token estimator for components that hold no tokenizer (the scheduler's admission,
dispatch and SCLS pool; synthetic workloads). Engines count real tokens and report them; the
scheduler scales its estimate per model by their counts (:class:`PromptTokens`)."""

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


MAX_SCALE = 8.0  # the counted tokens per estimated token a model's scale is kept within (and its inverse)


class PromptTokens:
    """The scheduler's prompt-token estimate per model: :func:`approx_token_count` scaled by what that
    model's engines counted.

    The regex reads text as common BPE tokenizers split English; a model's own tokenizer may split
    another way (code, other languages, a chat template's added tokens, or the emulated models' one
    token per ``t17`` word, which the regex reads as two). Each engine reports a request's real prompt
    tokens in its usage; :meth:`observe` takes that count beside the request's raw estimate, and
    :meth:`estimate` scales a raw estimate by the model's ratio of counted to estimated tokens over its
    recent requests (sums decayed by half every ``half_life`` observations, so long prompts weigh as
    the KV they take, and the ratio follows a change of traffic), kept within [1/8, 8]. A model no
    engine has counted yet keeps the raw estimate."""

    def __init__(self, half_life: float = 200.0) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0, got {half_life!r}")
        self._keep = 0.5 ** (1.0 / half_life)
        self._sums: dict[str, tuple[float, float]] = {}  # model -> (counted, estimated), decayed

    def scale(self, model: str) -> float:
        """Counted tokens per estimated token for ``model`` (1.0 until its engines counted one)."""
        counted, estimated = self._sums.get(model, (0.0, 0.0))
        if estimated <= 0:
            return 1.0
        return min(MAX_SCALE, max(1.0 / MAX_SCALE, counted / estimated))

    def estimate(self, model: str, raw: int) -> int:
        """``raw`` (the :func:`approx_token_count` of a prompt for ``model``) scaled; at least 1 when
        ``raw`` is."""
        if raw <= 0:
            return 0
        return max(1, round(raw * self.scale(model)))

    def observe(self, model: str, raw: int, counted: int) -> None:
        """An engine of ``model`` counted ``counted`` prompt tokens in a prompt estimated at ``raw``."""
        if raw <= 0 or counted <= 0:
            return
        c, e = self._sums.get(model, (0.0, 0.0))
        self._sums[model] = (c * self._keep + counted, e * self._keep + raw)

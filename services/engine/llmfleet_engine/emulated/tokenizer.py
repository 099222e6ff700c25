"""The emulated models' tokenizer: one token per whitespace-separated word.

A ``tokenizers`` WordLevel model (the library real checkpoints use) wrapped as a ``transformers`` fast
tokenizer, so the engine's validation, detokenizer and stop strings treat it as any other. Words
``t0`` … ``t{V-5}`` have fixed ids; any other word is ``<unk>``, still exactly one token: a prompt of
``n`` words is ``n`` prompt tokens, which is how ``llmfleet load --trace`` sends a trace's prompt
lengths. Generated ids decode to ``t<id>`` words.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<s>", "</s>", "<pad>", "<unk>")  # ids 0..3, as the tiny tokenizer
BOS_ID, EOS_ID, PAD_ID, UNK_ID = range(4)
WORD_BASE = len(SPECIALS)
MAX_CONTEXT = 1 << 20


def word(token_id: int) -> str:
    """The word of a regular token id."""
    return f"t{token_id - WORD_BASE}"


@lru_cache(maxsize=8)
def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of ``vocab_size`` ids (shared by every emulated model of that vocab)."""
    if vocab_size <= WORD_BASE:
        raise ValueError(f"vocab_size must exceed {WORD_BASE}, got {vocab_size}")
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update((word(i), i) for i in range(WORD_BASE, vocab_size))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with one space
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_CONTEXT,
    )

"""The emulated models' tokenizer: one token per whitespace-separated word.

A ``tokenizers`` WordLevel model (the library real checkpoints use) wrapped as a ``transformers`` fast
tokenizer, so the engine's validation, detokenizer and stop strings treat it as any other. Words
``t0`` … ``t{V-5}`` have fixed ids; any other word gets a stable id of its own (CRC-32 of its UTF-8
bytes over the regular ids, the same in every process), still exactly one token. So a prompt of ``n``
words is ``n`` prompt tokens, which is how ``llmfleet load --trace`` sends a trace's prompt lengths, and
two texts share prefix-cache blocks where they share leading words, as with a real tokenizer (two
distinct words share an id only by a collision of their hashes over the ``V - 4`` regular ids: about
``n² / 2V`` pairs among ``n`` distinct words). Every id decodes to its ``t<k>`` word: generated text and
decoded prompts read as those words.

A text is encoded by the library alone (which releases the GIL: an engine host's event loops keep
running while a worker thread tokenizes); only a text in which it found an unknown word is rewritten,
each such word as the word of its id where the library's split found it (so a special token glued to a
word stays special), and encoded again.
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import BatchEncoding, PreTrainedTokenizerFast

SPECIALS = ("<s>", "</s>", "<pad>", "<unk>")  # ids 0..3, as the tiny tokenizer
BOS_ID, EOS_ID, PAD_ID, UNK_ID = range(4)
WORD_BASE = len(SPECIALS)
MAX_CONTEXT = 1 << 20


def word(token_id: int) -> str:
    """The word of a regular token id."""
    return f"t{token_id - WORD_BASE}"


def unknown_word_id(text: str, vocab_size: int) -> int:
    """The stable regular id of a word outside the vocabulary."""
    return WORD_BASE + zlib.crc32(text.encode()) % (vocab_size - WORD_BASE)


def _has_unknown(ids: Any) -> bool:
    """Whether encoded ``input_ids`` (one sequence, a batch, or a tensor of either) hold ``<unk>``."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return any(_has_unknown(row) for row in ids) if ids and isinstance(ids[0], list) else UNK_ID in ids


class WordTokenizer(PreTrainedTokenizerFast):
    """The word-level tokenizer, giving each word outside the vocabulary its stable id."""

    def _encode_plus(self, text: Any, text_pair: Any = None, *args: Any, **kwargs: Any) -> BatchEncoding:
        # every encoding entry point (``__call__``, ``encode``, batches) ends here
        encoded = super()._encode_plus(text, text_pair, *args, **kwargs)
        if not _has_unknown(encoded["input_ids"]):
            return encoded
        pair = self.known_words(text_pair) if text_pair is not None else None
        return super()._encode_plus(self.known_words(text), pair, *args, **kwargs)

    def known_words(self, text: Any) -> Any:
        """``text`` (a string, or nested lists of them) with every unknown word replaced by its id's word."""
        if not isinstance(text, str):
            return type(text)(self.known_words(t) for t in text)
        # the library's own split (added tokens first, then words) says where each unknown word stands,
        # so a special token glued to a word (``<s>hello``) stays special
        pieces = self.backend_tokenizer.encode(text, add_special_tokens=False)
        out, end = [], 0
        for token_id, (start, stop) in zip(pieces.ids, pieces.offsets, strict=True):
            if token_id == UNK_ID and text[start:stop] != self.unk_token:
                out += [text[end:start], " ", word(unknown_word_id(text[start:stop], self.vocab_size)), " "]
                end = stop
        return "".join([*out, text[end:]])


@lru_cache(maxsize=8)
def word_tokenizer(vocab_size: int) -> WordTokenizer:
    """A word-level tokenizer of ``vocab_size`` ids (shared by every emulated model of that vocab)."""
    if vocab_size <= WORD_BASE:
        raise ValueError(f"vocab_size must exceed {WORD_BASE}, got {vocab_size}")
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update((word(i), i) for i in range(WORD_BASE, vocab_size))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with one space
    return WordTokenizer(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_CONTEXT,
    )

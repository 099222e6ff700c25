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
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from functools import lru_cache

from tokenizers import NormalizedString, PreTokenizedString, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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


class KnownWords:
    """A pre-tokenizer step that rewrites each word outside ``vocab`` as the word of its stable id.

    A text of known words only (every replayed trace prompt) passes through untouched after one set
    test; otherwise the text is rebuilt once, word by word."""

    def __init__(self, vocab: Iterable[str], vocab_size: int) -> None:
        self.vocab = frozenset(vocab)
        self.vocab_size = vocab_size

    def known(self, text: str) -> str:
        return text if text in self.vocab else word(unknown_word_id(text, self.vocab_size))

    def rewrite(self, _index: int, text: NormalizedString) -> list[NormalizedString]:
        words = str(text).split()
        if self.vocab.issuperset(words):
            return [text]
        return [NormalizedString(" ".join(map(self.known, words)))]

    def pre_tokenize(self, pretok: PreTokenizedString) -> None:
        pretok.split(self.rewrite)


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
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_CONTEXT,
    )
    # a custom (Python) step cannot be serialized, and the wrapper copies the tokenizer it is given, so
    # the step goes onto the wrapper's own backend tokenizer
    fast.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.PreTokenizer.custom(KnownWords(vocab, vocab_size)), pre_tokenizers.WhitespaceSplit()]
    )
    return fast

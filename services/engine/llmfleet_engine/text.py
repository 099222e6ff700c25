"""Incremental detokenization and stop strings for streamed completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21
    DecodeStream = None


class IncrementalDetokenizer:
    """Turns a token stream into text deltas without splitting multi-byte characters.

    Fast tokenizers use the tokenizers library's native ``DecodeStream`` (one Rust call per token);
    others fall back to the Python window decoding below.

    Decodes a short window of recent tokens twice (before/after the new token) and emits the new
    suffix only once it no longer ends in an incomplete character (U+FFFD). ``context_ids`` (the
    prompt tail) give decoders that strip a leading space the right context.
    """

    def __init__(self, tokenizer: Any, context_ids: Sequence[int] = (), context_window: int = 4) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context_ids)[-context_window:] if context_window else []
        self._prefix = 0
        self._read = len(self._ids)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._native = None
        if backend is not None and DecodeStream is not None:
            self._native = (DecodeStream(skip_special_tokens=True), backend)
            if self._ids:  # the prompt tail as context, its own text discarded
                self._native[0].step(backend, list(self._ids))
            self._held: list[int] = []

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _delta(self) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        return after[len(before) :] if len(after) > len(before) else ""

    def push(self, token_id: int) -> str:
        """Add a token; returns the newly completed text (possibly empty)."""
        if self._native is not None:
            stream, backend = self._native
            text = stream.step(backend, token_id)
            if text is None:
                self._held.append(token_id)
                return ""
            self._held.clear()
            return text
        self._ids.append(token_id)
        delta = self._delta()
        if not delta or delta.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix > 64:  # keep the window short
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return delta

    def flush(self) -> str:
        """Text of tokens still held back (an incomplete character decodes as U+FFFD)."""
        if self._native is not None:
            held, self._held = self._held, []
            return self._decode(held) if held else ""
        delta = self._delta()
        self._prefix = self._read = len(self._ids)
        return delta


class TextStream:
    """Detokenized completion text with stop strings: never releases text that may start a stop."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), context_ids: Sequence[int] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, context_ids)
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped_on_replay = False

    def replay(self, token_ids: Sequence[int]) -> None:
        """Feed tokens the consumer already has (resume, migration) without emitting their text."""
        for token in token_ids:
            self.stopped_on_replay = self.push(token)[1] or self.stopped_on_replay

    def _holdback(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:k]):
                    best = k
                    break
        return best

    def _cut_at_stop(self) -> int | None:
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token; returns (text safe to release, whether a stop string matched)."""
        if not self._stop:  # nothing to hold back or cut: the detokenizer's text as it comes
            return self._detok.push(token_id), False
        self._pending += self._detok.push(token_id)
        cut = self._cut_at_stop()
        if cut is not None:
            out, self._pending = self._pending[:cut], ""
            return out, True
        release = len(self._pending) - self._holdback()
        out, self._pending = self._pending[:release], self._pending[release:]
        return out, False

    def finish(self) -> str:
        """All remaining text at the end of the stream (cut before a stop string if one matches)."""
        self._pending += self._detok.flush()
        cut = self._cut_at_stop()
        out = self._pending if cut is None else self._pending[:cut]
        self._pending = ""
        return out

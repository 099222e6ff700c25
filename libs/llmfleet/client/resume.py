"""Exactly-once delivery over a resumable token stream.

After a retry the scheduler replays the request from the start (or from any earlier token), so the
client sees chunks it already delivered. Tokens are deduplicated by ``TokenChunk.index`` (the position
of ``token_ids[0]`` in the completion). Text is deduplicated by character position: the scheduler's
chunk texts concatenate to the completion text, so the text offset of a replayed chunk is known from
the offset recorded when a chunk starting at the same token index was first delivered. Replayed
tokens are checked against the delivered ones, so a request that was silently re-run with different
output fails loudly (DATA_LOSS) instead of splicing two different completions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import grpc

from llmfleet.api.v1 import common_pb2
from llmfleet.client.errors import Internal
from llmfleet.client.types import Chunk

log = logging.getLogger(__name__)


@dataclass
class StreamResumer:
    """Turns possibly-replayed TokenChunks into gap-free, duplicate-free :class:`Chunk` s."""

    request_id: str = ""
    next_index: int = 0  # tokens delivered so far
    text_len: int = 0  # characters delivered so far
    # token index -> characters delivered before the first chunk that started at that index
    _text_at: dict[int, int] = field(default_factory=lambda: {0: 0})
    _cursor_index: int | None = None  # token index the next chunk of this attempt should start at
    _cursor_text: int | None = None  # text offset of that position, None when unknown
    _delivered: list[int] = field(default_factory=list)  # token ids delivered so far

    def begin_attempt(self) -> None:
        """Call before reading a new stream for the same request (the server may replay)."""
        self._cursor_index = None
        self._cursor_text = None

    def accept(self, msg: common_pb2.TokenChunk) -> Chunk | None:
        """The not-yet-delivered part of ``msg``, or None when it only repeats delivered output."""
        start, ids = msg.index, list(msg.token_ids)
        if start > self.next_index:
            raise Internal(
                grpc.StatusCode.DATA_LOSS,
                f"token stream gap: expected a chunk starting at or before index {self.next_index}, "
                f"got index {start}",
                request_id=self.request_id or None,
            )
        if start != self._cursor_index:  # first chunk of an attempt, or the server jumped: re-align text
            self._cursor_text = self._text_at.get(start)
            if self._cursor_text is None and start == self.next_index:
                self._cursor_text = self.text_len
            if self._cursor_text is None:
                log.warning(
                    "request %s: replay starts at token %d, not at a known chunk boundary; "
                    "text of overlapping tokens may repeat",
                    self.request_id,
                    start,
                )
        self._cursor_index = start + len(ids)

        overlap = ids[: max(0, self.next_index - start)]
        if overlap != self._delivered[start : start + len(overlap)]:
            raise Internal(
                grpc.StatusCode.DATA_LOSS,
                f"replayed tokens {start}..{start + len(overlap) - 1} differ from the ones already delivered "
                "(the request was re-run instead of resumed)",
                request_id=self.request_id or None,
            )
        new_ids = ids[len(overlap) :]
        text = msg.text
        if self._cursor_text is not None:
            new_text = text[max(0, self.text_len - self._cursor_text) :]
            self._cursor_text += len(text)
        else:  # unknown alignment: keep the text only when the chunk brings new tokens
            new_text = text if new_ids else ""
        if not new_ids and not new_text:
            return None

        index = max(start, self.next_index)
        self._text_at.setdefault(index, self.text_len)
        self.next_index = max(self.next_index, start + len(ids))
        self._delivered.extend(new_ids)
        self.text_len += len(new_text)
        if self._cursor_text is None:  # delivered past the overlap: positions are in sync again
            self._cursor_text = self.text_len
        return Chunk(text=new_text, token_ids=tuple(new_ids), index=index)

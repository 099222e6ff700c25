"""Per-request journal: the tokens delivered so far, the outcome, and who is listening.

The journal is what makes request ids idempotent (a retried id attaches to the running request or
replays its finished result; it never runs twice) and what lets a stream survive an engine change:
chunks are kept in completion order, numbered by token index, so nothing is sent twice or skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
from llmfleet.api.v1 import common_pb2


class RequestFailed(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, retry_after_s: int | None = None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.retry_after_s = retry_after_s  # overloaded: when to try again (RESOURCE_EXHAUSTED)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC's retry pushback (``grpc-retry-pushback-ms``) when the failure says when to retry."""
        if self.retry_after_s is None:
            return ()
        return (("grpc-retry-pushback-ms", str(int(self.retry_after_s * 1000))),)


@dataclass
class RequestRecord:
    request_id: str
    service: str
    model: str
    fingerprint: bytes  # the serialized request minus its id: a reused id must carry the same request
    arrival: float = field(default_factory=time.monotonic)
    chunks: list[common_pb2.TokenChunk] = field(default_factory=list)
    n_tokens: int = 0
    prompt_tokens: int = 0
    # the prompt's tokens as estimated here (no tokenizer): approx_token_count (``prompt_raw``), counted
    # once, scaled by what the model's engines counted (llmfleet.token_estimate.PromptTokens)
    prompt_estimate: int = 0
    prompt_raw: int = 0
    first_token_at: float | None = None
    dispatched_at: float | None = None
    engine_ttft_s: float = 0.0  # the first engine's own TTFT (its final chunk's usage)
    cached_tokens: int = 0  # prompt tokens the first engine found in its prefix cache (its usage)
    final: common_pb2.TokenChunk | None = None
    error: RequestFailed | None = None
    subscribers: int = 0
    driver: asyncio.Task | None = None
    engines: list[str] = field(default_factory=list)
    finished_at: float | None = None
    on_done: Callable[[RequestRecord], None] | None = None  # set by Journal.add: finish-order index
    release: Callable[[], None] | None = None  # admission: leaves the waiting queue (first token, end)
    # tokens the client already held when it resumed here (its scheduler replica died): not streamed
    # again, numbered before the first chunk, and part of what the engine continues from
    prefix_token_ids: tuple[int, ...] = ()
    session: str = ""  # the conversation the request continues (dispatch affinity; "" when none)
    # Followers parked until the next change (plain futures: a Condition's lock per chunk costs more).
    _waiters: list[asyncio.Future] = field(default_factory=list)
    # Followers that take each chunk as it is added (``stream_to``: no wake-up per chunk), and their
    # futures, set when the request ends
    _listeners: list[Callable[[common_pb2.TokenChunk], None]] = field(default_factory=list)
    _end_waiters: list[asyncio.Future] = field(default_factory=list)

    def final_chunk(self, reason: int, engine_id: str = "") -> common_pb2.TokenChunk:
        """The request's final chunk, ending now for ``reason``, with its usage so far."""
        now = time.monotonic()
        return common_pb2.TokenChunk(
            request_id=self.request_id,
            index=self.n_tokens,
            finish_reason=reason,
            engine_id=engine_id or (self.engines[-1] if self.engines else ""),
            usage=common_pb2.Usage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.n_tokens,
                queue_s=(self.dispatched_at or now) - self.arrival,
                ttft_s=(self.first_token_at or now) - self.arrival,
                latency_s=now - self.arrival,
                engine_ttft_s=self.engine_ttft_s,
                cached_tokens=self.cached_tokens,
            ),
        )

    @property
    def done(self) -> bool:
        return self.final is not None or self.error is not None

    def delivered_token_ids(self) -> list[int]:
        return [*self.prefix_token_ids, *(t for c in self.chunks for t in c.token_ids)]

    async def append(self, chunk: common_pb2.TokenChunk) -> None:
        """Add an engine chunk; tokens this journal already has (index < n_tokens) are dropped."""
        self.add(chunk)

    def add(self, chunk: common_pb2.TokenChunk) -> None:
        """``append`` without the coroutine (the relay's callback path)."""
        skip = self.n_tokens - chunk.index
        if skip > 0:
            if skip >= len(chunk.token_ids):
                return
            del chunk.token_ids[:skip]
            chunk.text = ""  # text of a partial overlap cannot be split reliably; tokens are authoritative
            chunk.index = self.n_tokens
        if not chunk.token_ids and not chunk.text:
            return
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            if self.release is not None:
                self.release()
        self.n_tokens += len(chunk.token_ids)
        self.chunks.append(chunk)
        for listener in self._listeners:
            listener(chunk)
        if self._waiters:
            self._notify()

    async def finish(self, final: common_pb2.TokenChunk) -> None:
        self.final = final
        self.finished_at = time.monotonic()
        if self.release is not None:
            self.release()
        self._notify()
        if self.on_done is not None:
            self.on_done(self)

    async def fail(self, code: grpc.StatusCode, details: str, retry_after_s: int | None = None) -> None:
        if self.done:
            return
        self.error = RequestFailed(code, details, retry_after_s)
        self.finished_at = time.monotonic()
        if self.release is not None:
            self.release()
        self._notify()
        if self.on_done is not None:
            self.on_done(self)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        if self.done:
            waiters += self._end_waiters
            self._end_waiters = []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def stream_to(self, emit: Callable[[common_pb2.TokenChunk], None]) -> None:
        """``follow`` as a callback: every chunk from the start, new ones as they are added (called
        from ``add``), then the final chunk; raises the request's error instead of a final chunk."""
        for chunk in self.chunks:
            emit(chunk)
        if not self.done:
            self._listeners.append(emit)
            try:
                while not self.done:
                    waiter = asyncio.get_running_loop().create_future()
                    self._end_waiters.append(waiter)
                    await waiter
            finally:
                self._listeners.remove(emit)
        if self.error is not None:
            raise self.error
        assert self.final is not None
        emit(self.final)

    async def follow(self) -> AsyncIterator[common_pb2.TokenChunk]:
        """Every chunk from the start, then new ones as they come, then the final chunk (or raise)."""
        pos = 0
        while True:
            while pos < len(self.chunks):
                pos += 1
                yield self.chunks[pos - 1]
            if self.done:
                if self.error is not None:
                    raise self.error
                assert self.final is not None
                yield self.final
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


# A finished record as the journal keeps it: a tuple of strings, bytes and numbers, which the garbage
# collector stops tracking. As objects, 10,000 finished 16-token records are about 220,000 tracked
# objects; while the journal fills (after a start, or when traffic grows) full collections walk them
# all, each an event-loop pause of up to ~60 ms (3 of them over the first 10,000 requests; packed:
# none). Replays (a retried id) unpack a fresh record.
_Packed = tuple


def _pack(r: RequestRecord) -> _Packed:
    return (
        r.request_id,
        r.service,
        r.model,
        r.fingerprint,
        r.arrival,
        tuple(c.SerializeToString() for c in r.chunks),
        r.final.SerializeToString() if r.final is not None else b"",
        r.n_tokens,
        r.prompt_tokens,
        r.first_token_at,
        r.dispatched_at,
        tuple(r.engines),
        r.finished_at,
        r.prefix_token_ids,
    )


def _unpack(p: _Packed) -> RequestRecord:
    rid, service, model, fp, arrival, chunks, final, n, prompt, first, dispatched, engines, at, prefix = p
    return RequestRecord(
        request_id=rid,
        service=service,
        model=model,
        fingerprint=fp,
        arrival=arrival,
        chunks=[common_pb2.TokenChunk.FromString(c) for c in chunks],
        n_tokens=n,
        prompt_tokens=prompt,
        first_token_at=first,
        dispatched_at=dispatched,
        final=common_pb2.TokenChunk.FromString(final),
        engines=list(engines),
        finished_at=at,
        prefix_token_ids=prefix,
    )


@dataclass
class Journal:
    """Live and recently finished requests; finished ones are kept ``retain_s`` (at most ``capacity``).

    Finished records are indexed in finish order, so pruning pops expired ones off the front in O(1)
    each (a scan of every record on every ``add`` cost about 1 ms per request at 10,000 records), and
    kept packed (see ``_pack``), out of the garbage collector's sight. Whoever still holds the live
    record object (its followers, the relay) keeps using it; ``get`` returns a replayable copy."""

    retain_s: float = 600.0
    capacity: int = 10_000
    _records: OrderedDict[str, RequestRecord | _Packed] = field(default_factory=OrderedDict)
    _finished: OrderedDict[str, float] = field(default_factory=OrderedDict)  # id -> finished_at

    def get(self, request_id: str) -> RequestRecord | None:
        r = self._records.get(request_id)
        return _unpack(r) if type(r) is tuple else r

    def packed(self, request_id: str) -> _Packed | None:
        """The packed form kept of a finished request (see ``_pack``); None while it is live or gone."""
        r = self._records.get(request_id)
        return r if type(r) is tuple else None

    def add(self, record: RequestRecord) -> None:
        self._prune()
        self._records[record.request_id] = record
        record.on_done = self._record_done
        if record.done:
            self._record_done(record)

    def discard(self, request_id: str) -> None:
        self._records.pop(request_id, None)
        self._finished.pop(request_id, None)

    def live(self) -> list[RequestRecord]:
        return [r for r in self._records.values() if type(r) is not tuple and not r.done]

    def _record_done(self, record: RequestRecord) -> None:
        rid = record.request_id
        if self._records.get(rid) is not record:
            return
        self._finished[rid] = record.finished_at or time.monotonic()
        self._finished.move_to_end(rid)
        if record.error is None and record.final is not None:  # failed ones are discarded by their driver
            self._records[rid] = _pack(record)

    def _prune(self) -> None:
        horizon = time.monotonic() - self.retain_s
        finished = self._finished
        while finished:
            rid, at = next(iter(finished.items()))
            if at >= horizon and len(self._records) < self.capacity:
                break
            del finished[rid]
            self._records.pop(rid, None)

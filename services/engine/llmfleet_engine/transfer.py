"""KV export/import for live migration (Mell's "KV transfer"; token transfer when no KV is held).

Source side: ``pause`` takes a request out of scheduling (after the iteration in flight), ``export_header``
and ``export_tokens`` read its token state and K/V, then ``finish_migrated`` ends its stream with
MIGRATED and frees the blocks, or ``resume`` puts it back (the transfer failed). Destination side:
``begin_import`` checks model and shape and reserves blocks (nothing is allocated on a mismatch),
``ImportHandle.write`` copies token ranges, ``commit`` turns it into a running request whose chunks
are buffered until a consumer ``attach``es; ``abort`` frees everything.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from llmfleet.kvblocks import KvShape, OutOfBlocks

from llmfleet_engine.outputs import DuplicateRequestError, FinishReason, ResourceExhaustedError, TransferError
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import GenerationRequest

if TYPE_CHECKING:
    from llmfleet_engine.executor import Executor, _Request


@dataclass(frozen=True)
class TransferHeader:
    """Token state of a request in transit; its K/V for ``num_tokens`` tokens follows as chunks."""

    request_id: str
    model: str
    shape: KvShape
    num_tokens: int
    prompt: str
    prompt_token_ids: tuple[int, ...]
    generated_token_ids: tuple[int, ...]
    sampling: SamplingConfig
    service: str = ""
    rng_state: bytes = b""
    age_s: float = 0.0
    source_engine_id: str = ""


def pause(ex: Executor, request_id: str, timeout_s: float = 30.0) -> TransferHeader:
    """Stop scheduling ``request_id`` (waiting out the iteration in flight) and describe its state."""
    with ex._cond:
        r = _active(ex, request_id)
        r.paused = True
        deadline = time.monotonic() + timeout_s
        while request_id in ex._inflight:
            if not ex._cond.wait(max(0.0, deadline - time.monotonic())):
                r.paused = False
                raise TransferError(f"request {request_id!r} did not leave its iteration in {timeout_s}s")
        return _header(ex, r)


def resume(ex: Executor, request_id: str) -> bool:
    """Schedule a paused request again (the transfer failed); False if it is gone."""
    with ex._cond:
        r = ex._requests.get(request_id)
        if r is None or r.finished:
            return False
        r.paused = False
        ex._cond.notify_all()
        return True


def export_tokens(ex: Executor, request_id: str, start: int, end: int) -> bytes:
    """K/V of tokens [start, end) of a paused request in the canonical layout (KvStorage.export_tokens)."""
    with ex._cond:
        r = _active(ex, request_id)
        if not r.paused:
            raise TransferError(f"request {request_id!r} must be paused before its KV is read")
        if not 0 <= start < end <= r.in_kv:
            raise TransferError(f"token range [{start}, {end}) outside the {r.in_kv} tokens in the KV")
        blocks = ex.allocator.table(request_id).blocks
    return ex.storage.export_tokens(r.req.model, blocks, start, end)


def finish_migrated(ex: Executor, request_id: str, destination: str) -> None:
    """End the source side: final chunk MIGRATED (naming the destination), blocks freed."""
    with ex._cond:
        r = _active(ex, request_id)
        ex._finish_locked(r, FinishReason.MIGRATED, migrated_to=destination)
        ex._cond.notify_all()


def _active(ex: Executor, request_id: str) -> _Request:
    r = ex._requests.get(request_id)
    if r is None or r.finished:
        raise TransferError(f"no active request {request_id!r} on this engine")
    return r


def _header(ex: Executor, r: _Request) -> TransferHeader:
    rng = r.generator.get_state().numpy().tobytes() if r.generator is not None else b""
    return TransferHeader(
        request_id=r.request_id,
        model=r.req.model,
        shape=r.model.shape,
        num_tokens=r.in_kv,
        prompt=r.req.prompt,
        prompt_token_ids=r.req.prompt_token_ids,
        generated_token_ids=tuple(r.tokens),
        sampling=r.req.sampling,
        service=r.req.service,
        rng_state=rng,
        age_s=time.monotonic() - r.req.arrival_s,
    )


@dataclass
class ImportHandle:
    """Blocks reserved for an incoming request; fill them with ``write``, then ``commit`` or ``abort``."""

    ex: Executor
    header: TransferHeader
    blocks: tuple[int, ...]
    received: int = 0
    _done: bool = field(default=False, repr=False)

    def write(self, start: int, num_tokens: int, data: bytes) -> None:
        h = self.header
        if start != self.received or start + num_tokens > h.num_tokens or num_tokens <= 0:
            raise TransferError(
                f"chunk [{start}, {start + num_tokens}) out of order: expected start {self.received}, "
                f"{h.num_tokens} tokens in all"
            )
        expected = num_tokens * h.shape.bytes_per_token
        if len(data) != expected:
            raise TransferError(f"chunk of {num_tokens} tokens has {len(data)} bytes, expected {expected}")
        self.ex.storage.import_tokens(h.model, self.blocks, start, data)
        self.received += num_tokens

    def commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Adopt the request: it decodes from where the source stopped; output waits for ``attach``."""
        ex, h = self.ex, self.header
        if self.received != h.num_tokens:
            self.abort()
            raise TransferError(
                f"import of {h.request_id!r} incomplete: {self.received}/{h.num_tokens} tokens"
            )
        with ex._cond:
            model = ex._models.get(h.model)
            if model is None:
                self.abort_locked()
                raise TransferError(f"model {h.model!r} was unloaded during the import")
            req = GenerationRequest(
                request_id=h.request_id,
                model=h.model,
                prompt=h.prompt,
                prompt_token_ids=h.prompt_token_ids,
                sampling=h.sampling,
                arrival_s=time.monotonic() - h.age_s,
                service=h.service,
            )
            state = ex._new_state(req, model, loop, list(h.generated_token_ids))
            if state.generator is not None and h.rng_state:
                state.generator.set_state(torch.frombuffer(bytearray(h.rng_state), dtype=torch.uint8))
            state.attached = False
            state.scheduled_s = state.first_token_s = time.monotonic()
            ex._requests[h.request_id] = state
            self._done = True
            if h.num_tokens:
                state.in_kv = h.num_tokens
                state.sched.phase = "decode"
                ex._running.append(state)
                ex.policy.on_arrival(state.sched, time.monotonic())
                ex._cond.notify_all()
            else:  # token transfer: nothing in the KV, re-prefill here
                ex._enqueue_locked(state, time.monotonic())

    def abort(self) -> None:
        with self.ex._cond:
            self.abort_locked()

    def abort_locked(self) -> None:
        if not self._done:
            self._done = True
            if self.header.num_tokens and self.header.request_id in self.ex.allocator:
                self.ex.allocator.free(self.header.request_id)


def begin_import(ex: Executor, header: TransferHeader) -> ImportHandle:
    """Validate the header against this engine and reserve its blocks (nothing allocated on error)."""
    with ex._cond:
        model = ex._models.get(header.model)
        if model is None:
            raise TransferError(f"model {header.model!r} is not loaded here (loaded: {sorted(ex._models)})")
        if header.shape != model.shape:
            raise TransferError(
                f"KV shape mismatch for {header.model!r}: incoming {header.shape}, here {model.shape}"
            )
        n_full = len(header.prompt_token_ids) + len(header.generated_token_ids)
        if header.num_tokens and header.num_tokens != n_full - 1:
            raise TransferError(
                f"inconsistent state: {header.num_tokens} tokens of KV for {n_full} prompt + generated tokens"
            )
        if n_full > model.loaded.max_context:
            raise TransferError(
                f"{n_full} tokens exceed {header.model!r}'s context of {model.loaded.max_context}"
            )
        if header.request_id in ex._requests:
            raise DuplicateRequestError(f"request {header.request_id!r} is already active here")
        ex._check_fits(model, len(header.prompt_token_ids) + header.sampling.max_tokens)
        blocks: tuple[int, ...] = ()
        if header.num_tokens:
            try:
                table = ex.allocator.reserve_import(
                    header.request_id, header.model, header.shape, header.num_tokens
                )
            except OutOfBlocks as e:
                raise ResourceExhaustedError(f"no room for {header.num_tokens} tokens of KV: {e}") from e
            blocks = tuple(table.blocks)
        return ImportHandle(ex, header, blocks)

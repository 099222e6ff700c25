"""The executor's live-migration primitives (Mell's KV transfer; token transfer without KV): the
``migration`` part of :class:`~llmfleet_engine.executor.Executor` (``backend.KvMigration``).

Source side: ``pause_request`` takes a request out of scheduling (after the step in flight) and
describes its state, ``export_kv`` reads K/V of a token range, ``finish_migrated`` ends its stream with
MIGRATED, ``resume_request`` puts it back (the transfer failed). Destination side: ``begin_import``
checks model and shape and reserves blocks, ``write_import`` fills them, ``commit_import`` lands the
request in the engine core (``EngineCore.land``, with its KV or to re-prefill), ``abort_import`` frees
everything. ``llmfleet_engine.transfer`` is the protocol layer on top of these.

A request of a LoRA adapter travels as its base's KV (``TransferHeader.model``) with the adapter named
(``TransferHeader.adapter``): the destination refuses it, before any K/V is sent, unless the adapter is
registered here on that base; once landed, the engine core's adapter rule gives it the adapter's slot
(``EngineCore.land``: with its KV when a slot is free or evictable, else it re-prefills when one is).

Pauses nest (an ExportKv snapshot during a migration): the request runs again when its last holder
resumes it. A pause with ``moving_to`` claims the request for one migration; another migration of it
meanwhile is refused (``MigrationConflictError``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from llmfleet.engine_core import EngineCore
from llmfleet.kvblocks import BlockTable, OutOfBlocks
from llmfleet.rpc.migrate_status import NOT_ATTACHED

from llmfleet_engine.outputs import (
    DuplicateRequestError,
    FinishReason,
    MigrationConflictError,
    ResourceExhaustedError,
    TransferError,
)
from llmfleet_engine.transfer import ImportHandle, TransferHeader
from llmfleet_engine.validation import GenerationRequest

if TYPE_CHECKING:
    from llmfleet_engine.live_request import LiveRequest
    from llmfleet_engine.memory import KvPool
    from llmfleet_engine.model_host import HostedModel, ModelHost
    from llmfleet_engine.request_table import RequestTable, Retire


_RNG_STATE_BYTES = torch.Generator().get_state().numel()  # what pause_request sends (CPU generator)


class AdapterLookup(Protocol):
    """The LoRA adapters registered here (``AdapterHost``)."""

    def base_of(self, name: str) -> str | None:
        """The base model of adapter ``name``, or None when it is not registered here."""
        ...


class Admit(Protocol):
    """Make the executor's state of a request (its stream, detokenizer, sampler) from ``tokens``."""

    def __call__(
        self,
        request: GenerationRequest,
        model: HostedModel,
        loop: asyncio.AbstractEventLoop,
        tokens: list[int],
    ) -> LiveRequest: ...


@dataclass(eq=False)
class MigrationOps:
    """Pauses, exports and imports of requests, under the request table's lock. ``retire`` ends a
    migrated request; ``admit`` builds the state of an imported one. Also the
    :class:`~llmfleet_engine.transfer.ImportTarget` of its import handles. ``adapters``: the LoRA
    adapters registered here, which an incoming adapter's request needs."""

    table: RequestTable
    core: EngineCore
    pool: KvPool
    host: ModelHost
    retire: Retire
    admit: Admit
    adapters: AdapterLookup = field(kw_only=True)
    pauses: dict[str, int] = field(default_factory=dict, init=False)  # request -> pause holders
    moving: dict[str, str] = field(default_factory=dict, init=False)  # request -> its destination
    # requests with an import begun, not yet committed or aborted
    importing: set[str] = field(default_factory=set, init=False)

    def forget(self, request_id: str) -> None:
        """``request_id`` was retired (native: nothing kept per request beyond the pauses)."""

    def pause_request(
        self, request_id: str, timeout_s: float = 30.0, *, moving_to: str = ""
    ) -> TransferHeader:
        """Stop scheduling ``request_id`` (waiting out the step in flight) and describe its state.
        ``moving_to``: the pause is a migration's (one at a time per request)."""
        with self.table.cond:
            r = self.table.active(request_id)
            if moving_to:
                if not r.attached:  # moved in, and the scheduler has not followed it here yet
                    raise MigrationConflictError(
                        f"request {request_id!r} {NOT_ATTACHED}: it can move once the scheduler follows it here"
                    )
                if (other := self.moving.get(request_id)) is not None:
                    raise MigrationConflictError(
                        f"request {request_id!r} is already being migrated to {other}"
                    )
                self.moving[request_id] = moving_to
            self.core.pause(request_id)
            self.pauses[request_id] = self.pauses.get(request_id, 0) + 1
            deadline = time.monotonic() + timeout_s
            while self.core.in_flight(request_id):
                if not self.table.cond.wait(max(0.0, deadline - time.monotonic())):
                    self._release_locked(request_id, bool(moving_to))
                    raise TransferError(f"request {request_id!r} did not leave its iteration in {timeout_s}s")
            kv = r.core.kv_tokens if r.core.sched.phase == "decode" else 0
            rng = r.generator.get_state().numpy().tobytes() if r.generator is not None else b""
            return TransferHeader(
                request_id=r.request_id,
                model=r.model.loaded.name,  # an adapter's request holds its base's KV
                adapter=r.core.adapter or "",
                shape=r.model.shape,
                num_tokens=kv,
                prompt=r.req.prompt,
                prompt_token_ids=r.req.prompt_token_ids,
                generated_token_ids=tuple(r.tokens),
                sampling=r.req.sampling,
                service=r.req.service,
                rng_state=rng,
                age_s=time.monotonic() - r.req.arrival_s,
            )

    def resume_request(self, request_id: str, *, moving: bool = False) -> bool:
        """Release one pause (``moving``: the migration's, which failed); the request is scheduled again
        when no pause holds it. False if it is gone."""
        with self.table.cond:
            return self._release_locked(request_id, moving)

    def _release_locked(self, request_id: str, moving: bool) -> bool:
        if moving:
            self.moving.pop(request_id, None)
        held = self.pauses.get(request_id, 0) - 1
        if held > 0:
            self.pauses[request_id] = held
        else:
            self.pauses.pop(request_id, None)
        r = self.table.requests.get(request_id)
        if r is None or r.finished:
            return False
        if held <= 0:
            self.core.resume(request_id)
            self.table.cond.notify_all()
        return True

    def export_kv(self, request_id: str, start: int, end: int) -> bytes:
        """K/V of tokens [start, end) of a paused request in the canonical layout."""
        with self.table.cond:
            r, table = self._kv_range_locked(request_id, start, end)
        return self.pool.storage.export_tokens(
            r.model.loaded.name, table.blocks, start, end
        )  # an adapter's KV is its base's

    def _kv_range_locked(self, request_id: str, start: int, end: int) -> tuple[LiveRequest, BlockTable]:
        """The paused request whose K/V tokens [start, end) are read, and its block table."""
        r = self.table.active(request_id)
        if not r.core.paused:
            raise TransferError(f"request {request_id!r} must be paused before its KV is read")
        held = r.core.kv_tokens if r.core.sched.phase == "decode" else 0
        if not 0 <= start < end <= held:
            raise TransferError(f"token range [{start}, {end}) outside the {held} tokens in the KV")
        return r, self.pool.allocator.table(request_id)

    def finish_migrated(self, request_id: str, destination: str) -> None:
        """End the source side: final chunk MIGRATED (naming the destination), blocks freed."""
        with self.table.cond:
            self.moving.pop(request_id, None)
            self.pauses.pop(request_id, None)
            r = self.table.active(request_id)
            self.retire(r, FinishReason.MIGRATED, migrated_to=destination)
            self.table.cond.notify_all()

    def begin_import(self, header: TransferHeader) -> ImportHandle:
        """Validate ``header`` against this engine and reserve its blocks (nothing allocated on error)."""
        with self.table.cond:
            model = self.host.hosted.get(header.model)
            if model is None:
                raise TransferError(
                    f"model {header.model!r} is not loaded here (loaded: {sorted(self.host.hosted)})"
                )
            self._check_adapter_locked(header)
            if header.shape != model.shape:
                raise TransferError(
                    f"KV shape mismatch for {header.model!r}: incoming {header.shape}, here {model.shape}"
                )
            vocab = model.loaded.vocab_size
            if any(t >= vocab for t in (*header.prompt_token_ids, *header.generated_token_ids)):
                raise TransferError(
                    f"header: token ids must be below {header.model!r}'s vocabulary of {vocab}"
                )
            if header.rng_state and len(header.rng_state) != _RNG_STATE_BYTES:
                raise TransferError(
                    f"header: rng_state must be a CPU generator state of {_RNG_STATE_BYTES} bytes, "
                    f"got {len(header.rng_state)}"
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
            if header.request_id in self.table.requests or header.request_id in self.core.requests:
                raise DuplicateRequestError(f"request {header.request_id!r} is already active here")
            if header.request_id in self.importing:  # two sources sending one request: keep the first
                raise DuplicateRequestError(f"request {header.request_id!r} is already being imported here")
            self.host.check_fits(model, len(header.prompt_token_ids) + header.sampling.max_tokens)
            blocks: tuple[int, ...] = ()
            if header.num_tokens:
                try:
                    table = self.pool.allocator.reserve_import(
                        header.request_id, header.model, header.shape, header.num_tokens
                    )
                except OutOfBlocks as e:
                    raise ResourceExhaustedError(f"no room for {header.num_tokens} tokens of KV: {e}") from e
                blocks = tuple(table.blocks)
            self.importing.add(header.request_id)
            return ImportHandle(self, header, blocks)

    def _check_adapter_locked(self, header: TransferHeader) -> None:
        """TransferError unless the request's LoRA adapter (if any) is registered here on its base."""
        if header.adapter and self.adapters.base_of(header.adapter) != header.model:
            raise TransferError(
                f"LoRA adapter {header.adapter!r} of {header.model!r} is not registered here (an engine "
                f"serves an adapter declared for a base it hosts); request {header.request_id!r} stays on "
                "its source"
            )

    def wire_bytes_per_token(self, header: TransferHeader) -> int:
        """Bytes one token of ``header``'s K/V takes on the wire (chunks are sized by it)."""
        return header.shape.bytes_per_token

    def check_chunk(self, header: TransferHeader, start: int, num_tokens: int, data: bytes) -> None:
        expected = num_tokens * header.shape.bytes_per_token
        if len(data) != expected:
            raise TransferError(f"chunk of {num_tokens} tokens has {len(data)} bytes, expected {expected}")

    def write_import(self, handle: ImportHandle, start: int, data: bytes) -> None:
        self.pool.storage.import_tokens(handle.header.model, handle.blocks, start, data)

    def commit_import(self, handle: ImportHandle, loop: asyncio.AbstractEventLoop) -> None:
        """Adopt the request: it decodes from where the source stopped (or re-prefills, for a token
        transfer); its output is buffered until a consumer ``attach``es."""
        h = handle.header
        with self.table.cond:
            model = self.host.hosted.get(h.model)
            if model is None:
                self.abort_import_locked(handle)
                raise TransferError(f"model {h.model!r} was unloaded during the import")
            if h.request_id in self.table.requests or h.request_id in self.core.requests:
                # never replace a live copy: its consumer would continue from this one's position
                self.abort_import_locked(handle)
                raise DuplicateRequestError(f"request {h.request_id!r} became active here during the import")
            try:
                self._check_adapter_locked(h)  # removed during the import
            except TransferError:
                self.abort_import_locked(handle)
                raise
            self.importing.discard(h.request_id)
            req = GenerationRequest(
                request_id=h.request_id,
                model=h.adapter or h.model,  # an adapter's request names its adapter, runs on its base
                prompt=h.prompt,
                prompt_token_ids=h.prompt_token_ids,
                sampling=h.sampling,
                arrival_s=time.monotonic() - h.age_s,
                service=h.service,
            )
            state = self.admit(req, model, loop, list(h.generated_token_ids))
            if state.generator is not None and h.rng_state:
                state.generator.set_state(torch.frombuffer(bytearray(h.rng_state), dtype=torch.uint8))
            state.attached = False
            state.scheduled_s = state.first_token_s = time.monotonic()
            self.table.requests[h.request_id] = state
            handle.done = True
            self.core.land(state.core, time.monotonic(), kv_tokens=h.num_tokens, reserved=bool(h.num_tokens))
            self.table.cond.notify_all()

    def abort_import(self, handle: ImportHandle) -> None:
        with self.table.cond:
            self.abort_import_locked(handle)

    def abort_import_locked(self, handle: ImportHandle) -> None:
        if not handle.done:
            handle.done = True
            rid = handle.header.request_id
            self.importing.discard(rid)
            if handle.header.num_tokens and rid in self.pool.allocator and rid not in self.core.requests:
                self.pool.allocator.free(rid)

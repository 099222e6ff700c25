"""The async side of KV transfer: header <-> protobuf, ExportKv/ImportKv streams, Migrate, link probes.

Migrate (source): pause the request, send the header to the destination's ImportKv and wait for its
acceptance (initial metadata ``llmfleet-kv-accepted: 1``, sent once it has reserved the blocks), then
stream the K/V chunks and end the local stream with MIGRATED. The handshake sends no K/V to a
destination that refuses, and lets the source read the refusal itself: a client stream that the server
ends while the client is still writing reports the failed write (INTERNAL), not the server's status. Any failure before the destination acknowledges resumes the
request here, so a broken transfer costs a pause, never the request. A failure after the destination
accepted the header may come after it committed the import (the reply lost): the source then cancels
the destination's copy (best effort; one that no consumer attaches is cancelled there after the
servicer's unattached timeout anyway), so the request runs in one place. Mode "kv" sends the K/V (Mell's
KV transfer); mode "tokens" sends the header alone and the destination re-prefills prompt + generated
tokens (Mell's token transfer; the same landing path as a request that holds no KV yet).

``measure_link``: stream a probe payload to another engine's ReceiveProbe and time it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import grpc
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.kvblocks import KvShape
from llmfleet.rpc.channels import open_channel

from llmfleet_engine.backend import KvMigration
from llmfleet_engine.outputs import TransferError
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.transfer import ImportHandle, TransferHeader

log = logging.getLogger(__name__)

DEFAULT_CHUNK_TOKENS = 256
MAX_CHUNK_BYTES = 1 << 20  # well under gRPC's default 4 MiB message limit of any client
TRANSFER_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 5.0  # how long a migration waits for the destination's connection
CANCEL_TIMEOUT_S = 2.0  # how long a failed migration tries to cancel a copy the destination may hold
ACCEPTED_METADATA = ("llmfleet-kv-accepted", "1")  # ImportKv's initial metadata once the header is taken

MigrateMode = Literal["kv", "tokens"]
MIGRATE_MODES: tuple[MigrateMode, ...] = ("kv", "tokens")

DEFAULT_PROBE_BYTES = 8 << 20
MAX_PROBE_BYTES = 1 << 30
_PROBE_PAYLOAD = bytes(MAX_CHUNK_BYTES)  # one zero-filled chunk, sliced for the last one


def header_to_proto(h: TransferHeader) -> engine_pb2.KvTransferHeader:
    s = h.sampling
    sampling = common_pb2.SamplingParams(
        max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, stop=list(s.stop)
    )
    if s.seed is not None:
        sampling.seed = s.seed
    return engine_pb2.KvTransferHeader(
        request_id=h.request_id,
        model=h.model,
        shape=engine_pb2.KvShape(
            num_layers=h.shape.num_layers,
            num_kv_heads=h.shape.num_kv_heads,
            head_dim=h.shape.head_dim,
            dtype=h.shape.dtype,
        ),
        num_tokens=h.num_tokens,
        prompt_token_ids=list(h.prompt_token_ids),
        generated_token_ids=list(h.generated_token_ids),
        sampling=sampling,
        service=h.service,
        rng_state=h.rng_state,
        age_s=h.age_s,
        source_engine_id=h.source_engine_id,
        prompt=h.prompt,
        adapter=h.adapter,
    )


def header_from_proto(m: engine_pb2.KvTransferHeader) -> TransferHeader:
    if not m.request_id or not m.model:
        raise TransferError("header: request_id and model are required")
    try:
        shape = KvShape(m.shape.num_layers, m.shape.num_kv_heads, m.shape.head_dim, m.shape.dtype)
    except ValueError as e:
        raise TransferError(f"header.shape: {e}") from None
    s = m.sampling
    if s.max_tokens <= 0:
        raise TransferError("header.sampling.max_tokens must be > 0")
    # what the source's validation guarantees; a bad header must not reach the tokenizer or sampler
    if not m.prompt_token_ids:
        raise TransferError("header.prompt_token_ids: must not be empty")
    for name in ("prompt_token_ids", "generated_token_ids"):
        if any(t < 0 for t in getattr(m, name)):
            raise TransferError(f"header.{name}: token ids must be >= 0")
    if not s.temperature >= 0:  # also NaN (the same rule as a request's validation)
        raise TransferError(f"header.sampling.temperature: must be >= 0, got {s.temperature}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise TransferError(f"header.sampling.top_p: must be in (0, 1], got {s.top_p}")
    if any(not x for x in s.stop):
        raise TransferError("header.sampling.stop: stop strings must not be empty")
    return TransferHeader(
        request_id=m.request_id,
        model=m.model,
        shape=shape,
        num_tokens=m.num_tokens,
        prompt=m.prompt,
        prompt_token_ids=tuple(m.prompt_token_ids),
        generated_token_ids=tuple(m.generated_token_ids),
        sampling=SamplingConfig(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p if s.HasField("top_p") else 1.0,
            seed=s.seed if s.HasField("seed") else None,
            stop=tuple(s.stop),
        ),
        service=m.service,
        rng_state=m.rng_state,
        age_s=m.age_s,
        source_engine_id=m.source_engine_id,
        adapter=m.adapter,
    )


async def export_stream(
    ops: KvMigration, header: TransferHeader, chunk_tokens: int
) -> AsyncIterator[engine_pb2.KvChunk]:
    """Header, then K/V in ranges of ``chunk_tokens`` tokens, at most MAX_CHUNK_BYTES each (the request
    must be paused)."""
    chunk_tokens = max(1, min(chunk_tokens, MAX_CHUNK_BYTES // max(1, ops.wire_bytes_per_token(header))))
    yield engine_pb2.KvChunk(header=header_to_proto(header))
    for start in range(0, header.num_tokens, chunk_tokens):
        end = min(start + chunk_tokens, header.num_tokens)
        data = await asyncio.to_thread(ops.export_kv, header.request_id, start, end)
        yield engine_pb2.KvChunk(data=engine_pb2.KvData(start_token=start, num_tokens=end - start, data=data))


async def import_stream(
    ops: KvMigration,
    chunks: AsyncIterator[engine_pb2.KvChunk],
    accepted: Callable[[], Awaitable[None]],
) -> engine_pb2.ImportKvResponse:
    """Consume an ImportKv stream; ``accepted()`` is awaited once the header's blocks are reserved
    (the servicer sends ``ACCEPTED_METADATA``); on any failure the reserved blocks are freed."""
    first = await anext(chunks, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise TransferError("ImportKv: the first message must be the header")
    header = header_from_proto(first.header)
    handle: ImportHandle = await asyncio.to_thread(ops.begin_import, header)
    nbytes = 0
    try:
        await accepted()
        async for msg in chunks:
            if msg.WhichOneof("payload") != "data":
                raise TransferError("ImportKv: only one header per stream")
            d = msg.data
            await asyncio.to_thread(handle.write, d.start_token, d.num_tokens, d.data)
            nbytes += len(d.data)
        handle.commit(asyncio.get_running_loop())
    except BaseException:
        handle.abort()
        raise
    return engine_pb2.ImportKvResponse(
        request_id=header.request_id, num_tokens=header.num_tokens, blocks=len(handle.blocks), bytes=nbytes
    )


async def _cancel_copy(stub: engine_pb2_grpc.EngineStub, request_id: str, destination: str) -> None:
    """Cancel the destination's copy of ``request_id`` after a failure that may have followed its commit
    (the reply lost), as the request runs on here. Best effort: if the destination cannot be reached,
    the copy, attached by no one, is cancelled there after its unattached timeout."""
    try:
        reply = await stub.Cancel(common_pb2.CancelRequest(request_id=request_id), timeout=CANCEL_TIMEOUT_S)
    except grpc.aio.AioRpcError as e:
        log.warning("migration of %s to %s failed after its header was accepted, and the cancel of a "
                    "copy there failed too (%s): the destination cancels it once unattached",
                    request_id, destination, e.code().name)  # fmt: skip
        return
    if reply.found:
        log.warning("migration of %s to %s failed after the import was committed there: that copy is "
                    "cancelled, the request runs on here", request_id, destination)  # fmt: skip


@dataclass(frozen=True)
class MigrationResult:
    num_tokens: int  # tokens of K/V sent (0: a token transfer)
    bytes: int  # K/V bytes sent
    transfer_s: float  # from the pause's end to the destination's acknowledgement
    pause_s: float  # how long the request did not decode here
    mode: MigrateMode = "kv"  # how it moved: "tokens" when no K/V went along


async def _connect(channel: grpc.aio.Channel, destination: str) -> None:
    """Wait for the channel's first connection attempt: READY, or a TransferError at once when it
    fails (refused, unreachable) or is still connecting after ``CONNECT_TIMEOUT_S``. (A call started
    while a fresh channel is still connecting can fail at once with UNAVAILABLE.)"""
    ready, failed = (
        grpc.ChannelConnectivity.READY,
        (
            grpc.ChannelConnectivity.TRANSIENT_FAILURE,
            grpc.ChannelConnectivity.SHUTDOWN,
        ),
    )
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    state = channel.get_state(try_to_connect=True)
    while state != ready:
        if state in failed:
            raise TransferError(f"transfer to {destination} failed: UNAVAILABLE: cannot connect")
        try:
            await asyncio.wait_for(
                channel.wait_for_state_change(state), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            raise TransferError(
                f"transfer to {destination} failed: UNAVAILABLE: not connected within {CONNECT_TIMEOUT_S:g}s"
            ) from None
        state = channel.get_state(try_to_connect=True)


async def _send(
    stub: engine_pb2_grpc.EngineStub, chunks: AsyncIterator[engine_pb2.KvChunk], accepted: Callable[[], None]
) -> engine_pb2.ImportKvResponse:
    """Send the header, wait for the destination's acceptance (then call ``accepted``), then stream the
    K/V chunks.

    A destination that refuses the header ends the call before any K/V is written, so its own status
    (e.g. FAILED_PRECONDITION "model not loaded") is what the caller sees; a destination that breaks
    midway may still surface as the failed write (INTERNAL)."""
    call = stub.ImportKv(timeout=TRANSFER_TIMEOUT_S)
    try:
        await call.write(await anext(chunks))
        if ACCEPTED_METADATA not in tuple(await call.initial_metadata() or ()):
            return await call  # refused: raises the destination's status
        accepted()
        async for chunk in chunks:
            await call.write(chunk)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        if not call.done():
            raise
    return await call  # the destination's reply, or the status that ended the call


async def migrate(
    ops: KvMigration,
    engine_id: str,
    request_id: str,
    destination: str,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    mode: MigrateMode = "kv",
) -> MigrationResult:
    """Move ``request_id`` to ``destination``; resumes it locally if anything fails before the commit.

    Raises ``RequestNotFoundError`` (not here), ``MigrationConflictError`` (another migration is moving
    it) or ``TransferError`` (the transfer failed; the request runs on here)."""
    if mode not in MIGRATE_MODES:
        raise ValueError(f"mode must be one of {MIGRATE_MODES}, got {mode!r}")
    t0 = time.perf_counter()
    header = await asyncio.to_thread(ops.pause_request, request_id, moving_to=destination)
    header = dataclasses.replace(
        header, source_engine_id=engine_id, num_tokens=header.num_tokens if mode == "kv" else 0
    )
    t1 = time.perf_counter()
    accepted = asyncio.Event()  # the destination took the header: from then on it may commit the import
    resumed = False

    def resume() -> None:
        nonlocal resumed
        if not resumed:
            resumed = True
            ops.resume_request(request_id, moving=True)

    try:
        async with open_channel(destination, tracing=False) as channel:  # see open_channel
            await _connect(channel, destination)
            stub = engine_pb2_grpc.EngineStub(channel)
            try:
                resp = await _send(stub, export_stream(ops, header, chunk_tokens), accepted.set)
            except Exception:
                if accepted.is_set():  # a committed import whose reply was lost must not run on there
                    resume()
                    await _cancel_copy(stub, request_id, destination)
                raise
    except BaseException as e:
        resume()
        if isinstance(e, grpc.aio.AioRpcError):
            raise TransferError(f"transfer to {destination} failed: {e.code().name}: {e.details()}") from e
        raise
    ops.finish_migrated(request_id, destination)
    done = time.perf_counter()
    moved: MigrateMode = "kv" if header.num_tokens else "tokens"
    log.info(
        "migrated %s to %s (%s): %d tokens, %d B in %.3fs",
        request_id,
        destination,
        moved,
        resp.num_tokens,
        resp.bytes,
        done - t1,
    )
    return MigrationResult(resp.num_tokens, resp.bytes, done - t1, done - t0, moved)


@dataclass(frozen=True)
class LinkMeasurement:
    destination: str
    bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


def _probe_chunks(nbytes: int) -> Iterator[engine_pb2.ProbeChunk]:
    full = len(_PROBE_PAYLOAD)
    for start in range(0, nbytes, full):
        n = min(full, nbytes - start)
        yield engine_pb2.ProbeChunk(data=_PROBE_PAYLOAD if n == full else _PROBE_PAYLOAD[:n])


async def measure_link(destination: str, nbytes: int = DEFAULT_PROBE_BYTES) -> LinkMeasurement:
    """Stream ``nbytes`` of zeros to ``destination``'s ReceiveProbe and time the call (after an empty
    probe that opens the connection, so the handshake is not counted; one round trip is).

    Raises ``TransferError`` when the destination cannot be reached or refuses the probe."""
    if not 0 < nbytes <= MAX_PROBE_BYTES:
        raise ValueError(f"bytes must be in (0, {MAX_PROBE_BYTES}], got {nbytes}")
    try:
        async with open_channel(destination) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            # connect first (one empty message: a stream of none ends CANCELLED on a dead peer)
            await stub.ReceiveProbe(iter((engine_pb2.ProbeChunk(),)), timeout=TRANSFER_TIMEOUT_S)
            t0 = time.perf_counter()
            ack = await stub.ReceiveProbe(_probe_chunks(nbytes), timeout=TRANSFER_TIMEOUT_S)
            seconds = time.perf_counter() - t0
    except grpc.aio.AioRpcError as e:
        raise TransferError(f"probe to {destination} failed: {e.code().name}: {e.details()}") from e
    if ack.bytes != nbytes:
        raise TransferError(f"probe to {destination}: sent {nbytes} B, {ack.bytes} B acknowledged")
    return LinkMeasurement(destination, nbytes, seconds)


async def receive_probe(chunks: AsyncIterator[engine_pb2.ProbeChunk]) -> engine_pb2.ProbeAck:
    """The receiving end of ``measure_link``: count the payload."""
    nbytes = 0
    t0: float | None = None
    async for msg in chunks:
        if t0 is None:
            t0 = time.perf_counter()
        nbytes += len(msg.data)
    return engine_pb2.ProbeAck(bytes=nbytes, seconds=time.perf_counter() - t0 if t0 is not None else 0.0)

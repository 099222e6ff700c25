"""The ``llmfleet.v1.Engine`` gRPC servicer: protobuf <-> executor dataclasses, errors -> statuses."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc.mux import GENERATE_MANY, Emit, StreamRefused, serve_many
from llmfleet.types import ModelSpec

from llmfleet_engine import kv_rpc
from llmfleet_engine.backend import (
    EmulatedLink,
    EngineBackend,
    KvMigration,
    LoraBackend,
    ModelHosting,
    ProfilingBackend,
)
from llmfleet_engine.executor import Executor
from llmfleet_engine.migrations import DEFAULT_MAX_MIGRATIONS, LinkTable, MigrateCall, Migrations
from llmfleet_engine.model_host import ModelHost
from llmfleet_engine.models import LoadedModel, ModelLoadError, ModelSourceNotFound
from llmfleet_engine.outputs import (
    DuplicateRequestError,
    EngineChunk,
    ExecutorClosedError,
    FinishReason,
    LoadSnapshot,
    ModelConflictError,
    QueueFullError,
    ResourceExhaustedError,
    TransferError,
)
from llmfleet_engine.stream import RequestStream
from llmfleet_engine.validation import (
    DEFAULT_MAX_TOKENS,
    UnknownModelError,
    ValidationError,
    validate_generate,
)

log = logging.getLogger(__name__)

MODE_TO_PROTO: dict[kv_rpc.MigrateMode, engine_pb2.MigrateMode] = {
    "kv": engine_pb2.MIGRATE_MODE_KV,
    "tokens": engine_pb2.MIGRATE_MODE_TOKENS,
}
MODE_FROM_PROTO = {v: k for k, v in MODE_TO_PROTO.items()}

DEFAULT_WATCH_INTERVAL_S = 1.0
MIN_WATCH_INTERVAL_S = 0.05
MAX_WATCH_INTERVAL_S = 3600.0


def chunk_to_proto(chunk: EngineChunk, engine_id: str) -> common_pb2.TokenChunk:
    msg = common_pb2.TokenChunk(
        request_id=chunk.request_id,
        index=chunk.index,
        token_ids=list(chunk.token_ids),
        text=chunk.text,
        engine_id=engine_id,
    )
    if chunk.finish_reason is not None:
        msg.finish_reason = int(chunk.finish_reason)
        msg.migrated_to = chunk.migrated_to
    if chunk.usage is not None:
        u = chunk.usage
        msg.usage.CopyFrom(
            common_pb2.Usage(
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                queue_s=u.queue_s,
                ttft_s=u.ttft_s,
                latency_s=u.latency_s,
                cached_tokens=u.cached_tokens,
            )
        )
    return msg


def snapshot_to_proto(snap: LoadSnapshot, engine_id: str) -> common_pb2.LoadSnapshot:
    msg = common_pb2.LoadSnapshot(
        engine_id=engine_id,
        timestamp=snap.timestamp,
        running=snap.running,
        waiting=snap.waiting,
        kv_used_bytes=snap.kv_used_bytes,
        kv_capacity_bytes=snap.kv_capacity_bytes,
        tokens_per_s=snap.tokens_per_s,
        models=[
            common_pb2.ModelLoad(
                model=m.model,
                running=m.running,
                waiting=m.waiting,
                kv_used_bytes=m.kv_used_bytes,
                kv_tokens=m.kv_tokens,
                kv_blocks=m.kv_blocks,
                tokens_per_block=m.tokens_per_block,
                adapters=m.adapters,
                adapter_loads=m.adapter_loads,
                adapter_slots=m.adapter_slots,
            )
            for m in snap.models
        ],
        kv_blocks_used=snap.kv_blocks_used,
        kv_blocks_total=snap.kv_blocks_total,
        preemptions=snap.preemptions,
        kv_fragmentation=snap.kv_fragmentation,
        max_running=snap.max_running,
    )
    cache = snap.prefix_cache
    if cache is not None:
        msg.prefix_cache.CopyFrom(
            common_pb2.PrefixCacheLoad(
                blocks=cache.blocks,
                idle_blocks=cache.idle_blocks,
                queries=cache.queries,
                hits=cache.hits,
            )
        )
    add = msg.requests.add  # one message per request, built in place
    rows = zip(snap.requests.rows(), snap.requests.adapter_column(), strict=True)
    for (rid, model, tokens, kv_bytes, phase), adapter in rows:
        add(request_id=rid, model=model, tokens=tokens, kv_bytes=kv_bytes, phase=phase, adapter=adapter)
    return msg


def loaded_model_to_proto(m: LoadedModel, host: ModelHosting) -> engine_pb2.LoadedModel:
    msg = engine_pb2.LoadedModel(
        name=m.name,
        source=m.source,
        architecture=m.architecture,
        weight_bytes=m.weight_bytes,
        max_context=m.max_context,
        kv_bytes_per_token=m.kv_bytes_per_token,
    )
    if isinstance(host, ModelHost):  # models in the native unified pool of blocks
        msg.tokens_per_block = host.tokens_per_block(m.name)
        msg.reserved_bytes = host.reserved_bytes(m.name)
    return msg


class EngineServicer(engine_pb2_grpc.EngineServicer):
    """Serves one engine backend (native ``Executor`` or ``VllmExecutor``) as engine ``engine_id``."""

    def __init__(
        self,
        executor: EngineBackend,
        engine_id: str,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        unattached_timeout_s: float = 30.0,
        max_migrations: int = DEFAULT_MAX_MIGRATIONS,
        links: LinkTable | None = None,
    ) -> None:
        self.executor = executor
        self.engine_id = engine_id
        self.default_max_tokens = default_max_tokens
        self.unattached_timeout_s = unattached_timeout_s
        self.links = links if links is not None else LinkTable()
        self.migrations = (
            Migrations(executor.migration, engine_id, max_in_flight=max_migrations, links=self.links)
            if executor.migration is not None
            else None
        )
        self._reapers: set[asyncio.Task] = set()

    def engine_info(self) -> engine_pb2.EngineInfo:
        ex = self.executor
        info = engine_pb2.EngineInfo(
            engine_id=self.engine_id,
            device=ex.device,
            backend=ex.backend,
            memory_bytes=ex.memory_bytes,
            kv_capacity_bytes=ex.host.kv_capacity_bytes,
            models=[loaded_model_to_proto(m, ex.host) for _, m in sorted(ex.host.models.items())],
            links=[
                engine_pb2.LinkEstimate(
                    destination=e.destination,
                    bytes_per_s=e.bytes_per_s,
                    bytes=e.bytes,
                    seconds=e.seconds,
                    source=e.source,
                    timestamp=e.timestamp,
                )
                for e in self.links.estimates()
            ],
            max_migrations=self.migrations.max_in_flight if self.migrations is not None else 0,
        )
        if isinstance(ex, Executor):
            info.kv_block_bytes = ex.plan.block_bytes
            info.kv_num_blocks = ex.plan.num_blocks
            info.policy = ex.policy.name
            info.memory_budget_bytes = ex.plan.budget_bytes
        return info

    async def Generate(
        self, request: engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        try:
            async for msg in self.generate_chunks(request):
                yield msg
        except StreamRefused as e:
            await context.abort(e.code, e.details)

    async def GenerateMany(
        self,
        request_iterator: AsyncIterator[engine_pb2.GenerateCommands],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[common_pb2.ChunkBatch]:
        """Generate's streams multiplexed on one call (``llmfleet.rpc.mux``)."""

        async def run(request: engine_pb2.GenerateRequest, _timeout: float | None, emit: Emit) -> None:
            await self.generate_into(request, emit)

        async for batch in serve_many(request_iterator, run, method=GENERATE_MANY, name="GenerateMany"):
            yield batch

    async def generate_chunks(
        self, request: engine_pb2.GenerateRequest
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        """One request's chunks (a new request, or one migrated in and attached); ``StreamRefused``
        with the status its Generate call ends with. Closing the iterator cancels the request."""
        stream = await self._open_stream(request)
        out: list[common_pb2.TokenChunk] = []
        try:
            async for chunk in stream:
                try:
                    self._to_proto(chunk, out.append)
                except StreamRefused:
                    for msg in out:  # an evicted request's last tokens go out before its status
                        yield msg
                    raise
                for msg in out:
                    yield msg
                out.clear()
        finally:  # client gone, deadline, or server shutdown: stop the work
            stream.close()

    async def generate_into(self, request: engine_pb2.GenerateRequest, emit: Emit) -> None:
        """``generate_chunks`` handing each chunk to ``emit`` as the worker produces it (no task wakes
        per token: the multiplexed path)."""
        stream = await self._open_stream(request)
        try:
            await stream.run_into(lambda chunk: self._to_proto(chunk, emit))
        finally:
            stream.close()

    def _to_proto(self, chunk: EngineChunk, emit: Emit) -> None:
        """``chunk`` as the stream's message; a request a drain evicted hands over its last tokens
        and ends UNAVAILABLE (its consumer resumes it elsewhere)."""
        # a request a drain evicted is resumed elsewhere by its consumer
        if chunk.finish_reason == FinishReason.CANCELLED and (
            why := self.executor.host.take_eviction(chunk.request_id)
        ):
            if chunk.token_ids:
                emit(chunk_to_proto(replace(chunk, finish_reason=None, usage=None), self.engine_id))
            raise StreamRefused(grpc.StatusCode.UNAVAILABLE, why)
        emit(chunk_to_proto(chunk, self.engine_id))

    async def _open_stream(self, request: engine_pb2.GenerateRequest) -> RequestStream:
        """Start ``request`` (or attach to it, migrated in); ``StreamRefused`` with Generate's status.

        The prompt is validated and tokenized on a worker thread: tokenizers release the GIL, so a long
        prompt (a few ms for thousands of tokens) does not hold up the event loop that streams every
        other request's tokens. The drain check and the submit follow on the loop, with no await
        between them. The request's TTFT and latency count from its receipt here, before tokenizing,
        as vLLM counts from its arrival time; the executor's scheduling sees it from the submit."""
        attached = self.executor.attach(request.request_id) if request.request_id else None
        try:
            if attached is not None:  # a request migrated in: continue its stream
                return attached
            models = self.executor.host.models
            base = request.model
            if isinstance(self.executor, LoraBackend):  # an engine's LoRA adapters run on their base
                models = self.executor.adapters.with_adapters(models)
                base = self.executor.adapters.base_of(request.model) or base
            received_s = time.monotonic()
            req = await asyncio.to_thread(
                validate_generate,
                request,
                models,
                default_max_tokens=self.default_max_tokens,
                received_s=received_s,
            )
            if why := self.executor.host.draining_reason(base):  # the relay re-routes UNAVAILABLE
                raise StreamRefused(grpc.StatusCode.UNAVAILABLE, f"{why}; retry on another engine")
            return self.executor.submit(req)
        except UnknownModelError as e:
            raise StreamRefused(grpc.StatusCode.NOT_FOUND, str(e)) from None
        except ValidationError as e:
            raise StreamRefused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        except DuplicateRequestError as e:
            raise StreamRefused(grpc.StatusCode.ALREADY_EXISTS, str(e)) from None
        except (QueueFullError, ResourceExhaustedError) as e:
            raise StreamRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
        except ExecutorClosedError as e:
            raise StreamRefused(grpc.StatusCode.UNAVAILABLE, str(e)) from None

    async def Cancel(
        self, request: common_pb2.CancelRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CancelResponse:
        return common_pb2.CancelResponse(found=self.executor.cancel(request.request_id))

    async def LoadModel(
        self, request: engine_pb2.LoadModelRequest, context: grpc.aio.ServicerContext
    ) -> engine_pb2.LoadModelResponse:
        spec_pb = request.model
        if not spec_pb.name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model.name: must not be empty")
        if not spec_pb.source:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model.source: must not be empty")
        spec = ModelSpec(name=spec_pb.name, source=spec_pb.source, dtype=spec_pb.dtype or "float32")
        started = time.perf_counter()
        try:
            result = await asyncio.to_thread(self.executor.host.load, spec)
        except ModelSourceNotFound as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model.source: {e}")
        except ModelLoadError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"model.source: {e}")
        except ModelConflictError as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"model.name: {e}")
        except ResourceExhaustedError as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except ExecutorClosedError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except Exception as e:
            log.exception("loading %s from %s failed", spec.name, spec.source)
            await context.abort(grpc.StatusCode.INTERNAL, f"loading {spec.source!r} failed: {e}")
        m = result.model
        return engine_pb2.LoadModelResponse(
            model=m.name,
            weight_bytes=m.weight_bytes,
            max_context=m.max_context,
            load_s=time.perf_counter() - started,
        )

    async def UnloadModel(
        self, request: engine_pb2.UnloadModelRequest, context: grpc.aio.ServicerContext
    ) -> engine_pb2.UnloadModelResponse:
        host = self.executor.host
        if not await asyncio.to_thread(host.unload, request.model):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.model!r} is not loaded on this engine; loaded: {list(host.model_names())}",
            )
        return engine_pb2.UnloadModelResponse(unloaded=True)

    async def GetInfo(
        self, request: engine_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> engine_pb2.EngineInfo:
        return self.engine_info()

    async def WatchLoad(
        self, request: engine_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.LoadSnapshot]:
        interval = request.interval_s if request.interval_s > 0 else DEFAULT_WATCH_INTERVAL_S
        interval = min(max(interval, MIN_WATCH_INTERVAL_S), MAX_WATCH_INTERVAL_S)
        while True:
            yield snapshot_to_proto(self.executor.load_snapshot(), self.engine_id)
            await asyncio.sleep(interval)

    # ------------------------------------------------------------ KV transfer

    async def _kv_migration(self, context: grpc.aio.ServicerContext) -> KvMigration:
        """The backend's KV migration; FAILED_PRECONDITION when it has none."""
        ops = self.executor.migration
        if ops is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the {self.executor.backend} backend has no KV transfer; it migrates by re-prefill",
            )
        assert ops is not None
        return ops

    async def ExportKv(
        self, request: engine_pb2.ExportKvRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[engine_pb2.KvChunk]:
        ops = await self._kv_migration(context)
        chunk_tokens = request.chunk_tokens or kv_rpc.DEFAULT_CHUNK_TOKENS
        try:
            header = await asyncio.to_thread(ops.pause_request, request.request_id)
        except TransferError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        try:  # a snapshot: the request keeps running here afterwards
            async for msg in kv_rpc.export_stream(ops, header, chunk_tokens):
                yield msg
        finally:
            ops.resume_request(request.request_id)

    async def ImportKv(
        self, request_iterator: AsyncIterator[engine_pb2.KvChunk], context: grpc.aio.ServicerContext
    ) -> engine_pb2.ImportKvResponse:
        ops = await self._kv_migration(context)
        try:
            resp = await kv_rpc.import_stream(
                ops,
                request_iterator,
                lambda: context.send_initial_metadata((kv_rpc.ACCEPTED_METADATA,)),
            )
        except (TransferError, DuplicateRequestError) as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ResourceExhaustedError as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        task = asyncio.create_task(self._reap_unattached(resp.request_id))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)
        return resp

    async def _reap_unattached(self, request_id: str) -> None:
        await asyncio.sleep(self.unattached_timeout_s)
        if self.executor.cancel_if_unattached(request_id):
            log.warning("imported request %s was never attached; cancelled", request_id)

    async def Migrate(
        self, request: engine_pb2.MigrateRequest, context: grpc.aio.ServicerContext
    ) -> engine_pb2.MigrateResponse:
        await self._kv_migration(context)
        assert self.migrations is not None  # a backend with KV migration has them
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: must not be empty")
        if not request.destination:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "destination: host:port is required")
        mode = MODE_FROM_PROTO.get(request.mode)
        if mode is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"mode: unknown MigrateMode {request.mode}")
        call = MigrateCall(
            request.request_id,
            request.destination,
            mode,
            request.chunk_tokens or kv_rpc.DEFAULT_CHUNK_TOKENS,
        )
        outcome = await self.migrations.migrate(call, request.migration_id)
        if outcome.code is not None:
            await context.abort(outcome.code, outcome.details)
        result = outcome.result
        assert result is not None
        return engine_pb2.MigrateResponse(
            request_id=request.request_id,
            num_tokens=result.num_tokens,
            bytes=result.bytes,
            transfer_s=result.transfer_s,
            pause_s=result.pause_s,
            mode=MODE_TO_PROTO[result.mode],
            migration_id=outcome.migration_id,
        )

    # ---------------------------------------------------------- link probes

    async def MeasureLink(
        self, request: engine_pb2.MeasureLinkRequest, context: grpc.aio.ServicerContext
    ) -> engine_pb2.MeasureLinkResponse:
        if not request.destination:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "destination: host:port is required")
        nbytes = request.bytes or kv_rpc.DEFAULT_PROBE_BYTES
        if nbytes > kv_rpc.MAX_PROBE_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"bytes: at most {kv_rpc.MAX_PROBE_BYTES}, got {nbytes}"
            )
        try:
            m = await kv_rpc.measure_link(request.destination, nbytes)
        except TransferError as e:
            await context.abort(grpc.StatusCode.ABORTED, str(e))
        self.links.record(m.destination, m.bytes, m.seconds, "probe")
        return engine_pb2.MeasureLinkResponse(
            destination=m.destination, bytes=m.bytes, seconds=m.seconds, bytes_per_s=m.bytes_per_s
        )

    async def ReceiveProbe(
        self, request_iterator: AsyncIterator[engine_pb2.ProbeChunk], context: grpc.aio.ServicerContext
    ) -> engine_pb2.ProbeAck:
        ack = await kv_rpc.receive_probe(request_iterator)
        link = self.executor.migration
        if isinstance(link, EmulatedLink):  # the payload arrives at the emulated link's speed
            await asyncio.sleep(max(0.0, link.link_seconds(ack.bytes) - ack.seconds))
        return ack

    # -------------------------------------------------------------- profiling

    async def Profile(
        self, request: engine_pb2.ProfileRequest, context: grpc.aio.ServicerContext
    ) -> engine_pb2.ProfileResponse:
        if not isinstance(self.executor, ProfilingBackend):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"{self.executor.backend} cannot profile"
            )
        loaded = self.executor.host.model_names()
        if request.model not in loaded:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"model {request.model!r} is not loaded; loaded: {list(loaded)}"
            )
        kwargs = {
            "batch_sizes": list(request.batch_sizes) or [1, 2, 4, 8],
            "input_lengths": list(request.input_lengths) or [16, 64, 256],
            "context_lengths": list(request.context_lengths) or [16, 64, 256],
            "repeats": request.repeats or 3,
        }
        try:
            result = await asyncio.to_thread(self.executor.profile, request.model, **kwargs)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except ResourceExhaustedError as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        return engine_pb2.ProfileResponse(
            model=request.model,
            device=self.executor.device,
            samples=[
                engine_pb2.ProfileSample(
                    phase=s.phase, batch_size=s.batch_size, tokens=s.tokens, seconds=s.seconds
                )
                for s in result.samples
            ],
        )

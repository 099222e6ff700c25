"""An in-process fake Scheduler for testing code that uses the SDK, without a cluster.

    fake = FakeScheduler(faults=[Fault(attempt=1, after_chunks=2)])
    server = await start_fake_scheduler(fake)          # on the current event loop
    # or, for blocking code:  with FakeSchedulerThread(fake) as srv: Client(srv.address) ...

The completion of a prompt is deterministic: token ``i`` has id ``1000 + i`` and text
``" <word><i>"`` where ``<word>`` cycles through the prompt's words. It honours max_tokens (default:
the service's max_tokens) and stop strings, validates requests like the real scheduler
(NOT_FOUND for an unknown service, INVALID_ARGUMENT for bad sampling parameters), replays a request
from index 0 when its id is submitted again, and can inject faults on chosen attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType

import grpc

from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.rpc.mux import SUBMIT_MANY, from_servicer, serve_many
from llmfleet.rpc.server import GrpcServer, service_name

BASE_TOKEN_ID = 1000


@dataclass(frozen=True)
class FakeService:
    name: str
    model: str = "fake-model"
    ttft_slo_s: float = 5.0
    tpot_slo_s: float = 0.5
    priority: int = 0
    max_tokens: int = 8  # the output cap of a request that sets none
    engines: tuple[str, ...] = ("fake-engine",)


@dataclass(frozen=True)
class Fault:
    """Abort the ``attempt``-th Submit of a request id (1-based) after ``after_chunks`` chunks."""

    attempt: int
    after_chunks: int
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    message: str = "injected fault"


def fake_completion(prompt: str, n: int) -> list[tuple[int, str]]:
    """The (token id, text) pairs the fake produces for ``prompt`` (before stop strings)."""
    words = prompt.split() or ["tok"]
    return [(BASE_TOKEN_ID + i, f" {words[i % len(words)]}{i}") for i in range(n)]


@dataclass
class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """A scriptable Scheduler servicer; inspect ``submits``/``attempts``/``cancelled`` in tests."""

    services: Sequence[FakeService] = (FakeService("chat"), FakeService("summarize", max_tokens=12))
    chunk_size: int = 1  # tokens per chunk on a request's first attempt
    replay_chunk_size: int | None = None  # tokens per chunk on later attempts (None: chunk_size)
    token_delay_s: float = 0.0  # sleep before each chunk
    faults: Sequence[Fault] = ()
    final_in_last_chunk: bool = False  # put finish_reason/usage on the last token chunk
    fail_services: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    engine_id: str = "fake-engine"
    # admission control: each request's first N attempts are refused RESOURCE_EXHAUSTED with this pushback
    overloaded_attempts: int = 0
    pushback_ms: int = 100
    submits: list[scheduler_pb2.SubmitRequest] = field(default_factory=list)
    attempts: Counter[str] = field(default_factory=Counter)
    cancelled: set[str] = field(default_factory=set)
    in_flight: set[str] = field(default_factory=set)
    submit_many_calls: int = 0  # SubmitMany calls opened (each carries many streams)

    def _service(self, name: str) -> FakeService | None:
        return next((s for s in self.services if s.name == name), None)

    def _validate(self, request: scheduler_pb2.SubmitRequest) -> tuple[grpc.StatusCode, str] | None:
        if request.service in self.fail_services:
            return self.fail_services[request.service]
        if self._service(request.service) is None:
            known = sorted(s.name for s in self.services)
            return grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; known: {known}"
        if not request.prompt:
            return grpc.StatusCode.INVALID_ARGUMENT, "prompt must not be empty"
        sp = request.sampling
        if sp.HasField("max_tokens") and sp.max_tokens <= 0:
            return grpc.StatusCode.INVALID_ARGUMENT, f"max_tokens must be > 0, got {sp.max_tokens}"
        if sp.HasField("temperature") and sp.temperature < 0:
            return grpc.StatusCode.INVALID_ARGUMENT, f"temperature must be >= 0, got {sp.temperature}"
        if sp.HasField("top_p") and not 0 < sp.top_p <= 1:
            return grpc.StatusCode.INVALID_ARGUMENT, f"top_p must be in (0, 1], got {sp.top_p}"
        return None

    def completion(
        self, request: scheduler_pb2.SubmitRequest
    ) -> tuple[list[tuple[int, str]], common_pb2.FinishReason]:
        """(tokens, finish_reason) the fake answers ``request`` with."""
        svc = self._service(request.service)
        assert svc is not None
        sp = request.sampling
        n = sp.max_tokens if sp.HasField("max_tokens") else svc.max_tokens
        tokens = fake_completion(request.prompt, n)
        for i, (_, text) in enumerate(tokens):
            if any(s and s in text for s in sp.stop):
                return tokens[:i], common_pb2.FINISH_REASON_STOP
        return tokens, common_pb2.FINISH_REASON_LENGTH

    async def Submit(
        self, request: scheduler_pb2.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        arrived = time.monotonic()
        self.submits.append(request)
        rid = request.request_id or uuid.uuid4().hex
        self.attempts[rid] += 1
        attempt = self.attempts[rid]
        error = self._validate(request)
        if error is not None:
            await context.abort(*error)
        if attempt <= self.overloaded_attempts:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"service {request.service!r} is overloaded (fake); retry after {self.pushback_ms} ms",
                (("grpc-retry-pushback-ms", str(self.pushback_ms)),),
            )
        tokens, finish = self.completion(request)
        fault = next((f for f in self.faults if f.attempt == attempt), None)
        size = self.chunk_size if attempt == 1 else (self.replay_chunk_size or self.chunk_size)
        batches = [tokens[i : i + size] for i in range(0, len(tokens), size)]
        self.in_flight.add(rid)
        first_token_at: float | None = None
        try:
            index = 0
            for n, batch in enumerate(batches):
                if fault is not None and n == fault.after_chunks:
                    await context.abort(fault.code, fault.message)
                if rid in self.cancelled:
                    finish = common_pb2.FINISH_REASON_CANCELLED
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                first_token_at = first_token_at or time.monotonic()
                chunk = common_pb2.TokenChunk(
                    request_id=rid,
                    index=index,
                    token_ids=[t for t, _ in batch],
                    text="".join(s for _, s in batch),
                    engine_id=self.engine_id,
                )
                index += len(batch)
                if self.final_in_last_chunk and n == len(batches) - 1:
                    self._finish(chunk, request, index, finish, arrived, first_token_at)
                    yield chunk
                    return
                yield chunk
            if fault is not None and fault.after_chunks >= len(batches):
                await context.abort(fault.code, fault.message)
            final = common_pb2.TokenChunk(request_id=rid, index=index, engine_id=self.engine_id)
            self._finish(final, request, index, finish, arrived, first_token_at)
            yield final
        finally:
            self.in_flight.discard(rid)

    async def SubmitMany(
        self, request_iterator: AsyncIterator[scheduler_pb2.SubmitCommands], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.ChunkBatch]:
        """Submit's answers multiplexed (``llmfleet.rpc.mux``): each stream's abort ends that stream."""
        self.submit_many_calls += 1
        async for batch in serve_many(request_iterator, from_servicer(self.Submit), method=SUBMIT_MANY):
            yield batch

    @staticmethod
    def _finish(
        chunk: common_pb2.TokenChunk,
        request: scheduler_pb2.SubmitRequest,
        n_tokens: int,
        finish: common_pb2.FinishReason,
        arrived: float,
        first_token_at: float | None,
    ) -> None:
        now = time.monotonic()
        chunk.finish_reason = finish
        chunk.usage.CopyFrom(
            common_pb2.Usage(
                prompt_tokens=len(request.prompt.split()),
                completion_tokens=n_tokens,
                queue_s=0.0,
                ttft_s=(first_token_at or now) - arrived,
                latency_s=now - arrived,
            )
        )

    async def Cancel(
        self, request: common_pb2.CancelRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.CancelResponse:
        found = request.request_id in self.in_flight
        if found:
            self.cancelled.add(request.request_id)
        return common_pb2.CancelResponse(found=found)

    async def ListServices(
        self, request: scheduler_pb2.ListServicesRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListServicesResponse:
        return scheduler_pb2.ListServicesResponse(
            services=[
                scheduler_pb2.ServiceInfo(
                    name=s.name,
                    model=s.model,
                    ttft_slo_s=s.ttft_slo_s,
                    tpot_slo_s=s.tpot_slo_s,
                    priority=s.priority,
                    engines=list(s.engines),
                )
                for s in self.services
            ]
        )


async def start_fake_scheduler(
    fake: scheduler_pb2_grpc.SchedulerServicer | None = None, host: str = "127.0.0.1", port: int = 0
) -> GrpcServer:
    """Serve ``fake`` (default: a new FakeScheduler) on the running loop; ``await server.stop()`` after."""
    servicer = fake if fake is not None else FakeScheduler()
    registration = (
        scheduler_pb2_grpc.add_SchedulerServicer_to_server,
        servicer,
        service_name(scheduler_pb2, "Scheduler"),
    )
    return await GrpcServer([registration], host=host, port=port).start()


class FakeSchedulerThread:
    """Serves a fake Scheduler from its own event loop in a daemon thread (for blocking tests)."""

    def __init__(self, fake: scheduler_pb2_grpc.SchedulerServicer | None = None, host: str = "127.0.0.1"):
        self.fake = fake if fake is not None else FakeScheduler()
        self.host = host
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-scheduler", daemon=True)
        self._server: GrpcServer | None = None

    def start(self) -> FakeSchedulerThread:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(start_fake_scheduler(self.fake, self.host), self._loop)
        self._server = fut.result(timeout=30)
        self.address = self._server.address
        return self

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(timeout=30)
            self._server = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> FakeSchedulerThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

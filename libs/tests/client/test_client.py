"""AsyncClient / Client against an in-process fake Scheduler (llmfleet.client.testing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from llmfleet.api.v1 import common_pb2
from llmfleet.client import (
    AsyncClient,
    Cancelled,
    Chunk,
    Client,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LlmfleetError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from llmfleet.client.errors import error_for
from llmfleet.client.resume import StreamResumer
from llmfleet.client.testing import (
    BASE_TOKEN_ID,
    FakeScheduler,
    FakeSchedulerThread,
    Fault,
    fake_completion,
    start_fake_scheduler,
)
from llmfleet.supervisor import free_port

Serve = Callable[[FakeScheduler], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start fake schedulers on this test's loop; all stopped at teardown."""
    servers = []

    async def _serve(fake: FakeScheduler) -> str:
        server = await start_fake_scheduler(fake)
        servers.append(server)
        return server.address

    yield _serve
    for server in servers:
        await server.stop(0)


def expected(prompt: str, n: int) -> tuple[str, list[int]]:
    toks = fake_completion(prompt, n)
    return "".join(t for _, t in toks), [i for i, _ in toks]


async def test_stream_yields_chunks_then_usage(serve: Serve) -> None:
    fake = FakeScheduler()
    async with AsyncClient(await serve(fake)) as client:
        stream = client.generate("hello big world", service="chat", max_tokens=5)
        assert fake.submits == []  # lazy: nothing sent before iteration
        chunks = [c async for c in stream]
    text, ids = expected("hello big world", 5)
    assert [c.index for c in chunks] == [0, 1, 2, 3, 4]
    assert "".join(c.text for c in chunks) == text
    assert [t for c in chunks for t in c.token_ids] == ids
    assert all(isinstance(c, Chunk) for c in chunks)
    u = stream.usage
    assert u is not None
    assert (u.prompt_tokens, u.completion_tokens, u.finish_reason, u.engine_id) == (
        3,
        5,
        "length",
        "fake-engine",
    )
    assert u.latency_s >= u.ttft_s >= 0
    assert len(stream.request_id) == 32 and stream.request_id == fake.submits[0].request_id
    assert stream.attempts == 1


async def test_text_collects_whole_completion_including_consumed_chunks(serve: Serve) -> None:
    async with AsyncClient(await serve(FakeScheduler(chunk_size=2))) as client:
        stream = client.generate("a b", service="chat", max_tokens=7, request_id="rid-1")
        first = await stream.__anext__()
        assert first.token_ids == (BASE_TOKEN_ID, BASE_TOKEN_ID + 1)
        assert await stream.text() == expected("a b", 7)[0]
        assert stream.request_id == "rid-1" and stream.finish_reason == "length"


async def test_complete_list_services_and_sampling_forwarded(serve: Serve) -> None:
    fake = FakeScheduler()
    async with AsyncClient(await serve(fake)) as client:
        done = await client.complete(
            "x y", service="chat", max_tokens=9, temperature=0.5, top_p=0.9, seed=7, stop=" y3"
        )
        services = await client.list_services()
    assert done.text == expected("x y", 3)[0] and done.token_ids == tuple(expected("x y", 3)[1])
    assert done.usage.finish_reason == "stop" and done.usage.completion_tokens == 3
    sp = fake.submits[0].sampling
    assert (sp.max_tokens, sp.seed, list(sp.stop)) == (9, 7, [" y3"])
    assert sp.temperature == pytest.approx(0.5) and sp.top_p == pytest.approx(0.9)
    assert [s.name for s in services] == ["chat", "summarize"]
    assert services[0].engines == ("fake-engine",) and services[0].ttft_slo_s == 5.0


async def test_unset_sampling_fields_stay_unset(serve: Serve) -> None:
    fake = FakeScheduler()
    async with AsyncClient(await serve(fake)) as client:
        done = await client.complete("p", service="summarize")
    sp = fake.submits[0].sampling
    assert not any(sp.HasField(f) for f in ("max_tokens", "temperature", "top_p", "seed"))
    assert done.usage.completion_tokens == 12  # the service default


@pytest.mark.parametrize(
    ("kwargs", "fail", "exc_type", "code", "message"),
    [
        ({"service": "nope"}, {}, NotFound, grpc.StatusCode.NOT_FOUND, "unknown service 'nope'"),
        (
            {"max_tokens": 0},
            {},
            InvalidArgument,
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens must be > 0, got 0",
        ),
        ({"top_p": 1.5}, {}, InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, "top_p must be in (0, 1]"),
        (
            {},
            {"chat": (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")},
            ResourceExhausted,
            None,
            "queue full",
        ),
        (
            {},
            {"chat": (grpc.StatusCode.FAILED_PRECONDITION, "no engine")},
            FailedPrecondition,
            None,
            "no engine",
        ),
        ({}, {"chat": (grpc.StatusCode.INTERNAL, "boom")}, Internal, None, "boom"),
        ({}, {"chat": (grpc.StatusCode.CANCELLED, "shutting down")}, Cancelled, None, "shutting down"),
        ({}, {"chat": (grpc.StatusCode.PERMISSION_DENIED, "nope")}, PermissionDenied, None, "nope"),
        ({}, {"chat": (grpc.StatusCode.UNAUTHENTICATED, "no key")}, Unauthenticated, None, "no key"),
        ({}, {"chat": (grpc.StatusCode.RESOURCE_EXHAUSTED, "full")}, ResourceExhausted, None, "full"),
        ({}, {"chat": (grpc.StatusCode.ABORTED, "nope")}, LlmfleetError, None, "nope"),
    ],
)
async def test_errors_map_to_typed_exceptions(
    serve: Serve,
    kwargs: dict,
    fail: dict,
    exc_type: type[LlmfleetError],
    code: grpc.StatusCode | None,
    message: str,
) -> None:
    fake = FakeScheduler(fail_services=fail)
    async with AsyncClient(await serve(fake), retries=3) as client:
        args = {"service": "chat", **kwargs}
        with pytest.raises(exc_type) as ei:
            await client.complete("hi", **args)
    err = ei.value
    assert type(err) is exc_type
    assert message in err.message and message in str(err)
    if code is not None:
        assert err.code == code
    assert err.request_id == fake.submits[0].request_id
    assert len(fake.submits) == 1  # only UNAVAILABLE (and an overload with a pushback) is retried


def test_error_for_covers_codes() -> None:
    assert type(error_for(grpc.StatusCode.UNAVAILABLE, "x")) is Unavailable
    assert type(error_for(grpc.StatusCode.DEADLINE_EXCEEDED, "x")) is DeadlineExceeded
    assert type(error_for(grpc.StatusCode.UNKNOWN, "x")) is Internal
    assert type(error_for(grpc.StatusCode.UNAUTHENTICATED, "x")) is Unauthenticated
    assert type(error_for(grpc.StatusCode.ABORTED, "x")) is LlmfleetError
    e = error_for(grpc.StatusCode.NOT_FOUND, "gone")
    assert isinstance(e, LlmfleetError) and e.code is grpc.StatusCode.NOT_FOUND and e.message == "gone"


def test_unrepresentable_argument_fails_before_sending() -> None:
    client = AsyncClient("127.0.0.1:1")
    with pytest.raises(InvalidArgument, match="invalid request"):
        client.generate("hi", service="chat", seed=-1)


@pytest.mark.parametrize(("first", "replay"), [(1, None), (1, 4), (2, 3), (3, 1), (2, 8)])
async def test_retry_after_unavailable_resumes_exactly_once(
    serve: Serve, first: int, replay: int | None
) -> None:
    fake = FakeScheduler(
        chunk_size=first, replay_chunk_size=replay, faults=[Fault(attempt=1, after_chunks=2)]
    )
    async with AsyncClient(await serve(fake), retries=3, backoff_s=0.01) as client:
        stream = client.generate("one two three", service="chat", max_tokens=8)
        chunks = [c async for c in stream]
    text, ids = expected("one two three", 8)
    assert [t for c in chunks for t in c.token_ids] == ids  # no duplicates, no gaps
    assert "".join(c.text for c in chunks) == text
    indices = [c.index for c in chunks]
    assert indices == sorted(set(indices)) and indices[0] == 0
    assert len(fake.submits) == 2 and stream.attempts == 2
    assert fake.submits[0].request_id == fake.submits[1].request_id == stream.request_id
    assert stream.usage is not None and stream.usage.completion_tokens == 8


async def test_fault_before_final_chunk_is_retried(serve: Serve) -> None:
    fake = FakeScheduler(faults=[Fault(attempt=1, after_chunks=4)])
    async with AsyncClient(await serve(fake), backoff_s=0.01) as client:
        done = await client.complete("a", service="chat", max_tokens=4)
    assert done.token_ids == tuple(expected("a", 4)[1]) and len(fake.submits) == 2


async def test_final_chunk_may_carry_tokens(serve: Serve) -> None:
    fake = FakeScheduler(final_in_last_chunk=True, chunk_size=3)
    async with AsyncClient(await serve(fake)) as client:
        done = await client.complete("a", service="chat", max_tokens=5)
    assert done.token_ids == tuple(expected("a", 5)[1]) and done.usage.finish_reason == "length"


async def test_retries_exhausted_raise_unavailable(serve: Serve) -> None:
    fake = FakeScheduler(
        faults=[Fault(attempt=a, after_chunks=0, message="engine gone") for a in range(1, 9)]
    )
    async with AsyncClient(await serve(fake), retries=2, backoff_s=0.01) as client:
        with pytest.raises(Unavailable, match="engine gone") as ei:
            await client.complete("a", service="chat")
    assert len(fake.submits) == 3 and ei.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_call_the_scheduler_never_took_up_is_retried(serve: Serve) -> None:
    """gRPC core ends a call CANCELLED when its server has not accepted it within 30 s (a saturated
    scheduler; seen at 1,000 concurrent streams): nothing ran, so the SDK retries it (on the next
    replica when there are several). CANCELLED after tokens arrived is final."""
    fake = FakeScheduler(
        faults=[Fault(attempt=1, after_chunks=0, code=grpc.StatusCode.CANCELLED, message="CANCELLED")]
    )
    async with AsyncClient(await serve(fake), backoff_s=0.01) as client:
        done = await client.complete("a", service="chat", max_tokens=4)
    assert done.token_ids == tuple(expected("a", 4)[1]) and len(fake.submits) == 2
    late = FakeScheduler(
        faults=[Fault(attempt=1, after_chunks=2, code=grpc.StatusCode.CANCELLED, message="CANCELLED")]
    )
    async with AsyncClient(await serve(late), backoff_s=0.01) as client:
        with pytest.raises(Cancelled):
            await client.complete("a", service="chat", max_tokens=4)
    assert len(late.submits) == 1


async def test_other_errors_mid_stream_are_not_retried(serve: Serve) -> None:
    fake = FakeScheduler(
        faults=[Fault(attempt=1, after_chunks=1, code=grpc.StatusCode.INTERNAL, message="oops")]
    )
    async with AsyncClient(await serve(fake)) as client:
        stream = client.generate("a", service="chat")
        got = []
        with pytest.raises(Internal, match="oops"):
            async for c in stream:
                got.append(c)
    assert len(got) == 1 and len(fake.submits) == 1


async def test_deadline_exceeded(serve: Serve) -> None:
    fake = FakeScheduler(token_delay_s=0.5)
    async with AsyncClient(await serve(fake)) as client:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded) as ei:
            await client.complete("a", service="chat", timeout_s=0.2)
        assert time.monotonic() - t0 < 2.0
        assert ei.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # the client-wide default applies too
    async with AsyncClient(await serve(FakeScheduler(token_delay_s=0.5)), timeout_s=0.2) as client:
        with pytest.raises(DeadlineExceeded):
            await client.complete("a", service="chat")


async def test_unreachable_scheduler_is_unavailable() -> None:
    async with AsyncClient(f"127.0.0.1:{free_port()}", retries=1, backoff_s=0.01) as client:
        with pytest.raises(Unavailable):
            await client.complete("a", service="chat", timeout_s=10)
        with pytest.raises(Unavailable):
            await client.list_services()


async def test_cancel_running_request(serve: Serve) -> None:
    fake = FakeScheduler(token_delay_s=0.05)
    async with AsyncClient(await serve(fake)) as client:
        stream = client.generate("a", service="chat", max_tokens=50)
        await stream.__anext__()
        assert await client.cancel(stream.request_id) is True
        rest = [c async for c in stream]
        assert len(rest) < 49
        assert stream.finish_reason == "cancelled"
        assert await client.cancel(stream.request_id) is False  # finished: nothing to cancel
        assert await client.cancel("unknown") is False


async def test_stream_cancel_and_aclose(serve: Serve) -> None:
    fake = FakeScheduler(token_delay_s=0.05)
    async with AsyncClient(await serve(fake)) as client:
        stream = client.generate("a", service="chat", max_tokens=50)
        await stream.__anext__()
        assert await stream.cancel() is True
        assert [c async for c in stream] == []  # closed
        with pytest.raises(Cancelled):
            await stream.collect()
        other = client.generate("b", service="chat", max_tokens=50)
        async with other:
            await other.__anext__()
        await asyncio.sleep(0.1)
        assert other.request_id not in fake.in_flight  # closing the stream cancelled the RPC


def test_resumer_rejects_gaps() -> None:
    r = StreamResumer(request_id="r")
    r.accept(common_pb2.TokenChunk(index=0, token_ids=[1, 2], text="ab"))
    with pytest.raises(Internal, match="gap") as ei:
        r.accept(common_pb2.TokenChunk(index=3, token_ids=[4], text="d"))
    assert ei.value.code == grpc.StatusCode.DATA_LOSS


def test_resumer_rejects_a_replay_that_differs() -> None:
    r = StreamResumer(request_id="r")
    r.accept(common_pb2.TokenChunk(index=0, token_ids=[1, 2], text="ab"))
    r.begin_attempt()
    with pytest.raises(Internal, match="differ from the ones already delivered"):
        r.accept(common_pb2.TokenChunk(index=0, token_ids=[1, 5, 6], text="aXY"))


def test_resumer_dedupes_partial_overlap_and_text_only_chunks() -> None:
    r = StreamResumer()
    out = [r.accept(common_pb2.TokenChunk(index=0, token_ids=[1, 2], text="ab"))]
    out.append(r.accept(common_pb2.TokenChunk(index=2, token_ids=[3], text="c")))
    out.append(r.accept(common_pb2.TokenChunk(index=3, text="!")))  # text flushed without tokens
    r.begin_attempt()
    assert r.accept(common_pb2.TokenChunk(index=0, token_ids=[1], text="a")) is None
    c = r.accept(common_pb2.TokenChunk(index=1, token_ids=[2, 3, 4], text="bc!d"))
    assert c is not None and (c.index, c.token_ids, c.text) == (3, (4,), "d")
    assert "".join(x.text for x in out if x) == "abc!"


def test_sync_client_streams_lazily_and_retries() -> None:
    fake = FakeScheduler(faults=[Fault(attempt=1, after_chunks=3)])
    with FakeSchedulerThread(fake) as srv, Client(srv.address, backoff_s=0.01) as client:
        it = client.generate("s y n c", service="chat", max_tokens=6)
        assert fake.submits == []
        first = next(it)
        assert first.index == 0 and len(fake.submits) == 1
        rest = list(it)
        assert [t for c in [first, *rest] for t in c.token_ids] == expected("s y n c", 6)[1]
        assert it.usage is not None and it.usage.completion_tokens == 6 and it.attempts == 2
        assert client.complete("q", service="summarize", max_tokens=2).text == expected("q", 2)[0]
        assert it.request_id == fake.submits[0].request_id == fake.submits[1].request_id
        assert [s.name for s in client.list_services()] == ["chat", "summarize"]
        assert client.cancel("nope") is False
        with pytest.raises(NotFound, match="unknown service"):
            client.complete("q", service="missing")
        with client.generate("w", service="chat", max_tokens=3) as it2:
            assert it2.text() == expected("w", 3)[0]


def test_sync_client_deadline_and_close_idempotent() -> None:
    with FakeSchedulerThread(FakeScheduler(token_delay_s=0.5)) as srv:
        client = Client(srv.address, timeout_s=0.2)
        with pytest.raises(DeadlineExceeded):
            client.complete("q", service="chat")
        client.close()
        client.close()
        with pytest.raises(RuntimeError, match="closed"):
            client.list_services()


async def test_an_overload_is_retried_after_the_servers_pushback(serve: Serve) -> None:
    fake = FakeScheduler(overloaded_attempts=2, pushback_ms=300)
    async with AsyncClient(await serve(fake), retries=3) as client:
        t0 = time.monotonic()
        done = await client.complete("hi", service="chat", max_tokens=3)
        assert time.monotonic() - t0 >= 0.6  # two pushbacks of 0.3 s, not the 0.1 s backoff
    assert done.usage.completion_tokens == 3 and len(fake.submits) == 3
    fake = FakeScheduler(overloaded_attempts=2)
    async with AsyncClient(await serve(fake), retries=1) as client:
        with pytest.raises(ResourceExhausted, match="overloaded"):
            await client.complete("hi", service="chat", max_tokens=3)
    assert len(fake.submits) == 2
    fake = FakeScheduler(overloaded_attempts=1, pushback_ms=5000)
    async with AsyncClient(await serve(fake), retries=3, timeout_s=1) as client:
        with pytest.raises(ResourceExhausted):  # the pushback would pass the deadline: give up now
            await client.complete("hi", service="chat", max_tokens=3)
    assert len(fake.submits) == 1


async def test_multiplexed_streams_share_one_call_and_spread_goes_round_robin(serve: Serve) -> None:
    """Many streams, one SubmitMany call per replica; ``spread`` alternates the replicas and skips one
    that failed (its streams resume on the other)."""
    a, b = FakeScheduler(), FakeScheduler()
    async with AsyncClient([await serve(a), await serve(b)], spread=True) as client:
        done = await asyncio.gather(
            *[client.complete(f"p {i}", service="chat", max_tokens=3) for i in range(8)]
        )
        assert all(c.usage.completion_tokens == 3 for c in done)
        assert len(a.submits) == len(b.submits) == 4
        assert a.submit_many_calls == b.submit_many_calls == 1

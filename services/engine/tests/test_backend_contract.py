"""The engine-backend contract: one suite of cases run against every backend that implements
``EngineBackend`` with KV migration here — the native paged executor (a tiny random model on
the CPU) and the emulated backend (a catalog model on an emulated A100). Whatever sits above the
backend (servicer, placement follower, migration) relies on exactly these behaviours."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from llmfleet.types import ModelSpec
from llmfleet_engine import kv_rpc
from llmfleet_engine.backend import EngineBackend, ProfilingBackend
from llmfleet_engine.emulated import EmulatedConfig, EmulatedExecutor
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import ModelLoadError
from llmfleet_engine.outputs import DuplicateRequestError, FinishReason, MigrationConflictError, TransferError
from llmfleet_engine.validation import UnknownModelError, ValidationError, build_request


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[..., Executor]
    spec: ModelSpec
    bad_source: ModelSpec  # a load that must fail with ModelLoadError


def native(tmp_path) -> Executor:
    return Executor(
        ExecutorConfig(cache_dir=tmp_path, allow_download=False, num_threads=1, block_bytes=16 * 1152)
    )


def emulated(tmp_path) -> Executor:
    return EmulatedExecutor(EmulatedConfig(hardware="a100-80gb", sim_models={"m": "llama2-7b"}))


CASES = [
    Case("native", native, ModelSpec("m", "tiny://llama"), ModelSpec("bad", "tiny://no-such-arch")),
    Case("emulated", emulated, ModelSpec("m", "emulated://llama2-7b"), ModelSpec("bad", "emulated://gpt-9")),
]


@pytest.fixture(params=CASES, ids=lambda c: c.name)
async def backend(request, tmp_path) -> AsyncIterator[tuple[Case, Executor]]:
    case: Case = request.param
    ex = case.make(tmp_path)
    await asyncio.to_thread(ex.host.load, case.spec)
    yield case, ex
    await ex.aclose()


def request_for(ex: Executor, rid: str, max_tokens: int = 8, words: int = 12):
    return build_request(
        ex.host.models["m"], " ".join(["hello"] * words), request_id=rid, max_tokens=max_tokens
    )


async def test_implements_the_protocols(backend):
    _, ex = backend
    assert isinstance(ex, EngineBackend) and isinstance(ex, ProfilingBackend)
    assert ex.migration is not None


async def test_generate_streams_max_tokens_and_reports_usage(backend):
    _, ex = backend
    chunks = await asyncio.wait_for(ex.submit(request_for(ex, "g1", max_tokens=6)).collect(), 30)
    final = chunks[-1]
    assert final.finish_reason in (FinishReason.LENGTH, FinishReason.EOS)
    tokens = [t for c in chunks for t in c.token_ids]
    assert len(tokens) == final.usage.completion_tokens <= 6
    assert final.usage.prompt_tokens == request_for(ex, "x").prompt_tokens
    assert final.usage.latency_s >= final.usage.ttft_s >= 0


async def test_same_request_gives_same_tokens(backend):
    _, ex = backend
    a = await ex.submit(request_for(ex, "d1")).collect()
    b = await ex.submit(request_for(ex, "d1")).collect()
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


async def test_cancel_ends_the_stream_and_frees_kv(backend):
    _, ex = backend
    stream = ex.submit(request_for(ex, "c1", max_tokens=2000))
    first = await asyncio.wait_for(stream.__anext__(), 30)
    assert first.token_ids
    assert ex.cancel("c1")
    rest = await asyncio.wait_for(stream.collect(), 30)
    assert rest[-1].finish_reason == FinishReason.CANCELLED
    assert not ex.cancel("c1")
    await asyncio.sleep(0.05)
    assert ex.load_snapshot().kv_used_bytes == 0


async def test_load_unload_change_the_pool(backend):
    case, ex = backend
    cap = ex.host.kv_capacity_bytes
    assert ex.host.model_names() == ("m",)
    assert ex.host.load(case.spec).already_loaded
    assert await asyncio.to_thread(ex.host.load, ModelSpec("m2", case.spec.source)) is not None
    assert ex.host.kv_capacity_bytes < cap and set(ex.host.model_names()) == {"m", "m2"}
    assert ex.host.unload("m2") and ex.host.kv_capacity_bytes == cap
    assert not ex.host.unload("m2")


async def test_snapshot_counts_running_requests(backend):
    _, ex = backend
    streams = [ex.submit(request_for(ex, f"s{i}", max_tokens=400)) for i in range(3)]
    await asyncio.wait_for(streams[0].__anext__(), 30)
    snap = ex.load_snapshot()
    assert snap.running + snap.waiting == 3 and snap.kv_used_bytes > 0
    assert {m.model for m in snap.models} == {"m"} and snap.kv_capacity_bytes == ex.host.kv_capacity_bytes
    for i in range(3):
        ex.cancel(f"s{i}")
    for s in streams:
        await asyncio.wait_for(s.collect(), 30)


async def test_bad_input_is_refused(backend):
    case, ex = backend
    with pytest.raises(ModelLoadError):
        await asyncio.to_thread(ex.host.load, case.bad_source)
    with pytest.raises(UnknownModelError):
        ex.submit(dataclasses.replace(request_for(ex, "u1"), model="nope"))
    with pytest.raises(ValidationError, match="max_tokens"):
        request_for(ex, "huge", max_tokens=10**9)
    with pytest.raises(ValidationError, match="max_tokens"):
        request_for(ex, "zero", max_tokens=0)


async def test_kv_moves_between_two_engines_and_the_stream_goes_on(backend, tmp_path):
    case, src = backend
    dst = case.make(tmp_path)
    try:
        await asyncio.to_thread(dst.host.load, case.spec)
        stream = src.submit(request_for(src, "mv", max_tokens=40))
        got = [await asyncio.wait_for(stream.__anext__(), 30) for _ in range(3)]
        header = await asyncio.to_thread(src.migration.pause_request, "mv", moving_to="dst")
        assert header.num_tokens > 0

        async def accepted() -> None:
            pass

        resp = await kv_rpc.import_stream(
            dst.migration, kv_rpc.export_stream(src.migration, header, 8), accepted
        )
        assert resp.num_tokens == header.num_tokens
        src.migration.finish_migrated("mv", "dst")
        tail = await asyncio.wait_for(stream.collect(), 30)
        assert tail[-1].finish_reason == FinishReason.MIGRATED
        moved = dst.attach("mv")
        assert moved is not None
        rest = await asyncio.wait_for(moved.collect(), 30)
        produced = sum(len(c.token_ids) for c in [*got, *tail, *rest])
        assert rest[-1].finish_reason in (FinishReason.LENGTH, FinishReason.EOS)
        assert produced == rest[-1].usage.completion_tokens
    finally:
        await dst.aclose()


async def test_a_corrupt_kv_chunk_is_refused(backend):
    _, src = backend
    stream = src.submit(request_for(src, "bad-kv", max_tokens=40))
    await asyncio.wait_for(stream.__anext__(), 30)
    header = await asyncio.to_thread(src.migration.pause_request, "bad-kv")
    handle = await asyncio.to_thread(
        src.migration.begin_import, dataclasses.replace(header, request_id="copy")
    )
    with pytest.raises(TransferError):
        handle.write(0, 1, b"\x00" * 3)
    handle.abort()
    src.migration.resume_request("bad-kv")
    src.cancel("bad-kv")
    await asyncio.wait_for(stream.collect(), 30)


async def test_profile_returns_a_sample_per_point(backend):
    _, ex = backend
    res = await asyncio.to_thread(
        ex.profile, "m", batch_sizes=[1, 2], input_lengths=[8], context_lengths=[8], repeats=2
    )
    assert {(s.phase, s.batch_size) for s in res.samples} == {
        ("prefill", 1),
        ("prefill", 2),
        ("decode", 1),
        ("decode", 2),
    }
    assert all(s.seconds > 0 for s in res.samples) and len(res.samples) == 8


async def test_an_import_with_a_bad_rng_state_is_refused_up_front(backend):
    _, ex = backend
    stream = ex.submit(request_for(ex, "rng", max_tokens=40))
    await asyncio.wait_for(stream.__anext__(), 30)
    header = await asyncio.to_thread(ex.migration.pause_request, "rng")
    bad = dataclasses.replace(header, request_id="rng-copy", rng_state=b"\x01")
    with pytest.raises(TransferError, match="rng_state"):
        await asyncio.to_thread(ex.migration.begin_import, bad)
    ex.migration.resume_request("rng")
    ex.cancel("rng")
    await asyncio.wait_for(stream.collect(), 30)


@contextlib.asynccontextmanager
async def second_engine(case: Case, tmp_path) -> AsyncIterator[Executor]:
    """Another engine of the same backend with the case's model loaded (a migration destination)."""
    dst = case.make(tmp_path)
    try:
        await asyncio.to_thread(dst.host.load, case.spec)
        yield dst
    finally:
        await dst.aclose()


async def started_then_paused(ex: Executor, rid: str, moving_to: str = ""):
    """A request that produced its first chunk, then paused as a migration source does: (stream, header)."""
    stream = ex.submit(request_for(ex, rid, max_tokens=40))
    await asyncio.wait_for(stream.__anext__(), 30)
    return stream, await asyncio.to_thread(ex.migration.pause_request, rid, moving_to=moving_to)


async def accepted() -> None:
    """ImportKv's accepted callback (the servicer sends metadata there; nothing to do in-process)."""


async def test_one_request_imported_twice_keeps_the_first_copy(backend, tmp_path):
    """Two sources sending the same request at once (a migration planned on a stale view while an
    earlier one lands): the second import is refused at its start, or at its commit if the first
    committed meanwhile, so a consumer attaching to the request never continues from a copy that ran
    ahead of what it was sent. Token transfers (no KV, nothing reserved) included."""
    case, src = backend
    async with second_engine(case, tmp_path) as dst:
        stream, header = await started_then_paused(src, "twice")
        tokens_only = dataclasses.replace(header, num_tokens=0)  # a token transfer reserves no blocks
        first = await asyncio.to_thread(dst.migration.begin_import, tokens_only)
        with pytest.raises(DuplicateRequestError, match="being imported"):
            await asyncio.to_thread(dst.migration.begin_import, tokens_only)
        first.commit(asyncio.get_running_loop())
        with pytest.raises(DuplicateRequestError, match="already active"):
            await asyncio.to_thread(dst.migration.begin_import, tokens_only)
        # begun before the request became active here: refused at the commit, the live copy stays
        dst.cancel("twice")
        await asyncio.sleep(0)
        a = await asyncio.to_thread(
            dst.migration.begin_import, dataclasses.replace(tokens_only, request_id="race")
        )
        live = dst.submit(request_for(dst, "race", max_tokens=40))
        with pytest.raises(DuplicateRequestError, match="became active"):
            a.commit(asyncio.get_running_loop())
        dst.cancel("race")
        await asyncio.wait_for(live.collect(), 30)
        src.migration.resume_request("twice")
        src.cancel("twice")
        await asyncio.wait_for(stream.collect(), 30)


async def test_a_request_that_just_moved_in_moves_on_only_once_followed(backend, tmp_path):
    """An imported request streams to nobody until the scheduler follows it: moving it on before that
    would leave the scheduler behind the newest copy (a token gap, seen live with Mell at 15 moves/s),
    so the engine refuses, and the coordinator retries in a later epoch."""
    case, src = backend
    async with second_engine(case, tmp_path) as dst:
        stream, header = await started_then_paused(src, "hop", moving_to="dst")
        await kv_rpc.import_stream(dst.migration, kv_rpc.export_stream(src.migration, header, 8), accepted)
        src.migration.finish_migrated("hop", "dst")
        await asyncio.wait_for(stream.collect(), 30)
        with pytest.raises(MigrationConflictError, match="no consumer yet"):
            await asyncio.to_thread(dst.migration.pause_request, "hop", moving_to="elsewhere")
        moved = dst.attach("hop")
        assert moved is not None
        await asyncio.to_thread(
            dst.migration.pause_request, "hop", moving_to="elsewhere"
        )  # followed: it may move
        dst.migration.resume_request("hop", moving=True)
        dst.cancel("hop")
        await asyncio.wait_for(moved.collect(), 30)

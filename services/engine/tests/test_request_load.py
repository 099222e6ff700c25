"""Per-request load in the executor's snapshots (phase, context tokens, KV bytes), and the pause
bookkeeping migrations rely on (nested pauses, one migration per request at a time)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from llmfleet.testing import eventually
from llmfleet_engine.outputs import FinishReason, MigrationConflictError, RequestNotFoundError
from llmfleet_engine.servicer import snapshot_to_proto
from llmfleet_engine.validation import build_request


def rows(ex) -> dict[str, tuple]:
    return {
        rid: (model, tokens, kv, phase)
        for rid, model, tokens, kv, phase in ex.load_snapshot().requests.rows()
    }


async def test_phases_tokens_and_kv_bytes(make_executor, endless) -> None:
    ex = make_executor(max_running=1)
    hosted = ex.host.hosted[endless.name]
    forward = hosted.runner.forward
    entered, release = threading.Event(), threading.Event()

    def held(steps):  # the first forward (r1's prefill) waits until released
        entered.set()
        release.wait(10)
        return forward(steps)

    hosted.runner.forward = held
    prompt = "The quick brown fox"
    n_prompt = len(endless.tokenizer(prompt)["input_ids"])
    bpt = endless.kv_bytes_per_token
    first = ex.submit(build_request(endless, prompt, max_tokens=400, request_id="r1"))
    second = ex.submit(build_request(endless, prompt, max_tokens=5, request_id="r2"))
    await asyncio.to_thread(entered.wait, 10)
    got = rows(ex)
    assert got["r1"] == (endless.name, n_prompt, n_prompt * bpt, "prefill")  # its prompt's slots
    assert got["r2"] == (endless.name, n_prompt, 0, "waiting")  # max_running=1: queued, no KV
    hosted.runner.forward = forward
    release.set()
    for _ in range(3):
        await first.__anext__()
    snap = ex.load_snapshot()
    _, tokens, kv, phase = rows(ex)["r1"]
    assert phase == "decode" and tokens >= n_prompt + 3 and kv in ((tokens - 1) * bpt, tokens * bpt)
    assert sum(snap.requests.kv_bytes) == sum(m.kv_used_bytes for m in snap.models)
    msg = snapshot_to_proto(snap, "e")
    assert [(r.request_id, r.model, r.tokens, r.kv_bytes, r.phase) for r in msg.requests] == list(
        snap.requests.rows()
    )
    assert ex.cancel("r1")
    await second.collect()
    await eventually(lambda: not rows(ex), 5, "no request left")
    assert len(ex.load_snapshot().requests) == 0


async def test_pauses_nest_and_one_migration_at_a_time(make_executor, endless) -> None:
    ex = make_executor()
    stream = ex.submit(build_request(endless, "Pause me twice", max_tokens=2000, request_id="p"))
    await stream.__anext__()
    await asyncio.to_thread(ex.migration.pause_request, "p", moving_to="dst:1")
    with pytest.raises(MigrationConflictError, match="already being migrated to dst:1"):
        await asyncio.to_thread(ex.migration.pause_request, "p", moving_to="dst:2")
    await asyncio.to_thread(ex.migration.pause_request, "p")  # an ExportKv snapshot meanwhile
    assert ex.migration.resume_request("p")  # the snapshot ends: still paused by the migration
    produced = rows(ex)["p"][1]
    await asyncio.sleep(0.05)
    assert rows(ex)["p"][1] == produced
    assert ex.migration.resume_request("p", moving=True)  # the migration failed: runs again
    await eventually(lambda: rows(ex)["p"][1] > produced, 5, "the request to run again")
    await asyncio.to_thread(ex.migration.pause_request, "p", moving_to="dst:2")  # free for another migration
    ex.migration.finish_migrated("p", "dst:2")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == FinishReason.MIGRATED
    with pytest.raises(RequestNotFoundError):
        await asyncio.to_thread(ex.migration.pause_request, "p")
    assert (ex.migration.pauses, ex.migration.moving) == ({}, {})

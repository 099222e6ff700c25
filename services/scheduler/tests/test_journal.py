import asyncio

import grpc
import pytest
from llmfleet.api.v1 import common_pb2
from llmfleet_scheduler.journal import Journal, RequestFailed, RequestRecord


def chunk(index, ids, text=""):
    return common_pb2.TokenChunk(request_id="r", index=index, token_ids=ids, text=text)


def rec(rid="r"):
    return RequestRecord(request_id=rid, service="s", model="m", fingerprint=b"")


async def collect(r):
    return [c async for c in r.follow()]


async def test_follow_replays_then_streams_then_final():
    r = rec()
    await r.append(chunk(0, [1, 2], "ab"))
    task = asyncio.create_task(collect(r))
    await asyncio.sleep(0.01)
    await r.append(chunk(2, [3], "c"))
    await r.finish(
        common_pb2.TokenChunk(request_id="r", index=3, finish_reason=common_pb2.FINISH_REASON_LENGTH)
    )
    out = await asyncio.wait_for(task, 2)
    assert [list(c.token_ids) for c in out] == [[1, 2], [3], []]
    assert out[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    # A late subscriber (a retried request id) gets the identical sequence.
    assert [list(c.token_ids) for c in await collect(r)] == [[1, 2], [3], []]


async def test_overlapping_chunks_are_deduplicated():
    r = rec()
    await r.append(chunk(0, [1, 2, 3]))
    await r.append(chunk(1, [2, 3]))  # fully duplicate: dropped
    await r.append(chunk(2, [3, 4, 5]))  # partial overlap: trimmed to [4, 5]
    assert r.delivered_token_ids() == [1, 2, 3, 4, 5]
    assert r.chunks[-1].index == 3


async def test_failure_is_raised_to_followers():
    r = rec()
    await r.append(chunk(0, [1]))
    await r.fail(grpc.StatusCode.UNAVAILABLE, "no engine")
    with pytest.raises(RequestFailed, match="no engine"):
        await collect(r)


async def test_journal_prunes_finished_records_over_capacity():
    j = Journal(capacity=2)
    a, b = rec("a"), rec("b")
    j.add(a)
    j.add(b)
    await a.finish(common_pb2.TokenChunk(request_id="a"))
    j.add(rec("c"))
    assert j.get("a") is None and j.get("b") is not None and j.get("c") is not None


def test_discard_forgets_a_record():
    j = Journal()
    j.add(rec("a"))
    j.discard("a")
    j.discard("a")  # idempotent
    assert j.get("a") is None

import asyncio
import gc

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


async def test_finished_records_expire_after_retain_s_in_finish_order():
    j = Journal(retain_s=0.05)
    a, b, live = rec("a"), rec("b"), rec("live")
    for r in (a, live, b):
        j.add(r)
    await b.finish(common_pb2.TokenChunk(request_id="b"))
    await a.finish(common_pb2.TokenChunk(request_id="a"))
    await asyncio.sleep(0.06)
    j.add(rec("c"))
    assert j.get("a") is None and j.get("b") is None  # expired, behind a live record added earlier
    assert j.get("live") is live and j.get("c") is not None


async def test_a_finished_record_is_kept_packed_and_replays_identically():
    j = Journal()
    r = rec("p")
    j.add(r)
    await r.append(chunk(0, [1, 2], "ab"))
    await r.append(chunk(2, [3], "c"))
    r.engines.append("e0")
    final = common_pb2.TokenChunk(
        request_id="p", index=3, finish_reason=common_pb2.FINISH_REASON_LENGTH, usage={"ttft_s": 0.25}
    )
    await r.finish(final)
    gc.collect()  # CPython untracks a tuple of untracked items when a collection looks at it:
    gc.collect()  # the inner tuples on the first pass, the record's own tuple by the second
    packed = j.packed("p")
    assert packed is not None and not gc.is_tracked(packed)  # out of the garbage collector's walks
    again = j.get("p")
    assert again is not r and again.done and again.engines == ["e0"] and again.n_tokens == 3
    assert await collect(again) == await collect(r)  # same chunks, same final (usage included)

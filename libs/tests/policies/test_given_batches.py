"""The engine half of SCLS central scheduling: run the batches the scheduler formed, as formed."""

from __future__ import annotations

import pytest
from llmfleet.policies.batching import GivenBatches, GivenBatchesOptions
from llmfleet.policies.request.base import BatchLimits, PoolView, SchedRequest

LIMITS = BatchLimits(max_requests=64, max_prefill_tokens=1 << 30)


def req(
    rid: str, t: float, batch: str = "", size: int = 0, prompt: int = 10, model: str = "m"
) -> SchedRequest:
    return SchedRequest(rid, "svc", model, t, prompt, 8, batch_id=batch, batch_size=size)


def pool(blocks: int = 10_000) -> PoolView:
    return PoolView(free_blocks=blocks, watermark_blocks=0, tokens_per_block={"m": 1, "n": 1})


def arrive(p: GivenBatches, reqs: list[SchedRequest]) -> list[SchedRequest]:
    for r in reqs:
        p.on_arrival(r, r.arrival_s)
    return reqs


def test_a_batch_runs_once_complete_and_as_formed():
    p = GivenBatches()
    waiting = arrive(p, [req("a1", 0.0, "A", 3), req("b1", 0.01, "B", 1), req("a2", 0.02, "A", 3)])
    b = p.form_batch(waiting, pool(), LIMITS, now=0.03)
    assert b is not None and b.request_ids == ("b1",)  # A is incomplete; B (complete) goes first
    waiting = [r for r in waiting if r.request_id != "b1"] + arrive(p, [req("a3", 0.04, "A", 3)])
    b = p.form_batch(waiting, pool(), LIMITS, now=0.05)
    assert b is not None and b.request_ids == ("a1", "a2", "a3") and b.max_iterations is None


def test_an_incomplete_batch_runs_after_wait_s():
    p = GivenBatches(GivenBatchesOptions(wait_s=0.5))
    waiting = arrive(p, [req("a1", 0.0, "A", 3), req("a2", 0.1, "A", 3)])  # a3 was cancelled on the way
    assert p.form_batch(waiting, pool(), LIMITS, now=0.4) is None
    b = p.form_batch(waiting, pool(), LIMITS, now=0.51)
    assert b is not None and b.request_ids == ("a1", "a2")


def test_untagged_requests_run_alone_in_arrival_order():
    p = GivenBatches()
    waiting = arrive(p, [req("y", 1.0), req("x", 0.5)])
    assert p.form_batch(waiting, pool(), LIMITS, now=2.0).request_ids == ("x",)


def test_memory_trims_the_batch_to_what_fits():
    p = GivenBatches()
    waiting = arrive(p, [req(f"r{i}", i * 0.01, "A", 4, prompt=100) for i in range(4)])
    # padded rows of 101 tokens (prompt + 1): 2 fit in 250 one-token blocks
    b = p.form_batch(waiting, pool(250), LIMITS, now=1.0)
    assert b is not None and b.request_ids == ("r0", "r1")
    assert p.form_batch(waiting, pool(50), LIMITS, now=1.0) is None  # not even one: wait for memory


def test_options_are_checked():
    with pytest.raises(ValueError, match="wait_s"):
        GivenBatchesOptions(wait_s=-1)

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from llmfleet.policies.request import (
    Batch,
    BatchLimits,
    MuxServeRR,
    PoolView,
    SchedRequest,
    make_request_policy,
    stuck_requests,
)

TPB = 16
MODELS = {"a": "ma", "b": "mb", "c": "mc"}
BIG = PoolView(free_blocks=10_000, watermark_blocks=0, tokens_per_block={m: TPB for m in ("ma", "mb", "mc")})


def w(rid, service="a", arrival=0.0, prompt=15, model=None, out=4):
    return SchedRequest(rid, service, model or MODELS[service], arrival, prompt, out)


def d(rid, service="a", arrival=0.0, prompt=15, model=None):
    r = w(rid, service, arrival, prompt, model)
    r.phase, r.generated = "decode", 1
    return r


def ran(p, batch, reqs, now=1.0):
    p.on_iteration(batch, 0.1, now, [r for r in reqs if r.request_id in batch.request_ids])


# --------------------------------------------------------------------------------- tiny engine loop


@dataclass
class Log:
    batches: list[tuple[str, str, tuple[str, ...], frozenset[str], int]] = field(default_factory=list)
    finish: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0

    def phases(self, phase):
        return [b for b in self.batches if b[0] == phase]


def loop(policy, reqs, total_blocks=10_000, limits=BatchLimits(), watermark=0) -> Log:
    """Iteration loop: each batch takes 1 s; prefill yields the first token; paged KV with recompute."""
    pending = sorted(reqs, key=lambda r: (r.arrival_s, r.request_id))
    waiting: list[SchedRequest] = []
    running: list[SchedRequest] = []
    held: dict[str, int] = {}
    log, now = Log(), 0.0

    def blocks(tokens):
        return -(-tokens // TPB)

    for _ in range(10_000):
        while pending and pending[0].arrival_s <= now:
            r = pending.pop(0)
            policy.on_arrival(r, now)
            waiting.append(r)
        if not (pending or waiting or running):
            return log
        free = total_blocks - sum(held.values())
        pool = PoolView(free, watermark, {"ma": TPB, "mb": TPB, "mc": TPB})
        batch = policy.next_batch(tuple(waiting), tuple(running), pool, limits, now)
        if batch is None:
            assert not running and not stuck_requests(waiting, running, pool) and pending
            now = pending[0].arrival_s
            continue
        members = [r for r in (*waiting, *running) if r.request_id in batch.request_ids]
        assert len(members) == len(batch.request_ids) <= limits.max_requests
        assert {r.model for r in members} == {batch.model}
        prefills = [r for r in members if r in waiting]
        decodes = [r for r in members if r in running]
        assert batch.phase == ("prefill" if prefills else "decode") and not (prefills and decodes)
        assert sum(blocks(r.prompt_tokens + 1) for r in prefills) <= pool.available_blocks
        log.batches.append(
            (batch.phase, batch.model, batch.request_ids, frozenset(r.service for r in members), len(running))
        )
        for r in prefills:
            waiting.remove(r)
            running.append(r)
            held[r.request_id] = blocks(r.prompt_tokens + 1)
        done = []
        for r in decodes:
            if r.request_id not in held:
                continue
            extra = blocks(r.context_tokens + 1) - held[r.request_id]
            while extra > total_blocks - sum(held.values()):
                v = policy.preemption_victim(tuple(running), now)
                held.pop(v.request_id)
                running.remove(v)
                v.prompt_tokens += v.generated
                v.max_new_tokens -= v.generated
                v.generated, v.phase = 0, "prefill"
                waiting.append(v)
                log.preemptions += 1
                if v in done:
                    done.remove(v)
                if v is r:
                    break
            if r.request_id in held:
                held[r.request_id] += extra
                done.append(r)
        ran_reqs = [*prefills, *done]
        if not ran_reqs:
            continue
        now += 1.0
        for r in prefills:
            r.phase, r.generated = "decode", 1
        for r in done:
            r.generated += 1
        policy.on_iteration(
            Batch(batch.model, batch.phase, tuple(r.request_id for r in ran_reqs)), 1.0, now, ran_reqs
        )
        for r in ran_reqs:
            if r.generated >= r.max_new_tokens:
                running.remove(r)
                held.pop(r.request_id)
                policy.on_finish(r, now)
                log.finish[r.request_id] = now
    raise AssertionError("loop did not finish")


def three_services(n=3, out=4):
    return [w(f"{s}{i}", s, arrival=0.01 * i, out=out) for i in range(n) for s in "cba"]


def test_loop_rotates_services_and_models_and_alternates_phases():
    reqs = three_services()
    log = loop(MuxServeRR(), reqs, limits=BatchLimits(max_requests=1))
    assert set(log.finish) == {r.request_id for r in reqs}
    prefill_services = [next(iter(b[3])) for b in log.phases("prefill")]
    assert prefill_services == list("abcabcabc")
    assert [b[2] for b in log.phases("prefill")][:4] == [("a0",), ("b0",), ("c0",), ("a1",)]
    assert [b[1] for b in log.phases("decode")][:6] == ["ma", "mb", "mc", "ma", "mb", "mc"]
    for prev, cur in zip(log.batches, log.batches[1:], strict=False):
        if prev[0] == "prefill" and cur[4] > 0:  # something running: no second prefill in a row
            assert cur[0] == "decode", log.batches
    assert log.batches[0][0] == "prefill"  # prefill priority


def test_rr_lets_a_late_service_in_before_a_burst_drains():
    reqs = [w(f"a{i}", "a", arrival=0.0) for i in range(6)] + [w("b0", "b", arrival=0.5)]
    lim = BatchLimits(max_requests=2)
    log = loop(MuxServeRR(), reqs, limits=lim)
    assert [b[2] for b in log.phases("prefill")][:3] == [("a0", "a1"), ("b0",), ("a2", "a3")]


def test_everything_finishes_under_kv_pressure():
    reqs = [w(f"{s}{i}", s, arrival=0.1 * i, prompt=40, out=30) for i in range(6) for s in "abc"]
    log = loop(MuxServeRR(), reqs, total_blocks=24, limits=BatchLimits(max_requests=4), watermark=1)
    assert set(log.finish) == {r.request_id for r in reqs}
    assert log.preemptions > 0


# ------------------------------------------------------------------------------------- unit cases


def test_prefill_batch_is_one_model_of_the_turns_service_in_fcfs_order():
    p = MuxServeRR()
    waiting = [w("a2", arrival=2.0), w("x", arrival=0.5, model="mb"), w("a1", arrival=1.0), w("b1", "b", 0.0)]
    waiting.append(w("a0", arrival=0.0))  # oldest of service "a", model ma
    b = p.next_batch(waiting, [], BIG, BatchLimits(), 0.0)
    assert b == Batch("ma", "prefill", ("a0", "a1", "a2"))  # "x" is service a's other model: later
    assert p.next_batch(waiting, [], BIG, BatchLimits(), 0.0) == b  # no state change before it ran
    ran(p, b, waiting)
    b2 = p.next_batch([r for r in waiting if r.request_id in ("x", "b1")], [], BIG, BatchLimits(), 1.0)
    assert b2 == Batch("mb", "prefill", ("b1",))  # service b's turn, though "a"/"x" waits too


def test_after_a_prefill_decodes_run_when_something_runs():
    p = MuxServeRR()
    waiting, running = [w("a0"), w("b0", "b")], [d("r0", "c")]
    b = p.next_batch(waiting, running, BIG, BatchLimits(), 0.0)
    assert b == Batch("ma", "prefill", ("a0",))
    ran(p, b, waiting)
    running.append(d("a0"))
    b = p.next_batch(waiting[1:], running, BIG, BatchLimits(), 1.0)
    assert b == Batch("ma", "decode", ("a0",))  # models rotate: "ma" first (none decoded yet)
    ran(p, b, running)
    b = p.next_batch(waiting[1:], running, BIG, BatchLimits(), 2.0)
    assert b == Batch("mb", "prefill", ("b0",))
    ran(p, b, waiting)
    assert p.next_batch([], running, BIG, BatchLimits(), 3.0) == Batch("mc", "decode", ("r0",))


def test_decode_batch_oldest_first_within_max_requests():
    p = MuxServeRR()
    running = [d(f"r{i}", arrival=float(5 - i)) for i in range(5)]
    b = p.next_batch([], running, BIG, BatchLimits(max_requests=3), 0.0)
    assert b == Batch("ma", "decode", ("r4", "r3", "r2"))


def test_turn_holding_blocked_service_decodes_instead_of_letting_others_in():
    pool = PoolView(free_blocks=3, watermark_blocks=0, tokens_per_block={"ma": TPB, "mb": TPB})
    big, small = w("a0", prompt=100), w("b0", "b", arrival=1.0)  # a0 needs 7 blocks, b0 needs 1
    p = MuxServeRR()
    assert p.next_batch([big, small], [d("r", "b")], pool, BatchLimits(), 0.0) == Batch(
        "mb", "decode", ("r",)
    )
    # nothing running: waiting cannot help a0, the turn passes on
    assert p.next_batch([big, small], [], pool, BatchLimits(), 0.0) == Batch("mb", "prefill", ("b0",))
    assert p.next_batch([big], [], pool, BatchLimits(), 0.0) is None


def test_victim_is_the_latest_arrival():
    p = MuxServeRR()
    running = [d("x", arrival=1.0), d("z", "b", arrival=3.0), d("y", arrival=3.0), d("w", arrival=2.0)]
    assert p.preemption_victim(running, 5.0).request_id == "z"
    with pytest.raises(ValueError):
        p.preemption_victim([], 5.0)


def test_on_iteration_marks_members_and_idle_returns_none():
    p = MuxServeRR()
    r = w("a0")
    p.on_iteration(Batch("ma", "prefill", ("a0",)), 0.25, 2.0, [r])
    assert (r.first_scheduled_s, r.last_run_s) == (1.75, 2.0)
    assert p.next_batch([], [], BIG, BatchLimits(), 0.0) is None
    with pytest.raises(ValueError):
        p.on_iteration(Batch("ma", "prefill", ("a0",)), -1.0, 2.0, [r])


def test_registry():
    assert isinstance(make_request_policy("muxserve_rr"), MuxServeRR)
    with pytest.raises(ValueError, match="bad options"):
        make_request_policy("muxserve_rr", quantum=3)

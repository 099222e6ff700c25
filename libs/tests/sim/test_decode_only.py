"""Decode-only instances (split-phase serving): a request arrives with its prompt prefilled elsewhere,
its KV lands with it, and its first step here is a decode (no prefill priced)."""

from __future__ import annotations

import math

import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel.decode_worker import decode_worker
from llmfleet.costmodel.latency_model import latency_model
from llmfleet.policies.request import Fcfs
from llmfleet.sim.instance import SimInstance
from llmfleet.sim.records import RequestRecord
from llmfleet.sim.spec import EngineSettings
from llmfleet.workload import Workload
from llmfleet.workload import WorkloadRequest as W

A100 = hardware("A100-80GB")


def make_instance(tiny, engine: EngineSettings) -> SimInstance:
    book = tiny.book(tiny.spec(engine))
    archs = {tiny.model: model_arch(tiny.model)}
    return SimInstance("x", (tiny.model,), 1, A100, archs, engine, book, Fcfs(), fast_forward=False)


def fail(r, why):
    raise AssertionError(f"{r.request_id} failed: {why}")


def test_first_step_is_a_decode_of_the_prompts_kv(tiny):
    engine = EngineSettings(kv_bytes=100 * tiny.block_bytes, watermark=0.0, decode_only=True)
    inst = make_instance(tiny, engine)
    rec = RequestRecord("a", "s", tiny.model, 0.0, 100, 5)
    inst.admit(rec, 4096, 0.0)
    # landed with its prompt's KV, running as a decode; its first token came from the prefill worker
    assert "a" in inst.running and not inst.waiting
    assert inst.alloc.num_tokens("a") == 100 and inst.alloc.used_blocks == math.ceil(100 / 16)
    assert rec.produced == 1 and rec.first_token_s == 0.0
    end = inst.start(0.0, fail)
    plan = inst.work.plan
    assert plan.prefills == [] and plan.prefill_tokens == 0 and plan.decodes == 1
    assert plan.context_tokens == 101  # the prompt's KV and the first token's slot, as after a prefill
    assert end == pytest.approx(tiny.dec(1, 101))  # a decode iteration, no prefill priced
    assert inst.alloc.num_tokens("a") == 101  # the first token's K/V appended
    inst.finish_work(end)
    t = end
    while rec.finish_s is None:
        t = inst.start(t, fail)
        inst.finish_work(t)
    assert rec.produced == 5 and inst.iterations == 4  # tokens 2..5 decoded here
    assert rec.ttft_s == 0.0 and rec.tpot_s == pytest.approx(t / 4)
    assert inst.alloc.used_blocks == 0


def test_a_mixed_instance_prefills_the_same_request(tiny):
    inst = make_instance(tiny, EngineSettings(kv_bytes=100 * tiny.block_bytes, watermark=0.0))
    rec = RequestRecord("a", "s", tiny.model, 0.0, 100, 5)
    inst.admit(rec, 4096, 0.0)
    assert "a" in inst.waiting and "a" not in inst.alloc
    end = inst.start(0.0, fail)
    assert inst.work.plan.prefill_tokens == 100 and end == pytest.approx(tiny.pre(100))


def test_a_request_whose_kv_does_not_fit_re_prefills_prompt_and_first_token(tiny):
    engine = EngineSettings(kv_bytes=4 * tiny.block_bytes, watermark=0.0, decode_only=True)
    inst = make_instance(tiny, engine)
    rec = RequestRecord("a", "s", tiny.model, 0.0, 100, 3)  # 7 blocks of KV, 4 in the pool
    inst.admit(rec, 4096, 0.0)
    assert "a" in inst.waiting and "a" not in inst.alloc
    assert rec.produced == 1 and inst.core.requests["a"].sched.prompt_tokens == 101


def test_arrivals_during_a_step_land_at_its_end(tiny):
    sim = tiny.sim(engine=EngineSettings(decode_only=True), fast_forward=False)
    reqs = Workload((W("a", 0.0, 200, 6, "s"), W("b", 0.001, 300, 4, "s")))
    res = sim.run(reqs.requests)
    by = {r.request_id: r for r in res.records}
    assert all(r.done and r.ttft_s == 0.0 for r in by.values())
    first = tiny.dec(1, 201)
    # b arrived during a's first decode and joined at its end; each step decodes both (a's context
    # 202 then, b's 301), b's three tokens after its first
    assert by["b"].finish_s == pytest.approx(first + tiny.dec(2, 503) + tiny.dec(2, 505) + tiny.dec(2, 507))
    assert tiny.kv_mismatches(sim) == []


def test_a_decode_workers_latency_model_prices_no_prefill():
    lm = latency_model(model_arch("llama2-7b"), A100, 1)
    dw = decode_worker(lm)
    assert lm.prefill.predict(500) > 0 and dw.prefill.predict(500) == 0.0
    assert dw.decode.predict(8, 300) == lm.decode.predict(8, 300)
    assert dw.decode.context_limit(8, 0.015) == lm.decode.context_limit(8, 0.015)

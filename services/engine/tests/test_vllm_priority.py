"""The vLLM backend with ``scheduling_policy: priority`` on the real vLLM (CPU build here): a request's
priority reaches vLLM, so with one slot (``max_num_seqs: 1``) a high-priority request submitted after
low ones is served before them. One vLLM engine for the module (a start costs about a minute on 2
cores); the direction of the mapping is unit-tested in test_vllm_mappings.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import chunk_checks as cc
import pytest
from llmfleet.spec.vllm import VllmSettings
from llmfleet.types import ModelSpec
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import FinishReason
from llmfleet_engine.validation import build_request
from llmfleet_engine.vllm_backend import VllmConfig, VllmExecutor, VllmLoadedModel
from vllm_marks import VLLM_DEVICE, VLLM_TINY_SOURCE, requires_vllm

pytestmark = [*requires_vllm, pytest.mark.timeout(600)]

NAME = "tiny-mistral-priority"
SETTINGS = VllmSettings(
    kv_cache_memory_bytes=128 * 2**20,
    max_model_len=512,
    enforce_eager=True,
    dtype="float32",
    max_num_seqs=1,  # one slot: the order requests are served in is the order vLLM picks them
    scheduling_policy="priority",
)
WAIT_S = 60.0  # vLLM's stats reach the adapter after its next step; a bound, not a timing


@pytest.fixture(scope="module")
def vexec(cache_dir: Path) -> Iterator[VllmExecutor]:
    config = VllmConfig(settings=SETTINGS, device=VLLM_DEVICE, cache_dir=cache_dir, allow_download=False)
    executor = VllmExecutor(config)
    try:
        executor.load(ModelSpec(name=NAME, source=VLLM_TINY_SOURCE))
        yield executor
    finally:
        executor.close()


async def test_a_high_priority_request_submitted_last_is_served_first(
    vexec: VllmExecutor, mistral: LoadedModel, long_prompt
) -> None:
    model = vexec.models[NAME]
    assert isinstance(model, VllmLoadedModel)
    n = 400  # the slot's holder runs far longer than the checks below take
    holder = vexec.submit(build_request(model, long_prompt(mistral, n), max_tokens=n, request_id="holder"))
    assert not (await holder.__anext__()).final  # it holds the one slot
    order: list[str] = []

    async def collect(rid: str, stream) -> list:
        chunks = await stream.collect()
        order.append(rid)
        return chunks

    tasks = []
    for rid, priority in (("low-0", 0), ("low-1", 0), ("high", 5)):  # vLLM's arrival order
        req = build_request(model, "Once upon a time", max_tokens=4, request_id=rid, priority=priority)
        tasks.append(asyncio.create_task(collect(rid, vexec.submit(req))))
    await cc.wait_for(lambda: vexec.scheduler_view(NAME).waiting == 3, WAIT_S)  # all three wait in vLLM
    assert vexec.cancel("holder")  # the slot frees: vLLM picks the next by priority, then arrival
    results = await asyncio.gather(*tasks)
    for chunks in results:
        cc.check_stream(chunks)
        assert chunks[-1].finish_reason in (FinishReason.LENGTH, FinishReason.EOS)
    assert order == ["high", "low-0", "low-1"]

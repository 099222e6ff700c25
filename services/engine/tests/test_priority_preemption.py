"""The live executor preempts for priority (the engine core's ``PreemptionRule``): a high-priority
arrival on a full engine preempts the lowest-priority running request, which resumes later by
recompute with its greedy output unchanged."""

from __future__ import annotations

import asyncio

import torch
from llmfleet.testing import eventually
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.validation import build_request


def ids(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def greedy_no_eos(model: LoadedModel, prompt: str, n: int) -> list[int]:
    seq = list(model.tokenizer(prompt)["input_ids"])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            token = int(torch.argmax(model.model(torch.tensor([seq])).logits[0, -1]))
            out.append(token)
            seq.append(token)
    return out


async def test_high_priority_preempts_and_the_preempted_output_is_unchanged(make_executor, endless):
    ex = make_executor(max_running=2)
    prompts = ["A low priority story about engines", "Another low priority story about fleets"]
    lows = [ex.submit(build_request(endless, p, max_tokens=80)) for p in prompts]
    firsts = [await s.__anext__() for s in lows]  # both run (and hold the two slots)
    high_prompt = "An urgent question"
    high = ex.submit(build_request(endless, high_prompt, max_tokens=6, priority=1))
    got_high = await high.collect()
    await eventually(lambda: ex.preemptions >= 1, 5, "a low-priority request to be preempted")
    rest = await asyncio.gather(*(s.collect() for s in lows))
    assert ids(got_high) == greedy_no_eos(endless, high_prompt, 6)
    for p, first, chunks in zip(prompts, firsts, rest, strict=True):
        assert ids([first, *chunks]) == greedy_no_eos(endless, p, 80)
    assert ex.preemptions == 1  # the latest low one, once
    await eventually(lambda: ex.load_snapshot().kv_blocks_used == 0, 5, "all blocks back")

"""Helpers shared by integration tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import torch
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc, migration_pb2, migration_pb2_grpc


def hf_greedy(model_dir: Path | str, prompt: str, max_new_tokens: int) -> list[int]:
    """Reference continuation from transformers' own ``generate`` on the same checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


async def migration_status(address: str) -> migration_pb2.StatusResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        return await migration_pb2_grpc.MigrationStub(ch).Status(migration_pb2.StatusRequest(), timeout=5)


async def load_snapshot(address: str) -> common_pb2.LoadSnapshot:
    """The engine at ``address``'s load now: the first snapshot of its ``WatchLoad``."""
    async with grpc.aio.insecure_channel(address) as ch:
        stream = engine_pb2_grpc.EngineStub(ch).WatchLoad(engine_pb2.WatchLoadRequest(interval_s=0.05))
        snap = await anext(aiter(stream))
        stream.cancel()
    return snap


async def wait_running(address: str, predicate, timeout: float, what: str) -> dict[str, int]:
    """Poll the migration coordinator's view of per-engine running requests until ``predicate``."""
    deadline = time.monotonic() + timeout
    running: dict[str, int] = {}
    while time.monotonic() < deadline:
        st = await migration_status(address)
        running = {e.engine_id: e.load.running for e in st.engines if e.reporting}
        if predicate(running):
            return running
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last per-engine running: {running}")


def flatten(chunks: Sequence) -> list[int]:
    return [t for c in chunks for t in c.token_ids]

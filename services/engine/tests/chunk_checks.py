"""Checks on engine chunk streams shared by the executor and vLLM-backend tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmfleet_engine.outputs import EngineChunk


def ids(chunks: list[EngineChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def text(chunks: list[EngineChunk]) -> str:
    return "".join(c.text for c in chunks)


def check_stream(chunks: list[EngineChunk], start: int = 0) -> None:
    """Indices are contiguous from ``start``; only the last chunk is final and carries usage."""
    expected = start
    for c in chunks:
        assert c.index == expected
        expected += len(c.token_ids)
    assert chunks[-1].final and chunks[-1].usage is not None
    assert not any(c.final or c.usage for c in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == expected


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def read(call, tokens: list[int], n: int | None = None):
    """Read a gRPC token stream ``call`` into ``tokens`` (``n``: stop after that many tokens); the last chunk read."""
    last = None
    async for chunk in call:
        assert chunk.index == len(tokens) or not chunk.token_ids
        tokens.extend(chunk.token_ids)
        last = chunk
        if n is not None and len(tokens) >= n:
            break
    return last

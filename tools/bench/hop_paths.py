"""The ways ``hop_bench.py`` sends one request, each returning its client-side TTFT: direct to the
engine's ``Generate``, through the scheduler with the SDK, through its OpenAI-compatible HTTP API with
httpx, and the same with the official ``openai`` client."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.client import AsyncClient
from llmfleet.rpc.channels import open_channel

SERVICE = "hop"
MODEL = "tiny-llama"
PROMPT = "Once upon a time there was a tiny model"


def _ttft(what: str, t0: float, first: float | None, n: int, max_tokens: int) -> float:
    """Seconds from ``t0`` to the first chunk, once the request produced exactly ``max_tokens``."""
    if first is None or n != max_tokens:
        raise RuntimeError(f"{what} produced {n} tokens, wanted {max_tokens}")
    return first - t0


class Paths:
    """The ways to send one request; each returns its client-side TTFT in seconds."""

    def __init__(self, engine: str, scheduler: str, http: str = "", width: int = 100) -> None:
        self._engine_channel = open_channel(engine)
        self._engine = engine_pb2_grpc.EngineStub(self._engine_channel)
        self._client = AsyncClient(scheduler, timeout_s=60)
        self._base = f"http://{http}" if http else ""
        self._width = width
        self._http: Any = None  # aiohttp.ClientSession, made in the running loop on first use
        self._openai = None
        self._http_openai = None
        if http:
            import httpx

            # one connection per request in flight, all kept alive from one request (burst) to the next
            limits = httpx.Limits(max_connections=width + 8, max_keepalive_connections=width + 8)
            self._http_openai = httpx.AsyncClient(limits=limits, timeout=60)

    async def http(self, max_tokens: int) -> float:
        """``POST /v1/completions`` streamed; TTFT: the first ``data:`` event (the first chunk of tokens,
        whose text may still be empty); the final usage chunk checks the token count."""
        assert self._base, "no HTTP API address"
        if self._http is None:
            import aiohttp

            # one connection per request in flight, all kept alive from one request (burst) to the next
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._width + 8), timeout=aiohttp.ClientTimeout(total=60)
            )
        body = {
            "model": SERVICE,
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        first = None
        n = -1
        async with self._http.post(f"{self._base}/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
            async for raw in resp.content:
                if not raw.startswith(b"data: "):
                    continue
                if first is None:
                    first = time.perf_counter()
                if b'"usage":{' in raw:
                    n = json.loads(raw[6:])["usage"]["completion_tokens"]
        return _ttft("request through the HTTP API", t0, first, n, max_tokens)

    async def openai(self, max_tokens: int) -> float:
        """The same with the official ``openai`` client (``AsyncOpenAI``, no retries)."""
        if self._openai is None:
            import openai

            assert self._base, "no HTTP API address"
            self._openai = openai.AsyncOpenAI(
                base_url=f"{self._base}/v1",
                api_key="unused",
                max_retries=0,
                http_client=self._http_openai,
            )
        t0 = time.perf_counter()
        first = None
        n = -1
        stream = await self._openai.completions.create(
            model=SERVICE,
            prompt=PROMPT,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices:
                first = time.perf_counter()
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
        return _ttft("request through the openai client", t0, first, n, max_tokens)

    async def direct(self, max_tokens: int) -> float:
        t0 = time.perf_counter()
        req = engine_pb2.GenerateRequest(
            request_id=uuid.uuid4().hex,
            model=MODEL,
            prompt=PROMPT,
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        )
        first = None
        n = 0
        async for msg in self._engine.Generate(req, timeout=60):
            if first is None and msg.token_ids:
                first = time.perf_counter()
            n += len(msg.token_ids)
        return _ttft("direct request", t0, first, n, max_tokens)

    async def through(self, max_tokens: int) -> float:
        t0 = time.perf_counter()
        first = None
        n = 0
        async with self._client.generate(PROMPT, SERVICE, max_tokens=max_tokens) as stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = time.perf_counter()
                n += len(chunk.token_ids)
        return _ttft("request through the scheduler", t0, first, n, max_tokens)

    async def close(self) -> None:
        await self._client.close()
        await self._engine_channel.close()
        if self._http is not None:
            await self._http.close()
        if self._http_openai is not None:
            await self._http_openai.aclose()

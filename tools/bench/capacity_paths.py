"""The SDK path against the OpenAI HTTP paths, side by side in one run (``make bench-capacity``'s
``paths`` arm).

Each round runs ``total`` streamed ``tokens``-token requests, ``concurrency`` in flight (closed loop:
a worker sends its next request when the last one ended), from ``generators`` processes, once per
path, the paths alternating round by round so that the machine's drift falls on both:

* ``sdk``: ``llmfleet.client.AsyncClient.generate`` (one multiplexed ``SubmitMany`` call per process);
* ``http``: ``POST /v1/completions`` with ``"stream": true`` over aiohttp (keep-alive connections; the
  load generator of vLLM's serving benchmark), the server-sent events read to ``[DONE]``, served by
  the scheduler's own HTTP API;
* ``front``: the same requests to the OpenAI front (``llmfleet-front``), which sends them to the
  scheduler on the SDK's multiplexed path.

Per round: requests/s completed, errors, client TTFT p50/p99, the CPU of the scheduler processes per
request, net of their idle CPU (``idle``: CPU seconds per second with no load), and on the ``front``
path the front's own CPU per request (its processes, net of their idle CPU) too."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np

PATHS = ("sdk", "http", "front")


def _client(
    path: str, target: str, service: str, prompt: str, tokens: int, concurrency: int, total: int, q
) -> None:
    """(a generator process) ``total`` requests over ``concurrency`` workers; puts its results on ``q``."""
    import logging

    logging.getLogger("llmfleet.client").setLevel(logging.ERROR)
    run = _sdk if path == "sdk" else _http
    q.put(asyncio.run(_closed_loop(run, target, service, prompt, tokens, concurrency, total)))


async def _closed_loop(
    run: Callable, target: str, service: str, prompt: str, tokens: int, concurrency: int, total: int
) -> dict[str, Any]:
    ttfts: list[float] = []
    errors: list[str] = []
    left = [total]

    async def worker(send: Callable) -> None:
        while left[0] > 0:
            left[0] -= 1
            t0 = time.perf_counter()
            try:
                first = await send()
                ttfts.append(first - t0)
            except Exception as e:  # counted, never fatal
                errors.append(f"{type(e).__name__}: {e}"[:200])

    async with run(target, service, prompt, tokens, concurrency) as send:
        await send()  # open the connections before the clock starts
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        await asyncio.gather(*(worker(send) for _ in range(concurrency)))
        wall = time.perf_counter() - start
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "completed": len(ttfts),
        "ttfts": ttfts,
        "errors": errors,
        "wall_s": wall,
        "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
    }


class _sdk:
    """``send()``: one streamed request through the SDK, read to its end; returns when its first token
    arrived."""

    def __init__(self, target: str, service: str, prompt: str, tokens: int, concurrency: int) -> None:
        from llmfleet.client import AsyncClient

        self.client = AsyncClient(target, timeout_s=60)
        self.service, self.prompt, self.tokens = service, prompt, tokens

    async def __aenter__(self) -> Callable:
        await self.client.__aenter__()
        return self.send

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)

    async def send(self) -> float:
        first = None
        async with self.client.generate(self.prompt, self.service, max_tokens=self.tokens) as stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = time.perf_counter()
        if first is None or stream.usage is None:
            raise RuntimeError("stream ended without tokens or usage")
        return first


class _http:
    """``send()``: one streamed ``/v1/completions`` request over aiohttp, read to ``[DONE]``."""

    def __init__(self, target: str, service: str, prompt: str, tokens: int, concurrency: int) -> None:
        self.url = f"http://{target}/v1/completions"
        self.concurrency = concurrency
        self.body = {"model": service, "prompt": prompt, "max_tokens": tokens, "stream": True}

    async def __aenter__(self) -> Callable:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self.concurrency + 4)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))
        return self.send

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def send(self) -> float:
        first = None
        last = b""
        async with self.session.post(self.url, json=self.body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
            async for line in r.content:
                line = line.strip()
                if not line:
                    continue
                if first is None and line.startswith(b"data: {"):
                    first = time.perf_counter()
                if b'"error"' in line:
                    raise RuntimeError(line[:200].decode(errors="replace"))
                last = line
        if first is None or last != b"data: [DONE]":
            raise RuntimeError(f"stream ended early: {last[:200]!r}")
        return first


def run_round(
    path: str,
    target: str,
    service: str,
    prompt: str,
    tokens: int,
    concurrency: int,
    total: int,
    generators: int,
    cpu: Callable[[], float],
    idle_per_s: float,
    front_cpu: Callable[[], float] | None = None,
    front_idle_per_s: float = 0.0,
) -> dict[str, Any]:
    """One round of ``total`` requests on ``path``; ``cpu()``: the scheduler processes' CPU seconds so far,
    ``idle_per_s``: theirs with no load; ``front_cpu``, ``front_idle_per_s``: the same of the front's
    processes (the ``front`` path)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(
            target=_client,
            args=(path, target, service, prompt, tokens, concurrency // generators, total // generators, q),
        )
        for _ in range(generators)
    ]
    for p in procs:
        p.start()
    time.sleep(1.5)  # the generators import and connect before the clock starts
    c0, f0, t0 = cpu(), front_cpu() if front_cpu else 0.0, time.monotonic()
    results = [q.get(timeout=600) for _ in procs]
    span = time.monotonic() - t0
    c1, f1 = cpu(), front_cpu() if front_cpu else 0.0
    for p in procs:
        p.join(30)
    done = sum(r["completed"] for r in results)
    wall = max(r["wall_s"] for r in results)
    ttft = np.array([t * 1000 for r in results for t in r["ttfts"]])
    errors = [e for r in results for e in r["errors"]]
    sched = max(0.0, c1 - c0 - idle_per_s * span)
    front = max(0.0, f1 - f0 - front_idle_per_s * span)
    return {
        "path": path,
        "requests": total,
        "completed": done,
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "rps": done / wall if wall else 0.0,
        "ttft_p50_ms": float(np.percentile(ttft, 50)) if ttft.size else None,
        "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft.size else None,
        "scheduler_cpu_ms_per_req": 1000 * sched / done if done else None,
        "front_cpu_ms_per_req": 1000 * front / done if done and front_cpu else None,
        "clients_cpu_s": sum(r["cpu_s"] for r in results),
    }


def _ratios(rounds: list[dict[str, Any]], path: str) -> tuple[list[float], list[float]]:
    """``path`` ÷ SDK per round (scheduler CPU per request, requests/s)."""
    sdk = [r for r in rounds if r["path"] == "sdk"]
    other = [r for r in rounds if r["path"] == path]
    cpu = [h["scheduler_cpu_ms_per_req"] / s["scheduler_cpu_ms_per_req"] for s, h in zip(sdk, other, strict=False)
           if s["scheduler_cpu_ms_per_req"] and h["scheduler_cpu_ms_per_req"]]  # fmt: skip
    rps = [h["rps"] / s["rps"] for s, h in zip(sdk, other, strict=False) if s["rps"]]
    return [round(x, 2) for x in cpu], [round(x, 2) for x in rps]


def compare(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """HTTP ÷ SDK and front ÷ SDK per round (scheduler CPU per request and requests/s), with their
    spread; ``met``: per path, every round within the goals."""
    out: dict[str, Any] = {"goal_cpu_ratio": 1.5, "goal_rps_ratio": 0.7, "met": {}}
    for path in PATHS[1:]:
        cpu, rps = _ratios(rounds, path)
        if not cpu and not rps:
            continue
        out[f"cpu_per_req_{path}_over_sdk"] = cpu
        out[f"rps_{path}_over_sdk"] = rps
        out["met"][path] = bool(cpu and rps and max(cpu) <= 1.5 and min(rps) >= 0.7)
    return out


def markdown(section: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## SDK vs OpenAI HTTP ({section['concurrency']} concurrent, {section['tokens']}-token streams, "
        f"{section['generators']} client processes, paths alternating)",
        "",
        "| round | path | req/s | errors | TTFT p50 ms | TTFT p99 ms | sched. CPU ms/req | front CPU ms/req "
        "| clients CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    paths = len({r["path"] for r in section["rounds"]}) or 1
    for i, r in enumerate(section["rounds"]):
        front = f"{r['front_cpu_ms_per_req']:.2f}" if r.get("front_cpu_ms_per_req") is not None else "-"
        lines.append(
            f"| {i // paths} | {r['path']} | {r['rps']:.0f} | {r['errors']} | {r['ttft_p50_ms'] or 0:.0f} | "
            f"{r['ttft_p99_ms'] or 0:.0f} | {r['scheduler_cpu_ms_per_req'] or 0:.2f} | {front} | "
            f"{r['clients_cpu_s']:.1f} |"
        )
    c = section["ratios"]
    lines.append("")
    for path, met in c["met"].items():
        lines.append(
            f"{path} ÷ SDK scheduler CPU per request: {c[f'cpu_per_req_{path}_over_sdk']} "
            f"(goal ≤ {c['goal_cpu_ratio']}); requests/s: {c[f'rps_{path}_over_sdk']} "
            f"(goal ≥ {c['goal_rps_ratio']}): {'met' if met else 'not met'}."
        )
    return lines

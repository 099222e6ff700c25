"""``make bench-engine``, the backends section: the native engine, the vLLM backend and transformers'
``generate`` on the same checkpoint, on this machine's CPU.

The checkpoint is ``tiny://mistral`` without EOS (every request runs to ``max_tokens``), in float32
for all three (vLLM's CPU attention needs a head size that is a multiple of 32, which the tiny llama
of the other sections does not have). Per batch size (1, 8, 32; equal-length prompts, so HF needs no
padding) each repeat runs the native engine, vLLM and HF back to back, so machine noise hits all three
alike; tokens/s are medians over the repeats with their min..max. Also measured: TTFT at batch 1 (the
first chunk of a lone request), load time, and resident memory after the load (RSS of this process's
growth plus vLLM's engine-core processes). No goal is set on CPU speed: these are measurements.

vLLM runs in its own processes (its engine core), with ``VLLM_SETTINGS``; its first load includes
its start-up (process spawn, model load, KV cache allocation, warm-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from llmfleet.spec.vllm import VllmSettings
from llmfleet.types import ModelSpec
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import LoadedModel, load_model, materialize, without_eos
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import GenerationRequest
from llmfleet_engine.vllm_backend import VllmConfig, VllmExecutor

BATCHES = (1, 8, 32)
VLLM_SETTINGS = VllmSettings(
    kv_cache_memory_bytes=256 * 2**20, max_model_len=512, enforce_eager=True, dtype="float32"
)


def _rss(pids: list[int]) -> int:
    import psutil

    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss
    return total


def _children() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


def _request(model: str, ids: list[int], rid: str, new: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        model=model,
        prompt="<bench>",
        prompt_token_ids=tuple(ids),
        sampling=SamplingConfig(max_tokens=new),
    )


async def _run(ex: Any, model: str, batch: list[list[int]], new: int) -> tuple[float, float]:
    """(seconds for the whole batch, seconds to the first chunk of the first request)."""
    t0 = time.perf_counter()
    streams = [
        ex.submit(_request(model, ids, f"r{i}-{time.monotonic_ns()}", new)) for i, ids in enumerate(batch)
    ]
    first = await streams[0].__anext__()
    ttft = time.perf_counter() - t0
    rest = await asyncio.gather(*(s.collect() for s in streams))
    dt = time.perf_counter() - t0
    got = [sum(len(c.token_ids) for c in r) for r in rest]
    got[0] += len(first.token_ids)
    assert got == [new] * len(batch), f"every request runs to max_tokens: {got}"
    return dt, ttft


def _loaded(load: Callable[[], Any]) -> tuple[Any, float, int]:
    """Run ``load``; (its result, seconds, resident bytes it added to this process and its children)."""
    before = _rss([os.getpid(), *_children()])
    t0 = time.perf_counter()
    result = load()
    seconds = time.perf_counter() - t0
    return result, seconds, _rss([os.getpid(), *_children()]) - before


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def backends(
    models: Path, repeats: int, new: int, prompt_tokens: int, hf_generate_s: Callable, device: str = "cpu"
) -> dict:
    """The three side by side on ``device`` (``hf_generate_s(model, batch, new)``: engine_bench's HF
    timing)."""

    path = without_eos(materialize("tiny://mistral", models), models / "mistral-no-eos")
    spec = ModelSpec(name="tiny-mistral", source=str(path))
    hf: LoadedModel
    hf, hf_load_s, hf_rss = _loaded(
        lambda: load_model(spec, device=device, cache_dir=models, allow_download=False)
    )
    native = Executor(
        ExecutorConfig(device=device, cache_dir=models, max_batch_requests=32, allow_download=False)
    )
    _, native_load_s, native_rss = _loaded(lambda: native.host.load(spec))
    vllm = VllmExecutor(
        VllmConfig(settings=VLLM_SETTINGS, device=device, cache_dir=models, allow_download=False)
    )
    _, vllm_load_s, vllm_rss = _loaded(lambda: vllm.host.load(spec))
    engines = {"native": native, "vllm": vllm}
    g = torch.Generator().manual_seed(0)
    rows = []
    try:
        for b in BATCHES:
            batch = [
                torch.randint(4, hf.vocab_size, (prompt_tokens,), generator=g).tolist() for _ in range(b)
            ]
            for ex in engines.values():
                await _run(ex, spec.name, batch, 4)  # warm-up
            hf_generate_s(hf, batch, 4)
            tps: dict[str, list[float]] = {"native": [], "vllm": [], "hf": []}
            ttft: dict[str, list[float]] = {"native": [], "vllm": []}
            for _ in range(repeats):
                for name, ex in engines.items():
                    dt, first = await _run(ex, spec.name, batch, new)
                    tps[name].append(b * new / dt)
                    ttft[name].append(first)
                tps["hf"].append(b * new / hf_generate_s(hf, batch, new))
            row = {"batch": b, **{f"{k}_tokens_per_s": _spread(v) for k, v in tps.items()}}
            if b == 1:
                row.update({f"{k}_ttft_s": _spread(v) for k, v in ttft.items()})
            rows.append(row)
            print(
                f"  batch {b:>2}: native {row['native_tokens_per_s']['median']:7.0f}, vLLM "
                f"{row['vllm_tokens_per_s']['median']:7.0f}, HF {row['hf_tokens_per_s']['median']:7.0f} tok/s"
            )
    finally:
        vllm.close()
        native.close()
    return {
        "checkpoint": f"tiny://mistral without EOS, float32, on {device}",
        "vllm_settings": VLLM_SETTINGS.model_dump(),
        "load_s": {"native": native_load_s, "vllm": vllm_load_s, "hf": hf_load_s},
        "rss_bytes": {"native": native_rss, "vllm": vllm_rss, "hf": hf_rss},
        "rows": rows,
    }


def _cell(row: dict, key: str, fmt: str = "{:.0f}") -> str:
    v = row.get(key)
    if v is None:
        return "-"
    return f"{fmt.format(v['median'])} [{fmt.format(v['min'])}..{fmt.format(v['max'])}]"


def markdown(section: dict) -> list[str]:
    """The section's lines of ``engine.md``."""
    lines = [
        "## Backends: native engine, vLLM and HF generate (same checkpoint, CPU)",
        "",
        f"{section['checkpoint']}; vLLM settings {section['vllm_settings']}.",
        "",
        "| batch | native tok/s | vLLM tok/s | HF generate tok/s | native TTFT | vLLM TTFT |",
        "|---|---|---|---|---|---|",
    ]
    for r in section["rows"]:
        cells = [_cell(r, k) for k in ("native_tokens_per_s", "vllm_tokens_per_s", "hf_tokens_per_s")]
        cells += [_cell(r, k, "{:.3f}") for k in ("native_ttft_s", "vllm_ttft_s")]
        lines.append(f"| {r['batch']} | " + " | ".join(cells) + " |")
    load, rss = section["load_s"], section["rss_bytes"]
    lines += [
        "",
        "| | native | vLLM | HF |",
        "|---|---|---|---|",
        f"| load (s) | {load['native']:.1f} | {load['vllm']:.1f} | {load['hf']:.1f} |",
        f"| resident memory added (MiB) | {rss['native'] / 2**20:.0f} | {rss['vllm'] / 2**20:.0f} | "
        f"{rss['hf'] / 2**20:.0f} |",
        "",
    ]
    return lines

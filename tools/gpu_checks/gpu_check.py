"""``make gpu-check``: GPU-measured costs of the native engine beside transformers and the vidur tables.

One prepared run (≤ 8 min on one H100/H200; ``--budget-s`` stops the sweeps early and says so):

1. A random Llama of a 1B shape (TinyLlama-1.1B's: 22 layers, hidden 2048, FFN 5632, 32 heads, 4 KV
   heads, vocab 32,000) in bf16 on ``--device`` (``tiny``: a 2-layer toy for CI on CPU).
2. The engine's own profiler (``Executor.profile``): prefill of b × n tokens and decode of b sequences
   at context c, b ∈ {1, 2, 4, 8, 16, 32}, n, c ∈ {128, 512, 2048}, median of ``--repeats``.
3. Native engine vs transformers ``generate`` (greedy, equal-length 128-token prompts, 32 new tokens,
   batch 1, 8, 32), back to back per repeat as ``engine_bench.py`` does on CPU; the ratio per repeat,
   its median and min..max.
4. The vidur source (``costmodel.vidur``: Microsoft Vidur's measured operators on ``--vidur-hw``,
   roofline attention, without its 2 ms constant) and the roofline predict every profiled point; the
   residual measured − vidur at each decode point is fitted as a per-iteration overhead a + c·b (the
   quantity ``costmodel.overhead`` takes from Vidur's CPU profile), reported beside that fit.

Writes ``gpu_check.json`` and ``gpu_check.md`` under ``--out`` (default ``.bench/gpu``). On CPU
(``--device cpu``) the same code runs, so that it cannot rot; the numbers then describe the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from llmfleet.costmodel import hardware
from llmfleet.costmodel.models import arch_from_hf_config
from llmfleet.costmodel.overhead import VIDUR_A100_OVERHEAD
from llmfleet.costmodel.roofline import decode_time, prefill_time
from llmfleet.costmodel.vidur import vidur_legs
from llmfleet.types import ModelSpec
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import load_model, materialize
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.validation import GenerationRequest

from tools.toolkit.stats import spread as median_spread

SHAPES: dict[str, dict[str, int]] = {
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}
BATCHES = (1, 2, 4, 8, 16, 32)
LENGTHS = (128, 512, 2048)
HF_BATCHES = (1, 8, 32)
PROMPT, NEW = 128, 32


def build_model(shape: str, dtype: str, root: Path) -> Path:
    """A seeded random Llama of ``shape`` saved in ``dtype``, with the tiny tokenizer beside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = root / f"llama-{shape}-{dtype}"
    if path.exists():
        return path
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, eos_token_id=None)
    LlamaForCausalLM(cfg).to(getattr(torch, dtype)).save_pretrained(path)
    tok = Path(materialize("tiny://llama", root))
    for f in tok.glob("*token*"):
        (path / f.name).write_bytes(f.read_bytes())
    return path


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and how many."""
    return {**median_spread(values), "n": len(values)}


async def native_vs_hf(ex, model, device: str, repeats: int, deadline: float) -> list[dict]:
    """Tokens/s of the engine and of ``generate`` on the same batches, back to back per repeat."""

    async def native(batch: list[list[int]]) -> float:
        _sync(device)
        t0 = time.perf_counter()
        streams = [
            ex.submit(
                GenerationRequest(
                    request_id=f"g{i}-{time.monotonic_ns()}",
                    model=model.name,
                    prompt="<gpu-check>",
                    prompt_token_ids=tuple(ids),
                    sampling=SamplingConfig(max_tokens=NEW),
                )
            )
            for i, ids in enumerate(batch)
        ]
        out = await asyncio.gather(*(s.collect() for s in streams))
        dt = time.perf_counter() - t0
        if any(sum(len(c.token_ids) for c in r) != NEW for r in out):
            raise RuntimeError("a request stopped before max_tokens")
        return len(batch) * NEW / dt

    def hf(batch: list[list[int]]) -> float:
        ids = torch.tensor(batch, device=model.model.device)
        with torch.inference_mode():
            _sync(device)
            t0 = time.perf_counter()
            out = model.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                pad_token_id=0,
            )
            _sync(device)
            dt = time.perf_counter() - t0
        if out.shape[1] != ids.shape[1] + NEW:
            raise RuntimeError("generate stopped early")
        return len(batch) * NEW / dt

    rows = []
    g = torch.Generator().manual_seed(1)
    for b in HF_BATCHES:
        if time.monotonic() > deadline:
            rows.append({"batch": b, "skipped": "time budget"})
            continue
        batch = [torch.randint(4, model.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(b)]
        await native(batch)  # warm-up
        hf(batch)
        nat, ref = [], []
        for _ in range(repeats):
            nat.append(await native(batch))
            ref.append(hf(batch))
        rows.append(
            {
                "batch": b,
                "native_tok_s": spread(nat),
                "hf_tok_s": spread(ref),
                "ratio": spread([n / h for n, h in zip(nat, ref, strict=True)]),
            }
        )
        print(f"  batch {b:>2}: native/HF {rows[-1]['ratio']['median']:.2f}x", file=sys.stderr)
    return rows


def predictions(arch, hw_name: str, phase: str, b: int, n: int) -> dict[str, float | str | None]:
    """vidur (no constant overhead) and roofline seconds for one profiled point."""

    hw = hardware(hw_name)
    out: dict[str, float | str | None] = {}
    try:
        legs = vidur_legs(arch, hw, 1, overhead_s=0.0)
        if phase == "prefill":
            t, q = b * n, b * n * n
            out["vidur_s"] = max(a + be * t + g * q for a, be, g in legs.prefill)
        else:
            out["vidur_s"] = max(a + be * b + g * b * n for a, be, g in legs.decode)
    except LookupError as e:
        out["vidur_s"], out["vidur_error"] = None, str(e)
    if phase == "prefill":
        out["roofline_s"] = prefill_time(arch, hw, b * n, 1, [n] * b)
    else:
        out["roofline_s"] = decode_time(arch, hw, b, n, 1)
    return out


def fit_residual(points: list[dict]) -> dict[str, float] | None:
    """Least squares a + c·b of (measured − vidur) over the decode points (the engine's overhead)."""
    pts = [
        (p["batch"], p["seconds"] - p["vidur_s"])
        for p in points
        if p["phase"] == "decode" and p.get("vidur_s")
    ]
    if len({b for b, _ in pts}) < 2:
        return None
    c, a = np.polyfit([b for b, _ in pts], [r for _, r in pts], 1)
    return {"a_ms": 1e3 * float(a), "c_ms_per_request": 1e3 * float(c), "points": len(pts)}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--out", type=Path, default=Path(".bench/gpu"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt/context lengths")
    ap.add_argument(
        "--vidur-hw", default=None, help="catalog hardware for the vidur tables (default by device)"
    )
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new work after this")
    return ap


def measure(
    a: argparse.Namespace, batches: list[int], lengths: list[int], vidur_hw: str, deadline: float
) -> tuple[list[dict], list[list], list[dict]]:
    """Build and load the model, profile it and race it against HF ``generate``: (the profiled points
    with their predictions, the skipped points, the native-vs-HF rows)."""

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = build_model(a.shape, a.dtype, root)
        model = load_model(
            ModelSpec(name=f"llama-{a.shape}", source=str(path), dtype=a.dtype),
            device=a.device,
            cache_dir=root,
            allow_download=False,
        )
        block = 1 << 20 if a.device.startswith("cuda") else 64 * 1024
        ex = Executor(
            ExecutorConfig(
                device=a.device,
                cache_dir=root,
                max_batch_requests=max(*batches, *HF_BATCHES),
                allow_download=False,
                block_bytes=block,
            )
        )
        ex.host.add_loaded(model)
        arch = arch_from_hf_config(model.model.config, dtype="bfloat16" if a.dtype == "bfloat16" else a.dtype)
        try:
            usable = [n for n in lengths if n < model.max_context]
            prof = ex.profile(
                model.name,
                batch_sizes=batches,
                input_lengths=usable,
                context_lengths=usable,
                repeats=a.repeats,
            )
            points = []
            for s in prof.samples:
                points.append(
                    {
                        "phase": s.phase,
                        "batch": s.batch_size,
                        "tokens": s.tokens,
                        "seconds": s.seconds,
                        **predictions(arch, vidur_hw, s.phase, s.batch_size, s.tokens),
                    }
                )
            print(f"  profiled {len(points)} points ({len(prof.skipped)} skipped)", file=sys.stderr)
            hf = asyncio.run(native_vs_hf(ex, model, a.device, a.repeats, deadline))
        finally:
            ex.close()
    return points, [list(x) for x in prof.skipped], hf


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; run with --device cpu", file=sys.stderr)
        return 2
    if a.repeats < 1:
        ap.error("--repeats must be ≥ 1")
    batches = [int(x) for x in a.batches.split(",")]
    lengths = [int(x) for x in a.lengths.split(",")]
    name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else platform.processor() or "cpu"
    vidur_hw = a.vidur_hw or ("h100-80gb" if "H100" in name or "H200" in name else "a100-80gb")
    t0 = time.monotonic()

    points, skipped, hf = measure(a, batches, lengths, vidur_hw, t0 + a.budget_s)
    result = {
        "device": a.device,
        "device_name": name,
        "shape": {"name": a.shape, **SHAPES[a.shape], "dtype": a.dtype},
        "vidur_hw": vidur_hw,
        "profile": points,
        "skipped": skipped,
        "native_vs_hf": hf,
        "engine_overhead_fit": fit_residual(points),
        "vidur_cpu_overhead_fit_tp1": {
            "a_ms": 1e3 * VIDUR_A100_OVERHEAD.fits[1][0],
            "c_ms_per_request": 1e3 * VIDUR_A100_OVERHEAD.fits[1][1],
        },
        "wall_s": time.monotonic() - t0,
        "budget_s": a.budget_s,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_check.json").write_text(json.dumps(result, indent=1))
    (a.out / "gpu_check.md").write_text(markdown(result))
    print(f"wrote {a.out / 'gpu_check.json'} and gpu_check.md in {result['wall_s']:.0f} s", file=sys.stderr)
    return 0


def markdown(r: dict) -> str:
    lines = [
        f"# gpu-check on {r['device_name']} ({r['device']}), {r['shape']['name']} Llama in {r['shape']['dtype']}",
        "",
    ]
    lines += [
        "| phase | batch | tokens | measured ms | vidur ms | roofline ms | measured/vidur |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in r["profile"]:
        v = p.get("vidur_s")
        ratio = f"{p['seconds'] / v:.2f}" if v else "–"
        vv = f"{1e3 * v:.3f}" if v else "–"
        lines.append(
            f"| {p['phase']} | {p['batch']} | {p['tokens']} | {1e3 * p['seconds']:.3f} | {vv} | "
            f"{1e3 * p['roofline_s']:.3f} | {ratio} |"
        )
    lines += ["", "| batch | native tok/s | HF tok/s | native/HF (min..max) |", "|---|---|---|---|"]
    for h in r["native_vs_hf"]:
        if "skipped" in h:
            lines.append(f"| {h['batch']} | skipped ({h['skipped']}) | | |")
            continue
        q = h["ratio"]
        lines.append(
            f"| {h['batch']} | {h['native_tok_s']['median']:.0f} | {h['hf_tok_s']['median']:.0f} | "
            f"{q['median']:.2f} ({q['min']:.2f}..{q['max']:.2f}) |"
        )
    f, v = r["engine_overhead_fit"], r["vidur_cpu_overhead_fit_tp1"]
    lines += [
        "",
        "Per-iteration overhead a + c·b (decode residual measured − vidur):",
        f"engine {f['a_ms']:.2f} ms + {f['c_ms_per_request']:.3f} ms·b" if f else "engine: not enough points",
        f"; Vidur's CPU profile of vLLM (TP 1) {v['a_ms']:.2f} ms + {v['c_ms_per_request']:.3f} ms·b.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

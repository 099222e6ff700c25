"""``make bench-engine``: the native engine measured side by side in one run.

1. Decode throughput of the native executor vs transformers ``generate`` on the same tiny llama,
   batch 1, 8 and 32 (equal-length prompts, so HF needs no padding: its best case). Each repeat runs
   the native engine and then HF back to back, so machine noise hits both alike; the ratio is taken
   per repeat and reported as its median with the min..max spread over the repeats.
2. Two models sharing one pool vs each alone on the same work (SeaLLM reports <= 8% overhead),
   interleaved the same way: the overhead per repeat, its median and spread.
3. KV transfer on loopback between two engine servers: ExportKv throughput and a live Migrate of a
   1,000-token request, with a llama-shaped model large enough for the bytes to matter.
4. The backends side by side where vLLM is installed (``make setup-vllm``): the native engine, the
   vLLM backend and HF ``generate`` on one checkpoint, tokens/s at batch 1, 8 and 32, TTFT, load time
   and resident memory (``engine_backends.py``).

1 and 2 run once per intra-op thread count of ``--threads`` (default ``default,1``: torch's default
count, then 1); both sides always use the same count (HF in the main thread, the engine's worker via
``ExecutorConfig.num_threads``). On a small CPU box the count matters more than anything else: with
more than one thread, every parallel region of a tiny model's ops wakes sleeping OpenMP threads that
the event loop and the other runs compete with, which makes HF and the engine alike several times
slower and noisy; one thread shows the engines' own costs. Writes ``engine.json``, ``engine.md`` and
PNG plots to ``--out``. Nothing is asserted: these are measurements; the goals from the issue are
printed next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import torch
from llmfleet.api.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from llmfleet.rpc import GrpcServer
from llmfleet.rpc.server import service_name
from llmfleet.types import ModelSpec
from llmfleet_engine.executor import Executor, ExecutorConfig
from llmfleet_engine.models import LoadedModel, load_model, materialize, without_eos
from llmfleet_engine.sampling import SamplingConfig
from llmfleet_engine.servicer import EngineServicer
from llmfleet_engine.validation import GenerationRequest
from transformers import LlamaConfig, LlamaForCausalLM

from tools.bench import engine_backends

NEW_TOKENS = 64
PROMPT_TOKENS = 32


def endless(source: str, models: Path, name: str) -> LoadedModel:
    path = without_eos(materialize(source, models), models / f"{name}-no-eos")
    return load_model(ModelSpec(name=name, source=str(path)), cache_dir=models, allow_download=False)


def medium_llama(models: Path) -> LoadedModel:
    """A random llama with 16 KiB of KV per token (4 layers x 8 KV heads x 64 dims, fp32)."""
    path = models / "medium-llama"
    if not path.exists():
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=512,
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            max_position_embeddings=4096,
            eos_token_id=None,
        )
        LlamaForCausalLM(cfg).save_pretrained(path)
        tok_src = Path(materialize("tiny://llama", models))
        for f in tok_src.glob("*token*"):
            (path / f.name).write_bytes(f.read_bytes())
    return load_model(
        ModelSpec(name="medium-llama", source=str(path)), cache_dir=models, allow_download=False
    )


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (length,), generator=g).tolist() for _ in range(n)]


def request(model: LoadedModel, ids: list[int], rid: str, new: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        model=model.name,
        prompt="<bench>",
        prompt_token_ids=tuple(ids),
        sampling=SamplingConfig(max_tokens=new),
    )


async def run_requests(ex: Executor, work: list[tuple[LoadedModel, list[int]]], new: int) -> float:
    t0 = time.perf_counter()
    streams = [
        ex.submit(request(m, ids, f"r{i}-{time.monotonic_ns()}", new)) for i, (m, ids) in enumerate(work)
    ]
    results = await asyncio.gather(*(s.collect() for s in streams))
    dt = time.perf_counter() - t0
    assert all(sum(len(c.token_ids) for c in r) == new for r in results), "every request runs to max_tokens"
    return dt


def hf_generate_s(model: LoadedModel, batch: list[list[int]], new: int) -> float:
    ids = torch.tensor(batch, device=model.model.device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
        )
        if ids.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new
    return dt


def spread(values: list[float]) -> dict:
    """Median and min..max of per-repeat values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


async def throughput(llama: LoadedModel, models: Path, repeats: int, threads: int | None) -> list[dict]:
    rows = []
    ex = Executor(
        ExecutorConfig(cache_dir=models, max_batch_requests=32, allow_download=False, num_threads=threads)
    )
    ex.host.add_loaded(llama)
    try:
        for b in (1, 8, 32):
            batch = prompts(b, PROMPT_TOKENS, llama.vocab_size, seed=b)
            work = [(llama, ids) for ids in batch]
            await run_requests(ex, work, 4)  # warm-up
            hf_generate_s(llama, batch, 4)
            native, hf = [], []
            for _ in range(repeats):  # back to back: a noisy moment hits both
                native.append(b * NEW_TOKENS / await run_requests(ex, work, NEW_TOKENS))
                hf.append(b * NEW_TOKENS / hf_generate_s(llama, batch, NEW_TOKENS))
            ratio = spread([n / h for n, h in zip(native, hf, strict=True)])
            rows.append(
                {
                    "batch": b,
                    "native_tokens_per_s": statistics.median(native),
                    "hf_tokens_per_s": statistics.median(hf),
                    "ratio": ratio["median"],
                    "native": spread(native),
                    "hf": spread(hf),
                    "ratio_spread": ratio,
                }
            )
            print(
                f"  batch {b:>2}: native {rows[-1]['native_tokens_per_s']:8.0f} tok/s, "
                f"HF generate {rows[-1]['hf_tokens_per_s']:8.0f} tok/s (medians); native/HF "
                f"{ratio['median']:.2f}x [{ratio['min']:.2f}..{ratio['max']:.2f}]"
            )
    finally:
        ex.close()
    return rows


async def sharing(
    llama: LoadedModel, qwen: LoadedModel, models: Path, repeats: int, threads: int | None
) -> dict:
    def make(*ms: LoadedModel) -> Executor:
        ex = Executor(
            ExecutorConfig(cache_dir=models, max_batch_requests=8, allow_download=False, num_threads=threads)
        )
        for m in ms:
            ex.host.add_loaded(m)
        return ex

    work_a = [(llama, ids) for ids in prompts(8, PROMPT_TOKENS, llama.vocab_size, seed=11)]
    work_b = [(qwen, ids) for ids in prompts(8, PROMPT_TOKENS, qwen.vocab_size, seed=12)]
    times: dict[str, list[float]] = {"alone_a": [], "alone_b": [], "shared": []}
    alone_a, alone_b, shared = make(llama), make(qwen), make(llama, qwen)
    try:
        for ex, work in ((alone_a, work_a), (alone_b, work_b), (shared, work_a + work_b)):
            await run_requests(ex, work, 4)  # warm-up
        for _ in range(repeats):  # interleave the three so drift hits all alike
            times["alone_a"].append(await run_requests(alone_a, work_a, NEW_TOKENS))
            times["alone_b"].append(await run_requests(alone_b, work_b, NEW_TOKENS))
            times["shared"].append(await run_requests(shared, work_a + work_b, NEW_TOKENS))
    finally:
        for ex in (alone_a, alone_b, shared):
            ex.close()
    a, b, s = (statistics.median(times[k]) for k in ("alone_a", "alone_b", "shared"))
    per = spread(
        [
            sh / (x + y) - 1
            for x, y, sh in zip(times["alone_a"], times["alone_b"], times["shared"], strict=True)
        ]
    )
    out = {
        "alone_llama_s": a,
        "alone_qwen2_s": b,
        "shared_s": s,
        "overhead": per["median"],
        "overhead_spread": per,
        "times": times,
    }
    print(
        f"  alone {a:.3f}s + {b:.3f}s vs shared {s:.3f}s (medians): overhead {100 * per['median']:+.1f}% "
        f"[{100 * per['min']:+.1f}%..{100 * per['max']:+.1f}%]"
    )
    return out


async def kv_transfer(models: Path) -> dict:
    medium = medium_llama(models)
    servers, channels, executors = [], [], []
    for name in ("src", "dst"):
        ex = Executor(ExecutorConfig(cache_dir=models, block_bytes=256 * 1024, allow_download=False))
        ex.host.add_loaded(medium)
        executors.append(ex)
        servicer = EngineServicer(ex, name)
        servers.append(
            await GrpcServer(
                [(engine_pb2_grpc.add_EngineServicer_to_server, servicer, service_name(engine_pb2, "Engine"))]
            ).start()
        )
    try:
        src_ch = grpc.aio.insecure_channel(servers[0].address)
        dst_ch = grpc.aio.insecure_channel(servers[1].address)
        channels += [src_ch, dst_ch]
        src, dst = engine_pb2_grpc.EngineStub(src_ch), engine_pb2_grpc.EngineStub(dst_ch)
        ids = prompts(1, 1000, medium.vocab_size, seed=5)[0]
        bpt = executors[0].host.hosted["medium-llama"].shape.bytes_per_token

        async def start(rid: str) -> grpc.aio.UnaryStreamCall:
            req = engine_pb2.GenerateRequest(
                request_id=rid,
                model="medium-llama",
                prompt=medium.tokenizer.decode(ids),
                sampling=common_pb2.SamplingParams(max_tokens=2000),
            )
            call = src.Generate(req)
            await anext(aiter(call))
            return call

        call = await start("export-1")
        t0 = time.perf_counter()
        nbytes = 0
        async for msg in src.ExportKv(engine_pb2.ExportKvRequest(request_id="export-1", chunk_tokens=256)):
            if msg.WhichOneof("payload") == "data":
                nbytes += len(msg.data.data)
        export_s = time.perf_counter() - t0
        call.cancel()

        call = await start("migrate-1")
        resp = await src.Migrate(
            engine_pb2.MigrateRequest(
                request_id="migrate-1", destination=servers[1].address, chunk_tokens=256
            )
        )
        tail = dst.Generate(
            engine_pb2.GenerateRequest(request_id="migrate-1", model="medium-llama", prompt="x")
        )
        first = await anext(aiter(tail))
        tail.cancel()
        call.cancel()
        out = {
            "bytes_per_token": bpt,
            "export_tokens": nbytes // bpt,
            "export_mb_per_s": nbytes / export_s / 1e6,
            "migrate_tokens": resp.num_tokens,
            "migrate_bytes": resp.bytes,
            "migrate_transfer_s": resp.transfer_s,
            "migrate_pause_s": resp.pause_s,
            "migrate_mb_per_s": resp.bytes / resp.transfer_s / 1e6,
            "destination_continued": first.index > 0,
        }
        print(
            f"  ExportKv {out['export_tokens']} tokens at {out['export_mb_per_s']:.0f} MB/s; Migrate "
            f"{resp.num_tokens} tokens ({resp.bytes / 1e6:.1f} MB) in {resp.transfer_s * 1e3:.0f} ms "
            f"(request paused {resp.pause_s * 1e3:.0f} ms)"
        )
        return out
    finally:
        for ch in channels:
            await ch.close()
        for s in servers:
            await s.stop(0)
        for ex in executors:
            ex.close()


def markdown(result: dict) -> str:
    lines = [
        "# Engine benchmark",
        "",
        f"{result['machine']} · {result['cpus']} CPUs · torch {result['torch']} · {NEW_TOKENS} new tokens, "
        f"{PROMPT_TOKENS}-token prompts · {result['repeats']} repeats, native and HF back to back in each · "
        "medians, [min..max] over the repeats",
    ]
    for run in result["runs"]:
        lines += [
            "",
            f"## {run['label']}",
            "",
            "Decode throughput, native engine vs transformers `generate` (tiny llama):",
            "",
            "| batch | native tok/s | HF generate tok/s | native / HF (per repeat) | goal |",
            "|---:|---:|---:|---:|---|",
        ]
        for r in run["throughput"]:
            goal = "≥ 1.0× at batch ≥ 8" if r["batch"] >= 8 else ""
            q = r["ratio_spread"]
            lines.append(
                f"| {r['batch']} | {r['native_tokens_per_s']:.0f} | {r['hf_tokens_per_s']:.0f} | "
                f"{q['median']:.2f}× [{q['min']:.2f}..{q['max']:.2f}] | {goal} |"
            )
        s = run["sharing"]
        o = s["overhead_spread"]
        lines += [
            "",
            "Two models sharing one pool (8 requests each; run times are medians):",
            "",
            "| llama alone | qwen2 alone | both on one engine | overhead (per repeat) | goal |",
            "|---:|---:|---:|---:|---|",
            f"| {s['alone_llama_s']:.3f} s | {s['alone_qwen2_s']:.3f} s | {s['shared_s']:.3f} s | "
            f"{100 * o['median']:+.1f}% [{100 * o['min']:+.1f}%..{100 * o['max']:+.1f}%] | ≤ 8% |",
        ]
    k = result["kv_transfer"]
    lines += [
        "",
        f"## KV transfer on loopback (llama-shaped, {k['bytes_per_token'] // 1024} KiB of KV per token)",
        "",
        "| ExportKv | Migrate: tokens | bytes | transfer | request paused | MB/s |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {k['export_mb_per_s']:.0f} MB/s | {k['migrate_tokens']} | {k['migrate_bytes'] / 1e6:.1f} MB | "
        f"{k['migrate_transfer_s'] * 1e3:.0f} ms | {k['migrate_pause_s'] * 1e3:.0f} ms | {k['migrate_mb_per_s']:.0f} |",
        "",
    ]
    if result.get("backends"):
        lines += engine_backends.markdown(result["backends"])
    else:
        lines += ["Backends section skipped: vLLM is not installed (make setup-vllm) or --no-vllm.", ""]
    lines += ["GPU: " + result["gpu"], ""]
    return "\n".join(lines)


def plots(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def err(rows: list[dict], key: str) -> list[list[float]]:  # min..max around the median
        return [
            [r[key]["median"] - r[key]["min"] for r in rows],
            [r[key]["max"] - r[key]["median"] for r in rows],
        ]

    runs = result["runs"]
    fig, axes = plt.subplots(len(runs), 2, figsize=(10, 3.3 * len(runs)), squeeze=False)
    for (ax, ax2), run in zip(axes, runs, strict=True):
        rows = run["throughput"]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["native"]["median"] for r in rows], 0.4, yerr=err(rows, "native"),
               capsize=3, label="native engine")  # fmt: skip
        ax.bar([x + 0.2 for x in xs], [r["hf"]["median"] for r in rows], 0.4, yerr=err(rows, "hf"),
               capsize=3, label="transformers generate")  # fmt: skip
        ax.set_xticks(list(xs), [f"batch {r['batch']}" for r in rows])
        ax.set_ylabel("tokens / s (median, min..max)")
        ax.set_title(f"Decode throughput, tiny llama, CPU, {run['threads']} thread(s)")
        ax.legend()
        ax2.bar(list(xs), [r["ratio_spread"]["median"] for r in rows], 0.5, yerr=err(rows, "ratio_spread"),
                capsize=3)  # fmt: skip
        ax2.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax2.set_xticks(list(xs), [f"batch {r['batch']}" for r in rows])
        ax2.set_ylabel("native / HF per repeat")
        ax2.set_title("Ratio (median, min..max over repeats)")
    fig.tight_layout()
    fig.savefig(out / "engine_throughput.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for x, run in enumerate(runs):
        o = run["sharing"]["overhead_spread"]
        ax.bar(x, 100 * o["median"], 0.5, yerr=[[100 * (o["median"] - o["min"])], [100 * (o["max"] - o["median"])]],
               capsize=4)  # fmt: skip
        ax.scatter([x] * len(o["values"]), [100 * v for v in o["values"]], color="black", s=8, zorder=3)
    ax.axhline(8, color="red", linestyle="--", linewidth=1, label="goal ≤ 8%")
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xticks(list(range(len(runs))), [f"{run['threads']} thread(s)" for run in runs])
    ax.set_ylabel("shared / (alone + alone) − 1, %")
    ax.set_title("Two models on one pool: overhead per repeat")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "engine_sharing.png", dpi=120)
    plt.close(fig)
    return ["engine_throughput.png", "engine_sharing.png"]


async def main_async(args: argparse.Namespace) -> dict:
    models = Path(args.models_dir or tempfile.mkdtemp(prefix="llmfleet-bench-"))
    default_threads = torch.get_num_threads()
    llama = endless("tiny://llama", models, "tiny-llama")
    qwen = endless("tiny://qwen2", models, "tiny-qwen2")
    runs = []
    for spec in args.threads.split(","):
        threads = default_threads if spec.strip() == "default" else int(spec)
        label = f"{threads} intra-op thread{'s' if threads > 1 else ''}" + (
            " (torch's default)" if spec.strip() == "default" else ""
        )
        torch.set_num_threads(threads)  # HF, in this thread; the engine's worker gets the same count
        print(f"== {label}\ndecode throughput:")
        tp = await throughput(llama, models, args.repeats, threads)
        print("sharing one pool:")
        sh = await sharing(llama, qwen, models, args.repeats, threads)
        runs.append({"threads": threads, "label": label, "throughput": tp, "sharing": sh})
    torch.set_num_threads(default_threads)
    print("KV transfer:")
    kv = await kv_transfer(models)
    section = None
    if importlib.util.find_spec("vllm") is not None and not args.no_vllm:
        print("backends (native, vLLM, HF generate):")
        section = await engine_backends.backends(
            models, args.repeats, NEW_TOKENS, PROMPT_TOKENS, hf_generate_s
        )
    gpu = (
        f"CUDA available ({torch.cuda.get_device_name(0)}) but this run used the CPU"
        if torch.cuda.is_available()
        else "no GPU on this machine: the CUDA paths of the native engine and of vLLM are unverified here"
    )
    return {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads": default_threads,
        "repeats": args.repeats,
        "new_tokens": NEW_TOKENS,
        "prompt_tokens": PROMPT_TOKENS,
        "runs": runs,
        "throughput": runs[0]["throughput"],  # the first thread setting (compatibility)
        "sharing": runs[0]["sharing"],
        "kv_transfer": kv,
        "backends": section,
        "gpu": gpu,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".bench/engine", help="output directory")
    ap.add_argument("--repeats", type=int, default=7, help="repeats of every measurement")
    ap.add_argument(
        "--threads",
        default="default,1",
        help="comma list of intra-op thread counts for HF and the engine alike; 'default' is torch's",
    )
    ap.add_argument(
        "--models-dir", default=None, help="where tiny checkpoints are built (default: a temp dir)"
    )
    ap.add_argument("--no-vllm", action="store_true", help="skip the backends section (vLLM side by side)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(main_async(args))
    result["plots"] = plots(result, out)
    (out / "engine.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "engine.md").write_text(markdown(result))
    print(f"\nwrote {out}/engine.json, engine.md, {', '.join(result['plots'])}")
    print(markdown(result))


if __name__ == "__main__":
    main()

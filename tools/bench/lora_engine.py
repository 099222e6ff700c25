"""Mixed-adapter decode batches on the native CPU runner against the base model alone.

A random llama (``engine_bench.medium_llama``: 4 layers, hidden 512) and ``--adapters`` random PEFT
adapters of rank ``--rank`` on ``--targets`` (saved in PEFT's format and read back by the engine). A
batch of ``--batch`` sequences is prefilled with ``--context`` tokens each, then ``--steps`` decode
forwards are timed, three ways on one machine, interleaved per repeat so its other tenants hit all
alike:

- ``base``: the model without an adapter pool (the runner's direct path);
- ``mixed``: the model with the pool attached, row ``i`` on adapter ``i mod adapters``;
- ``pool, no adapter``: the pool attached, every row on the base (what the wrapped modules cost).

Output tokens/s of each, and the ratio mixed / base (goal: >= 0.7 at batch 16) as the median over
``--repeats`` with the min..max spread. Nothing is asserted: these are measurements.

    .venv/bin/python -m tools.bench.lora_engine --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from llmfleet.kvblocks.storage import KvStorage
from llmfleet_engine.lora import AdapterPool, load_adapter
from llmfleet_engine.native import PagedRunner, SeqStep
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from tools.bench.engine_bench import medium_llama, prompts

ALL_LINEAR = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def make_adapters(base_dir: Path, out: Path, n: int, rank: int, targets: list[str]) -> list[Path]:
    dirs = []
    for i in range(n):
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
        get_peft_model(model, cfg).save_pretrained(out / f"a{i}")
        dirs.append(out / f"a{i}")
    return dirs


def decode_tokens_per_s(runner: PagedRunner, rows: list[list[int]], slots: list[int], steps: int) -> float:
    """Prefill ``rows`` in one forward, then time ``steps`` decode forwards of all of them."""
    t_m = runner.tokens_per_block
    free = list(range(runner.storage.num_blocks))
    need = -(-(len(rows[0]) + steps + 1) // t_m)
    tables = [[free.pop() for _ in range(need)] for _ in rows]

    def step(i: int, ids: list[int], start: int) -> SeqStep:
        pos = range(start, start + len(ids))
        tb = tables[i]
        return SeqStep(ids, start, tb, [tb[p // t_m] for p in pos], [p % t_m for p in pos], slots[i])

    n = len(rows[0])
    logits = runner.forward([step(i, r, 0) for i, r in enumerate(rows)])
    last = logits.argmax(-1).tolist()
    t0 = time.perf_counter()
    for k in range(steps):
        last = runner.forward([step(i, [t], n + k) for i, t in enumerate(last)]).argmax(-1).tolist()
    return len(rows) * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default=ALL_LINEAR)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = medium_llama(root)
        dirs = make_adapters(Path(base.path), root, args.adapters, args.rank, args.targets.split(","))
        wrapped = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32).eval()
        pool = AdapterPool.attach(wrapped, max_adapters=args.adapters, max_rank=args.rank)
        slots = list(range(len(dirs)))  # one slot each (the pool has one per adapter)
        for slot, d in zip(slots, dirs, strict=True):
            pool.load(load_adapter(d.name, d, wrapped, max_rank=args.rank, targets=pool.targets), slot)
        blocks = args.batch * (-(-(args.context + args.steps + 1) // 8) + 1)
        plain = PagedRunner(base.model, KvStorage(blocks, 8 * 16384), "base")
        lora = PagedRunner(wrapped, KvStorage(blocks, 8 * 16384), "base", lora=pool)
        rows = prompts(args.batch, args.context, 512, seed=1)
        mixed = [slots[i % len(slots)] for i in range(args.batch)]
        none = [-1] * args.batch
        runs: dict[str, list[float]] = {"base": [], "mixed": [], "pool, no adapter": []}
        for _ in range(args.repeats):
            runs["base"].append(decode_tokens_per_s(plain, rows, none, args.steps))
            runs["mixed"].append(decode_tokens_per_s(lora, rows, mixed, args.steps))
            runs["pool, no adapter"].append(decode_tokens_per_s(lora, rows, none, args.steps))
    print(
        f"batch {args.batch}, {args.adapters} adapters of rank {args.rank} on {args.targets}, context "
        f"{args.context}, {args.steps} decode steps, {args.threads} thread(s), {args.repeats} repeats"
    )
    for name, v in runs.items():
        print(f"  {name:18s} {statistics.median(v):8.0f} tokens/s")
    for name in ("mixed", "pool, no adapter"):
        ratios = [a / b for a, b in zip(runs[name], runs["base"], strict=True)]
        print(
            f"  {name} / base: {statistics.median(ratios):.2f}x (spread {min(ratios):.2f}..{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()

"""GPU check: a tiny model split across cuda:0 and cpu by a HELR map (UELLM §4.3) decodes the same
greedy tokens as the unsplit model.

For each tiny arch, HELR (LR mode) plans on a two-device topology whose cuda:0 holds only part of the
layers, so the plan must pipeline cuda:0 → cpu; the engine's ``load_model`` loads the map (accelerate
dispatch) and HF ``generate`` runs greedy on both. The reference is the unsplit model on the cpu and on
cuda:0: float32 matmuls differ slightly between the two, so matching either counts. Prints one JSON
line; exits 0 with "skipped: no CUDA" without a GPU, 1 when a split run matches neither reference.

    .venv/bin/python -m tools.gpu_checks.helr_device_map [--tokens 24] [--archs llama,qwen2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

import torch
from llmfleet.policies.placement.device_topology import Device, LayeredModel, Topology
from llmfleet.policies.placement.helr import HelrOptions, HelrPlanner
from llmfleet.types import ModelSpec
from llmfleet_engine.models import load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--archs", default="llama,qwen2,mistral")
    ap.add_argument("--cache-dir", default=None, help="tiny model cache (default: a temp dir)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0

    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="helr-gpu-")
    prompts = ["The quick brown fox", "Once upon a time there was", "def add(a, b):"]
    results: list[dict[str, Any]] = []
    ok = True
    for arch in args.archs.split(","):
        source = f"tiny://{arch}"
        cpu_ref = load_model(ModelSpec(f"{arch}-cpu", source), device="cpu", cache_dir=cache)
        gpu_ref = load_model(ModelSpec(f"{arch}-gpu", source), device="cuda:0", cache_dir=cache)
        config = cpu_ref.model.config
        layered = LayeredModel.from_hf_config(config, dtype=cpu_ref.dtype, name=arch)
        n = config.num_hidden_layers
        on_gpu = max(1, n // 2)  # cuda:0 (faster) holds about half the layers, the cpu the rest
        topo = Topology(
            (
                Device("cuda:0", int((on_gpu + 0.5) * layered.bytes_per_layer), 10.0),
                Device("cpu", 64 * layered.total_bytes, 1.0),
            ),
            {("cuda:0", "cpu"): 1e-5},
        )
        plan = HelrPlanner(HelrOptions(mode="lr", compute_scale=1e-9)).device_map(topo, layered)
        mapped = load_model(
            ModelSpec(f"{arch}-helr", source, device_map=plan.device_map_pairs()), cache_dir=cache
        )
        placed = sorted({str(p.device) for p in mapped.model.parameters()})
        row: dict[str, Any] = {
            "arch": arch,
            "order": plan.order,
            "layers": plan.layers,
            "reported_device": mapped.device,
            "param_devices": placed,
            "hf_device_map": getattr(mapped.model, "hf_device_map", None),
            "prompts": [],
        }
        for prompt in prompts:
            ids = cpu_ref.tokenizer(prompt, return_tensors="pt")["input_ids"]
            out = {
                name: _greedy(m.model, ids, args.tokens, m.tokenizer.pad_token_id)
                for name, m in (("cpu", cpu_ref), ("cuda", gpu_ref), ("split", mapped))
            }
            match = out["split"] in (out["cpu"], out["cuda"])
            row["prompts"].append({"prompt": prompt, "match": match, **out})
            ok &= match
        row["split_across_devices"] = set(placed) == {"cpu", "cuda:0"}
        ok &= row["split_across_devices"]
        results.append(row)
        for m in (cpu_ref, gpu_ref, mapped):
            del m.model
        torch.cuda.empty_cache()
    print(json.dumps({"check": "helr_device_map", "ok": ok, "results": results}))
    return 0 if ok else 1


def _greedy(model: Any, ids: torch.Tensor, n: int, pad_id: int | None) -> list[int]:
    device = next(model.parameters()).device  # the embedding's device under a map
    ids = ids.to(device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            pad_token_id=pad_id,
        )
    return out[0, ids.shape[1] :].tolist()


if __name__ == "__main__":
    sys.exit(main())

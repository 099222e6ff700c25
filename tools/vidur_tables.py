"""Rebuild the shipped Vidur operator tables (``libs/llmfleet/costmodel/data/vidur_<gpu>.json``).

Reads Microsoft Vidur's public profiling CSVs (MIT license; copied unchanged under
``../shared/profiles/vidur``) and writes, per GPU, the compact tables ``llmfleet.costmodel.vidur`` needs:

- per profiled model shape and TP degree: the median time of one layer's non-attention operators
  (the sum of input_layernorm, attn_pre_proj, attn_rope, attn_post_proj, post_attention_layernorm,
  mlp_up_proj, mlp_act, mlp_down_proj and add, each its ``time_stats.<op>.median``) and of the
  embedding lookup, at every profiled ``num_tokens`` (rows repeated for one (tokens, TP) are reduced to
  their median);
- all-reduce time against message size (fp16 elements) per TP group size, from the DGX table, using
  the rows whose group sits in one node (``devices_per_node == num_workers``), which is how a TP group
  of up to 8 GPUs runs; groups larger than a node keep their cross-node rows.

Times are milliseconds, as in the source. The attribution (source commit and license) goes into every
file and the license text into ``VIDUR_LICENSE`` beside them. Only this script reads the raw files;
the package and its tests read the derived tables.

    python -m tools.vidur_tables [RAW_DIR] [--out libs/llmfleet/costmodel/data]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RAW = ROOT.parent / "shared" / "profiles" / "vidur"
DEFAULT_OUT = ROOT / "libs" / "llmfleet" / "costmodel" / "data"

LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
SHAPE_COLS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
# GPU directory under compute/ -> the network directory whose all-reduce a TP group inside one node sees
NETWORK = {"a100": "a100_dgx", "h100": "h100_dgx"}
# the llmfleet hardware catalog entries measured by each GPU directory (Vidur profiled the 80 GB SXM parts)
HARDWARE = {"a100": ["a100-80gb"], "h100": ["h100"]}
FORMAT_VERSION = 1


def _sig(x: float) -> float:
    """Round to 5 significant digits (the source has 3-4): keeps the tables small and diffable."""
    return float(f"{x:.5g}")


def _commit(raw: Path) -> str:
    readme = raw / "README.md"
    if readme.is_file():
        m = re.search(r"commit ([0-9a-f]{40})", readme.read_text())
        if m:
            return m.group(1)
    return "unknown"


def read_mlp(path: Path) -> dict:
    """One model's ``mlp.csv`` -> shape + {tp: {tokens, layer_ms, emb_ms}} (medians, sorted by tokens)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no rows")
    needed = [*SHAPE_COLS, "num_tokens", "num_tensor_parallel_workers", "time_stats.emb.median"]
    needed += [f"time_stats.{op}.median" for op in LAYER_OPS]
    missing = [c for c in needed if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    shapes = {tuple(r[c] for c in SHAPE_COLS) for r in rows}
    if len(shapes) != 1:
        raise ValueError(f"{path}: more than one model shape: {sorted(shapes)}")
    (shape,) = shapes
    layer: dict[tuple[int, int], list[float]] = defaultdict(list)
    emb: dict[tuple[int, int], list[float]] = defaultdict(list)
    for i, r in enumerate(rows, start=2):
        try:
            key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
            layer[key].append(sum(float(r[f"time_stats.{op}.median"]) for op in LAYER_OPS))
            emb[key].append(float(r["time_stats.emb.median"]))
        except ValueError as e:
            raise ValueError(f"{path}:{i}: {e}") from None
    by_tp: dict[str, dict[str, list]] = {}
    for tp in sorted({k[0] for k in layer}):
        tokens = sorted(t for (p, t) in layer if p == tp)
        by_tp[str(tp)] = {
            "tokens": tokens,
            "layer_ms": [_sig(statistics.median(layer[(tp, t)])) for t in tokens],
            "emb_ms": [_sig(statistics.median(emb[(tp, t)])) for t in tokens],
        }
    return {
        "n_head": int(shape[0]),
        "n_kv_head": int(shape[1]),
        "n_embd": int(shape[2]),
        "n_expanded_embd": int(shape[3]),
        "vocab_size": int(shape[4]),
        "use_gated_mlp": shape[5].strip().lower() == "true",
        "tp": by_tp,
    }


def read_all_reduce(path: Path) -> dict[str, dict[str, list]]:
    """``all_reduce.csv`` -> {num_workers: {size, ms, devices_per_node}}: the rows of a group inside one
    node where the table has them, else those with the most devices per node; medians per size."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[int, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i, r in enumerate(rows, start=2):
        try:
            nw, dpn = int(r["num_workers"]), int(r["devices_per_node"])
            groups[(nw, dpn)][int(r["size"])].append(float(r["time_stats.all_reduce.median"]))
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}:{i}: {e!r}") from None
    out: dict[str, dict[str, list]] = {}
    for nw in sorted({k[0] for k in groups}):
        dpn = max(d for (w, d) in groups if w == nw and d <= nw)
        sizes = groups[(nw, dpn)]
        ordered = sorted(sizes)
        out[str(nw)] = {
            "devices_per_node": dpn,
            "size": ordered,
            "ms": [_sig(statistics.median(sizes[s])) for s in ordered],
        }
    return out


def build(raw: Path, out: Path) -> list[Path]:
    raw, out = Path(raw), Path(out)
    if not (raw / "compute").is_dir():
        raise FileNotFoundError(f"{raw}: no compute/ directory (expected Vidur's profiling data)")
    out.mkdir(parents=True, exist_ok=True)
    commit = _commit(raw)
    written = []
    for gpu_dir in sorted(p for p in (raw / "compute").iterdir() if p.is_dir()):
        gpu = gpu_dir.name
        models = {}
        for mlp in sorted(gpu_dir.glob("*/*/mlp.csv")):
            name = f"{mlp.parent.parent.name}/{mlp.parent.name}"
            models[name] = read_mlp(mlp)
        if not models:
            continue
        net_name = NETWORK.get(gpu, f"{gpu}_dgx")
        net_csv = raw / "network" / net_name / "all_reduce.csv"
        table = {
            "format": FORMAT_VERSION,
            "gpu": gpu,
            "hardware": HARDWARE.get(gpu, [gpu]),
            "units": {"time": "ms", "all_reduce.size": "fp16 elements"},
            "attribution": {
                "source": "Microsoft Vidur profiling data, github.com/microsoft/vidur",
                "commit": commit,
                "license": "MIT (Copyright (c) Microsoft Corporation); full text in VIDUR_LICENSE",
                "files": [f"compute/{gpu}/{m}/mlp.csv" for m in models]
                + ([f"network/{net_name}/all_reduce.csv"] if net_csv.is_file() else []),
                "derived_by": "tools/vidur_tables.py (medians; layer = sum of the non-attention ops)",
            },
            "layer_ops": list(LAYER_OPS),
            "models": models,
            "network": net_name if net_csv.is_file() else None,
            "all_reduce": read_all_reduce(net_csv) if net_csv.is_file() else {},
        }
        path = out / f"vidur_{gpu}.json"
        path.write_text(json.dumps(table, separators=(",", ":")) + "\n")
        written.append(path)
    if (raw / "LICENSE").is_file():
        shutil.copyfile(raw / "LICENSE", out / "VIDUR_LICENSE")
        written.append(out / "VIDUR_LICENSE")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", nargs="?", type=Path, default=DEFAULT_RAW, help=f"default {DEFAULT_RAW}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    args = ap.parse_args(argv)
    try:
        paths = build(args.raw, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"vidur_tables: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(f"{p}  {p.stat().st_size:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())

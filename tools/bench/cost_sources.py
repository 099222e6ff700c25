"""How well the simulator's cost sources match measured GPU timings: ``make bench-costs``.

Writes ``<out>/cost_sources.{json,md}`` (default ``.bench/costs``). Everything is computed from the
tables shipped in the package (``llmfleet/costmodel/data/vidur_*.json``, derived from Microsoft Vidur's
MIT-licensed A100-80GB / H100 profiling data by ``tools/vidur_tables.py``); nothing is hard-coded:

1. held-out token counts: the ``vidur`` source's fits made on the even-indexed token counts (and
   all-reduce sizes), scored on the odd ones, per GPU, profiled model and TP degree; the per-layer
   non-attention time and the whole non-attention part of an iteration (L layers + embedding +
   2L all-reduces);
2. the all-reduce fit alone (even sizes → odd sizes) per TP group;
3. leave-one-shape-out: each profiled layer shape derived from the others (how unprofiled shapes such
   as OPT-6.7B are costed) against its measurement;
4. the calibrated source's overhead fit (a + c·b per TP on Vidur's CPU-overhead rows) and its scaled
   roofline (hardware without measurements): the fitted factors, and their error against the measured
   cost on rows held out of the fit (one GPU, or one layer shape, at a time);
5. the compiled iteration times of every source side by side for catalog models (no measurement to
   compare with: attention is not in the data; this shows what switching the source changes).

    python -m tools.bench.cost_sources [--out .bench/costs]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmfleet.costmodel import COST_SOURCES, DEFAULT_COST_SOURCE, cost_of, hardware, model_arch
from llmfleet.costmodel import calibrated as cal
from llmfleet.costmodel import vidur as v
from llmfleet.costmodel.overhead import VIDUR_A100_OVERHEAD
from llmfleet.costmodel.vidur import FRAMEWORK_OVERHEAD_S

CATALOG_ROWS = (
    ("a100-80gb", "llama2-7b", (1, 2, 4)),
    ("a100-80gb", "llama2-13b", (1, 2, 4)),
    ("a100-80gb", "opt-6.7b", (1, 2)),
    ("a100-80gb", "llama2-70b", (4, 8)),
    ("h100", "llama2-7b", (1, 2)),
    ("h100", "llama2-13b", (1, 2)),
    ("h100", "opt-6.7b", (1,)),
    ("h100", "llama3-8b", (1,)),
    ("h100", "llama2-70b", (4, 8)),
    ("l4", "llama2-7b", (1, 2)),
    ("h200", "llama2-70b", (4, 8)),
)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Markdown table; the first ``left`` columns (names) left-aligned, the numbers right-aligned."""
    align = ["---" if i < left else "---:" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _short(profile: str) -> str:
    return profile.split("/", 1)[-1]


def run(out: Path) -> dict:
    t0 = time.perf_counter()
    result: dict = {
        "cost_source": "vidur",
        "framework_overhead_s": FRAMEWORK_OVERHEAD_S,
        "attribution": {gpu: v.load_table(gpu)["attribution"] for gpu in v.GPUS},
        "heldout": {},
        "allreduce": {},
        "leave_one_shape_out": {},
        "summary": {},
        "catalog": [],
        "default_cost_source": DEFAULT_COST_SOURCE,
        "overhead": {
            "source": VIDUR_A100_OVERHEAD.source,
            "max_rel_error": VIDUR_A100_OVERHEAD.max_rel_error,
            "fits_ms": {
                str(tp): [1e3 * a, 1e3 * c] for tp, (a, c) in sorted(VIDUR_A100_OVERHEAD.fits.items())
            },
        },
        "scaled_roofline": {
            "factors": {
                f"{ph}@tp{tp}": list(f) for (ph, tp), f in sorted(cal.roofline_scale().factors.items())
            },
            "heldout": cal.scale_heldout_errors(),
        },
    }
    for gpu in v.GPUS:
        held = v.heldout_errors(gpu)
        ar = v.allreduce_heldout_errors(gpu)
        loso = v.leave_one_shape_out(gpu)
        result["heldout"][gpu] = held
        result["allreduce"][gpu] = ar
        result["leave_one_shape_out"][gpu] = loso
        result["summary"][gpu] = {
            "heldout_layer": v.summarize(held, "layer"),
            "heldout_forward": v.summarize(held, "forward"),
            "allreduce": v.summarize(ar, None),
            "leave_one_shape_out_layer": v.summarize(loso, "layer"),
        }
    for hw_name, model, tps in CATALOG_ROWS:
        hw, arch = hardware(hw_name), model_arch(model)
        for tp in tps:
            for src in COST_SOURCES:
                lm = cost_of(src, arch, hw, tp)
                result["catalog"].append(
                    {
                        "hardware": hw_name,
                        "model": model,
                        "tp": tp,
                        "requested": src,
                        "cost_source": lm.source,
                        "prefill_512_ms": 1e3 * lm.prefill(512),
                        "prefill_2048_ms": 1e3 * lm.prefill(2048),
                        "decode_b1_ctx1024_ms": 1e3 * lm.decode(1, 1024),
                        "decode_b32_ctx1024_ms": 1e3 * lm.decode(32, 32 * 1024),
                    }
                )
    result["elapsed_s"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_sources.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "cost_sources.md").write_text("\n".join(markdown(result)) + "\n")
    return result


def markdown(r: dict) -> list[str]:
    commit = r["attribution"]["a100"]["commit"]
    lines = [
        "# Cost sources against measured GPU timings",
        "",
        f"Data: Microsoft Vidur's A100-80GB / H100 operator profiles (github.com/microsoft/vidur @ {commit[:12]}, "
        "MIT), as shipped in `llmfleet/costmodel/data/`. Errors are |model − measured| / measured. Attention "
        "is not in the data (the `vidur` source takes it from the roofline), so only the non-attention part "
        f"is scored. The framework overhead ({1e3 * r['framework_overhead_s']:.1f} ms per iteration) is a "
        "modelling assumption and is left out of every comparison.",
        "",
        "## Summary (cost source: vidur)",
        "",
    ]
    lines += _summary(r)
    lines += [
        "",
        "## Held-out token counts (cost source: vidur; fit on even-indexed counts, scored on odd)",
        "",
    ]
    lines += _heldout(r)
    lines += ["", "## All-reduce fit (cost source: vidur; even sizes → odd sizes, DGX in-node groups)", ""]
    rows = [
        [gpu, str(e["tp"]), str(e["devices_per_node"]), _pct(e["mean_rel"]), _pct(e["max_rel"]), str(e["n"])]
        for gpu, ar in r["allreduce"].items()
        for e in ar
    ]
    lines += _table(["GPU", "GPUs", "per node", "mean", "max", "points"], rows)
    lines += [
        "",
        "## Derived shapes, leave-one-shape-out (cost source: vidur; per-layer time derived from the other shapes)",
        "",
    ]
    rows = [
        [gpu, _short(e["profile"]), str(e["tp"]), _pct(e["layer"]["mean_rel"]), _pct(e["layer"]["max_rel"])]
        for gpu, lo in r["leave_one_shape_out"].items()
        for e in lo
    ]
    lines += _table(["GPU", "left-out shape", "TP", "mean", "max"], rows, left=2)
    lines += ["", f"## The calibrated source (`{r['default_cost_source']}` is the default)", ""]
    lines += _calibrated(r)
    lines += [
        "",
        "## Iteration times of catalog models, every cost source (ms; not a measurement)",
        "",
    ]
    lines += _catalog(r)
    lines += ["", f"Computed in {r['elapsed_s']:.1f} s with `python -m tools.bench.cost_sources`."]
    return lines


def _mean_max(e: dict) -> str:
    return f"{_pct(e['mean_rel'])} / {_pct(e['max_rel'])}"


def _summary(r: dict) -> list[str]:
    """Per GPU: the mean / max error of each held-out check."""
    rows = [
        [
            gpu,
            _mean_max(s["heldout_layer"]),
            _mean_max(s["heldout_forward"]),
            _mean_max(s["allreduce"]),
            _mean_max(s["leave_one_shape_out_layer"]),
        ]
        for gpu, s in r["summary"].items()
    ]
    return _table(
        [
            "GPU",
            "per-layer, held-out tokens (mean / max)",
            "non-attention forward, held-out (mean / max)",
            "all-reduce fit, held-out sizes",
            "derived shape, leave-one-shape-out",
        ],
        rows,
    )


def _heldout(r: dict) -> list[str]:
    """Per GPU, profile and TP degree: the held-out token counts' errors."""
    rows = [
        [
            gpu,
            _short(e["profile"]),
            str(e["tp"]),
            _mean_max(e["layer"]),
            f"{e['layers']}",
            _mean_max(e["forward"]),
            str(e["legs"]),
        ]
        for gpu, held in r["heldout"].items()
        for e in held
    ]
    return _table(
        ["GPU", "profile", "TP", "per-layer mean / max", "L", "forward mean / max", "legs"], rows, left=2
    )


def _calibrated(r: dict) -> list[str]:
    """The overhead fit, the scaled roofline's factors and its held-out errors."""
    o = r["overhead"]
    lines = [
        f"Per-iteration CPU overhead a + c·b, fitted per TP on {o['source']} (largest residual "
        f"{_pct(o['max_rel_error'])}):",
        "",
    ]
    lines += _table(
        ["TP", "a (ms)", "c (ms per sequence)"],
        [[tp, f"{a:.3f}", f"{c:.4f}"] for tp, (a, c) in o["fits_ms"].items()],
    )
    sr = r["scaled_roofline"]
    lines += [
        "",
        "Scaled roofline (hardware or TP without measurements): max(k_c·compute, k_m·memory) + e·L per "
        "phase and TP, fitted on every measured (GPU, layer shape, TP):",
        "",
    ]
    lines += _table(
        ["phase@TP", "k_c", "k_m", "e (µs per layer)"],
        [[k, f"{kc:.3f}", f"{km:.3f}", f"{1e6 * e:.1f}"] for k, (kc, km, e) in sr["factors"].items()],
    )
    lines += [
        "",
        "Its error against the measured cost (without the overhead) on the rows held out of the fit:",
        "",
    ]
    lines += _table(
        ["phase", "held out", "mean", "max", "points"],
        [
            [e["phase"], e["held_out"], _pct(e["mean_rel"]), _pct(e["max_rel"]), str(e["n"])]
            for e in sr["heldout"]
        ],
        left=2,
    )
    return lines


def _catalog(r: dict) -> list[str]:
    """Both cost sources' iteration times of the catalog models."""
    rows = [
        [
            e["hardware"],
            e["model"],
            str(e["tp"]),
            e["cost_source"]
            if e["cost_source"].startswith(e["requested"])
            else f"{e['requested']} → {e['cost_source']}",
            f"{e['prefill_512_ms']:.2f}",
            f"{e['prefill_2048_ms']:.2f}",
            f"{e['decode_b1_ctx1024_ms']:.2f}",
            f"{e['decode_b32_ctx1024_ms']:.2f}",
        ]
        for e in r["catalog"]
    ]
    return _table(
        [
            "hardware",
            "model",
            "TP",
            "cost source",
            "prefill 512",
            "prefill 2048",
            "decode b=1",
            "decode b=32",
        ],
        rows,
        left=4,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".bench/costs"))
    a = ap.parse_args(argv)
    r = run(a.out)
    print("\n".join(markdown(r)[:12]))
    print(f"written: {a.out / 'cost_sources.json'}, {a.out / 'cost_sources.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The measured-operator cost source (``costmodel.vidur``) on the shipped tables, its compilation to the
simulator's legs, the roofline fallback, and the table rebuild script on tiny synthetic CSVs (no test
reads the raw Vidur files)."""

from __future__ import annotations

import csv
import itertools
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from llmfleet.costmodel import hardware, model_arch
from llmfleet.costmodel import vidur as v
from llmfleet.sim.cost import CostBook, roofline_cost, vidur_cost
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec

from tools import vidur_tables

A100, H100 = hardware("a100-80gb"), hardware("h100")
DATA = Path(v.__file__).parent / "data"


def test_tables_load_with_attribution_and_license():
    for gpu in v.GPUS:
        t = v.load_table(gpu)
        assert t["attribution"]["commit"] == "7d47513363ec447a741ac5e47241580b47724fbf"
        assert "MIT" in t["attribution"]["license"]
        assert "meta-llama/Llama-2-7b-hf" in t["models"]
        assert sorted(t["models"]["meta-llama/Llama-2-7b-hf"]["tp"], key=int) == ["1", "2", "4", "8"]
        assert {"2", "4", "8"} <= set(t["all_reduce"])
    assert "MIT License" in (DATA / "VIDUR_LICENSE").read_text()
    assert v.gpu_for(A100) == "a100" and v.gpu_for(H100) == "h100"


def test_hinge_fit_recovers_a_convex_curve_and_its_legs_are_exact():
    x = np.arange(1, 400, 3, dtype=float)
    truth = v.Hinge(0.5, 0.001, ((64.0, 0.01), (256.0, 0.02)))
    fit = v.fit_hinge(x, truth(x), 2)
    assert np.allclose(fit(x), truth(x), rtol=0.02)
    legs = fit.legs()
    assert np.allclose(np.max([a + b * x for a, b in legs], axis=0), fit(x), rtol=1e-9)
    with pytest.raises(ValueError):
        v.fit_hinge([1.0, 2.0], [1.0, -1.0], 2)


@pytest.mark.parametrize("gpu", v.GPUS)
def test_compiled_non_attention_matches_table_points(gpu):
    """The compiled cost's token part, less overhead and lm_head, is L·layer + emb at the table points."""
    arch = model_arch("llama2-7b")
    for tp in (1, 2, 4, 8):
        c = v.measured_curve(gpu, "meta-llama/Llama-2-7b-hf", tp)
        legs = v.vidur_legs(arch, A100 if gpu == "a100" else H100, tp, 0.0)
        ar = v.allreduce_hinge(gpu, tp)(c.tokens * arch.hidden_size) if tp > 1 else 0.0
        meas = (arch.num_layers * (c.layer_ms + 2 * ar) + c.emb_ms) * 1e-3
        pred = legs.tokens(c.tokens)
        rel = np.abs(pred - meas) / meas
        assert legs.provenance == "measured:meta-llama/Llama-2-7b-hf"
        assert rel.mean() < 0.06 and np.median(rel) < 0.05
        assert rel[c.tokens >= 512].max() < 0.2


@pytest.mark.parametrize("hw", [A100, H100], ids=["a100", "h100"])
def test_monotone_in_tokens_batch_and_context(hw):
    for name in ("llama2-7b", "llama2-13b", "opt-6.7b", "llama2-70b"):
        for tp in (1, 2, 4, 8):
            lm = vidur_cost(model_arch(name), hw, tp)
            t = [lm.prefill(n) for n in (1, 16, 128, 512, 2048, 4096, 8192)]
            assert all(b > a for a, b in itertools.pairwise(t)), (name, tp, t)
            d = [lm.decode(b, b * 512) for b in (1, 8, 32, 128, 256)]
            assert all(y > x for x, y in itertools.pairwise(d))
            assert lm.decode(8, 8 * 4096) > lm.decode(8, 8 * 128)
            assert lm.prefill(1024, 1024**2) > lm.prefill(1024, 4 * 256**2)  # one long prompt > 4 short


@pytest.mark.parametrize("gpu", v.GPUS)
def test_tp_reduces_per_layer_time(gpu):
    arch = model_arch("llama2-70b")
    for n in (256, 1024, 4096):
        per_layer = [v.fit_hinge(*_layer(gpu, tp), 2)(n) for tp in (1, 2, 4, 8)]
        assert all(b < a for a, b in itertools.pairwise(per_layer)), (n, per_layer)
    hw = A100 if gpu == "a100" else H100
    assert vidur_cost(arch, hw, 4).prefill(2048) < vidur_cost(arch, hw, 1).prefill(2048)


def _layer(gpu, tp):
    c = v.measured_curve(gpu, "meta-llama/Llama-2-70b-hf", tp)
    return c.tokens, c.layer_ms


@pytest.mark.parametrize("gpu", v.GPUS)
def test_derived_shapes_are_sane(gpu):
    """13B's layer shape derived from the others sits between 7B's and 34B's measured per-layer times;
    OPT-6.7B (not profiled) is derived and close to Llama-2-7B's (similar GEMM work)."""
    k13 = v.shape_key(model_arch("llama2-13b"))
    for tp in (1, 2, 4, 8):
        d13 = v.derived_curve(gpu, k13, tp, exclude=k13)
        m7 = v.measured_curve(gpu, "meta-llama/Llama-2-7b-hf", tp)
        m34 = v.measured_curve(gpu, "codellama/CodeLlama-34b-Instruct-hf", tp)
        big = d13.tokens >= 512
        sel7, sel34 = np.isin(m7.tokens, d13.tokens[big]), np.isin(m34.tokens, d13.tokens[big])
        assert np.all(m7.layer_ms[sel7] < d13.layer_ms[big])
        assert np.all(d13.layer_ms[big] < m34.layer_ms[sel34])
        opt = v.curve_for(gpu, model_arch("opt-6.7b"), tp)
        assert opt.provenance == "derived"
        ratio = opt.layer_ms[big] / m7.layer_ms[np.isin(m7.tokens, opt.tokens[big])]
        assert 0.8 < np.median(ratio) < 1.3
    hw = A100 if gpu == "a100" else H100
    t7, t13, t70 = (
        vidur_cost(model_arch(m), hw, 1).prefill(2048) for m in ("llama2-7b", "llama2-13b", "llama2-70b")
    )
    assert t7 < t13 < t70


def test_shape_matching_uses_layer_shape_not_name():
    assert (
        v.curve_for("a100", model_arch("mistral-7b"), 1).provenance == "measured:meta-llama/Meta-Llama-3-8B"
    )
    assert v.curve_for("h100", model_arch("llama3-70b"), 2).provenance == "measured:meta-llama/Llama-2-70b-hf"
    assert v.curve_for("h100", model_arch("llama3-8b"), 1).provenance == "derived"
    assert vidur_cost(model_arch("opt-6.7b"), A100, 1).source == "vidur:a100:derived"
    assert vidur_cost(model_arch("llama2-7b"), H100, 2).source == "vidur:h100"


def test_overhead_and_attention_terms():
    arch = model_arch("llama2-7b")
    a = vidur_cost(arch, A100, 1, overhead_s=0.0)
    b = vidur_cost(arch, A100, 1, overhead_s=0.005)
    assert b.decode(4, 4000) - a.decode(4, 4000) == pytest.approx(0.005)
    assert b.prefill(100) - a.prefill(100) == pytest.approx(0.005)
    # attention: the roofline's γ terms (prefill FLOPs, decode KV read at the attainable bandwidth)
    roof = roofline_cost(arch, A100, 1)
    assert a.prefill_legs[0][2] == pytest.approx(roof.prefill_legs[0][2])
    assert a.decode_legs[0][2] == pytest.approx(arch.kv_bytes_per_token / A100.bandwidth)
    # a mixed iteration pays the fixed part once
    mixed = b.iteration(256, 256**2, 8, 8000)
    assert mixed < b.prefill(256) + b.decode(8, 8000)
    with pytest.raises(ValueError):
        vidur_cost(arch, A100, 0)


def test_unknown_hardware_falls_back_to_roofline(caplog):
    arch = model_arch("llama2-7b")
    with caplog.at_level(logging.WARNING, logger="llmfleet.costmodel.iteration_costs"):
        lm = vidur_cost(arch, hardware("cpu"), 1)
    assert lm.source == "roofline"
    assert lm == roofline_cost(arch, hardware("cpu"), 1)
    assert "no Vidur measurements for hardware 'cpu'" in caplog.text
    # a TP degree without all-reduce data falls back too
    assert vidur_cost(arch, H100, 16).source == "roofline"
    with pytest.raises(v.VidurDataError):
        v.vidur_legs(arch, hardware("l4"), 1)


def test_costbook_source_option_and_spec():
    archs = {"llama2-7b": model_arch("llama2-7b"), "opt-6.7b": model_arch("opt-6.7b")}
    book = CostBook.build(A100, archs)
    assert book.model("llama2-7b", 1).source == "calibrated:a100"  # the default: costmodel.sources
    book = CostBook.build(A100, archs, source="vidur")
    assert book.model("llama2-7b", 2).source == "vidur:a100"
    assert book.model("opt-6.7b", 1).source == "vidur:a100:derived"
    assert book.sources() == {"llama2-7b@tp2": "vidur:a100", "opt-6.7b@tp1": "vidur:a100:derived"}
    with pytest.raises(ValueError, match="unknown cost source"):
        CostBook.build(A100, archs, source="measured")
    spec = SimSpec(ClusterSpec.parse("4xA100-80GB"), (SimService("s", "llama2-7b"),))
    assert spec.cost_source == "calibrated"
    with pytest.raises(ValueError, match="unknown cost source"):
        SimSpec(ClusterSpec.parse("4xA100-80GB"), (SimService("s", "llama2-7b"),), cost_source="x")


def test_validation_functions_report_errors():
    held = v.heldout_errors("h100")
    assert len(held) == 4 * len(v.load_table("h100")["models"])
    s = v.summarize(held, "layer")
    assert 0 < s["mean_rel"] < 0.1 and s["max_rel"] < 0.5
    lo = v.leave_one_shape_out("h100")
    assert {e["profile"] for e in lo} == set(v.load_table("h100")["models"])
    assert v.summarize(lo, "layer")["mean_rel"] < 0.1
    ar = v.allreduce_heldout_errors("h100")
    assert [e["tp"] for e in ar] == [2, 4, 8]


# ------------------------------------------------------------------------------ the rebuild script
def _write_raw(root: Path) -> None:
    d = root / "compute" / "h100" / "acme" / "tiny-1b"
    d.mkdir(parents=True)
    cols = [
        f"time_stats.{op}.{s}"
        for op in ("emb", *vidur_tables.LAYER_OPS)
        for s in ("min", "max", "mean", "median", "std")
    ]
    shape = {"n_head": 16, "n_kv_head": 16, "n_embd": 2048, "n_expanded_embd": 5632, "vocab_size": 32000}
    with (d / "mlp.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, [*cols, *shape, "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"])
        w.writeheader()
        for tp in (1, 2):
            for n in (1, 8, 64, 512, 512):  # 512 twice: repeats are reduced to their median
                row = {c: 0.01 for c in cols} | shape | {"use_gated_mlp": "True"}
                row |= {"num_tokens": n, "num_tensor_parallel_workers": tp}
                row["time_stats.mlp_up_proj.median"] = 0.001 * n / tp + (0.5 if n == 512 else 0.0)
                w.writerow(row)
    net = root / "network" / "h100_dgx"
    net.mkdir(parents=True)
    with (net / "all_reduce.csv").open("w", newline="") as f:
        f.write(",time_stats.all_reduce.median,num_workers,size,devices_per_node\n")
        for i, (nw, size, dpn, t) in enumerate([(2, 2048, 2, 0.01), (2, 4096, 2, 0.02), (2, 2048, 1, 9.0)]):
            f.write(f"{i},{t},{nw},{size},{dpn}\n")
    (root / "LICENSE").write_text("MIT License\nCopyright (c) Microsoft Corporation.\n")
    (root / "README.md").write_text("commit 0123456789abcdef0123456789abcdef01234567, MIT\n")


def test_rebuild_script_on_synthetic_csvs(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    _write_raw(raw)
    assert vidur_tables.main([str(raw), "--out", str(out)]) == 0
    t = json.loads((out / "vidur_h100.json").read_text())
    assert t["attribution"]["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert (out / "VIDUR_LICENSE").read_text().startswith("MIT License")
    m = t["models"]["acme/tiny-1b"]
    assert (m["n_embd"], m["n_expanded_embd"], m["use_gated_mlp"]) == (2048, 5632, True)
    tp1 = m["tp"]["1"]
    assert tp1["tokens"] == [1, 8, 64, 512]
    # 8 ops at 0.01 + mlp_up_proj; the repeated 512 rows reduce to one median
    assert tp1["layer_ms"][1] == pytest.approx(0.08 + 0.008)
    assert tp1["layer_ms"][3] == pytest.approx(0.08 + 0.512 + 0.5)
    assert tp1["emb_ms"] == [0.01] * 4
    # the in-node rows of a 2-GPU group, not the cross-node ones
    assert t["all_reduce"]["2"] == {"devices_per_node": 2, "size": [2048, 4096], "ms": [0.01, 0.02]}


def test_rebuild_script_errors(tmp_path, capsys):
    assert vidur_tables.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no compute/ directory" in capsys.readouterr().err


def test_cli_cost_source_flag_reaches_the_spec():
    import argparse

    from llmfleet.cli import sim as cli
    from llmfleet.cli.sim_args import sim_spec

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    base = ["--synthetic", "10", "--cluster", "2xA100-80GB", "--model", "llama2-7b"]
    assert sim_spec(p.parse_args(base), None).cost_source == "calibrated"
    assert sim_spec(p.parse_args([*base, "--cost-source", "roofline"]), None).cost_source == "roofline"
    assert sim_spec(p.parse_args([*base, "--cost-source", "vidur"]), None).cost_source == "vidur"
    with pytest.raises(SystemExit):
        p.parse_args([*base, "--cost-source", "measured"])

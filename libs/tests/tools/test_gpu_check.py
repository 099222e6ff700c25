"""``make gpu-check`` runs on CPU too (``--device cpu``), so the prepared GPU script cannot rot."""

from __future__ import annotations

import json

from tools.gpu_checks import gpu_check


def test_gpu_check_runs_on_cpu(tmp_path):
    rc = gpu_check.main(["--device", "cpu", "--shape", "tiny", "--repeats", "1", "--batches", "1,2",
                         "--lengths", "16,32", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert r["device"] == "cpu" and r["shape"]["dtype"] == "bfloat16"
    phases = {(p["phase"], p["batch"], p["tokens"]) for p in r["profile"]}
    assert ("prefill", 2, 32) in phases and ("decode", 1, 16) in phases
    for p in r["profile"]:
        assert p["seconds"] > 0 and p["vidur_s"] > 0 and p["roofline_s"] > 0
    done = [h for h in r["native_vs_hf"] if "skipped" not in h]
    assert done and all(h["ratio"]["median"] > 0 for h in done)
    assert "native/HF" in (tmp_path / "gpu_check.md").read_text()


def test_gpu_check_refuses_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda"]) == 2

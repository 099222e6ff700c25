"""``make gpu-check`` runs on CPU too (``--device cpu``), so the prepared GPU script cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "gpu_checks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_runs_on_cpu(tmp_path):
    mod = _load()
    rc = mod.main(["--device", "cpu", "--shape", "tiny", "--repeats", "1", "--batches", "1,2",
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
    mod = _load()
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    assert mod.main(["--device", "cuda"]) == 2

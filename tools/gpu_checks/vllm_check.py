"""``make gpu-check``, the vLLM part (run where CUDA is present, after ``make setup-vllm`` installed
vLLM's CUDA build): the backends side by side on the GPU, then every vLLM test on the GPU.

1. The native engine, the vLLM backend and HF ``generate`` on one checkpoint on ``cuda``
   (``tools/bench/engine_backends.py``: tokens/s at batch 1, 8 and 32, TTFT, load time, memory).
2. ``pytest -m vllm`` over the engine's and the integration tests with ``LLMFLEET_VLLM_DEVICE=cuda``:
   the same tests CI runs on the CPU (SDK and OpenAI paths, placement load/unload, drain, kill -9,
   bad input), with their engines on the GPU.

Writes ``vllm_check.json`` and ``vllm_check.md`` under ``--out`` (default ``.bench/gpu``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.bench import engine_backends
from tools.bench.engine_bench import NEW_TOKENS, PROMPT_TOKENS, hf_generate_s

ROOT = Path(__file__).resolve().parents[2]


def run_tests(timeout_s: float) -> dict:
    """``pytest -m vllm`` with the vLLM engines on cuda; its exit code and last lines."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "vllm", "integration_tests", "services/engine/tests", "-q",
         "-p", "no:cacheprovider"],
        cwd=ROOT, env={**os.environ, "LLMFLEET_VLLM_DEVICE": "cuda"}, capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip
    return {
        "exit_code": proc.returncode,
        "wall_s": time.monotonic() - t0,
        "tail": (proc.stdout + proc.stderr).strip().splitlines()[-15:],
    }


def markdown(result: dict) -> str:
    tests = result["tests"]
    lines = [
        f"# vLLM backend on {result['device_name']}",
        "",
        *engine_backends.markdown(result["backends"]),
        f"## `pytest -m vllm` on cuda: exit {tests['exit_code']} in {tests['wall_s']:.0f} s",
        "",
        "```",
        *tests["tail"],
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(".bench/gpu"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tests-timeout-s", type=float, default=420)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("vllm-check: no CUDA device here", file=sys.stderr)
        return 2
    models = Path(tempfile.mkdtemp(prefix="llmfleet-vllm-check-"))
    section = asyncio.run(
        engine_backends.backends(models, a.repeats, NEW_TOKENS, PROMPT_TOKENS, hf_generate_s, device="cuda")
    )
    result = {
        "device_name": torch.cuda.get_device_name(0),
        "backends": section,
        "tests": run_tests(a.tests_timeout_s),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "vllm_check.json").write_text(json.dumps(result, indent=1))
    (a.out / "vllm_check.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["tests"]["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

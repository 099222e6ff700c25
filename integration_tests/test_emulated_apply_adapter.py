"""A LoRA adapter added at runtime (``llmfleet apply``) on an emulated fleet whose engines share one
process (``llmfleet up --emulate 2xA100-80GB --emulate-processes 1``: one process hosting both GPUs,
``--engines 2``): every engine of the process follows the model catalog's adapter entries, through the
process's one catalog watch, and the adapter's new service is served."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from emulated import BIN, emulated_up, engines, wait_status
from llmfleet.client import AsyncClient, NotFound, Unavailable

pytestmark = pytest.mark.timeout(600)

BASE = "llama2-7b"
CONFIG = {
    "services": {"plain": {"model": BASE, "max_tokens": 8}},
    "models": {BASE: {"source": f"emulated://{BASE}"}},
    "placement": {"policy": "colocate_all", "interval_s": 2},
    "emulated": {"engine": {"max_loras": 2, "max_lora_rank": 8}},
}


def test_engines_sharing_a_process_serve_an_adapter_applied_at_runtime(tmp_path: Path) -> None:
    with emulated_up(tmp_path, CONFIG, gpus=2, processes=1) as (endpoints, _state):
        etcd, sched = endpoints["etcd"]["address"], endpoints["scheduler"]["address"]
        st = wait_status(etcd, lambda s: len(engines(s)) == 2, 120, "two engines")
        hosts = {n.get("pid") for n in engines(st)}
        assert len(hosts) == 1  # both engines in one process
        applied = tmp_path / "chat.yaml"
        applied.write_text(
            yaml.safe_dump(
                {
                    "services": {"chat": {"model": "chat-lora", "max_tokens": 8}},
                    "models": {"chat-lora": {"base": BASE, "adapter": "emulated://r8"}},
                }
            )
        )
        out = subprocess.run(
            [str(BIN / "llmfleet"), "apply", "-f", str(applied), "--timeout", "30"],
            capture_output=True, text=True, timeout=90, env=os.environ | {"LLMFLEET_ETCD": etcd},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        # each engine of the process advertises the adapter with its base
        wait_status(
            etcd,
            lambda s: all("chat-lora" in n.get("models", []) for n in engines(s)),
            60,
            "both engines advertising chat-lora",
        )

        async def first_request() -> str:
            async with AsyncClient(sched, timeout_s=30, retries=0) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        return await client.complete("Once upon a time", service="chat", max_tokens=8)
                    except (Unavailable, NotFound):
                        assert time.monotonic() < deadline, "the adapter's service was never served"
                        await asyncio.sleep(0.2)

        assert asyncio.run(first_request())

"""A LoRA adapter added at runtime on a real cluster (etcd, a scheduler, a placement service with the
static policy, one CPU engine with ``--max-loras``: native with the tiny llama, or vLLM's CPU build
with the tiny Mistral, whose head size vLLM's CPU attention takes): ``llmfleet apply`` writes the adapter's
entry and a service of it; the engine learns the entry from etcd's model catalog, reads and registers
the adapter off its event loop and advertises it; the scheduler routes the new service to it.

Measured while a service of the base runs requests back to back: the new service's first request
completes within 2 s of ``llmfleet apply`` returning, every request of the base's service succeeds
meanwhile, and the adapter's greedy tokens differ from the base's (its B is not zero).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from harness import BIN, Cluster
from llmfleet.client import AsyncClient, DeadlineExceeded, NotFound, Unavailable
from llmfleet.coord import LocalEtcd
from llmfleet.spec.vllm import VllmSettings
from llmfleet.supervisor import ProcessGroup
from vllm_marks import VLLM_INSTALLED, VLLM_TINY_SOURCE

pytestmark = pytest.mark.timeout(900)  # a vLLM start on a busy 2-core machine

BASE = "tiny-base"
LORA = {"max_loras": 2, "max_lora_rank": 8}
VLLM_SETTINGS = VllmSettings(
    kv_cache_memory_bytes=128 * 2**20, max_model_len=512, enforce_eager=True, dtype="float32"
)
# backend -> (the base's source, its engine entry, its engine's flags)
BACKENDS = {
    "native": ("tiny://llama", {}, ("--threads", "1", "--memory-budget", "256MiB")),
    "vllm": (
        VLLM_TINY_SOURCE,
        {"backend": "vllm", "vllm": VLLM_SETTINGS.model_dump(exclude_defaults=True)},
        ("--backend", "vllm", "--vllm-options", VLLM_SETTINGS.model_dump_json(exclude_defaults=True)),
    ),
}
PROMPT = "Once upon a time"
FIRST_REQUEST_S = 2.0


def make_adapter(source: str, models_dir: Path, target: Path) -> Path:
    """A random rank-8 PEFT adapter of the base (B not zero), in PEFT's saved format."""
    from llmfleet_engine.models import materialize
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(materialize(source, models_dir), dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        cfg = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        )
        get_peft_model(base, cfg).save_pretrained(target)
    return target


@pytest.fixture(
    scope="module",
    params=[
        "native",
        pytest.param("vllm", marks=pytest.mark.skipif(not VLLM_INSTALLED, reason="make setup-vllm")),
    ],
)
def cluster(request: pytest.FixtureRequest, tmp_path_factory) -> Cluster:
    source, entry, flags = BACKENDS[request.param]
    config = {
        "services": {"plain": {"model": BASE, "max_tokens": 8}},
        "models": {BASE: {"source": source}},
        "engines": {"e0": {"models": [BASE], **entry, **LORA}},
        "placement": {"policy": "static"},
    }
    root = tmp_path_factory.mktemp(f"apply-adapter-{request.param}")
    config_path = root / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    etcd = LocalEtcd(root / "etcd").start()
    c = Cluster(
        root, etcd, ProcessGroup(root / "logs"), f"/it-{uuid.uuid4().hex[:8]}", config_path, root / "models"
    )
    try:
        c.start("scheduler", "llmfleet-scheduler", "--http-port", "-1")
        c.start("placement", "llmfleet-placement", "--config", str(config_path), "--resync-s", "1")
        c.start(
            "e0",
            "llmfleet-engine",
            "--models-dir", str(c.models_dir), "--offline", *flags,
            "--max-loras", "2", "--max-lora-rank", "8",
        )  # fmt: skip
        c.wait_healthy()
        c.source = source  # type: ignore[attr-defined]
        yield c
    finally:
        c.stop()


def apply(c: Cluster, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        # --timeout: the CLI's wait for etcd while vLLM's engine core holds this machine's cores
        [
            str(BIN / "llmfleet"),
            "apply",
            "-f",
            str(path),
            "--etcd",
            c.etcd.endpoint,
            "--prefix",
            c.prefix,
            "--timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_an_applied_adapter_serves_within_2s_and_the_base_never_fails(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    adapter_dir = make_adapter(c.source, c.models_dir, tmp_path / "chat-adapter")  # type: ignore[attr-defined]
    async with AsyncClient(c.scheduler, timeout_s=30, retries=0) as client:
        deadline = time.monotonic() + 600  # a vLLM start on a busy 2-core machine
        while True:  # the base is placed and loaded
            try:
                base_out = await client.complete(PROMPT, service="plain", max_tokens=8)
                break
            except (Unavailable, DeadlineExceeded):  # held by the scheduler while the base loads
                assert time.monotonic() < deadline, "the base was never served"
                await asyncio.sleep(0.5)

        plain_done, plain_failed = 0, []
        stop = asyncio.Event()

        async def base_traffic() -> None:
            nonlocal plain_done
            while not stop.is_set():
                try:
                    await client.complete(PROMPT, service="plain", max_tokens=8)
                    plain_done += 1
                except Exception as e:  # any failure of the base's service counts
                    plain_failed.append(repr(e))

        traffic = [asyncio.create_task(base_traffic()) for _ in range(2)]
        await asyncio.sleep(1.0)
        f = tmp_path / "chat.yaml"
        f.write_text(
            yaml.safe_dump(
                {
                    "services": {"chat": {"model": "chat-lora", "max_tokens": 8}},
                    "models": {"chat-lora": {"base": BASE, "adapter": str(adapter_dir)}},
                }
            )
        )
        started = time.monotonic()  # the CLI's start, its own interpreter start-up included
        out = await asyncio.to_thread(apply, c, f)
        applied = time.monotonic()
        assert out.returncode == 0, out.stderr
        assert "model chat-lora created" in out.stdout and "service chat created" in out.stdout
        while True:
            try:
                chat_out = await client.complete(PROMPT, service="chat", max_tokens=8)
                break
            except (Unavailable, NotFound):
                assert time.monotonic() - applied < 30, "the adapter's service was never served"
                await asyncio.sleep(0.02)
        first_s, since_start_s = time.monotonic() - applied, time.monotonic() - started
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*traffic)

    print(
        f"first request of the applied adapter: {first_s:.2f}s after llmfleet apply returned, "
        f"{since_start_s:.2f}s after it started; base requests meanwhile: {plain_done}"
    )
    assert first_s < FIRST_REQUEST_S, f"{first_s:.2f}s"
    assert plain_failed == [] and plain_done > 0
    assert chat_out.usage.engine_id == "e0"
    assert chat_out.token_ids != base_out.token_ids  # the adapter's tokens, not the base's
    assert f"adapter chat-lora of {BASE} declared" in c.log("e0")

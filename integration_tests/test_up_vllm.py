"""The README's two commands for a vLLM engine: `make setup-vllm` (CI ran it), then `llmfleet up -c
deploy/local/vllm.yaml`; the official OpenAI client gets a completion served by vLLM, the engine's
/metrics speaks vLLM's names with vLLM's numbers, and Ctrl-C stops every child, vLLM's engine-core
processes included."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import psutil
import pytest
from llmfleet.supervisor import free_port
from vllm_marks import requires_vllm

pytestmark = [pytest.mark.integration, *requires_vllm]

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 600  # etcd, the control plane and a vLLM start on a busy 2-core machine


def test_up_with_the_shipped_vllm_config_serves_openai_and_stops_cleanly(tmp_path: Path) -> None:
    state, http_port = tmp_path / "state", free_port()
    out = open(tmp_path / "up.out", "w")  # noqa: SIM115 - closed in finally, after up exits
    up = subprocess.Popen(
        [str(BIN / "llmfleet"), "up", "-c", str(ROOT / "deploy/local/vllm.yaml"), "--state-dir", str(state),
         "--etcd-port", "0", "--base-port", str(free_port()), "--http-port", str(http_port), "--ttl", "3"],
        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        endpoints_file = state / "endpoints.json"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not endpoints_file.exists():
            assert up.poll() is None, (tmp_path / "up.out").read_text()
            assert time.monotonic() < deadline, "llmfleet up did not come up"
            time.sleep(0.5)
        endpoints = json.loads(endpoints_file.read_text())
        children = psutil.Process(up.pid).children(recursive=True)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", timeout=120)
        while True:  # the engine loads its placement asynchronously
            try:
                completion = client.completions.create(model="chat", prompt="Once upon a time", max_tokens=8)
                break
            except openai.APIStatusError:
                assert time.monotonic() < deadline, "no completion before the deadline"
                time.sleep(2)
        assert completion.usage.completion_tokens == 8 and completion.choices[0].finish_reason == "length"
        with urllib.request.urlopen(f"http://{endpoints['vllm-0']['metrics']}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'vllm:kv_cache_usage_perc{model_name="tiny-mistral"}' in metrics
        assert 'vllm:prefix_cache_queries_total{model_name="tiny-mistral"}' in metrics
        assert 'vllm:generation_tokens_total{model_name="tiny-mistral"} 8.0' in metrics
        children = psutil.Process(up.pid).children(recursive=True)  # vLLM's engine core by now
    finally:
        up.send_signal(signal.SIGINT)
        rc = up.wait(timeout=120)
        out.close()
    assert rc == 0, (tmp_path / "up.out").read_text()
    assert len(children) > 7, "etcd, the control plane, the engine and vLLM's engine-core processes"
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"children left behind after Ctrl-C: {[p.pid for p in alive]}"

"""`llmfleet up` (what `make run` runs) with the shipped cluster config: everything comes up, the
endpoints are printed, `llmfleet submit` streams text, Ctrl-C stops every child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmfleet.supervisor import free_port

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _status(endpoints: dict) -> dict:
    env = os.environ | {"LLMFLEET_ETCD": endpoints["etcd"]["address"]}
    st = subprocess.run(
        [str(BIN / "llmfleet"), "status", "--json"], capture_output=True, text=True, timeout=60, env=env
    )
    assert st.returncode == 0, st.stderr
    return json.loads(st.stdout)


def _demo_scale_out(endpoints: dict, tmp_path: Path) -> None:
    """The demo of docs/getting-started.md: the shipped config starts one of its three engines idle (which one depends
    on the order the engines registered in); `llmfleet load` on chat makes the aladdin leader give it
    chat's model, and `llmfleet status` shows the decision and the pool."""
    pool = {e["engine_id"]: e for e in _status(endpoints)["fleet"]["pool"]}
    idle = [eid for eid, e in sorted(pool.items()) if e["idle"] and e["models"] == []]
    assert idle, pool
    spare = idle[-1]
    summary = tmp_path / "load.json"
    load = subprocess.run(
        [
            str(BIN / "llmfleet"), "load", "--phase", "chat:8:25", "--report-s", "5",
            "--scheduler", endpoints["scheduler"]["address"], "--json", str(summary),
        ],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert load.returncode == 0, load.stdout + load.stderr
    assert json.loads(summary.read_text())["errors"] == 0
    deadline = time.monotonic() + 60
    while True:
        fleet = _status(endpoints)["fleet"]
        pool = {e["engine_id"]: e for e in fleet["pool"]}
        if pool[spare]["models"] == ["tiny-llama"] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert pool[spare]["models"] == ["tiny-llama"], fleet
    assert fleet["gpus_in_use"] == 3
    assert any(f"{spare}: +tiny-llama" in d["summary"] for d in fleet["decisions"] if d["ok"])


def _metrics(endpoints: dict) -> None:
    """Every process's /metrics is listed; engines speak vLLM's names, the control plane llmfleet_."""
    import urllib.request

    def scrape(name: str) -> str:
        with urllib.request.urlopen(f"http://{endpoints[name]['metrics']}/metrics", timeout=10) as r:
            return r.read().decode()

    assert all(e.get("metrics") for name, e in endpoints.items() if name != "etcd")
    engine = scrape("engine-0")
    assert 'vllm:num_requests_running{model_name="tiny-llama"}' in engine
    assert "vllm:generation_tokens_total" in engine and "llmfleet_" not in engine.replace("llmfleet_etcd", "")
    scheduler = scrape("scheduler")
    assert "llmfleet_" in scheduler and "vllm:" not in scheduler


def _openai(endpoints: dict, http_port: int) -> None:
    """The OpenAI-compatible API (the front's), with the official client, as docs/getting-started.md shows it."""
    import openai

    assert endpoints["front"]["http"] == f"127.0.0.1:{http_port}" and "http" not in endpoints["scheduler"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused")
    assert "chat" in {m.id for m in client.models.list()}
    out = client.completions.create(model="chat", prompt="Once upon a time", max_tokens=8)
    assert out.usage.completion_tokens == 8 and out.choices[0].finish_reason == "length"


def test_up_serves_and_stops_cleanly(tmp_path):
    base = free_port()  # a free block is likely just above a free port; up fails loudly otherwise
    http_port = free_port()
    state = tmp_path / "state"
    out = open(tmp_path / "up.out", "w")  # noqa: SIM115 - closed in finally, after up exits
    up = subprocess.Popen(
        [
            str(BIN / "llmfleet"),
            "up",
            "--state-dir",
            str(state),
            "--etcd-port",
            "0",
            "--base-port",
            str(base),
            "--ttl",
            "3",
            "--config",
            str(ROOT / "deploy/local/cluster.yaml"),
            "--http-port",
            str(http_port),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )
    endpoints_file = state / "endpoints.json"
    try:
        deadline = time.monotonic() + 180
        while not endpoints_file.exists():
            assert up.poll() is None, (tmp_path / "up.out").read_text()
            assert time.monotonic() < deadline, "llmfleet up did not become healthy"
            time.sleep(0.5)
        endpoints = json.loads(endpoints_file.read_text())
        assert {"etcd", "scheduler", "profiler", "placement", "migration", "engine-0", "engine-1"} <= set(
            endpoints
        )
        printed = (tmp_path / "up.out").read_text()
        assert endpoints["scheduler"]["address"] in printed
        pids = [e["pid"] for e in endpoints.values() if e.get("pid")]

        # the engines load their placement asynchronously; submit retries until the model is up
        deadline = time.monotonic() + 120
        while True:
            sub = subprocess.run(
                [
                    str(BIN / "llmfleet"),
                    "submit",
                    "Once upon a time",
                    "--service",
                    "chat",
                    "--max-tokens",
                    "12",
                    "--scheduler",
                    endpoints["scheduler"]["address"],
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if sub.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert sub.returncode == 0, sub.stderr
        assert "12 completion tokens" in sub.stderr and sub.stdout
        _demo_scale_out(endpoints, tmp_path)
        _metrics(endpoints)
        _openai(endpoints, http_port)
    finally:
        up.send_signal(signal.SIGINT)
        rc = up.wait(timeout=60)
        out.close()
    assert rc == 0, (tmp_path / "up.out").read_text()
    deadline = time.monotonic() + 10  # up has waited for each child; allow the kernel to reap them
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "children left behind after Ctrl-C"

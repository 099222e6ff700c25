"""The live control plane on an emulated fleet (CI size): ``llmfleet up --emulate 16xA100-80GB
--emulate-processes 2`` — etcd, two schedulers, profiler, placement, migration and 16 emulated A100s
in two processes — serving Llama-2 7B/13B as the cost model prices them.

Checked here: every emulated GPU registers as its own engine (own lease, port and /metrics, the
catalog hardware), Aladdin's placement scales the pool out on a rate step and back in when the rate
drops (no request lost while engines leave), JSQ spreads chat over the engines placement gave it, and
each engine's ``vllm:*`` metrics are its own. Full sizes (32–256 GPUs, trace replays against
``llmfleet sim``) are ``make bench-fleet``.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest
from emulated import BIN, emulated_up, engines, status, wait_status

GPUS, PROCESSES = 16, 2

CONFIG = {
    "services": {
        "chat": {"model": "llama2-7b", "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "dispatch": "jsq"},
        "code": {"model": "llama2-13b", "slo": {"ttft_s": 3.0, "tpot_s": 0.15}},
    },
    "models": {
        "llama2-7b": {"source": "emulated://llama2-7b", "dtype": "float16"},
        "llama2-13b": {"source": "emulated://llama2-13b", "dtype": "float16"},
    },
    # Aladdin Eq. 7 with a demo slope: one more chat worker per 4 req/s (the demo value of docs/getting-started.md)
    "placement": {"policy": "aladdin", "interval_s": 2, "window_s": 10, "confirm_intervals": 1,
                  "options": {"k5": 0.25}},
    "emulated": {"hardware": "A100-80GB", "count": 4, "processes": 1},
}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with emulated_up(tmp_path_factory.mktemp("emulated-fleet"), CONFIG, GPUS, PROCESSES) as up:
        yield up


def test_every_emulated_gpu_is_an_engine_of_its_own(fleet):
    endpoints, _ = fleet
    etcd = endpoints["etcd"]["address"]
    assert {"emu0", "emu1"} <= set(endpoints) and "engine-0" not in endpoints
    st = wait_status(etcd, lambda s: len(engines(s)) == GPUS, 60, f"{GPUS} emulated engines")
    pool = engines(st)
    assert len({e["address"] for e in pool}) == GPUS  # own ports
    assert len({e["pid"] for e in pool}) == PROCESSES  # hosted by two processes
    assert {e["device"] for e in pool} == {"emulated"}
    # placement gives each model a worker although nothing was sent yet (Aladdin's min_workers)
    st = wait_status(etcd, lambda s: s["fleet"]["gpus_in_use"] >= 2, 90, "a first plan to load both models")
    loaded = {m for e in engines(st) for m in e["models"]}
    assert loaded == {"llama2-7b", "llama2-13b"}


def test_aladdin_scales_out_on_a_rate_step_and_back_in_without_losing_requests(fleet, tmp_path):
    endpoints, _ = fleet
    etcd, sched = endpoints["etcd"]["address"], endpoints["scheduler"]["address"]
    wait_status(etcd, lambda s: s["fleet"]["gpus_in_use"] >= 2, 90, "the first plan")
    before = status(etcd)["fleet"]["gpus_in_use"]
    summary = tmp_path / "load.json"
    load = subprocess.Popen(
        [
            str(BIN / "llmfleet"), "load", "--scheduler", sched, "--json", str(summary), "--report-s", "5",
            "--phase", "chat:2:6", "--phase", "chat:16:24", "--phase", "chat:1:24", "--max-tokens", "64",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    peak = before
    deadline = time.monotonic() + 200
    while load.poll() is None and time.monotonic() < deadline:
        peak = max(peak, status(etcd)["fleet"]["gpus_in_use"])
        time.sleep(2)
    output = load.communicate(timeout=120)[0]
    assert load.returncode == 0, output
    result = json.loads(summary.read_text())
    assert result["errors"] == 0, output  # nothing lost, also while engines left
    assert peak >= before + 2, f"16 req/s should need more chat workers than {before - 1}: {output}"
    st = wait_status(
        etcd, lambda s: s["fleet"]["gpus_in_use"] < peak, 60, "the pool to shrink after the step"
    )
    assert any(d["ok"] for d in st["fleet"]["decisions"])
    assert len([e for e, n in result["engines"].items() if n]) >= 2, "JSQ spreads chat over its workers"


def test_each_emulated_engine_serves_its_own_vllm_metrics(fleet):
    endpoints, _ = fleet
    host_port = endpoints["emu0"]["metrics"].split("..")[0]
    with urllib.request.urlopen(f"http://{host_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "vllm:kv_cache_usage_perc" in text or "vllm:num_requests_running" in text

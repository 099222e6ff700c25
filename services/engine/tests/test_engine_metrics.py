"""The engine's vllm:* metrics: they move when requests run, under exactly vLLM's names and labels;
``--metrics-port`` (the shared shell's flag) and the /metrics server."""

from __future__ import annotations

import re
import urllib.request

import pytest
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.metrics.server import metrics_port, samples, start_metrics_server
from llmfleet.rpc.node import ServiceNode
from llmfleet_engine.executor import Executor
from llmfleet_engine.main import build_parser
from llmfleet_engine.models import LoadedModel
from llmfleet_engine.outputs import FinishReason
from llmfleet_engine.validation import build_request
from prometheus_client import CollectorRegistry, generate_latest


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    return samples(registry)


def _types(registry: CollectorRegistry) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", generate_latest(registry).decode(), re.M))


@pytest.fixture
def metered(executor: Executor) -> tuple[Executor, CollectorRegistry]:
    registry = CollectorRegistry()
    executor.attach_metrics(EngineMetrics(registry))
    return executor, registry


async def test_metrics_move_when_requests_run(metered, llama: LoadedModel, endless: LoadedModel) -> None:
    executor, registry = metered
    req = build_request(llama, "The quick brown fox", max_tokens=5)
    chunks = await executor.submit(req).collect()
    assert chunks[-1].finish_reason == FinishReason.LENGTH
    s = _samples(registry)
    m = f'model_name="{llama.name}"'
    assert s[f'vllm:request_success_total{{finished_reason="length",{m}}}'] == 1
    assert s[f"vllm:prompt_tokens_total{{{m}}}"] == req.prompt_tokens
    assert s[f"vllm:generation_tokens_total{{{m}}}"] == 5
    assert s[f"vllm:time_to_first_token_seconds_count{{{m}}}"] == 1
    assert s[f"vllm:inter_token_latency_seconds_count{{{m}}}"] == 4
    assert s[f"vllm:e2e_request_latency_seconds_count{{{m}}}"] == 1
    assert s[f"vllm:request_queue_time_seconds_count{{{m}}}"] == 1
    assert s[f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",{m}}}'] == 1
    assert s[f"vllm:num_requests_running{{{m}}}"] == 0

    # a running request shows in the gauges; cancelling it counts as abort
    long = build_request(endless, "The quick brown fox", max_tokens=1500, request_id="long")
    stream = executor.submit(long)
    await stream.__anext__()
    s = _samples(registry)
    e = f'model_name="{endless.name}"'
    assert s[f"vllm:num_requests_running{{{e}}}"] == 1
    assert s[f"vllm:num_requests_waiting{{{e}}}"] == 0
    assert 0 < s[f"vllm:kv_cache_usage_perc{{{e}}}"] <= 1
    assert executor.cancel("long")
    _ = [c async for c in stream]
    s = _samples(registry)
    assert s[f'vllm:request_success_total{{finished_reason="abort",{e}}}'] == 1


async def test_names_and_types_are_vllms(metered, llama: LoadedModel) -> None:
    executor, registry = metered
    await executor.submit(build_request(llama, "Hello", max_tokens=3)).collect()
    executor.metrics.preempted(llama.name)  # the counter's exposition (preemption itself: hard to force)
    types = _types(registry)
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions_total": "counter",
        "vllm:prompt_tokens_total": "counter",
        "vllm:generation_tokens_total": "counter",
        "vllm:request_success_total": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
    }
    assert types == expected  # nothing else (no *_created series, no llmfleet_* on an engine registry)
    for key in _samples(registry):
        labels = set(re.findall(r"(\w+)=", key[key.index("{") :])) if "{" in key else set()
        labels.discard("le")
        base = key.split("{")[0]
        want = {"model_name", "finished_reason"} if base == "vllm:request_success_total" else {"model_name"}
        assert labels == want, key


def test_metrics_port_rule() -> None:
    ap = build_parser()
    assert metrics_port(ap.parse_args([])) == 50061 + 1000
    assert metrics_port(ap.parse_args(["--port", "50100"])) == 51100
    assert metrics_port(ap.parse_args(["--port", "0"])) == 0
    assert metrics_port(ap.parse_args(["--metrics-port", "0"])) == 0
    assert metrics_port(ap.parse_args(["--metrics-port", "-1"])) == -1
    assert start_metrics_server(-1) is None


def test_metrics_server_serves_the_registry() -> None:
    registry = CollectorRegistry()
    EngineMetrics(registry).finished("m", "EOS", 0.01, 0.5, True)
    server = start_metrics_server(0, registry=registry)
    assert server is not None and server.port > 0
    try:
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
    finally:
        server.stop()
    assert 'vllm:request_success_total{finished_reason="stop",model_name="m"} 1.0' in body


async def test_shell_metrics_port_minus_one_disables() -> None:
    class _Server:
        address = "127.0.0.1:1"

        async def start(self) -> None: ...

    node = ServiceNode("engine", "e1", None, _Server(), metrics_port=-1)  # type: ignore[arg-type]
    assert node.start_metrics() is None and node.metrics is None
    node.metrics_port = 0
    server = node.start_metrics()
    try:
        assert server is not None and server.port > 0
        assert urllib.request.urlopen(server.url, timeout=5).status == 200
    finally:
        server.stop()

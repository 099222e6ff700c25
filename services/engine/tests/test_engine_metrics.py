"""The engine's vllm:* metrics: they move when requests run, under exactly vLLM's names and labels;
``--metrics-port`` (the shared shell's flag) and the /metrics server."""

from __future__ import annotations

import re
import urllib.request

import pytest
from llmfleet.config import EtcdSettings
from llmfleet.metrics.engine import EngineMetrics
from llmfleet.metrics.server import metrics_port, samples, start_metrics_server
from llmfleet.rpc.node import ServiceNode
from llmfleet.rpc.server import GrpcServer
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
        "vllm:prefix_cache_queries_total": "counter",
        "vllm:prefix_cache_hits_total": "counter",
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
    # what Prometheus asks for: OpenMetrics first; the answer is the text format, colons kept
    prometheus = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    try:
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
        req = urllib.request.Request(server.url, headers={"Accept": prometheus})
        with urllib.request.urlopen(req, timeout=5) as resp:
            negotiated, content_type = resp.read().decode(), resp.headers["Content-Type"]
    finally:
        server.stop()
    assert 'vllm:request_success_total{finished_reason="stop",model_name="m"} 1.0' in body
    assert 'vllm:request_success_total{finished_reason="stop",model_name="m"} 1.0' in negotiated
    assert "vllm_request_success" not in negotiated and content_type.startswith("text/plain")


async def test_shell_metrics_port_minus_one_disables() -> None:
    node = ServiceNode("engine", "e1", EtcdSettings(), GrpcServer(()), metrics_port=-1)
    assert node.start_metrics() is None and node.metrics is None
    node.metrics_port = 0
    server = node.start_metrics()
    try:
        assert server is not None and server.port > 0
        assert urllib.request.urlopen(server.url, timeout=5).status == 200
    finally:
        server.stop()


def test_exposition_is_prometheus_clients() -> None:
    """The hooks keep plain numbers; what a scrape reads is exactly what prometheus-client's own
    Counter / Histogram (vLLM's metrics) expose for the same observations."""
    from llmfleet.metrics import engine as em
    from prometheus_client import Counter, Histogram

    ours = CollectorRegistry()
    m = EngineMetrics(ours)
    ref = CollectorRegistry()
    label = ["model_name"]
    pre = Counter("vllm:num_preemptions", "Cumulative number of preemptions.", label, registry=ref)
    queries = Counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        label,
        registry=ref,
    )
    hits = Counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        label,
        registry=ref,
    )
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", label, registry=ref)
    gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", label, registry=ref)
    success = Counter(
        "vllm:request_success",
        "Count of finished requests by finished reason.",
        [*label, "finished_reason"],
        registry=ref,
    )
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        label,
        buckets=em.TTFT_BUCKETS,
        registry=ref,
    )
    itl = Histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        label,
        buckets=em.ITL_BUCKETS,
        registry=ref,
    )
    e2e = Histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        label,
        buckets=em.REQUEST_LATENCY_BUCKETS,
        registry=ref,
    )
    queue = Histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        label,
        buckets=em.REQUEST_LATENCY_BUCKETS,
        registry=ref,
    )
    assert generate_latest(ours) == generate_latest(ref)  # nothing observed yet: HELP and TYPE only

    m.preempted("a")
    pre.labels("a").inc()
    m.prefix_cache("a", 300, 256)
    queries.labels("a").inc(300)
    hits.labels("a").inc(256)
    m.prefix_cache("b", 0, 0)  # no lookup: no series
    m.first_token("a", 7, 0.02)  # exactly on a bucket boundary: counted in that bucket
    prompt.labels("a").inc(7)
    ttft.labels("a").observe(0.02)
    m.first_token("b", 3, -1.0)
    prompt.labels("b").inc(3)
    ttft.labels("b").observe(0.0)
    m.tokens("a", 2)
    m.tokens("b", 0)  # no series for nothing
    gen.labels("a").inc(2)
    m.inter_token("a", 0.3)
    itl.labels("a").observe(0.3)
    m.decode_step("a", 10.0, {9.99: 3, 9.5: 1, 1.0: 2}, 6)  # 3 x 10 ms, 1 x 0.5 s, 2 x 9 s
    gen.labels("a").inc(6)
    for gap, k in ((10.0 - 9.99, 3), (0.5, 1), (9.0, 2)):
        for _ in range(k):
            itl.labels("a").observe(gap)
    m.decode_step("b", 5.0, {}, 1)  # a step of first tokens only
    gen.labels("b").inc(1)
    m.inter_token("b", 1000.0)  # beyond every bucket: +Inf
    itl.labels("b").observe(1000.0)
    for reason, counted in (("LENGTH", True), ("EOS", True), ("MIGRATED", True), ("CANCELLED", False)):
        m.finished("a", reason, 0.25, 1.5, counted)
        success.labels("a", em.FINISHED_REASONS[reason]).inc()
        if counted and reason != "MIGRATED":
            queue.labels("a").observe(0.25)
            e2e.labels("a").observe(1.5)
    m.finished("a", "WEIRD", 0.1, 0.2, True)
    success.labels("a", "weird").inc()
    queue.labels("a").observe(0.1)
    e2e.labels("a").observe(0.2)

    def lines(reg: CollectorRegistry) -> list[str]:  # the sums: float addition in another order
        out = []
        for line in generate_latest(reg).decode().splitlines():
            if "_sum{" in line:
                key, _, value = line.rpartition(" ")
                line = f"{key} {float(value):.9f}"
            out.append(line)
        return out

    assert lines(ours) == lines(ref)

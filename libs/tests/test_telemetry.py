"""Trace context crosses process boundaries: SDK client -> server A -> (nested call) -> server B (for a
request, the SDK's stream on SubmitMany -> server A's stream -> its Submit call -> server B).

``setup_tracing`` installs the global TracerProvider once per process, so this test attaches its own
in-memory exporter to whatever provider is installed, filters spans by its own trace ids, and shuts
the exporter down at the end (later tests keep tracing on, but nothing accumulates in memory).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.client import AsyncClient
from llmfleet.client.testing import FakeScheduler, start_fake_scheduler
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.mux import SUBMIT_MANY
from llmfleet.telemetry import setup_tracing, tracing_enabled
from llmfleet.telemetry.streams import REQUEST_ID
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind


class RelayScheduler(FakeScheduler):
    """Answers ListServices and Submit by calling another Scheduler (a nested client call)."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream

    async def ListServices(
        self, request: scheduler_pb2.ListServicesRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListServicesResponse:
        async with open_channel(self.upstream) as channel:
            return await scheduler_pb2_grpc.SchedulerStub(channel).ListServices(request)

    async def Submit(
        self, request: scheduler_pb2.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        async with open_channel(self.upstream) as channel:
            async for chunk in scheduler_pb2_grpc.SchedulerStub(channel).Submit(request):
                yield chunk


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = setup_tracing("test", exporter=exp)
    installed = trace.get_tracer_provider()
    assert isinstance(installed, TracerProvider) and tracing_enabled()
    if installed is not provider:  # someone else installed the global provider first
        installed.add_span_processor(SimpleSpanProcessor(exp))
    yield exp
    exp.shutdown()  # stop collecting; later tests' spans are dropped


def _by_trace(spans: tuple[ReadableSpan, ...], method: str) -> dict[int, list[ReadableSpan]]:
    """The spans of ``method`` calls by trace; for ``Submit``, also the SDK's request streams on
    ``SubmitMany`` that reach it (the stream spans name their request; the long-lived call's own
    spans name none and belong to no request's trace)."""
    out: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        ours = s.name.endswith(f"/llmfleet.v1.Scheduler/{method}") or (
            method == "Submit" and s.name == SUBMIT_MANY and REQUEST_ID in (s.attributes or {})
        )
        if ours and s.context is not None:
            out.setdefault(s.context.trace_id, []).append(s)
    return out


@pytest.mark.parametrize("method", ["ListServices", "Submit"])
async def test_client_and_nested_server_spans_share_one_trace(
    exporter: InMemorySpanExporter, method: str
) -> None:
    leaf = await start_fake_scheduler(FakeScheduler())
    relay = await start_fake_scheduler(RelayScheduler(leaf.address))
    try:
        exporter.clear()
        async with AsyncClient(relay.address) as client:
            if method == "ListServices":
                assert [s.name for s in await client.list_services()] == ["chat", "summarize"]
            else:
                assert (
                    await client.complete("a b", service="chat", max_tokens=3)
                ).usage.completion_tokens == 3
    finally:
        await relay.stop(0)
        await leaf.stop(0)

    traces = _by_trace(exporter.get_finished_spans(), method)
    assert len(traces) == 1, f"expected one trace for {method}, got {len(traces)}: {traces}"
    spans = next(iter(traces.values()))
    kinds = sorted(s.kind.name for s in spans)
    assert kinds == ["CLIENT", "CLIENT", "SERVER", "SERVER"], kinds

    # parent chain: SDK client -> relay server -> relay's client -> leaf server
    by_id = {s.context.span_id: s for s in spans}
    roots = [s for s in spans if s.parent is None or s.parent.span_id not in by_id]
    assert len(roots) == 1 and roots[0].kind is SpanKind.CLIENT
    chain = [roots[0]]
    while True:
        children = [
            s for s in spans if s.parent is not None and s.parent.span_id == chain[-1].context.span_id
        ]
        if not children:
            break
        assert len(children) == 1
        chain.append(children[0])
    assert [s.kind for s in chain] == [SpanKind.CLIENT, SpanKind.SERVER, SpanKind.CLIENT, SpanKind.SERVER]

"""One request's spans (SDK -> scheduler -> engine on the multiplexed calls' streams, and the scheduler's
Observe to the profiler) share one trace id. The services run in this process (built by their own ``build_node``) so one in-memory
exporter sees every span; etcd is real."""

from __future__ import annotations

import asyncio

from llmfleet.client import AsyncClient
from llmfleet.coord import EtcdClient, put_service
from llmfleet.rpc.mux import GENERATE_MANY, SUBMIT_MANY
from llmfleet.spec.services import ServiceSpec
from llmfleet.telemetry import setup_tracing
from llmfleet.telemetry.streams import REQUEST_ID
from llmfleet.testing import eventually
from llmfleet_engine import main as engine_main
from llmfleet_profiler import main as profiler_main
from llmfleet_scheduler import main as scheduler_main
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


async def test_one_trace_spans_sdk_scheduler_engine(etcd_settings, node_args, tmp_path):
    exporter = InMemorySpanExporter()
    setup_tracing("integration-test", exporter=exporter)  # before servers/channels are built
    common = node_args
    engine, _ = engine_main.build_node(
        engine_main.build_parser().parse_args(
            [
                *common,
                "--id",
                "engine-t",
                "--models-dir",
                str(tmp_path),
                "--threads",
                "1",
                "--model",
                "m=tiny://llama",
            ]
        )
    )
    scheduler, _ = scheduler_main.build_node(
        scheduler_main.build_parser().parse_args([*common, "--id", "sched-t"])
    )
    profiler = profiler_main.build_node(profiler_main.build_parser().parse_args([*common, "--id", "prof-t"]))
    nodes = [engine, scheduler, profiler]
    etcd = EtcdClient(etcd_settings)
    await etcd.connect(wait=False)
    try:
        for n in nodes:
            await n.start()
        await put_service(etcd, ServiceSpec(name="chat", model="m"))
        await asyncio.wait_for(engine.etcd_ready.wait(), 30)
        await asyncio.wait_for(scheduler.etcd_ready.wait(), 30)
        # wait until the scheduler sees the engine with the model loaded and the profiler (an
        # observation made while no profiler is registered is dropped, by design)
        await scheduler_main_directory(scheduler).nodes_view.wait_for(
            lambda nodes: "m" in getattr(nodes.get("engine-t"), "models", ()) and "prof-t" in nodes,
            timeout=60,
        )
        exporter.clear()
        async with AsyncClient(scheduler.address, timeout_s=30) as client:
            done = await client.complete("trace me", service="chat", max_tokens=3)
        assert done.usage.engine_id == "engine-t"
        await eventually(
            lambda: any(s.name.endswith("Profiler/Observe") for s in exporter.get_finished_spans()),
            30,  # the profiler's first Observe can be slow on a loaded machine
            "the scheduler's Observe call to finish",
        )
        spans = exporter.get_finished_spans()
        # each request has its own spans on the multiplexed calls, in one trace: SDK -> scheduler
        # (SubmitMany's stream) -> engine (GenerateMany's stream), and the scheduler's Observe
        mine = [s for s in spans if s.attributes.get(REQUEST_ID) == done.request_id]
        assert {(s.name, s.kind.name) for s in mine} == {
            (SUBMIT_MANY, "CLIENT"),
            (SUBMIT_MANY, "SERVER"),
            (GENERATE_MANY, "CLIENT"),
            (GENERATE_MANY, "SERVER"),
        }, [(s.name, s.kind.name, dict(s.attributes)) for s in spans]
        trace_ids = {s.context.trace_id for s in mine}
        assert len(trace_ids) == 1
        observe = {s.context.trace_id for s in spans if s.name.endswith("Profiler/Observe")}
        assert observe == trace_ids
        by_id = {s.context.span_id: s for s in mine}
        parents = {
            (s.name, s.kind.name): by_id[s.parent.span_id]
            for s in mine
            if s.parent is not None and s.parent.span_id in by_id
        }
        assert parents[(SUBMIT_MANY, "SERVER")].kind.name == "CLIENT"  # the SDK's span is its parent
        assert parents[(GENERATE_MANY, "CLIENT")].name == SUBMIT_MANY  # inside the scheduler's
        assert parents[(GENERATE_MANY, "SERVER")].name == GENERATE_MANY
        # the long-lived multiplexed calls belong to no request's trace
        calls = [
            s for s in spans if s.name in (SUBMIT_MANY, GENERATE_MANY) and REQUEST_ID not in s.attributes
        ]
        assert not {s.context.trace_id for s in calls} & trace_ids
    finally:
        for n in reversed(nodes):
            await n.stop()
        await etcd.close()


def scheduler_main_directory(node):
    """The scheduler's ClusterDirectory, reached through its servicer registration."""
    servicer = node.server.services[0][1]
    return servicer.directory

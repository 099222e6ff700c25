"""Status details stay under gRPC's metadata limit (found by fuzzing: a refusal echoing a 1 MiB field
reached the client as RESOURCE_EXHAUSTED "received metadata size exceeds hard limit")."""

from __future__ import annotations

import grpc
import pytest
from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.details import MAX_DETAILS
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.security import SecuritySettings

HUGE = "x" * (1 << 20)


class Echoing(scheduler_pb2_grpc.SchedulerServicer):
    """Refuses every call, echoing the (huge) request field in the details."""

    async def Cancel(self, request, context):
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown request {request.request_id!r}")

    async def Submit(self, request, context):
        yield common_pb2.TokenChunk(request_id="first")
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"service: unknown {request.service!r}")

    async def ListServices(self, request, context):
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details(HUGE)
        return scheduler_pb2.ListServicesResponse()


@pytest.fixture
async def stub():
    reg = (
        scheduler_pb2_grpc.add_SchedulerServicer_to_server,
        Echoing(),
        service_name(scheduler_pb2, "Scheduler"),
    )
    server = await GrpcServer([reg], security=SecuritySettings().validated()).start()
    async with open_channel(server.address) as channel:
        yield scheduler_pb2_grpc.SchedulerStub(channel)
    await server.stop(0)


async def test_abort_details_are_clipped(stub):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Cancel(common_pb2.CancelRequest(request_id=HUGE), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # not RESOURCE_EXHAUSTED: the refusal arrives
    assert e.value.details().startswith("unknown request 'xxx") and "clipped" in e.value.details()
    assert len(e.value.details()) <= MAX_DETAILS


async def test_streaming_and_set_details_are_clipped(stub):
    call = stub.Submit(scheduler_pb2.SubmitRequest(service=HUGE), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async for _ in call:
            pass
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith("service: ")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ListServices(scheduler_pb2.ListServicesRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and len(e.value.details()) <= MAX_DETAILS

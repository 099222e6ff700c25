"""TLS, mutual TLS and API keys on a real gRPC server (loopback), with throwaway certificates."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmfleet.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet.security import SecuritySettings
from llmfleet.security.certs import write_dev_certs


class Echo(scheduler_pb2_grpc.SchedulerServicer):
    async def ListServices(self, request, context):
        return scheduler_pb2.ListServicesResponse(services=[scheduler_pb2.ServiceInfo(name="chat")])

    async def Submit(self, request, context):
        yield common_pb2.TokenChunk(request_id=request.request_id, token_ids=[1, 2])


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("tls")
    server = write_dev_certs(d, ["127.0.0.1", "localhost"])
    client = write_dev_certs(d, ["client"], name="client")  # same CA
    other = write_dev_certs(d / "other", ["127.0.0.1"])  # another CA
    return {
        "ca": str(server.ca),
        "cert": str(server.cert),
        "key": str(server.key),
        "client_cert": str(client.cert),
        "client_key": str(client.key),
        "other_ca": str(other.ca),
    }


async def serve(security: SecuritySettings) -> GrpcServer:
    reg = (
        scheduler_pb2_grpc.add_SchedulerServicer_to_server,
        Echo(),
        service_name(scheduler_pb2, "Scheduler"),
    )
    return await GrpcServer([reg], security=security.validated()).start()


async def list_services(address: str, security: SecuritySettings, timeout: float = 5) -> list[str]:
    async with open_channel(address, security) as ch:
        resp = await scheduler_pb2_grpc.SchedulerStub(ch).ListServices(
            scheduler_pb2.ListServicesRequest(), timeout=timeout
        )
        return [s.name for s in resp.services]


async def health(address: str, security: SecuritySettings) -> int:
    async with open_channel(address, security) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return resp.status


async def test_tls_server_refuses_plaintext_and_serves_verified_clients(certs):
    server = await serve(SecuritySettings(tls_cert=certs["cert"], tls_key=certs["key"]))
    try:
        assert await list_services(server.address, SecuritySettings(tls_ca=certs["ca"])) == ["chat"]
        with pytest.raises(grpc.aio.AioRpcError) as e:  # a plaintext client
            await list_services(server.address, SecuritySettings(), timeout=3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as e:  # a client that trusts another CA
            await list_services(server.address, SecuritySettings(tls_ca=certs["other_ca"]), timeout=3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


async def test_plaintext_server_refuses_a_tls_client(certs):
    server = await serve(SecuritySettings())
    try:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await list_services(server.address, SecuritySettings(tls_ca=certs["ca"]), timeout=3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


async def test_mutual_tls_needs_a_client_certificate_from_the_ca(certs):
    server = await serve(
        SecuritySettings(
            tls_cert=certs["cert"], tls_key=certs["key"], tls_ca=certs["ca"], tls_client_auth=True
        )
    )
    try:
        with_cert = SecuritySettings(
            tls_ca=certs["ca"], tls_cert=certs["client_cert"], tls_key=certs["client_key"]
        )
        assert await list_services(server.address, with_cert) == ["chat"]
        with pytest.raises(grpc.aio.AioRpcError) as e:  # TLS, but no client certificate
            await list_services(server.address, SecuritySettings(tls_ca=certs["ca"]), timeout=3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


async def test_api_keys_refuse_missing_and_wrong_keys_and_leave_health_open(tmp_path: Path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {name: team-a, key: sk-team-a-0001}\n")
    server = await serve(SecuritySettings(api_keys_file=str(keys)))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await list_services(server.address, SecuritySettings())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "missing API key" in e.value.details() and "authorization: Bearer" in e.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await list_services(server.address, SecuritySettings(api_key="sk-team-a-0002"))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and e.value.details() == "invalid API key"
        async with open_channel(server.address, SecuritySettings()) as ch:  # a stream without a key
            call = scheduler_pb2_grpc.SchedulerStub(ch).Submit(scheduler_pb2.SubmitRequest(request_id="r"))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await anext(aiter(call))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = SecuritySettings(api_key="sk-team-a-0001")
        assert await list_services(server.address, good) == ["chat"]
        async with open_channel(server.address, good) as ch:
            chunks = [
                c
                async for c in scheduler_pb2_grpc.SchedulerStub(ch).Submit(
                    scheduler_pb2.SubmitRequest(request_id="r")
                )
            ]
            assert list(chunks[0].token_ids) == [1, 2]
        assert await health(server.address, SecuritySettings()) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


async def test_the_sdk_explains_a_tls_mismatch(certs):
    from llmfleet.client import AsyncClient, Unavailable

    server = await serve(SecuritySettings(tls_cert=certs["cert"], tls_key=certs["key"]))
    try:
        async with AsyncClient(server.address, timeout_s=5, retries=0) as client:
            client.security = SecuritySettings()  # plaintext, whatever this process's env says
            with pytest.raises(Unavailable, match="if the scheduler serves TLS, pass tls_ca="):
                await client.list_services()
    finally:
        await server.stop(0)
    server = await serve(SecuritySettings())
    try:
        async with AsyncClient(server.address, timeout_s=5, retries=0, tls_ca=certs["ca"]) as client:
            with pytest.raises(Unavailable, match="the scheduler may serve plaintext"):
                await client.list_services()
    finally:
        await server.stop(0)

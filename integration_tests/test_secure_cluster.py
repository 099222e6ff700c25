"""A cluster with TLS on every hop, mutual TLS between services, API keys at the scheduler (gRPC and
HTTPS), and admission control, driven by the SDK and the official ``openai`` client."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import time

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import Cluster, launch
from llmfleet.client import AsyncClient, PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable
from llmfleet.rpc.channels import open_channel
from llmfleet.security import SecuritySettings, configure
from llmfleet.security.certs import write_dev_certs
from llmfleet.supervisor import free_port

TEAM = "sk-team-a-0001"  # chat only
OPS = "sk-ops-0000001"


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> tuple[Cluster, str, dict[str, str]]:
    root = tmp_path_factory.mktemp("secure")
    files = write_dev_certs(root / "tls", ["127.0.0.1", "localhost"])
    tls = {"ca": str(files.ca), "cert": str(files.cert), "key": str(files.key)}
    keys = root / "keys.yaml"
    keys.write_text(
        f"keys:\n  - {{name: team-a, key: {TEAM}, services: [chat]}}\n  - {{name: ops, key: {OPS}}}\n"
    )
    service_tls = SecuritySettings(
        tls_cert=tls["cert"], tls_key=tls["key"], tls_ca=tls["ca"], tls_client_auth=True
    )
    previous = configure(service_tls)  # this process's health checks present the certificate too
    port = free_port()
    try:
        c = launch(
            root,
            engines=1,
            env=service_tls.to_env(),
            scheduler_env={"LLMFLEET_TLS_CLIENT_AUTH": "0"},  # users' entry: TLS + API keys
            scheduler_args=("--api-keys", str(keys), "--http-port", str(port), "--max-waiting", "2"),
        )
        try:
            yield c, f"https://127.0.0.1:{port}", tls
        finally:
            c.stop()
    finally:
        configure(previous)


def sdk(c: Cluster, tls: dict[str, str], key: str | None = OPS, **kw) -> AsyncClient:
    return AsyncClient(c.scheduler, timeout_s=60, api_key=key, tls_ca=tls["ca"], **kw)


async def test_sdk_needs_tls_and_a_key_allowed_the_service(secure):
    c, _, tls = secure
    async with sdk(c, tls) as client:
        done = await client.complete("Hello", service="chat", max_tokens=4, temperature=0)
        assert done.usage.completion_tokens == 4
        assert [s.name for s in await client.list_services()] == ["chat", "summarize", "unplaced"]
    async with sdk(c, tls, TEAM) as client:
        assert [s.name for s in await client.list_services()] == ["chat"]
        with pytest.raises(PermissionDenied, match="team-a"):
            await client.complete("Hello", service="summarize", max_tokens=4)
    async with sdk(c, tls, None) as client:
        with pytest.raises(Unauthenticated, match="missing API key"):
            await client.complete("Hello", service="chat", max_tokens=4)
    async with sdk(c, tls, "sk-wrong-key-1") as client:
        with pytest.raises(Unauthenticated, match="invalid API key"):
            await client.complete("Hello", service="chat", max_tokens=4)
    plaintext = AsyncClient(c.scheduler, timeout_s=10, retries=0, api_key=OPS)
    plaintext.security = SecuritySettings(api_key=OPS)  # this process's settings carry TLS; a bare client
    async with plaintext:
        with pytest.raises(Unavailable, match="if the scheduler serves TLS, pass tls_ca="):
            await plaintext.complete("Hello", service="chat", max_tokens=4)


def test_openai_client_over_https_with_keys(secure):
    _, base, tls = secure
    http = httpx.Client(verify=ssl.create_default_context(cafile=tls["ca"]))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=OPS, max_retries=0, http_client=http)
    got = client.completions.create(model="chat", prompt="Hello", max_tokens=4, temperature=0)
    assert got.usage.completion_tokens == 4
    wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong-key-1", max_retries=0, http_client=http)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model="chat", prompt="Hello", max_tokens=4)
    assert e.value.status_code == 401
    team = openai.OpenAI(base_url=f"{base}/v1", api_key=TEAM, max_retries=0, http_client=http)
    with pytest.raises(openai.PermissionDeniedError):
        team.completions.create(model="summarize", prompt="Hello", max_tokens=4)
    assert http.get(f"{base}/health").status_code == 200  # open, but HTTPS only
    with pytest.raises(httpx.HTTPError):
        httpx.get(base.replace("https", "http") + "/health", timeout=3)


async def test_services_require_client_certificates(secure):
    c, _, tls = secure
    engine = c.addresses["engine-0"]
    no_cert = SecuritySettings(tls_ca=tls["ca"])
    async with open_channel(engine, no_cert) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    with_cert = SecuritySettings(tls_ca=tls["ca"], tls_cert=tls["cert"], tls_key=tls["key"])
    async with open_channel(engine, with_cert) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_overload_is_refused_at_once_and_the_sdk_retries_after_the_pushback(secure):
    c, base, tls = secure
    engine = c.procs["engine-0"].pid
    async with sdk(c, tls) as client, sdk(c, tls, retries=0) as impatient, sdk(c, tls, retries=5) as patient:
        os.kill(engine, signal.SIGSTOP)  # a stalled engine: admitted requests wait for a first token
        try:
            waiting = [
                asyncio.ensure_future(client.complete(f"Wait {i}", service="chat", max_tokens=4))
                for i in range(2)
            ]
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            with pytest.raises(ResourceExhausted, match=r"overloaded.*2 requests waiting, limit 2"):
                await impatient.complete("One too many", service="chat", max_tokens=4)
            assert time.monotonic() - t0 < 2  # refused at once, not queued
            http = httpx.Client(verify=ssl.create_default_context(cafile=tls["ca"]))
            r = http.post(
                f"{base}/v1/completions",
                json={"model": "chat", "prompt": "One too many", "max_tokens": 4},
                headers={"Authorization": f"Bearer {OPS}"},
            )
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
            retried = asyncio.ensure_future(patient.complete("Patient", service="chat", max_tokens=4))
            await asyncio.sleep(0.5)
        finally:
            os.kill(engine, signal.SIGCONT)
        for w in waiting:
            assert (await w).usage.completion_tokens == 4
        done = await retried  # refused first, then admitted after the server's retry pushback
        assert done.usage.completion_tokens == 4

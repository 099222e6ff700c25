"""The OpenAI front in a cluster with TLS on every hop, mutual TLS between services and API keys: it
serves HTTPS to users (no client certificate asked, like the scheduler), reaches the scheduler over
TLS, and a key limited to some services sees and may use only those through it."""

from __future__ import annotations

import ssl
import time

import httpx
import openai
import pytest
from harness import Cluster, launch
from llmfleet.security import SecuritySettings, configure
from llmfleet.security.certs import write_dev_certs
from llmfleet.supervisor import free_port

TEAM = "sk-team-a-0001"  # chat only
OPS = "sk-ops-0000001"


@pytest.fixture(scope="module")
def secure_front(tmp_path_factory) -> tuple[Cluster, str, str]:
    root = tmp_path_factory.mktemp("secure-front")
    files = write_dev_certs(root / "tls", ["127.0.0.1", "localhost"])
    keys = root / "keys.yaml"
    keys.write_text(
        f"keys:\n  - {{name: team-a, key: {TEAM}, services: [chat]}}\n  - {{name: ops, key: {OPS}}}\n"
    )
    service_tls = SecuritySettings(
        tls_cert=str(files.cert), tls_key=str(files.key), tls_ca=str(files.ca), tls_client_auth=True
    )
    previous = configure(service_tls)  # this process's health checks present the certificate too
    users = {"LLMFLEET_TLS_CLIENT_AUTH": "0"}  # the users' entry points: TLS + API keys
    try:
        c = launch(
            root, engines=1, placement_replicas=1, env=service_tls.to_env(), scheduler_env=users,
            scheduler_args=("--api-keys", str(keys)),
        )  # fmt: skip
        try:
            port = free_port()
            c.start("front", "llmfleet-front", "--http-port", str(port), "--api-keys", str(keys), env=users)
            c.wait_healthy(["front"])
            base = f"https://127.0.0.1:{port}"
            wait_http_tls(base, str(files.ca))
            yield c, base, str(files.ca)
        finally:
            c.stop()
    finally:
        configure(previous)


def wait_http_tls(base: str, ca: str) -> None:
    """Until the front answers ``/health`` over HTTPS (it has read the services from etcd)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(
                f"{base}/health", verify=ssl.create_default_context(cafile=ca), timeout=2
            ).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def client(base: str, ca: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base}/v1",
        api_key=key,
        max_retries=0,
        timeout=60,
        http_client=httpx.Client(verify=ssl.create_default_context(cafile=ca)),
    )


def test_https_through_the_front_with_keys(secure_front):
    _, base, ca = secure_front
    ops, team = client(base, ca, OPS), client(base, ca, TEAM)
    r = ops.completions.create(model="summarize", prompt="Hello", max_tokens=3)
    assert r.usage is not None and r.usage.completion_tokens == 3
    assert [m.id for m in team.models.list()] == ["chat", "tiny-llama"]
    with pytest.raises(openai.PermissionDeniedError, match="team-a"):
        team.completions.create(model="summarize", prompt="Hello", max_tokens=3)
    done = team.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert done.usage is not None and done.usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError):
        client(base, ca, "sk-wrong-key-1").models.list()
    with pytest.raises(httpx.HTTPError):  # HTTPS only
        httpx.get(base.replace("https://", "http://") + "/health", timeout=5)

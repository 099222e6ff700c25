"""A request's priority over the OpenAI HTTP API (the official ``openai`` client) and the SDK: a
priority within the API key's max_priority runs; one above it is a 400 naming ``priority`` (gRPC
INVALID_ARGUMENT), as is one that is not an integer; ``/metrics`` counts requests by key and
priority."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest
from harness import Cluster, launch, wait_http
from llmfleet.client import AsyncClient, InvalidArgument
from llmfleet.supervisor import free_port

GOLD = "sk-gold-000001"  # max_priority 2
BASIC = "sk-basic-00001"  # max_priority: the default, 0


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> tuple[Cluster, str]:
    root = tmp_path_factory.mktemp("priority")
    keys = root / "keys.yaml"
    keys.write_text(
        f"keys:\n  - {{name: gold, key: {GOLD}, max_priority: 2}}\n  - {{name: basic, key: {BASIC}}}\n"
    )
    port = free_port()
    c = launch(root, engines=1, scheduler_args=("--api-keys", str(keys), "--http-port", str(port)))
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base)
        yield c, base
    finally:
        c.stop()


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


def test_openai_priority_within_and_above_the_allowance(api):
    _, base = api
    done = client(base, GOLD).completions.create(
        model="chat", prompt="Once upon a time", max_tokens=4, extra_body={"priority": 2}
    )
    assert done.usage.completion_tokens == 4
    chat = client(base, BASIC).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, extra_body={"priority": -1}
    )
    assert chat.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        client(base, BASIC).completions.create(
            model="chat", prompt="Once upon a time", max_tokens=4, extra_body={"priority": 1}
        )
    err = e.value.body
    assert isinstance(err, dict) and err["param"] == "priority"
    assert "above what the API key allows (0)" in err["message"] and "'basic'" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client(base, GOLD).completions.create(
            model="chat", prompt="Once upon a time", max_tokens=4, extra_body={"priority": "high"}
        )
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "priority"


def test_sdk_priority_above_the_allowance_is_invalid_argument(api):
    c, _ = api

    async def go() -> None:
        async with AsyncClient(c.scheduler, timeout_s=60, api_key=BASIC) as sdk:
            done = await sdk.complete("Hello", service="chat", max_tokens=2, priority=0)
            assert done.usage.completion_tokens == 2
            with pytest.raises(InvalidArgument, match="priority: 5 is above what the API key allows"):
                await sdk.complete("Hello", service="chat", max_tokens=2, priority=5)

    asyncio.run(go())


def test_metrics_count_requests_by_key_and_priority(api):
    c, base = api
    client(base, GOLD).completions.create(model="chat", prompt="Hi", max_tokens=2, extra_body={"priority": 1})
    url = re.search(r"metrics on (http://\S+/metrics)", c.log("scheduler"))
    assert url is not None
    text = httpx.get(url.group(1), timeout=5).text
    assert 'llmfleet_scheduler_key_requests_total{key="gold",outcome="admitted",priority="1"}' in text

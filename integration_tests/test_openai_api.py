"""The scheduler's OpenAI-compatible HTTP API, driven by the official ``openai`` package."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from harness import Cluster, launch, wait_http
from llmfleet import __version__
from llmfleet.client import AsyncClient
from llmfleet.supervisor import free_port

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> tuple[Cluster, str]:
    port = free_port()
    c = launch(tmp_path_factory.mktemp("cluster"), scheduler_args=("--http-port", str(port)))
    # give tiny-llama's tokenizer a chat template (the scheduler loads it at the first chat request)
    cfg_path = c.models_dir / "endless-llama" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base)
        yield c, base
    finally:
        c.stop()


def sync_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_version_and_models(api):
    _, base = api
    assert httpx.get(f"{base}/health").status_code == 200
    assert httpx.get(f"{base}/version").json() == {"version": __version__}
    models = sync_client(base).models.list()
    ids = {m.id for m in models.data}
    assert {"chat", "summarize", "unplaced", "tiny-llama", "tiny-qwen2"} <= ids
    assert all(m.owned_by == "llmfleet" for m in models.data)


def test_greedy_completion_equals_sdk(api):
    c, base = api
    prompt = "The fleet of small models"

    async def sdk():
        async with AsyncClient(c.scheduler, timeout_s=60) as client:
            return await client.complete(prompt, service="chat", max_tokens=8, temperature=0)

    want = asyncio.run(sdk())
    client = sync_client(base)
    got = client.completions.create(model="chat", prompt=prompt, max_tokens=8, temperature=0)
    assert got.choices[0].text == want.text
    assert got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 8
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got.usage.total_tokens == got.usage.prompt_tokens + 8

    # streamed, with the usage chunk: the same text
    stream = client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_usage_counts_the_prompt_tokens_found_in_a_prefix_cache(api):
    """``usage.prompt_tokens_details.cached_tokens``, as OpenAI's prompt caching reports it: a prompt
    sent again finds its full blocks cached on the engine that served it (the chat service's engines
    take turns or the least loaded, so one of two repeats lands where the first ran)."""
    c, base = api
    prompt = " ".join(f"cache{i}" for i in range(120))
    client = sync_client(base)
    usages = [
        client.completions.create(model="chat", prompt=prompt, max_tokens=2, temperature=0).usage
        for _ in range(3)
    ]
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert cached[0] == 0, cached
    assert 0 < max(cached[1:]) < usages[0].prompt_tokens, cached

    async def sdk():
        async with AsyncClient(c.scheduler, timeout_s=60) as sdk_client:
            return [
                (await sdk_client.complete(prompt, service="chat", max_tokens=2, temperature=0)).usage
                for _ in range(2)
            ]

    assert max(u.cached_tokens for u in asyncio.run(sdk())) == max(cached[1:])


def test_chat_sync_and_async_streaming(api):
    _, base = api
    messages = [{"role": "user", "content": "Say something"}]
    client = sync_client(base)
    whole = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, temperature=0)
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 6

    async def streamed():
        aclient = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        async with aclient:
            s = await aclient.chat.completions.create(
                model="chat", messages=messages, max_completion_tokens=6, temperature=0, stream=True
            )
            parts = [ch async for ch in s]
            n2 = await aclient.chat.completions.create(
                model="chat", messages=messages, max_tokens=4, temperature=0.8, seed=3, n=2
            )
            return parts, n2

    parts, n2 = asyncio.run(streamed())
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == text
    assert parts[-1].choices[0].finish_reason == "length"
    assert [ch.index for ch in n2.choices] == [0, 1]
    assert n2.usage.completion_tokens == 8


def test_errors(api):
    _, base = api
    client = sync_client(base)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="chat", prompt="x", max_tokens=2, top_p=5)
    assert e.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="chat", messages=[], max_tokens=2)


def test_chat_uses_the_model_tokenizers_template(api):
    _, base = api
    client = sync_client(base)
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Say hi"}]
    chat = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, temperature=0)
    rendered = "<|system|>Be terse.</s><|user|>Say hi</s><|assistant|>"  # CHAT_TEMPLATE by hand
    plain = client.completions.create(model="chat", prompt=rendered, max_tokens=6, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens

"""``FrontBackend`` behind the scheduler's OpenAI app, against in-process fake schedulers (real gRPC,
``llmfleet.client.testing.FakeScheduler``): the caller's key on its own SubmitMany call, the scheduler's
statuses as the in-scheduler API's HTTP errors, a stream resumed on another replica, cancellation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import httpx
import pytest
from fastapi import FastAPI
from llmfleet.client.testing import FakeScheduler, Fault, fake_completion, start_fake_scheduler
from llmfleet.metrics.control import FrontMetrics
from llmfleet.metrics.server import samples
from llmfleet.security import SecuritySettings
from llmfleet.spec.services import ServiceSpec
from llmfleet_front.backend import FrontBackend, as_request_error
from llmfleet_front.http_metrics import OTHER, HttpMetrics
from llmfleet_front.scheduler_links import SchedulerLinks
from llmfleet_scheduler.http_api import Credentials, HttpServer, create_app
from llmfleet_scheduler.http_api.errors import from_exc
from llmfleet_scheduler.journal import RequestFailed
from llmfleet_scheduler.validation import InvalidField
from prometheus_client import CollectorRegistry


@dataclass
class StaticCatalog:
    names: tuple[str, ...] = ("chat", "summarize")

    def ready(self) -> bool:
        return True

    def servable(self) -> tuple[bool, list[str]]:
        return True, []

    def services(self) -> dict[str, ServiceSpec]:
        return {n: ServiceSpec(name=n, model="fake-model") for n in self.names}

    def model_source(self, model: str) -> str | None:
        return None


@dataclass
class KeyedFake(FakeScheduler):
    """A fake that records the ``authorization`` metadata of each SubmitMany call."""

    keys: list[str | None] = field(default_factory=list)

    async def SubmitMany(self, request_iterator, context):  # type: ignore[override]
        self.keys.append(dict(context.invocation_metadata()).get("authorization"))
        async for batch in super().SubmitMany(request_iterator, context):
            yield batch


@pytest.fixture
async def fakes() -> AsyncIterator[list[tuple[KeyedFake, str]]]:
    out, servers = [], []
    for fake in (KeyedFake(), KeyedFake()):
        server = await start_fake_scheduler(fake)
        servers.append(server)
        out.append((fake, server.address))
    yield out
    for server in servers:
        await server.stop(0)


def front_app(
    addresses: list[str], own_key: str | None = None, registry: CollectorRegistry | None = None
) -> tuple[FrontBackend, FastAPI]:
    """The front's backend and app as ``llmfleet_front.main.build_front`` assembles them; its metrics on
    ``registry`` (default: one of its own)."""
    metrics = FrontMetrics(registry or CollectorRegistry())
    links = SchedulerLinks(lambda: addresses, SecuritySettings(), on_call=metrics.call_opened)
    backend = FrontBackend(links, StaticCatalog(), metrics, own_key=own_key, backoff_s=0.01)
    app = create_app(backend)
    app.add_middleware(HttpMetrics, metrics=metrics)
    return backend, app


def front(
    addresses: list[str], own_key: str | None = None, registry: CollectorRegistry | None = None
) -> tuple[FrontBackend, httpx.AsyncClient]:
    backend, app = front_app(addresses, own_key, registry)
    return backend, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front")


async def test_a_completion_goes_on_its_callers_own_submit_many_call(fakes):
    (fake, address), _ = fakes
    backend, http = front([address], own_key="sk-own")
    async with http:
        for key in ("sk-a", "sk-b", "sk-a"):
            r = await http.post("/v1/completions", headers={"authorization": f"Bearer {key}"},
                                json={"model": "chat", "prompt": "one two", "max_tokens": 3})  # fmt: skip
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["text"] == "".join(t for _, t in fake_completion("one two", 3))
            assert body["usage"]["completion_tokens"] == 3
        r = await http.post("/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200
    assert fake.keys == ["Bearer sk-a", "Bearer sk-b", "Bearer sk-own"]  # one call per key, reused
    await backend.links.close()


async def test_streamed_chat_events_end_with_done(fakes):
    (_, address), _ = fakes
    backend, http = front([address])
    async with http:
        r = await http.post("/v1/chat/completions", json={
            "model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        })  # fmt: skip
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()
    await backend.links.close()


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, 401),
        (grpc.StatusCode.PERMISSION_DENIED, 403),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.UNAVAILABLE, 503),
    ],
)
async def test_the_schedulers_status_is_the_same_http_error(fakes, code, status):
    (fake, address), _ = fakes
    fake.fail_services["chat"] = (code, "refused (fake)")
    backend, http = front([address])
    backend.retries = 0
    async with http:
        r = await http.post("/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 1})
    assert r.status_code == status and r.json()["error"]["message"] == "refused (fake)"
    await backend.links.close()


async def test_overload_is_429_with_retry_after_and_is_not_retried(fakes):
    (fake, address), _ = fakes
    fake.overloaded_attempts, fake.pushback_ms = 1, 2000
    backend, http = front([address])
    async with http:
        r = await http.post("/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert len(fake.submits) == 1
    await backend.links.close()


def test_an_invalid_field_is_named_as_the_openai_field():
    e = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(),
        "sampling.top_p: must be in (0, 1], got 1.5",
    )  # fmt: skip
    err = as_request_error(e)
    assert isinstance(err, InvalidField) and err.field == "sampling.top_p"
    api = from_exc(err, "prompt")
    assert (api.status, api.param, api.message) == (400, "top_p", "top_p: must be in (0, 1], got 1.5")
    other = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), "the prompt is too long"
    )
    assert isinstance(as_request_error(other), RequestFailed)


async def test_a_stream_cut_by_a_replica_resumes_on_the_next_with_each_token_once(fakes):
    (first, a), (second, b) = fakes
    first.faults = [Fault(attempt=1, after_chunks=3)]
    registry = CollectorRegistry()
    backend, _http = front([a, b], registry=registry)
    chunks = []
    _rid, follow = backend.submit(_request("one two three", 6), Credentials())
    await follow(chunks.append)
    text = "".join(c.text for c in chunks)
    assert text == "".join(t for _, t in fake_completion("one two three", 6))
    assert [i for c in chunks for i in c.token_ids] == [t for t, _ in fake_completion("one two three", 6)]
    assert chunks[-1].usage.completion_tokens == 6
    assert list(second.submits[0].resume_token_ids) == [t for t, _ in fake_completion("one two three", 3)]
    m = samples(registry)
    assert m["llmfleet_front_resumes_total"] == 1
    assert m['llmfleet_front_upstream_errors_total{code="UNAVAILABLE"}'] == 1
    assert m["llmfleet_front_tokens_streamed_total"] == 6  # the 3 replayed by the next replica once
    assert m["llmfleet_front_submit_many_calls"] == 2  # one on each replica (the fault ends a stream)
    await backend.links.close()
    assert samples(registry)["llmfleet_front_submit_many_calls"] == 0


async def test_cancel_stops_the_request_on_its_replica(fakes):
    (fake, address), _ = fakes
    fake.token_delay_s = 0.05
    backend, _http = front([address])
    rid, follow = backend.submit(_request("a b", 100), Credentials(token="sk-a"))
    task = asyncio.ensure_future(follow(lambda c: None))
    while rid not in fake.in_flight:
        await asyncio.sleep(0.01)
    assert await backend.cancel(rid)  # what the app does when its client leaves
    assert rid in fake.cancelled
    await asyncio.wait_for(task, 5)  # the request ends (cancelled) and so does its stream
    assert not await backend.cancel(rid)  # nothing left to cancel
    await backend.links.close()


def _request(prompt: str, max_tokens: int):
    from llmfleet.client.aio import build_submit_request

    return build_submit_request(prompt, "chat", max_tokens=max_tokens)


# ------------------------------------------------------------------ llmfleet_front_* metrics


async def test_requests_are_counted_by_route_and_status_with_their_time_to_first_byte(fakes):
    (fake, address), _ = fakes
    registry = CollectorRegistry()
    backend, http = front([address], registry=registry)
    n = 3
    async with http:
        for _ in range(n):
            r = await http.post(
                "/v1/completions", json={"model": "chat", "prompt": "one two", "max_tokens": 2}
            )
            assert r.status_code == 200
        assert (await http.post("/v1/completions", json={"model": "nope", "prompt": "x"})).status_code == 404
        fake.fail_services["summarize"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded (fake)")
        r = await http.post("/v1/completions", json={"model": "summarize", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 429
        assert (await http.get("/v2/nothing")).status_code == 404
    m = samples(registry)
    assert m['llmfleet_front_requests_total{route="/v1/completions",status="200"}'] == n
    assert m['llmfleet_front_requests_total{route="/v1/completions",status="404"}'] == 1
    assert m['llmfleet_front_requests_total{route="/v1/completions",status="429"}'] == 1
    assert m[f'llmfleet_front_requests_total{{route="{OTHER}",status="404"}}'] == 1
    assert m['llmfleet_front_ttfb_seconds_count{route="/v1/completions"}'] == n + 2
    assert m["llmfleet_front_tokens_streamed_total"] == 2 * n
    assert m['llmfleet_front_upstream_errors_total{code="RESOURCE_EXHAUSTED"}'] == 1
    assert "llmfleet_front_resumes_total" in m and m["llmfleet_front_resumes_total"] == 0
    await backend.links.close()


async def test_a_stream_is_open_while_it_is_written(fakes):
    (fake, address), _ = fakes
    fake.token_delay_s = 0.05
    registry = CollectorRegistry()
    backend, app = front_app([address], registry=registry)
    server = HttpServer(app, "127.0.0.1", 0)  # a real HTTP server: the stream is read as it is written
    await server.start()
    route = "/v1/chat/completions"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as http:
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                    "stream": True}  # fmt: skip
            async with http.stream("POST", route, json=body) as r:
                lines = r.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                assert samples(registry)[f'llmfleet_front_streams_open{{route="{route}"}}'] == 1
                rest = [line async for line in lines]
            assert "data: [DONE]" in rest
    finally:
        await server.stop()
        await backend.links.close()
    m = samples(registry)
    assert m[f'llmfleet_front_streams_open{{route="{route}"}}'] == 0
    assert m[f'llmfleet_front_requests_total{{route="{route}",status="200"}}'] == 1
    assert m[f'llmfleet_front_ttfb_seconds_count{{route="{route}"}}'] == 1
    assert m["llmfleet_front_tokens_streamed_total"] == 20

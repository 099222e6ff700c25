"""Per-key rate limits in the scheduler's submit path: a noisy key is refused with RESOURCE_EXHAUSTED
(HTTP 429 + Retry-After) and counted, while another key's requests all run; tokens/min counts the
prompt estimate plus max_tokens and gives back what a request did not generate."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import pytest
from fastapi.testclient import TestClient
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.metrics.server import samples
from llmfleet.security import ApiKeyStore, KeyRateLimiter
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet_scheduler.admission import Admission
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.http_api import ServicerBackend, create_app
from llmfleet_scheduler.journal import RequestFailed, RequestRecord
from llmfleet_scheduler.servicer import SchedulerServicer
from prometheus_client import CollectorRegistry

KEYS = """
keys:
  - {name: noisy, key: sk-noisy-0001, limits: {requests_per_s: 8, burst: 4}}
  - {name: quiet, key: sk-quiet-0001, limits: {requests_per_s: 8, burst: 4}}
  - {name: metered, key: sk-metered-01, limits: {tokens_per_min: 100}}
  - {name: ops, key: sk-ops-000001}
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeRelay:
    """Stands in for the Relay: each request gets ``tokens`` tokens and a length finish as soon as the
    event loop runs it (until then it waits, holding its place in admission)."""

    metrics: SchedulerMetrics
    tokens: int = 2

    async def run(self, rec: RequestRecord, _req, _deadline) -> None:
        rid = rec.request_id
        for i in range(self.tokens):
            await rec.append(common_pb2.TokenChunk(request_id=rid, index=i, token_ids=[i], text=f" t{i}"))
        usage = common_pb2.Usage(prompt_tokens=1, completion_tokens=self.tokens)
        await rec.finish(
            common_pb2.TokenChunk(
                request_id=rid, index=self.tokens, finish_reason=common_pb2.FINISH_REASON_LENGTH, usage=usage
            )
        )


@pytest.fixture
def keys(tmp_path) -> ApiKeyStore:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    return ApiKeyStore.load(path)


def scheduler(clock: Clock, max_waiting: int = 1024) -> tuple[SchedulerServicer, CollectorRegistry]:
    registry = CollectorRegistry()
    directory = ClusterDirectory(StaticView({"chat": ServiceSpec("chat", "m")}), StaticView({}))
    servicer = SchedulerServicer(
        directory,
        FakeRelay(SchedulerMetrics(registry)),
        admission=Admission(max_waiting=max_waiting),
        key_limits=KeyRateLimiter(clock),
    )
    return servicer, registry


def submit(prompt: str = "hi", max_tokens: int | None = 4) -> scheduler_pb2.SubmitRequest:
    req = scheduler_pb2.SubmitRequest(service="chat", prompt=prompt)
    if max_tokens is not None:
        req.sampling.max_tokens = max_tokens
    return req


def flood(servicer: SchedulerServicer, key, n: int) -> tuple[list[RequestRecord], list[RequestFailed]]:
    ok, refused = [], []
    for _ in range(n):
        try:
            ok.append(servicer.open_request(submit(), None, key))
        except RequestFailed as e:
            refused.append(e)
    return ok, refused


async def finished(servicer: SchedulerServicer, recs: list[RequestRecord]) -> None:
    for rec in recs:
        chunks = [c async for c in servicer.follow(rec)]
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert rec.driver is not None
        await rec.driver
        await asyncio.sleep(0)  # the driver's done callbacks (the give-back) run after it is done


async def test_a_noisy_key_cannot_starve_another_keys_requests(keys):
    noisy, quiet = keys.authenticate("sk-noisy-0001"), keys.authenticate("sk-quiet-0001")
    # Admission holds 20 waiting requests and the engine drains them between rounds. Without a limit,
    # a key that floods (ops) fills the queue each round and every other key is refused as overloaded.
    clock = Clock()
    servicer, _ = scheduler(clock, max_waiting=20)
    for _ in range(3):
        ok, _ = flood(servicer, keys.authenticate("sk-ops-000001"), 50)
        _, refused = flood(servicer, quiet, 1)
        assert len(ok) == 20 and "overloaded" in refused[0].details
        await finished(servicer, ok)

    servicer, registry = scheduler(clock, max_waiting=20)
    admitted, quiet_ok, noisy_refused = 0, 0, []
    for _ in range(20):  # 5 s: the noisy key offers 40 requests/s, the quiet one 4/s
        noisy_ok, refused = flood(servicer, noisy, 10)
        noisy_refused += refused
        ok, refused = flood(servicer, quiet, 1)
        assert refused == []
        await finished(servicer, noisy_ok + ok)
        admitted += len(noisy_ok)
        quiet_ok += len(ok)
        clock.t += 0.25
    assert quiet_ok == 20
    assert admitted == 4 + 19 * 2  # its burst, then its 8 requests/s
    e = noisy_refused[0]
    assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.retry_after_s == 1
    assert "API key 'noisy' is over its rate limit (8 requests/s, burst 4)" in e.details
    assert e.trailing_metadata() == (("grpc-retry-pushback-ms", "1000"),)
    s = samples(registry)
    assert s['llmfleet_scheduler_rejected_total{reason="rate_limited",service="chat"}'] == 200 - 42
    assert s['llmfleet_scheduler_rate_limited_total{key="noisy",limit="requests"}'] == 200 - 42
    assert not any(k.startswith("llmfleet_scheduler_rate_limited_total") and 'key="quiet"' in k for k in s)
    assert not any('reason="overloaded"' in k for k in s)


async def test_tokens_per_min_counts_the_prompt_as_the_models_engines_count_it(keys):
    metered = keys.authenticate("sk-metered-01")
    servicer, _ = scheduler(Clock())
    servicer.prompt_tokens.observe("m", 100, 400)  # m's engines count 4 tokens per estimated one
    prompt = "abcd " * 10  # 10 estimated, 40 as m's engines count it: + max_tokens 50 = 90 of 100
    servicer.open_request(submit(prompt, 50), None, metered)
    with pytest.raises(RequestFailed, match="this request counts 90"):
        servicer.open_request(submit(prompt, 50), None, metered)
    await servicer.close()


async def test_tokens_per_min_counts_prompt_and_max_tokens_and_gives_back_the_unused_part(keys):
    metered = keys.authenticate("sk-metered-01")
    clock = Clock()
    servicer, registry = scheduler(clock)
    # "abcdefgh": 2 tokens at 4 bytes a token, + max_tokens 40 = 42; the budget is 100 a minute
    a = servicer.open_request(submit("abcdefgh", 40), None, metered)
    b = servicer.open_request(submit("abcdefgh", 40), None, metered)
    with pytest.raises(RequestFailed) as e:
        servicer.open_request(submit("abcdefgh", 40), None, metered)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "100 tokens/min; this request counts 42" in e.value.details
    assert e.value.retry_after_s == 16  # 26 tokens more at 100/60 a second: 15.6 s
    await finished(servicer, [a, b])  # each generated 2 of its 40: 38 back each, 92 left
    c = servicer.open_request(submit("abcdefgh", 40), None, metered)
    await finished(servicer, [c])  # 2 + 2 counted: 88 left
    unknown = submit("abcdefgh", 40)
    unknown.service = "nope"
    with pytest.raises(RequestFailed) as e:  # refused after the limiter: its 40 back at once, 86 left
        servicer.open_request(unknown, None, metered)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    again = submit("abcdefgh", 40)
    again.request_id = c.request_id
    assert servicer.open_request(again, None, metered).request_id == c.request_id  # attached: 84 left
    servicer.open_request(submit("abcdefgh", None), None, metered)  # the service's default 64: 66
    with pytest.raises(RequestFailed, match="this request counts 66") as e:
        servicer.open_request(submit("abcdefgh", None), None, metered)
    assert e.value.retry_after_s == 29  # 18 left: 48 more at 100/60 a second, 28.8 s
    assert samples(registry)['llmfleet_scheduler_rate_limited_total{key="metered",limit="tokens"}'] == 2
    await servicer.close()


def test_http_429_carries_retry_after_and_other_keys_still_get_200(keys):
    clock = Clock()
    servicer, registry = scheduler(clock)
    app = create_app(ServicerBackend(servicer), version="1", key_store=keys)
    noisy = {"Authorization": "Bearer sk-noisy-0001"}
    quiet = {"Authorization": "Bearer sk-quiet-0001"}
    body = {"model": "chat", "prompt": "hi", "max_tokens": 2}
    with TestClient(app) as c:
        codes = [c.post("/v1/completions", json=body, headers=noisy).status_code for _ in range(8)]
        assert codes == [200] * 4 + [429] * 4
        r = c.post("/v1/completions", json={**body, "stream": True}, headers=noisy)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and "'noisy'" in err["message"]
        for _ in range(4):
            r = c.post("/v1/completions", json=body, headers=quiet)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == " t0 t1"
        clock.t += 0.125  # one request's worth
        assert c.post("/v1/completions", json=body, headers=noisy).status_code == 200
    assert samples(registry)['llmfleet_scheduler_rate_limited_total{key="noisy",limit="requests"}'] == 5

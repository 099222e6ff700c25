"""A request's priority in the scheduler's submit path: its own, bounded by its API key's
max_priority (a key may always ask for its service's own), or its service's; anything else is
INVALID_ARGUMENT naming ``priority`` (HTTP 400, param ``priority``); admitted requests are counted by
key and priority."""

from __future__ import annotations

import grpc
import pytest
from fastapi.testclient import TestClient
from llmfleet.api.v1 import common_pb2, scheduler_pb2
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.metrics.server import samples
from llmfleet.rpc.mux import StreamRefused
from llmfleet.security import ApiKeyStore
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.http_api import ServicerBackend, create_app
from llmfleet_scheduler.servicer import SchedulerServicer
from llmfleet_scheduler.validation import InvalidField
from prometheus_client import CollectorRegistry


class FakeRelay:
    """Stands in for the Relay: every request ends at once with one token."""

    def __init__(self, metrics: SchedulerMetrics) -> None:
        self.metrics = metrics

    async def run(self, rec, _req, _deadline) -> None:
        await rec.append(common_pb2.TokenChunk(request_id=rec.request_id, index=0, token_ids=[0], text=" t"))
        await rec.finish(rec.final_chunk(common_pb2.FINISH_REASON_LENGTH))


KEYS = """
keys:
  - {name: gold, key: sk-gold-00001, max_priority: 3}
  - {name: basic, key: sk-basic-0001}
"""


@pytest.fixture
def keys(tmp_path) -> ApiKeyStore:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    return ApiKeyStore.load(path)


def scheduler() -> tuple[SchedulerServicer, CollectorRegistry]:
    registry = CollectorRegistry()
    services = {"chat": ServiceSpec("chat", "m"), "vip": ServiceSpec("vip", "m", priority=2)}
    servicer = SchedulerServicer(
        ClusterDirectory(StaticView(services), StaticView({})), FakeRelay(SchedulerMetrics(registry))
    )
    return servicer, registry


def submit(service: str = "chat", priority: int | None = None) -> scheduler_pb2.SubmitRequest:
    return scheduler_pb2.SubmitRequest(service=service, prompt="hi", priority=priority)


async def test_priorities_within_the_keys_allowance_run(keys):
    servicer, registry = scheduler()
    gold, basic = keys.authenticate("sk-gold-00001"), keys.authenticate("sk-basic-0001")
    servicer.open_request(submit(priority=3), None, gold)
    servicer.open_request(submit(priority=-4), None, basic)  # sheddable: always allowed
    servicer.open_request(submit("vip", priority=2), None, basic)  # its service's own
    servicer.open_request(submit("vip"), None, basic)  # the service's: 2
    servicer.open_request(submit(priority=10), None, None)  # keys off: the range only
    s = samples(registry)
    assert s['llmfleet_scheduler_key_requests_total{key="gold",outcome="admitted",priority="3"}'] == 1
    assert s['llmfleet_scheduler_key_requests_total{key="basic",outcome="admitted",priority="-4"}'] == 1
    assert s['llmfleet_scheduler_key_requests_total{key="basic",outcome="admitted",priority="2"}'] == 2
    assert s['llmfleet_scheduler_key_requests_total{key="",outcome="admitted",priority="10"}'] == 1
    await servicer.close()


@pytest.mark.parametrize(
    ("service", "priority", "key", "message"),
    [
        ("chat", 4, "sk-gold-00001", "priority: 4 is above what the API key allows (3) (API key 'gold')"),
        ("chat", 1, "sk-basic-0001", "priority: 1 is above what the API key allows (0) (API key 'basic')"),
        ("vip", 3, "sk-basic-0001", "above what the API key allows (2)"),
        ("chat", 11, None, "priority: must be an integer in [-10, 10], got 11"),
        ("chat", -11, "sk-gold-00001", "must be an integer in [-10, 10]"),
    ],
)
async def test_a_priority_out_of_range_or_above_the_allowance_is_invalid(
    keys, service, priority, key, message
):
    servicer, _ = scheduler()
    with pytest.raises(InvalidField) as e:
        servicer.open_request(submit(service, priority), None, keys.authenticate(key) if key else None)
    assert e.value.field == "priority" and message in str(e.value)
    with pytest.raises(StreamRefused) as refused:  # the SDK's SubmitMany path
        await servicer.submit_into(
            submit(service, priority), None, keys.authenticate(key) if key else None, print
        )
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("priority", ["high", 1.5, True, [1]])
def test_http_a_priority_that_is_not_an_integer_is_a_400_naming_it(keys, priority):
    servicer, _ = scheduler()
    app = create_app(ServicerBackend(servicer), version="1", key_store=keys)
    body = {"model": "chat", "prompt": "hi", "max_tokens": 2, "priority": priority}
    with TestClient(app) as c:
        r = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-gold-00001"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "priority" and err["type"] == "invalid_request_error"

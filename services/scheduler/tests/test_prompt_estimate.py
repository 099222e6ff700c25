"""The scheduler estimates a prompt's tokens once per request: admission counts that estimate plus the
output cap, and the record carries it to dispatch (the relay reads it instead of counting again)."""

from __future__ import annotations

from llmfleet.api.v1 import engine_pb2, scheduler_pb2
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet.token_estimate import approx_token_count
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.servicer import SchedulerServicer
from prometheus_client import CollectorRegistry


class HeldRelay:
    """Keeps what it was asked to run and never finishes it (the request stays admitted)."""

    metrics = SchedulerMetrics(CollectorRegistry())

    def __init__(self) -> None:
        self.runs: list[tuple[RequestRecord, engine_pb2.GenerateRequest]] = []

    async def run(self, rec: RequestRecord, req: engine_pb2.GenerateRequest, _deadline: float | None) -> None:
        self.runs.append((rec, req))


async def test_the_prompt_is_estimated_once_and_carried_to_dispatch() -> None:
    relay = HeldRelay()
    directory = ClusterDirectory(StaticView({"chat": ServiceSpec("chat", "m")}), StaticView({}))
    servicer = SchedulerServicer(directory, relay)
    prompt = "Summarize the 2024 report, section 12: internationalization costs. " * 30
    req = scheduler_pb2.SubmitRequest(service="chat", prompt=prompt, request_id="r1")
    req.sampling.max_tokens = 16
    rec = servicer.open_request(req, None, None)
    assert rec.prompt_estimate == approx_token_count(prompt) > 300
    assert servicer.admission.waiting("chat") == (1, rec.prompt_estimate + 16)
    assert rec.driver is not None
    await rec.driver
    ((ran, _),) = relay.runs
    assert ran is rec

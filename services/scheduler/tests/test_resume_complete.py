"""A resume that already holds every token of its request (the final chunk was lost when a scheduler
replica died) ends at once with its final chunk, instead of being refused: the SDK's failover then
completes the stream. One token more than the request allows is still a bad request."""

from __future__ import annotations

import pytest
from llmfleet.api.v1 import common_pb2, engine_pb2, scheduler_pb2
from llmfleet.metrics.control import SchedulerMetrics
from llmfleet.spec.services import ServiceSpec
from llmfleet.testing import StaticView
from llmfleet_scheduler.directory import ClusterDirectory
from llmfleet_scheduler.journal import RequestRecord
from llmfleet_scheduler.servicer import SchedulerServicer
from llmfleet_scheduler.validation import InvalidField
from prometheus_client import CollectorRegistry


class NoRelay:
    """Nothing may be dispatched: a request run here fails the test."""

    metrics = SchedulerMetrics(CollectorRegistry())

    async def run(
        self, rec: RequestRecord, _req: engine_pb2.GenerateRequest, _deadline: float | None
    ) -> None:
        raise AssertionError(f"{rec.request_id} was dispatched")


def scheduler() -> SchedulerServicer:
    directory = ClusterDirectory(StaticView({"chat": ServiceSpec("chat", "m")}), StaticView({}))
    return SchedulerServicer(directory, NoRelay())


def resume(n_tokens: int, max_tokens: int = 4) -> scheduler_pb2.SubmitRequest:
    req = scheduler_pb2.SubmitRequest(service="chat", prompt="tell me a story", request_id="r1")
    req.sampling.max_tokens = max_tokens
    req.resume_token_ids.extend(range(n_tokens))
    return req


async def test_a_resume_holding_every_token_gets_its_final_chunk() -> None:
    servicer = scheduler()
    rec = servicer.open_request(resume(4), None, None)
    chunks = [c async for c in servicer.follow(rec)]
    assert len(chunks) == 1  # the tokens are the client's already: only the end is sent
    (end,) = chunks
    assert end.finish_reason == common_pb2.FINISH_REASON_LENGTH and end.index == 4
    assert end.usage.completion_tokens == 4 and end.usage.prompt_tokens > 0  # the prompt's estimate
    assert not servicer.admission.waiting("chat")[0]  # nothing queued, nothing dispatched


async def test_more_tokens_than_the_request_allows_is_refused() -> None:
    servicer = scheduler()
    with pytest.raises(InvalidField) as e:  # INVALID_ARGUMENT on gRPC, 400 on HTTP
        servicer.open_request(resume(5), None, None)
    assert e.value.field == "resume_token_ids" and "has 5 tokens; the request ends at 4" in str(e.value)

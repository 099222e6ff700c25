"""Queued prompts count as promised KV: the worst fit of Mell's baselines (active engines only) and
the load report's ``kv_waiting_bytes``."""

from __future__ import annotations

from llmfleet.api.v1 import common_pb2
from llmfleet.load.monitor import report_from_proto
from llmfleet.policies.dispatch import DispatchRequest, EngineCandidate, WorstFitKv, WorstFitKvOptions

REQ = DispatchRequest("r", "m", prompt_tokens=100, kv_bytes_per_token=10)  # needs 1,000 bytes now


def cand(eid: str, used: int, waiting: int = 0, cap: int = 10_000) -> EngineCandidate:
    return EngineCandidate(eid, ("m",), kv_used_bytes=used, kv_capacity_bytes=cap, kv_waiting_bytes=waiting)


def test_worst_fit_spreads_over_every_engine_by_default() -> None:
    assert WorstFitKv().choose("m", [cand("a", 5000), cand("b", 0)], request=REQ) == "b"


def test_active_only_worst_fit_opens_an_engine_only_when_no_active_one_fits() -> None:
    wf = WorstFitKv(WorstFitKvOptions(active_only=True))
    assert wf.choose("m", [cand("a", 5000), cand("b", 2000), cand("c", 0)], request=REQ) == "b"
    # b's queue promises 7,500 more bytes: a has the larger real hole
    assert wf.choose("m", [cand("a", 5000), cand("b", 2000, 7500), cand("c", 0)], request=REQ) == "a"
    assert wf.choose("m", [cand("a", 9500), cand("c", 0), cand("d", 0)], request=REQ) == "c"  # none fits


def test_load_report_counts_queued_prompts_at_the_models_bytes_per_token() -> None:
    snap = common_pb2.LoadSnapshot(kv_used_bytes=4000, kv_capacity_bytes=10_000)
    snap.models.add(model="m", kv_used_bytes=4000, kv_tokens=400)
    snap.requests.add(request_id="x", model="m", tokens=400, kv_bytes=4000, phase="decode")
    snap.requests.add(request_id="y", model="m", tokens=50, phase="waiting")
    snap.requests.add(request_id="z", model="other", tokens=50, phase="waiting")  # no rate known: 0
    assert report_from_proto(snap).kv_waiting_bytes == 500

"""WorkloadRequest validation and the Workload helpers (order, window, head, JSONL, summary)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from llmfleet.workload import Workload, WorkloadRequest


def req(
    rid: str, t: float, p: int = 10, o: int = 5, service: str = "default", model: str = ""
) -> WorkloadRequest:
    return WorkloadRequest(rid, t, p, o, service, model)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"prompt_tokens": -1}, ValueError, "prompt_tokens must be >= 0"),
        ({"output_tokens": 0}, ValueError, "output_tokens must be >= 1"),
        ({"arrival_s": math.nan}, ValueError, "finite"),
        ({"arrival_s": math.inf}, ValueError, "finite"),
        ({"arrival_s": -0.1}, ValueError, ">= 0"),
        ({"prompt_tokens": 3.0}, TypeError, "must be an int"),
        ({"output_tokens": True}, TypeError, "bool"),
        ({"request_id": ""}, ValueError, "request_id"),
        ({"arrival_s": "1.0"}, TypeError, "arrival_s must be a number"),
    ],
)
def test_request_validation(kwargs, error, match):
    fields = {"request_id": "r", "arrival_s": 0.0, "prompt_tokens": 1, "output_tokens": 1} | kwargs
    with pytest.raises(error, match=match):
        WorkloadRequest(**fields)


def test_request_coerces_numpy_scalars():
    r = WorkloadRequest("r", np.float32(1.5), np.int64(7), np.int32(3))
    assert (type(r.arrival_s), type(r.prompt_tokens), type(r.output_tokens)) == (float, int, int)
    assert (r.arrival_s, r.prompt_tokens, r.output_tokens) == (1.5, 7, 3)
    assert (r.service, r.model) == ("default", "")


def test_workload_sorts_by_arrival_then_id_numerically():
    w = Workload((req("r10", 1.0), req("r9", 1.0), req("a", 0.5), req("r2", 2.0)))
    assert [r.request_id for r in w] == ["a", "r9", "r10", "r2"]
    assert w == Workload(tuple(reversed(w.requests)))


def test_workload_rejects_duplicate_ids_and_non_requests():
    with pytest.raises(ValueError, match=r"duplicate request_id.*'x'"):
        Workload((req("x", 0.0), req("x", 1.0)))
    with pytest.raises(TypeError, match="WorkloadRequest"):
        # a wrong type on purpose: the check under test
        Workload(({"request_id": "x"},))  # type: ignore[arg-type]


def test_duration_and_rate():
    w = Workload(tuple(req(f"r{i}", t) for i, t in enumerate([0.5, 1.0, 2.0, 4.0])))
    assert w.duration_s == 4.0
    assert w.rate_rps == 1.0
    assert Workload().duration_s == 0.0 and Workload().rate_rps == 0.0
    assert Workload((req("a", 0.0),)).rate_rps == 0.0


def test_window_rebases_and_is_half_open():
    w = Workload(tuple(req(f"r{i}", t) for i, t in enumerate([0.0, 1.0, 1.5, 3.0, 3.5])))
    win = w.window(1.0, 3.0)
    assert [(r.request_id, r.arrival_s) for r in win] == [("r1", 0.0), ("r2", 0.5)]
    assert len(w.window(0.0, 100.0)) == 5
    for bad in [(2.0, 1.0), (1.0, 1.0), (-1.0, 2.0), (0.0, math.inf)]:
        with pytest.raises(ValueError, match="start_s < end_s"):
            w.window(*bad)


def test_head_and_services():
    w = Workload((req("a0", 0.0, service="a"), req("b0", 1.0, service="b"), req("a1", 2.0, service="a")))
    assert [r.request_id for r in w.head(2)] == ["a0", "b0"]
    assert len(w.head(0)) == 0 and len(w.head(10)) == 3
    with pytest.raises(ValueError):
        w.head(-1)
    assert w.services() == ("a", "b")
    groups = w.by_service()
    assert list(groups) == ["a", "b"]
    assert [r.arrival_s for r in groups["a"]] == [0.0, 2.0]  # same timeline, not re-based
    assert w.lengths() == [(10, 5)] * 3


def test_jsonl_round_trip(tmp_path):
    w = Workload(
        (
            req("x-1", 0.1 + 0.2, 123, 45, "svc0", "llama-7b"),
            req("x-2", 1 / 3, 0, 1, "svc1", ""),
            req("x-3", 12345.678901234567, 4096, 2048),
        )
    )
    path = tmp_path / "w.jsonl"
    w.to_jsonl(path)
    assert len(path.read_text().splitlines()) == 3
    back = Workload.from_jsonl(path)
    assert back == w
    assert back.requests[0].arrival_s == 0.1 + 0.2  # floats survive exactly


def test_from_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = '{"request_id": "a", "arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}'
    path.write_text(
        good + "\n\n" + good.replace('"a"', '"b"').replace('"output_tokens": 1', '"output_tokens": 0') + "\n"
    )
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: .*output_tokens must be >= 1"):
        Workload.from_jsonl(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r":1: .*JSON object"):
        Workload.from_jsonl(path)
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        Workload.from_jsonl(tmp_path / "nope.jsonl")


def test_summary_hand_checked():
    # service a: prompts 1..100 at t = 1..100; service b: two requests.
    reqs = [req(f"a{i}", float(i), i, 2 * i, "a") for i in range(1, 101)]
    reqs += [req("b0", 10.0, 7, 3, "b"), req("b1", 20.0, 9, 5, "b")]
    s = Workload(tuple(reqs)).summary()
    assert s["count"] == 102 and s["duration_s"] == 100.0 and s["rate_rps"] == pytest.approx(1.02)
    a = s["services"]["a"]
    assert a["count"] == 100 and a["rate_rps"] == pytest.approx(1.0)
    assert a["prompt_tokens"] == pytest.approx({"mean": 50.5, "p50": 50.5, "p99": 99.01})
    assert a["output_tokens"] == pytest.approx({"mean": 101.0, "p50": 101.0, "p99": 198.02})
    b = s["services"]["b"]
    assert b["prompt_tokens"]["mean"] == 8.0 and b["output_tokens"]["p50"] == 4.0
    assert s["all"]["count"] == 102
    assert Workload().summary()["services"] == {}

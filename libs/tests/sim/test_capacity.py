"""Capacity by replay: the gallop-and-bisect search and the fewest workers meeting an SLO target."""

from __future__ import annotations

import pytest
from llmfleet.sim.capacity import attainment_with, fewest_passing, workers_needed
from llmfleet.sim.run import PolicyBundle
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload, WorkloadRequest


@pytest.mark.parametrize("guess", [1, 3, 7, 8, 40])
def test_fewest_passing_finds_the_threshold_from_any_guess(guess):
    calls: list[int] = []

    def ok(n: int) -> bool:
        calls.append(n)
        return n >= 7

    assert fewest_passing(ok, guess, 64) == 7
    assert len(calls) <= 2 * 7  # logarithmic, not a scan
    assert fewest_passing(ok, guess, 5) is None
    assert fewest_passing(lambda n: True, guess, 64) == 1


def test_workers_needed_is_the_smallest_count_meeting_the_target():
    svc = SimService("chat", "llama2-7b", Slo(ttft_s=0.4, tpot_s=0.015))
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), (svc,))
    wl = Workload(tuple(WorkloadRequest(f"r{i}", 0.02 * i, 800, 64, "chat", "llama2-7b") for i in range(200)))
    bundle = PolicyBundle("jsq", dispatch="jsq", engine="fcfs")
    pt = workers_needed(spec, wl, bundle, model="llama2-7b", tp=1, target=0.99, max_workers=32)
    assert pt.workers >= 2 and pt.gpus == pt.workers and pt.attainment >= 0.99
    below = attainment_with(spec, wl, bundle, "llama2-7b", 1, pt.workers - 1, "aladdin")
    assert below < 0.99
    with pytest.raises(ValueError, match="target"):
        workers_needed(spec, wl, bundle, model="llama2-7b", tp=1, target=1.5)


def test_a_count_below_the_target_stops_early_and_the_answer_is_the_whole_replays():
    """A count that misses stops at the miss that decides it; the answer, and its attainment, are the
    ones whole replays give."""
    svc = SimService("chat", "llama2-7b", Slo(ttft_s=0.4, tpot_s=0.015))
    spec = SimSpec(ClusterSpec.parse("1xA100-80GB"), (svc,))
    wl = Workload(tuple(WorkloadRequest(f"r{i}", 0.02 * i, 800, 64, "chat", "llama2-7b") for i in range(200)))
    bundle = PolicyBundle("jsq", dispatch="jsq", engine="fcfs")
    for target in (1.0, 0.95):
        pt = workers_needed(spec, wl, bundle, model="llama2-7b", tp=1, target=target, max_workers=32)
        n = pt.workers
        whole = [attainment_with(spec, wl, bundle, "llama2-7b", 1, k, "aladdin") for k in (n - 1, n)]
        assert whole[0] < target <= whole[1] == pt.attainment
        assert attainment_with(spec, wl, bundle, "llama2-7b", 1, n - 1, "aladdin", stop_below=target) is None
        assert attainment_with(spec, wl, bundle, "llama2-7b", 1, n, "aladdin", stop_below=target) == whole[1]
    # no service sets a deadline: nothing to stop on, and the report has no such attainment
    with pytest.raises(ValueError, match="uellm"):
        attainment_with(spec, wl, bundle, "llama2-7b", 1, 1, "uellm", stop_below=0.5)
    # even the cap misses: the answer says so with the cap's whole attainment
    capped = workers_needed(spec, wl, bundle, model="llama2-7b", tp=1, target=1.0, max_workers=1)
    assert capped.workers == 0
    assert capped.attainment == attainment_with(spec, wl, bundle, "llama2-7b", 1, 1, "aladdin")

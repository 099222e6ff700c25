import random

import pytest
from llmfleet.policies.dispatch import (
    POLICIES,
    BestFitKv,
    DispatchRequest,
    EngineCandidate,
    JoinShortestQueue,
    LeastLoaded,
    NoCandidate,
    PowerOfTwo,
    PowerOfTwoOptions,
    WorstFitKv,
    make_dispatch_policy,
)


def eng(eid, running=0, waiting=0, used=0, cap=0, models=("m",)):
    return EngineCandidate(eid, models, running, waiting, used, cap)


def req(prompt=0, predicted=0.0, bpt=1):
    return DispatchRequest(
        "r", "m", prompt_tokens=prompt, predicted_output_tokens=predicted, kv_bytes_per_token=bpt
    )


# --------------------------------------------------------------------------------------------- jsq


def test_jsq_counts_running_plus_waiting_ties_by_id():
    cands = [eng("e2", 1, 1), eng("e0", 1, 5), eng("e1", 2, 0), eng("x", models=("other",))]
    assert JoinShortestQueue().choose("m", cands) == "e1"  # e1 and e2 queue 2: smaller id wins
    assert JoinShortestQueue().choose("m", cands, frozenset({"e1"})) == "e2"
    assert JoinShortestQueue().choose("m", [eng("a", 0, 3), eng("b", 3, 1)]) == "a"  # not running alone


# ------------------------------------------------------------------------------------ power of two


class FixedPair:
    """An rng stub whose sample() always returns the same two engines (by id), in the given order."""

    def __init__(self, first, second):
        self.ids = (first, second)

    def sample(self, pool, k):
        assert k == 2
        by_id = {c.engine_id: c for c in pool}
        return [by_id[i] for i in self.ids]


def test_power_of_two_picks_the_shorter_of_its_two_samples():
    cands = [eng("e0", 9), eng("e1", 1), eng("e2", 4), eng("e3", 4)]
    assert PowerOfTwo(rng=FixedPair("e0", "e2")).choose("m", cands) == "e2"  # e1 is shorter but unsampled
    assert PowerOfTwo(rng=FixedPair("e2", "e0")).choose("m", cands) == "e2"  # sample order does not matter
    assert PowerOfTwo(rng=FixedPair("e3", "e2")).choose("m", cands) == "e2"  # equal queues: smaller id


def test_power_of_two_is_seeded_and_never_picks_the_longest():
    cands = [eng(f"e{i}", waiting=q) for i, q in enumerate([5, 1, 3, 7, 2])]
    p, q = PowerOfTwo(PowerOfTwoOptions(seed=7)), PowerOfTwo(PowerOfTwoOptions(seed=7))
    a = [p.choose("m", cands) for _ in range(300)]
    assert a == [q.choose("m", cands) for _ in range(300)]  # same seed, same choices
    r = PowerOfTwo(PowerOfTwoOptions(seed=8))
    assert a != [r.choose("m", cands) for _ in range(300)]
    assert "e3" not in a  # the longest queue always loses its pair
    assert set(a) == {"e0", "e1", "e2", "e4"}  # everything else wins some pair
    # with 5 engines the shortest (e1) is in 4 of the 10 pairs: about 40 % of the picks
    assert 0.3 < a.count("e1") / len(a) < 0.5


def test_power_of_two_matches_the_documented_draws():
    cands = [eng(f"e{i}", waiting=q) for i, q in enumerate([5, 1, 3, 7, 2])]
    rng = random.Random(3)
    want = []
    for _ in range(50):
        x, y = rng.sample(sorted(cands, key=lambda c: c.engine_id), 2)
        want.append(min((x, y), key=lambda c: (c.queued, c.engine_id)).engine_id)
    p = PowerOfTwo(PowerOfTwoOptions(seed=3))
    assert [p.choose("m", cands) for _ in range(50)] == want


def test_power_of_two_single_engine_draws_nothing():
    cands = [eng("e0", 3), eng("e1", 1), eng("e2", 2)]
    p, fresh = PowerOfTwo(PowerOfTwoOptions(seed=1)), PowerOfTwo(PowerOfTwoOptions(seed=1))
    assert p.choose("m", cands, frozenset({"e0", "e1"})) == "e2"
    assert [p.choose("m", cands) for _ in range(20)] == [fresh.choose("m", cands) for _ in range(20)]


def test_power_of_two_rejects_bad_seed():
    with pytest.raises(ValueError, match="seed"):
        PowerOfTwo(PowerOfTwoOptions(seed=1.5))


# ------------------------------------------------------------------------------------ least loaded


def test_least_loaded_by_kv_utilization_then_queue_then_id():
    cands = [eng("e0", 1, 0, 50, 100), eng("e1", 0, 0, 30, 60), eng("e2", 0, 0, 90, 100)]
    assert LeastLoaded().choose("m", cands) == "e1"  # 0.5 == 0.5: fewer queued wins
    cands[1] = eng("e1", 1, 0, 30, 60)
    assert LeastLoaded().choose("m", cands) == "e0"  # same utilization, same queue: smaller id
    cands.append(eng("e3", 8, 8, 10, 100))
    assert LeastLoaded().choose("m", cands) == "e3"  # utilization, not queue length, decides


def test_least_loaded_unknown_capacity_falls_back_to_queue_length():
    cands = [eng("e0", 4, 0, 10, 100), eng("e1", 2, 1, 0, 0), eng("e2", 2, 2, 99, 100)]
    assert LeastLoaded().choose("m", cands) == "e1"
    assert LeastLoaded().choose("m", cands, frozenset({"e1"})) == "e0"  # all known again: 0.1 < 0.99


# ------------------------------------------------------------------------------- best / worst fit


FREE = [eng("e0", used=900, cap=1000), eng("e1", used=700, cap=1000), eng("e2", used=500, cap=1000)]
# free KV: e0 100, e1 300, e2 500


def test_kv_need_bytes():
    assert req(prompt=10, predicted=15.5, bpt=10).kv_need_bytes == 255


@pytest.mark.parametrize(
    ("need", "best", "worst"),
    [
        (0, "e0", "e2"),
        (100, "e0", "e2"),
        (101, "e1", "e2"),
        (250, "e1", "e2"),
        (500, "e2", "e2"),
        (600, "e2", "e2"),
    ],
)
def test_best_and_worst_fit_on_three_engines(need, best, worst):
    r = req(prompt=need)
    assert BestFitKv().choose("m", FREE, request=r) == best
    assert WorstFitKv().choose("m", FREE, request=r) == worst


def test_best_fit_without_request_and_ties():
    assert BestFitKv().choose("m", FREE) == "e0"  # need 0: the tightest engine
    tied = [*FREE, eng("d0", used=700, cap=1000)]
    assert BestFitKv().choose("m", tied, request=req(250)) == "d0"  # 300 free on d0 and e1
    assert WorstFitKv().choose("m", [*tied, eng("c9", used=0, cap=500)]) == "c9"  # 500 free ties e2
    none_fits = [eng("e0", used=900, cap=1000), eng("e1", used=600, cap=1000), eng("e2", used=200, cap=600)]
    assert BestFitKv().choose("m", none_fits, request=req(1000)) == "e1"  # 400 = 400: smaller id


def test_fit_policies_treat_unknown_capacity_as_full():
    cands = [eng("a", cap=0), *FREE]
    assert BestFitKv().choose("m", cands) == "e0"  # "a" has 0 free but no known capacity: not a fit
    assert WorstFitKv().choose("m", cands) == "e2"
    assert BestFitKv().choose("m", [eng("a"), eng("b")], request=req(5)) == "a"


# ------------------------------------------------------------------------------------------ common


NEEDS_OPTIONS = {"aladdin_bestfit"}  # built from latency models and SLOs (tested in test_aladdin.py)


@pytest.mark.parametrize("name", sorted(set(POLICIES) - NEEDS_OPTIONS))
def test_every_policy_raises_no_candidate_and_respects_model(name):
    p = make_dispatch_policy(name)
    assert p.name == name
    cands = [eng("e0", models=("other",)), eng("e1", 5, 5, 90, 100)]
    assert p.choose("m", cands, request=req(1)) == "e1"
    with pytest.raises(NoCandidate, match="no engine hosts it"):
        p.choose("nope", cands)
    with pytest.raises(NoCandidate, match="all hosts excluded"):
        p.choose("m", cands, frozenset({"e1"}))


def test_registry_options_and_errors():
    assert {"jsq", "power_of_two", "least_loaded", "best_fit_kv", "worst_fit_kv", "round_robin"} <= set(
        POLICIES
    )
    p = make_dispatch_policy("power_of_two", seed=5)
    assert isinstance(p, PowerOfTwo) and p.seed == 5
    with pytest.raises(ValueError, match=r"unknown dispatch policy 'x'.*best_fit_kv.*worst_fit_kv"):
        make_dispatch_policy("x")
    with pytest.raises(ValueError, match="bad options for dispatch policy 'jsq'"):
        make_dispatch_policy("jsq", seed=1)
    with pytest.raises(ValueError, match=r"bad options for dispatch policy 'power_of_two'.*seed"):
        make_dispatch_policy("power_of_two", seed="abc")

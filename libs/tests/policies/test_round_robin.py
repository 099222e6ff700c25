import pytest
from llmfleet.policies.dispatch import EngineCandidate, NoCandidate, RoundRobin, make_dispatch_policy

E = [
    EngineCandidate("e0", ("llama", "qwen")),
    EngineCandidate("e1", ("llama",)),
    EngineCandidate("e2", ("qwen",)),
]


def test_cycles_per_model_over_hosts_only():
    rr = RoundRobin()
    assert [rr.choose("llama", E) for _ in range(4)] == ["e0", "e1", "e0", "e1"]
    assert [rr.choose("qwen", E) for _ in range(3)] == ["e0", "e2", "e0"]


def test_exclusion_and_membership_change():
    rr = RoundRobin()
    assert rr.choose("llama", E, frozenset({"e0"})) == "e1"
    assert rr.choose("llama", E[1:]) == "e1"  # e0 left the cluster


def test_no_candidate_messages():
    rr = RoundRobin()
    with pytest.raises(NoCandidate, match="no engine hosts it"):
        rr.choose("mistral", E)
    with pytest.raises(NoCandidate, match="all hosts excluded"):
        rr.choose("qwen", E, frozenset({"e0", "e2"}))


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="round_robin"):
        make_dispatch_policy("nope")

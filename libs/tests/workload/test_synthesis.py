"""SeaLLM-style synthesis: clustering into services, model mapping, rates, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.workload import Workload, assign_models, from_lengths, length_features, synthesize


def two_clusters(n_short: int = 300, n_long: int = 100, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    short = np.column_stack([rng.integers(20, 41, n_short), rng.integers(10, 31, n_short)])
    long = np.column_stack([rng.integers(1500, 2501, n_long), rng.integers(500, 901, n_long)])
    both = np.concatenate([short, long])
    return both[rng.permutation(len(both))]


def rows(a: np.ndarray) -> set[tuple[int, int]]:
    return {tuple(r) for r in a.tolist()}


def test_kmeans_separates_two_obvious_clusters():
    data = two_clusters()
    mix = from_lengths(data, 2, seed=3)
    svc0, svc1 = mix.services
    assert mix.names() == ("svc0", "svc1")
    assert (svc0.count, svc1.count) == (300, 100)
    assert (svc0.share, svc1.share) == (0.75, 0.25)
    assert rows(svc0.lengths) == rows(data[data[:, 0] <= 40])
    assert rows(svc1.lengths) == rows(data[data[:, 0] >= 1500])
    assert svc0.mean_prompt < 41 and svc1.mean_output > 499
    assert not svc0.lengths.flags.writeable


def test_clusters_use_both_dimensions_and_are_ordered_by_total_length():
    rng = np.random.default_rng(1)

    def blob(p: int, o: int, n: int) -> np.ndarray:
        return np.column_stack([rng.integers(p, p + p // 5 + 2, n), rng.integers(o, o + o // 5 + 2, n)])

    # totals ≈ 20, ≈ 560 (long output) and ≈ 2210 (long prompt)
    data = np.concatenate([blob(2000, 10, 80), blob(10, 10, 50), blob(10, 500, 70)])
    mix = from_lengths(data, 3, models=["m1", "m2"], seed=0)
    assert [s.count for s in mix.services] == [50, 70, 80]
    assert mix.services[1].mean_output > 400 and mix.services[2].mean_prompt > 1900
    assert mix.models() == {"svc0": "m1", "svc1": "m2", "svc2": "m1"}  # round-robin


def test_length_features_are_log_standardized():
    f = length_features(np.array([[0, 1], [10, 1], [100, 1]]))
    assert f[:, 0].mean() == pytest.approx(0.0) and f[:, 0].std() == pytest.approx(1.0)
    assert np.all(f[:, 1] == 0.0)  # a constant column is only centred
    x = np.log1p([0, 10, 100])
    assert f[:, 0] == pytest.approx((x - x.mean()) / x.std())


def test_assign_models():
    names = ["svc0", "svc1", "svc2"]
    assert assign_models(names, None) == dict.fromkeys(names, "")
    assert assign_models(names, "one") == dict.fromkeys(names, "one")
    assert assign_models(names, ["a", "b"]) == {"svc0": "a", "svc1": "b", "svc2": "a"}
    assert assign_models(names, {"svc0": "x", "svc1": "y", "svc2": "z"})["svc2"] == "z"
    with pytest.raises(ValueError, match=r"missing \['svc2'\]"):
        assign_models(names, {"svc0": "x", "svc1": "y"})
    with pytest.raises(ValueError, match=r"unknown \['svc9'\]"):
        assign_models(names, {"svc0": "x", "svc1": "y", "svc2": "z", "svc9": "w"})
    with pytest.raises(ValueError, match="non-empty list"):
        assign_models(names, [])


def test_generate_carries_models_shares_and_cluster_lengths():
    data = two_clusters()
    mix = from_lengths(data, 2, models={"svc0": "small", "svc1": "big"}, seed=0)
    w = mix.generate(total_rate_rps=20.0, n_requests=8000, seed=5)
    assert len(w) == 8000 and len({r.request_id for r in w}) == 8000
    assert w.rate_rps == pytest.approx(20.0, rel=0.03)
    by = w.by_service()
    assert len(by["svc0"]) / len(w) == pytest.approx(0.75, abs=0.02)
    assert {r.model for r in by["svc0"]} == {"small"} and {r.model for r in by["svc1"]} == {"big"}
    for name, svc in zip(mix.names(), mix.services, strict=True):
        assert rows(np.array(by[name].lengths())) <= rows(svc.lengths)
    assert [r.request_id for r in by["svc1"]][:3] == ["svc1-0", "svc1-1", "svc1-2"]
    assert mix.with_models("m").models() == {"svc0": "m", "svc1": "m"}


def test_explicit_rates_and_disabled_service():
    mix = from_lengths(two_clusters(), 2)
    w = mix.generate(rates={"svc0": 1.0, "svc1": 9.0}, duration_s=1000.0, seed=1)
    counts = {k: len(v) for k, v in w.by_service().items()}
    assert counts["svc0"] == pytest.approx(1000, rel=0.1) and counts["svc1"] == pytest.approx(9000, rel=0.05)
    assert w.duration_s < 1000.0
    only = mix.generate(rates=[0.0, 3.0], duration_s=100.0, seed=1)
    assert only.services() == ("svc1",)


def test_time_varying_service_rates():
    mix = from_lengths(two_clusters(), 2)
    w = mix.generate(
        rates={"svc0": 5.0}, segments={"svc1": [(100.0, 0.0), (100.0, 20.0)]}, duration_s=300.0, seed=2
    )
    svc1 = np.array([r.arrival_s for r in w.by_service()["svc1"]])
    assert svc1.min() >= 100.0 and svc1.max() < 200.0  # idle, busy, then idle after the segments
    assert svc1.size == pytest.approx(2000, rel=0.1)
    assert len(w.by_service()["svc0"]) == pytest.approx(1500, rel=0.1)
    bursty = mix.generate(rates={"svc0": 5.0}, segments={"svc1": [(100.0, 0.0), (400.0, 20.0)]},
                          duration_s=500.0, cv=3.0, seed=2)  # fmt: skip
    t1 = np.array([r.arrival_s for r in bursty.by_service()["svc1"]])
    assert t1.min() >= 100.0 and t1.size == pytest.approx(8000, rel=0.15)  # time-varying and bursty
    gaps = np.diff(t1)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.2)
    with pytest.raises(ValueError, match=r"only .* of 10000"):
        mix.generate(segments={"svc0": [(1.0, 1.0)], "svc1": [(1.0, 1.0)]}, n_requests=10_000)


def test_cv_shapes_each_service_stream():
    data = two_clusters()
    bursty = synthesize(data, k=2, total_rate_rps=50.0, n_requests=8000, cv=3.0, seed=4)
    smooth = synthesize(data, k=2, total_rate_rps=50.0, n_requests=8000, cv=0.3, seed=4)
    for w, lo, hi in [(bursty, 2.4, 3.6), (smooth, 0.2, 0.4)]:
        t = np.array([r.arrival_s for r in w.by_service()["svc0"]])
        g = np.diff(t)
        assert lo < g.std() / g.mean() < hi


def test_same_seed_same_workload_different_seed_different(tmp_path):
    data = two_clusters()
    kw = {"k": 2, "total_rate_rps": 10.0, "duration_s": 60.0, "models": ["a", "b"]}
    w1, w2 = synthesize(data, seed=7, **kw), synthesize(data, seed=7, **kw)
    assert w1 == w2 and len(w1) > 0
    w3 = synthesize(data, seed=8, **kw)
    assert w3 != w1
    w1.to_jsonl(tmp_path / "w.jsonl")
    assert Workload.from_jsonl(tmp_path / "w.jsonl") == w1


@pytest.mark.parametrize(
    ("lengths", "k", "match"),
    [
        ([(1, 1), (1, 1), (2, 2)], 3, "cannot form k=3 clusters from 2 distinct"),
        ([(1, 1), (2, 0)], 1, r"lengths\[1\] = \[2, 0\]: need prompt >= 0 and output >= 1"),
        ([(1, 1), (-1, 3)], 1, r"lengths\[1\]"),
        ([(1, 1.5)], 1, r"lengths\[0\] = \[1.0, 1.5\] is not a pair of integers"),
        ([(1, 2, 3)], 1, "pairs"),
        ([], 1, "pairs|empty"),
        ([(1, 1), (2, 2)], 0, "k must be"),
    ],
)
def test_from_lengths_errors(lengths, k, match):
    with pytest.raises(ValueError, match=match):
        from_lengths(lengths, k)


def test_generate_argument_errors():
    mix = from_lengths(two_clusters(), 2)
    with pytest.raises(ValueError, match="exactly one of n_requests or duration_s"):
        mix.generate(total_rate_rps=1.0)
    with pytest.raises(ValueError, match="not both"):
        mix.generate(total_rate_rps=1.0, rates=[1.0, 1.0], n_requests=5)
    with pytest.raises(ValueError, match="has no rate"):
        mix.generate(n_requests=5)
    with pytest.raises(ValueError, match="no entry for service 'svc1'"):
        mix.generate(rates={"svc0": 1.0}, n_requests=5)
    with pytest.raises(ValueError, match="2 services"):
        mix.generate(rates=[1.0], n_requests=5)
    with pytest.raises(ValueError, match="unknown service"):
        mix.generate(total_rate_rps=1.0, segments={"svc7": [(1.0, 1.0)]}, n_requests=5)
    with pytest.raises(ValueError, match="total_rate_rps must be"):
        mix.generate(total_rate_rps=-1.0, n_requests=5)

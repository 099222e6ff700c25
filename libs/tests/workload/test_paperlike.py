"""Paper-like workloads: lengths from published statistics and per-service bursty arrivals."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.workload import (
    LONGBENCH_SEALLM,
    SHAREGPT_VLLM,
    LengthStats,
    lognormal_lengths,
    longbench_like_lengths,
    multi_service_workload,
    sharegpt_like_lengths,
)


def test_sharegpt_like_means_match_the_published_statistics():
    a = sharegpt_like_lengths(200_000, seed=1)
    assert a.shape == (200_000, 2) and a.dtype == np.int64 and a.min() >= 1
    assert a[:, 0].mean() == pytest.approx(SHAREGPT_VLLM.mean_prompt, rel=0.03)
    assert a[:, 1].mean() == pytest.approx(SHAREGPT_VLLM.mean_output, rel=0.03)
    assert "161.31" in SHAREGPT_VLLM.source and "337.99" in SHAREGPT_VLLM.source
    # heavy right tail: median well below the mean
    assert np.median(a[:, 0]) < 0.75 * a[:, 0].mean()


def test_lengths_are_seeded_and_capped():
    a, b = sharegpt_like_lengths(500, seed=7), sharegpt_like_lengths(500, seed=7)
    assert np.array_equal(a, b) and not np.array_equal(a, sharegpt_like_lengths(500, seed=8))
    c = longbench_like_lengths(5000, seed=0, max_prompt=4000, max_output=64)
    assert c[:, 0].max() <= 4000 and c[:, 1].max() <= 64
    assert c[:, 0].mean() > 0.8 * 4000  # most LongBench-like prompts exceed a 4k context
    u = longbench_like_lengths(100_000, seed=0)
    assert u[:, 0].mean() == pytest.approx(LONGBENCH_SEALLM.mean_prompt, rel=0.05)


def test_zero_sigma_gives_the_mean_and_bad_input_is_rejected():
    a = lognormal_lengths(LengthStats(100.0, 20.0, "x"), 10, sigma_prompt=0.0, sigma_output=0.0)
    assert (a[:, 0] == 100).all() and (a[:, 1] == 20).all()
    with pytest.raises(ValueError):
        lognormal_lengths(LengthStats(0.0, 20.0, "x"), 10)
    with pytest.raises(ValueError):
        sharegpt_like_lengths(0)
    with pytest.raises(ValueError):
        sharegpt_like_lengths(10, max_prompt=0)


def _pools():
    return {
        "chat": ("m1", sharegpt_like_lengths(1000, seed=1)),
        "long": ("m2", longbench_like_lengths(1000, seed=2, max_prompt=4000)),
    }


def test_multi_service_mean_rates_and_burstiness():
    rates = {"chat": 6.0, "long": 2.0}
    wl = multi_service_workload(_pools(), rates, duration_s=4000.0, cv=4.0, seed=3)
    assert all(np.diff([r.arrival_s for r in wl.requests]) >= 0)
    for svc, rate in rates.items():
        t = np.array([r.arrival_s for r in wl.requests if r.service == svc])
        # Gamma with CV 4: the count over 4000 s has sd ≈ cv·sqrt(n); 15% is > 3 sd at these rates
        assert len(t) / 4000.0 == pytest.approx(rate, rel=0.15)
        gaps = np.diff(t)
        assert gaps.std() / gaps.mean() == pytest.approx(4.0, rel=0.25)
        assert {r.model for r in wl.requests if r.service == svc} == {_pools()[svc][0]}
    long_prompts = [r.prompt_tokens for r in wl.requests if r.service == "long"]
    assert min(long_prompts) >= 1 and max(long_prompts) <= 4000


def test_multi_service_poisson_at_cv_one_and_seeded():
    wl = multi_service_workload(_pools(), {"chat": 5.0, "long": 5.0}, duration_s=2000.0, cv=1.0, seed=0)
    t = np.array([r.arrival_s for r in wl.requests if r.service == "chat"])
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)
    again = multi_service_workload(_pools(), {"chat": 5.0, "long": 5.0}, duration_s=2000.0, cv=1.0, seed=0)
    assert again.requests == wl.requests
    other = multi_service_workload(_pools(), {"chat": 5.0, "long": 5.0}, duration_s=2000.0, cv=1.0, seed=1)
    assert other.requests != wl.requests


def test_multi_service_rejects_mismatched_rates():
    with pytest.raises(ValueError, match="rates must name"):
        multi_service_workload(_pools(), {"chat": 1.0}, duration_s=10.0, cv=2.0)

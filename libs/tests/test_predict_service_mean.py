import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llmfleet.predict import LengthQuery, ServiceMeanPredictor


def test_prior_before_any_observation():
    p = ServiceMeanPredictor(prior_mean=10, prior_std=3).predict(LengthQuery("chat"))
    assert (p.mean, p.std, p.observations) == (10, 3, 0)


def test_services_are_independent():
    pred = ServiceMeanPredictor()
    for x in (10, 20, 30):
        pred.observe(LengthQuery("a"), x)
    pred.observe(LengthQuery("b"), 100)
    a, b = pred.predict(LengthQuery("a")), pred.predict(LengthQuery("b"))
    assert a.mean == pytest.approx(20) and a.observations == 3
    assert a.std == pytest.approx(statistics.pstdev([10, 20, 30]))
    assert b.mean == 100 and b.std == 0 and b.observations == 1


@given(st.lists(st.integers(min_value=0, max_value=100_000), min_size=1, max_size=200))
def test_running_stats_match_batch_statistics(xs):
    pred = ServiceMeanPredictor()
    for x in xs:
        pred.observe(LengthQuery("s"), x)
    p = pred.predict(LengthQuery("s"))
    assert p.mean == pytest.approx(statistics.fmean(xs), rel=1e-9, abs=1e-9)
    expect_std = statistics.pstdev(xs) if len(xs) > 1 else 0.0
    assert math.isclose(p.std, expect_std, rel_tol=1e-6, abs_tol=1e-6)


def test_negative_observation_rejected():
    with pytest.raises(ValueError, match="output_tokens"):
        ServiceMeanPredictor().observe(LengthQuery("s"), -1)

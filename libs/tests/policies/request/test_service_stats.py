import statistics

import pytest
from llmfleet.policies.request import ServiceStats


def test_prior_before_observations():
    s = ServiceStats(default_mean_s=2.0, default_std_s=0.5)
    assert (s.mean("x"), s.std("x"), s.count("x")) == (2.0, 0.5, 0)
    s.observe("x", 3.0)  # one sample: mean is data, std still the prior
    assert (s.mean("x"), s.std("x"), s.count("x")) == (3.0, 0.5, 1)
    assert s.services() == ["x"]


def test_welford_matches_batch_statistics():
    xs = [0.5, 1.25, 3.0, 0.75, 2.0, 10.0]
    s = ServiceStats()
    for x in xs:
        s.observe("svc", x)
    assert s.mean("svc") == pytest.approx(statistics.fmean(xs))
    assert s.std("svc") == pytest.approx(statistics.stdev(xs))
    assert s.mean("other") == s.default_mean_s  # services are independent


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_rejects_bad_observations(bad):
    with pytest.raises(ValueError):
        ServiceStats().observe("svc", bad)


def test_rejects_bad_priors():
    with pytest.raises(ValueError):
        ServiceStats(default_mean_s=0.0)
    with pytest.raises(ValueError):
        ServiceStats(default_std_s=-1.0)

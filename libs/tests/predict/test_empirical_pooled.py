"""The empirical predictor's pooled samples (kept between predictions, dropped by each observation) and
its point-only answer: the same floats as a predictor built from scratch on the same history."""

from __future__ import annotations

import random

import pytest
from llmfleet.predict.base import LengthQuery
from llmfleet.predict.empirical import EmpiricalLengthPredictor

SERVICES = ("chat", "code")


def _fresh(history: list[tuple[LengthQuery, int]], **kw) -> EmpiricalLengthPredictor:
    p = EmpiricalLengthPredictor(**kw)
    for q, out in history:
        p.observe(q, out)
    return p


@pytest.mark.parametrize("statistic", ["mean", 0.7])
def test_pooled_samples_and_point_equal_a_predictor_built_from_scratch(statistic):
    rng = random.Random(5)
    kw = {"max_samples": 16, "min_samples": 4, "seed": 3, "statistic": statistic}
    kept = EmpiricalLengthPredictor(**kw)
    history: list[tuple[LengthQuery, int]] = []
    for step in range(300):
        svc = rng.choice(SERVICES)
        if rng.random() < 0.4:  # an observation: the reservoir (and so every pool) may change
            q = LengthQuery(svc, prompt_tokens=rng.choice([0, 1, 3, 5, 20, 70, 300, 5000]))
            out = rng.randrange(0, 900)
            kept.observe(q, out)
            history.append((q, out))
            continue
        q = LengthQuery(
            svc, prompt_tokens=rng.randrange(0, 6000), generated_tokens=rng.choice([0, 1, 50, 400, 2000])
        )
        want = _fresh(history, **kw).predict(q)
        got = kept.predict(q)
        assert got == want, (step, q)
        assert kept.predict_mean(q) == want.mean, (step, q)


def test_point_only_answer_covers_the_prior_and_the_doubling():
    p = EmpiricalLengthPredictor(prior_mean=50.0, min_samples=2)
    q = LengthQuery("chat", prompt_tokens=10, generated_tokens=3)
    assert p.predict_mean(q) == p.predict(q).mean == 50.0  # no samples: the prior
    for out in (10, 20, 30):
        p.observe(LengthQuery("chat", prompt_tokens=10), out)
    late = LengthQuery("chat", prompt_tokens=10, generated_tokens=40)
    assert p.predict_mean(late) == p.predict(late).mean == 80.0  # none above 40: doubles it
    mid = LengthQuery("chat", prompt_tokens=10, generated_tokens=20)
    assert p.predict_mean(mid) == p.predict(mid).mean == 30.0  # E[l_out | l_out > 20]: the one sample above

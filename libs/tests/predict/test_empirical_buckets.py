import json

import pytest
from llmfleet.predict import (
    EmpiricalLengthPredictor,
    LengthQuery,
    Prediction,
    ServiceMeanPredictor,
    bucket_accuracy,
    hundred_token_buckets,
    power_of_two_buckets,
)
from llmfleet.predict.dataset import LengthItem, load_alpaca, train_test_split
from llmfleet.predict.evaluate import evaluate


def q(prompt_tokens, generated=0, service="s"):
    return LengthQuery(service, "", prompt_tokens, generated_tokens=generated)


def test_existing_call_sites_still_valid():
    p = Prediction(1.0, 2.0, 3, "x")
    assert p.quantiles == () and p.bucket_probs == () and p.buckets == ()
    assert LengthQuery("s", "hi", 2).generated_tokens == 0


def test_empirical_learns_per_bin_means():
    pred = EmpiricalLengthPredictor(min_samples=1)
    for x in (10, 20, 30):
        pred.observe(q(5), x)  # bin [4, 8)
    for x in (300, 500):
        pred.observe(q(100), x)  # bin [64, 128)
    a, b = pred.predict(q(6)), pred.predict(q(70))
    assert a.mean == pytest.approx(20) and a.observations == 3
    assert b.mean == pytest.approx(400) and b.observations == 2
    assert len(a.quantiles) == 3


def test_quantile_statistic():
    pred = EmpiricalLengthPredictor(min_samples=1, statistic=0.5)
    for x in (1, 2, 100):
        pred.observe(q(5), x)
    assert pred.predict(q(5)).mean == pytest.approx(2)


def test_reprediction_moves_past_generated_tokens():
    pred = EmpiricalLengthPredictor(min_samples=1)
    for x in (10, 20, 30, 200, 400):
        pred.observe(q(5), x)
    first = pred.predict(q(5)).mean
    assert first == pytest.approx(132)
    again = pred.predict(q(5, generated=150))
    assert again.mean == pytest.approx(300) and again.mean > 150
    assert pred.predict(q(5, generated=100)).mean == first  # below the prediction: unchanged
    beyond = pred.predict(q(5, generated=1000))  # nothing observed that long: doubling
    assert beyond.mean == 2000 and beyond.observations == 0


def test_fallbacks_neighbour_global_prior():
    pred = EmpiricalLengthPredictor(min_samples=2, max_radius=1, prior_mean=7, prior_std=1)
    assert pred.predict(q(5)) == Prediction(7, 1, 0, "empirical")  # nothing at all: prior
    pred.observe(q(5), 10)  # bin 2 ([4, 8))
    pred.observe(q(9), 30)  # bin 3 ([8, 16))
    assert pred.predict(q(5)).mean == pytest.approx(20)  # neighbours pooled
    assert pred.predict(q(1000)).mean == pytest.approx(20)  # far away: global
    assert pred.predict(q(5, service="other")).observations == 0


def test_reservoir_is_bounded_and_deterministic():
    def run():
        p = EmpiricalLengthPredictor(max_samples=16, seed=3)
        for x in range(1000):
            p.observe(q(5), x)
        return p.samples("s", 5)

    a, b = run(), run()
    assert a == b and len(a) == 16 and max(a) > 16


def test_bucket_schemes():
    h, p2 = hundred_token_buckets(), power_of_two_buckets()
    assert [h.bucket_of(n) for n in (0, 99, 100, 250, 5000)] == [0, 0, 1, 2, 20]
    assert [p2.bucket_of(n) for n in (0, 1, 2, 3, 4, 7, 8, 2048, 10**6)] == [0, 1, 2, 2, 3, 3, 4, 12, 12]
    assert h.representative(1) == 150 and h.upper_edges()[0] == 100
    fitted = h.fit_representatives([110, 130, 10])
    assert (
        fitted.representative(1) == 120 and fitted.representative(0) == 10 and fitted.representative(3) == 350
    )
    assert bucket_accuracy(h, [50, 150, 250], [99, 199, 301]) == pytest.approx(2 / 3)


def test_evaluate_hand_computed():
    items = [LengthItem("a", 10, 1), LengthItem("b", 90, 1), LengthItem("c", 250, 1)]
    pred = ServiceMeanPredictor(prior_mean=50, prior_std=0)
    ticks = iter(range(100))
    r = evaluate(pred, items, batch_size=2, clock=lambda: float(next(ticks)))
    # mean 50 → 100-bucket 0: right for 10 and 90, wrong for 250; pow2 bucket [32,64): all wrong
    assert r["acc_100"] == pytest.approx(2 / 3) and r["acc_pow2"] == 0
    assert r["mae"] == pytest.approx((40 + 40 + 200) / 3)
    assert r["n"] == 3 and r["latency_p50_ms"] == pytest.approx(1000.0)
    assert evaluate(pred, items)["latency_p99_ms"] is None


def test_dataset_load_and_split(tmp_path):
    data = [{"instruction": f"do {i}", "input": "x" if i % 2 else "", "output": "a b c"} for i in range(10)]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    items = load_alpaca(path, count_tokens=lambda ts: [len(t.split()) for t in ts])
    assert items[0].prompt == "do 0" and items[1].prompt == "do 1\nx"
    assert items[0].output_tokens == 3 and items[1].prompt_tokens == 3
    tr, te = train_test_split(items, 0.2, seed=1)
    assert len(tr) == 8 and len(te) == 2 and (tr, te) == train_test_split(items, 0.2, seed=1)
    assert {i.prompt for i in tr} | {i.prompt for i in te} == {i.prompt for i in items}
    path.write_text("{}")
    with pytest.raises(ValueError):
        load_alpaca(path, count_tokens=lambda ts: [1] * len(ts))


def test_evaluate_scores_median_when_reported_and_pools_passes():
    class Skewed:
        name = "skewed"
        calls = 0

        def predict(self, q):
            self.calls += 1
            return Prediction(100.0, 50.0, 1, self.name, quantiles=(10.0, 200.0, 400.0))

        def observe(self, q, n):
            pass

    items = [LengthItem("p", 10), LengthItem("q", 12), LengthItem("r", 300)]
    resets = []
    pred = Skewed()
    r = evaluate(
        pred, items, batch_size=2, clock=iter(range(100)).__next__, passes=3, reset=lambda: resets.append(1)
    )
    assert r["point"] == "median" and r["mae"] == pytest.approx((0 + 2 + 290) / 3)
    assert r["mae_mean"] == pytest.approx((90 + 88 + 200) / 3)
    assert r["acc_100"] == pytest.approx(2 / 3) and pred.calls == 9 and len(resets) == 3
    assert r["latency_p50_ms"] == pytest.approx(1000.0)  # the fake clock ticks 1 s per read
    m = evaluate(Skewed(), items, point="mean")
    assert m["point"] == "mean" and m["mae"] == m["mae_mean"]
    assert evaluate(ServiceMeanPredictor(), items)["point"] == "mean"  # no quantiles: its mean

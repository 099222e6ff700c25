"""The emulated models' word tokenizer: one token per word, known words at fixed ids, any other word at
a stable id of its own (the same in another process), and every id decoding to its ``t<k>`` word."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from llmfleet_engine.emulated.tokenizer import BOS_ID, EOS_ID, UNK_ID, WORD_BASE, word, word_tokenizer

VOCAB = 32000
TEXT = "Explain the French revolution in simple terms, café au lait, 東京 and t7"


def ids(text: str, vocab: int = VOCAB) -> list[int]:
    return list(word_tokenizer(vocab)(text)["input_ids"])


def test_known_words_keep_their_ids_and_every_word_is_one_token():
    assert ids("t0 t1 t31995") == [WORD_BASE, WORD_BASE + 1, WORD_BASE + 31995]
    got = ids(TEXT)
    assert len(got) == len(TEXT.split())
    assert got[-1] == WORD_BASE + 7
    assert all(WORD_BASE <= i < VOCAB for i in got)
    assert UNK_ID not in got


def test_an_unknown_word_has_one_id_wherever_it_stands():
    first, second = ids("hello world"), ids("world t3 hello")
    assert first[0] == second[2] and first[1] == second[0]
    assert ids("hello   world\n") == first  # whitespace is a separator only


def test_distinct_unknown_words_get_distinct_ids_but_for_rare_collisions():
    words = [f"word{k}" for k in range(2000)]
    # 2,000 words over 31,996 ids: about 2000² / (2 · 31996) ≈ 62 colliding pairs if the ids are uniform
    assert len(set(ids(" ".join(words)))) >= 1900


def test_ids_are_the_same_in_another_process():
    """Engines of one model in different processes must agree, so Python's salted ``hash`` cannot be
    the hash."""
    code = (
        "import json, sys; from llmfleet_engine.emulated.tokenizer import word_tokenizer; "
        f"print(json.dumps(list(word_tokenizer({VOCAB})(sys.argv[1])['input_ids'])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, TEXT],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PYTHONPATH": ":".join(sys.path)},
    )
    assert json.loads(out.stdout) == ids(TEXT)


def test_special_tokens_in_the_text_stay_special_and_ids_decode_to_words():
    assert ids("<s> hello")[0] == BOS_ID
    # a special token glued to an unknown word stays special, on either side and literal ``<unk>`` too
    hello = ids("hello")[0]
    assert ids("<s>hello") == [BOS_ID, hello]
    assert ids("hello</s>t7") == [hello, EOS_ID, WORD_BASE + 7]
    assert ids("<unk>hello") == [UNK_ID, hello]
    tok = word_tokenizer(VOCAB)
    assert tok.decode(ids(TEXT)).split() == [word(i) for i in ids(TEXT)]
    assert tok.decode([WORD_BASE + 5, WORD_BASE + 6]) == "t5 t6"


def test_a_small_vocabulary_still_maps_every_word_into_range():
    got = ids(TEXT, vocab=16)
    assert all(WORD_BASE <= i < 16 for i in got)
    with pytest.raises(ValueError, match="vocab_size must exceed 4"):
        word_tokenizer(4)


def test_every_entry_point_gives_unknown_words_their_ids():
    tok = word_tokenizer(VOCAB)
    want = ids(TEXT)
    assert tok.encode(TEXT) == want
    assert tok([TEXT, "t1 t2"])["input_ids"] == [want, [WORD_BASE + 1, WORD_BASE + 2]]
    assert tok(TEXT, return_tensors="pt")["input_ids"].tolist() == [want]


def test_a_text_of_known_words_is_encoded_by_the_library_alone(monkeypatch):
    """No Python step runs for it (the library releases the GIL while it encodes); a text with an
    unknown word is rewritten once."""
    tok = word_tokenizer(VOCAB)
    calls = []
    real = tok.known_words
    monkeypatch.setattr(tok, "known_words", lambda text: calls.append(text) or real(text))
    assert ids("t3 t4 t5") == [WORD_BASE + 3, WORD_BASE + 4, WORD_BASE + 5] and calls == []
    ids("t3 café")
    assert calls == ["t3 café"]

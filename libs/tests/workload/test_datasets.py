"""Alpaca-style length loading and the approximate token counter."""

from __future__ import annotations

import json

import pytest
from llmfleet.workload import alpaca_lengths, approx_token_count, from_lengths, load_azure_trace


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello world", 2),
        ("internationalization", 4),  # 20 letters: one token per started 6
        ("12345", 2),  # digits: one per started 3
        ("Hi, there!", 4),
        ("日本語", 3),
        ("  \n\t ", 0),
        ("abcdefghijklm", 3),  # 13 letters
        ("hello1234567", 4),  # a letter run, then a digit run: 1 + 3
        ("١٢٣", 3),  # non-ASCII digits: one each
    ],
)
def test_approx_token_count(text, expected):
    assert approx_token_count(text) == expected


def write_json(tmp_path, data, name="alpaca.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


ITEMS = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hi.", "input": "", "output": "Hello there, friend!"},
    {"instruction": "Stay silent.", "output": ""},  # no input key; empty output
]


def test_alpaca_lengths_with_tokenizer(tmp_path):
    lengths = alpaca_lengths(write_json(tmp_path, ITEMS), tokenizer=len)
    assert lengths == [
        (len("Add the numbers.\n2 and 3"), 1),
        (len("Say hi."), len("Hello there, friend!")),
        (len("Stay silent."), 1),  # empty output counts as 1 token
    ]


def test_alpaca_lengths_default_is_approx(tmp_path):
    lengths = alpaca_lengths(write_json(tmp_path, ITEMS))
    assert lengths[1] == (approx_token_count("Say hi."), approx_token_count("Hello there, friend!"))
    assert lengths[1] == (3, 5)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"instruction": "x"}, "expected a JSON list"),
        ([ITEMS[0], {"instruction": "x"}], r"item 1: missing key\(s\) \['output'\]"),
        ([ITEMS[0], ITEMS[1], "text"], "item 2: expected an object, got str"),
        ([{"instruction": 3, "output": "x"}], "item 0: 'instruction' must be a string, got int"),
        ([{"instruction": "x", "input": ["a"], "output": "x"}], "item 0: 'input' must be a string"),
    ],
)
def test_alpaca_errors_name_the_item(tmp_path, data, match):
    with pytest.raises(ValueError, match=match):
        alpaca_lengths(write_json(tmp_path, data))


def test_alpaca_bad_json_missing_file_and_bad_tokenizer(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"instruction": "x",\n "output": }]')
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON \(line 2"):
        alpaca_lengths(bad)
    with pytest.raises(FileNotFoundError, match=r"nowhere\.json"):
        alpaca_lengths(tmp_path / "nowhere.json")
    with pytest.raises(ValueError, match="item 0: tokenizer must return an int >= 0"):
        alpaca_lengths(write_json(tmp_path, ITEMS), tokenizer=lambda s: -1)


def test_lengths_feed_synthesis(tmp_path):
    items = [{"instruction": "w " * n, "output": "w " * (3 * n)} for n in (1, 2, 3, 200, 220, 240)]
    mix = from_lengths(alpaca_lengths(write_json(tmp_path, items)), 2, seed=0)
    assert [s.count for s in mix.services] == [3, 3]
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,12,6\n2,900,300\n3,950,320\n")
    mix2 = from_lengths(load_azure_trace(trace).lengths(), 2, models=["a", "b"])
    assert mix2.services[1].mean_prompt == 925.0 and mix2.models()["svc1"] == "b"

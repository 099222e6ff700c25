"""Function popularity → per-service shares (SeaLLM's MAF functions dealt round-robin)."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.workload import (
    Popularity,
    PopularityFormatError,
    load_function_counts,
    round_robin_shares,
    zipf_exponent_for,
    zipf_popularity,
)


def test_zipf_exponent_matches_published_point() -> None:
    s = zipf_exponent_for(10_000)
    pop = zipf_popularity(10_000, s)
    assert pop.top_mass(0.186) == pytest.approx(0.996, abs=1e-3)
    assert 1.5 < s < 1.8
    assert zipf_exponent_for(1_000) > s > zipf_exponent_for(50_000)  # fewer functions → steeper


def test_round_robin_shares_sum_to_one_and_are_unequal() -> None:
    shares = round_robin_shares(zipf_popularity(seed=0), ["a", "b", "c", "d"])
    assert sum(shares.values()) == pytest.approx(1.0)
    assert max(shares.values()) > 0.4  # the top function alone is ~46 % of invocations


def test_round_robin_deals_in_file_order() -> None:
    pop = Popularity(np.array([5.0, 1.0, 3.0, 1.0]), "hand")
    assert round_robin_shares(pop, ["x", "y"]) == {"x": 0.8, "y": 0.2}
    with pytest.raises(ValueError, match="cannot be dealt"):
        round_robin_shares(pop, list("abcde"))


def test_zipf_seed_changes_order_not_mass() -> None:
    a, b = zipf_popularity(100, 1.5, seed=0), zipf_popularity(100, 1.5, seed=1)
    assert sorted(a.counts) == pytest.approx(sorted(b.counts))
    assert not np.allclose(a.counts, b.counts)


def test_load_two_column_and_maf(tmp_path) -> None:
    p = tmp_path / "c.csv"
    p.write_text("function,count\nf1,10\nf2,0\nf3,30\n")
    assert load_function_counts(p).counts.tolist() == [10.0, 0.0, 30.0]
    m = tmp_path / "maf.csv"
    m.write_text("HashOwner,HashApp,HashFunction,Trigger,1,2,3\no,a,f1,http,1,2,3\no,a,f2,timer,0,0,4\n")
    assert load_function_counts(m).counts.tolist() == [6.0, 4.0]


def test_bad_lines_are_named(tmp_path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("function,count\nf1,10\nf2,lots\n")
    with pytest.raises(PopularityFormatError, match=r"bad.csv:3: count 'lots'"):
        load_function_counts(p)
    p.write_text("function,count\nf1,10,3\n")
    with pytest.raises(PopularityFormatError, match=r"bad.csv:2: 3 columns"):
        load_function_counts(p)
    p.write_text("function,count\nf1,-1\n")
    with pytest.raises(PopularityFormatError, match=r"bad.csv:2"):
        load_function_counts(p)
    p.write_text("a,b,c\n")
    with pytest.raises(PopularityFormatError, match=r"bad.csv:1: expected a header"):
        load_function_counts(p)
    p.write_text("function,count\n")
    with pytest.raises(PopularityFormatError, match="no function rows"):
        load_function_counts(p)

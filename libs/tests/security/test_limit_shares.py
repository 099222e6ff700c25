"""A key's limits split among scheduler replicas by demand: the fractions, the meter, and the bound on
what the cluster admits when every replica is asked for five times the key's rate."""

from __future__ import annotations

import pytest
from llmfleet.security import KeyLimits, KeyRateLimiter, RateLimited
from llmfleet.security.limit_shares import INTERVAL_S, KeyShares, decode, encode, fraction


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_fractions_follow_demand_and_sum_to_one():
    assert fraction(5, [5]) == pytest.approx(0.5)
    assert fraction(0, [0, 0]) == pytest.approx(1 / 3)  # nobody asks: an equal split
    busy, idle = fraction(9, [0]), fraction(0, [9])
    assert busy + idle == pytest.approx(1)
    assert 0 < idle < 0.1 < 0.9 < busy  # an idle replica keeps a little room
    shares = [fraction(d, [o for j, o in enumerate([1, 2, 7]) if j != i]) for i, d in enumerate([1, 2, 7])]
    assert sum(shares) == pytest.approx(1)
    assert shares[0] < shares[1] < shares[2]


def test_meter_publishes_smoothed_rates_and_forgets_idle_keys():
    clock = Clock()
    s = KeyShares("a", clock)
    assert s.share("k", 100) == (1.0, 1.0)  # alone
    for _ in range(9):
        s.share("k", 100)
    clock.t += 1
    r, t = s.roll()["k"]
    assert r == pytest.approx(10) and t == pytest.approx(60_000)
    for _ in range(30):
        clock.t += 1
        s.roll()
    assert "k" not in s.roll()


def test_peers_records_set_the_fractions():
    clock = Clock()
    a = KeyShares("a", clock)
    for _ in range(10):
        a.share("k", 10)
    clock.t += 1
    a.roll()
    a.peers_changed({"a": {"k": (10.0, 6000.0)}, "b": {"k": (30.0, 0.0)}})
    req, tok = a.fractions()["k"]
    assert req == pytest.approx(fraction(10, [30]))
    assert tok == pytest.approx(fraction(6000, [0]))
    a.peers_changed({})  # b's lease went: a holds the whole limit
    assert a.fractions()["k"] == pytest.approx((1.0, 1.0))


def test_records_round_trip_and_bad_entries_are_skipped():
    rec = {"k": (1.23456, 789.123)}
    assert decode(encode(rec)) == {"k": (1.2346, 789.12)}
    assert decode({"k": "x", "j": [1], "m": [1, "2"], "ok": [1, 2]}) == {"ok": (1.0, 2.0)}


@pytest.mark.parametrize("replicas", [2, 3])
def test_the_cluster_admits_the_keys_rate_when_every_replica_is_asked_five_times_it(replicas):
    """R req/s for one key; each replica is sent 5R for 30 s; records are exchanged every interval."""
    clock = Clock()
    rate, burst, seconds = 10.0, 10, 30
    limits = KeyLimits(requests_per_s=rate, burst=burst)
    names = [f"s{i}" for i in range(replicas)]
    shares = {n: KeyShares(n, clock) for n in names}
    limiters = {n: KeyRateLimiter(clock) for n in names}
    for s in shares.values():  # each replica publishes a record from its start
        s.peers_changed({n: {} for n in names})
    admitted = 0
    step = 1 / (5 * rate)
    next_roll = clock.t + INTERVAL_S
    end = clock.t + seconds
    while clock.t < end:
        for n in names:
            try:
                limiters[n].take("k", limits, 0, shares[n].share("k", 0))
                admitted += 1
            except RateLimited:
                pass
        clock.t += step
        if clock.t >= next_roll:
            records = {n: s.roll() for n, s in shares.items()}
            for s in shares.values():
                s.peers_changed(records)
            next_roll += INTERVAL_S
    assert admitted <= 1.1 * rate * seconds + burst
    assert admitted >= 0.9 * rate * seconds  # the limit is used, not starved

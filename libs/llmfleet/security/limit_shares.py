"""A key's rate limits held across scheduler replicas: each replica enforces a share of them, split by
the demand each replica observes.

Every replica counts, per key with limits, the requests and tokens it is asked for (admitted or
refused: a replica that refuses for want of share still shows its demand), and publishes the
smoothed rates every ``INTERVAL_S`` in etcd under its lease (``KeyShares.record``). From the
records of the live replicas, each replica's fraction of a key's limits is

    (d_i + δ) / Σ_j (d_j + δ),   δ = FLOOR × mean demand (so an idle replica keeps a little room)

computed separately for requests and tokens, with its own demand taken fresh and the others' as
last published (a replica publishes a record, empty or not, as long as it lives: the records say
which replicas share). A key no replica has demand for yet is split equally. The fractions of all replicas sum to 1, so the cluster admits at most the key's rate
(plus its burst, which is split the same way) while the replicas' views agree.

**Error bound.** The views disagree for up to one publishing interval plus the watch delay after a
change of demand, and a replica that starts is unknown to the others until its first record: in
those windows the cluster may admit up to one replica's share more, i.e. at most
``rate × (INTERVAL_S + watch delay)`` requests more per change. A replica that loses etcd keeps
enforcing its last fractions; a replica that dies stops publishing and its record goes with its
lease, so the others take its share within one lease TTL (so does a replica cut off from etcd for
longer than the TTL: the others cannot tell it from a dead one, and the cluster may then admit up to
its last share more until it is back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

INTERVAL_S = 1.0  # how often a replica publishes its demand and rolls its meter
FLOOR = 0.1  # δ: the share of the mean demand every live replica keeps
SMOOTHING = 0.5  # weight of the newest interval's rate in the published (exponentially smoothed) demand
FORGET = 1e-3  # a key whose smoothed demand falls below this (requests/s and tokens/min) is dropped

Demand = tuple[float, float]  # (requests/s, tokens/min)


def fraction(mine: float, others: list[float], floor: float = FLOOR) -> float:
    """This replica's fraction of a limit, from its demand ``mine`` and the other live replicas' demands
    (an equal split when nobody asks)."""
    n = len(others) + 1
    total = mine + sum(others)
    if total <= 0:
        return 1.0 / n
    delta = floor * total / n
    return (mine + delta) / (total + n * delta)


@dataclass
class KeyShares:
    """One replica's demand meter and its fractions of every limited key's limits (pure: the scheduler
    publishes ``record()`` and feeds the peers' records to ``peers_changed``)."""

    replica: str
    clock: Callable[[], float] = time.monotonic
    _counts: dict[str, list[float]] = field(default_factory=dict)  # key -> [requests, tokens] this interval
    _demand: dict[str, Demand] = field(default_factory=dict)  # key -> smoothed demand, as published
    _rolled_at: float | None = None
    _peers: dict[str, dict[str, Demand]] = field(default_factory=dict)  # replica -> its record
    _fractions: dict[str, Demand] = field(default_factory=dict)  # key -> (requests, tokens) fractions

    def share(self, key: str, tokens: int) -> Demand:
        """Count one request of ``tokens`` tokens asked of this replica for ``key``; its fractions of the
        key's (requests, tokens) limits."""
        c = self._counts.get(key)
        if c is None:
            c = self._counts[key] = [0.0, 0.0]
            if self._rolled_at is None:
                self._rolled_at = self.clock()
        c[0] += 1
        c[1] += tokens
        f = self._fractions.get(key)
        if f is None:
            f = self._fractions[key] = self._fraction(key)
        return f

    def roll(self) -> dict[str, Demand]:
        """Close the current interval: the smoothed demand per key (the record to publish)."""
        now = self.clock()
        span = max(1e-6, now - (self._rolled_at if self._rolled_at is not None else now))
        self._rolled_at = now
        demand: dict[str, Demand] = {}
        for key in self._counts.keys() | self._demand.keys():
            requests, tokens = self._counts.get(key, (0.0, 0.0))
            old_r, old_t = self._demand.get(key, (requests / span, 60 * tokens / span))
            r = SMOOTHING * requests / span + (1 - SMOOTHING) * old_r
            t = SMOOTHING * 60 * tokens / span + (1 - SMOOTHING) * old_t
            if r >= FORGET or t >= FORGET:
                demand[key] = (r, t)
        self._demand = demand
        self._counts = {}
        self._refresh()
        return dict(demand)

    def peers_changed(self, records: Mapping[str, Mapping[str, Demand]]) -> None:
        """The live replicas' published records (replica -> key -> demand), this one's included or not."""
        self._peers = {r: dict(rec) for r, rec in records.items() if r != self.replica}
        self._refresh()

    def fractions(self) -> dict[str, Demand]:
        """key -> this replica's (requests, tokens) fractions, for the keys it has seen."""
        return dict(self._fractions)

    def _refresh(self) -> None:
        self._fractions = {key: self._fraction(key) for key in self._fractions.keys() | self._demand.keys()}

    def _fraction(self, key: str) -> Demand:
        # a key new here counts as no demand until its first interval closes: with nobody's demand known
        # the live replicas split its limits equally, so replicas that see it at once do not each take
        # the whole of it
        mine = self._demand.get(key, (0.0, 0.0))
        others = [rec.get(key, (0.0, 0.0)) for rec in self._peers.values()]
        return (
            fraction(mine[0], [o[0] for o in others]),
            fraction(mine[1], [o[1] for o in others]),
        )


def encode(record: Mapping[str, Demand]) -> dict[str, list[float]]:
    return {key: [round(r, 4), round(t, 2)] for key, (r, t) in sorted(record.items())}


def decode(raw: Mapping[str, object]) -> dict[str, Demand]:
    """A published record; entries that are not two numbers are skipped."""
    out: dict[str, Demand] = {}
    for key, value in raw.items():
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
            out[str(key)] = (float(value[0]), float(value[1]))
    return out

"""Multi-service workload synthesis, as in SeaLLM: cluster request lengths into services.

(prompt, output) length samples — from a trace (``Workload.lengths()``) or a data set — are clustered
with k-means into ``k`` services. Features are ``log1p`` of each length, then standardized per column
(zero mean, unit variance; a constant column is only centred): lengths are heavy-tailed, so the log
makes clusters by relative rather than absolute size, and standardizing keeps prompt and output on an
equal footing. k-means is scipy's ``kmeans2`` with k-means++ seeding, restarted ``n_init`` times from one
seeded Generator; the lowest-inertia run without empty clusters wins.

Services are named ``svc0 .. svc{k-1}`` in order of mean prompt + output tokens. Each gets a model
(``assign_models``) and its own arrival process; each request's lengths are drawn with replacement from
its service's cluster. Everything is seeded: the same seed gives an identical ``Workload``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.cluster.vq import ClusterError, kmeans2

from llmfleet.workload.arrivals import gamma, piecewise_gamma, piecewise_poisson, poisson
from llmfleet.workload.request import Workload, WorkloadRequest

Lengths = Sequence[tuple[int, int]] | np.ndarray
Models = str | Sequence[str] | Mapping[str, str] | None
Segments = Sequence[tuple[float, float]]


def lengths_array(lengths: Lengths) -> np.ndarray:
    """(prompt, output) pairs as an (N, 2) int64 array; prompt >= 0 and output >= 1 are required."""
    a = np.asarray(lengths)
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"lengths must be (prompt_tokens, output_tokens) pairs, got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError("lengths is empty")
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"lengths must be numbers, got dtype {a.dtype}")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
        bad = int(np.flatnonzero(~np.isfinite(a).all(1) | (a != np.round(a)).any(1))[0])
        raise ValueError(f"lengths[{bad}] = {a[bad].tolist()} is not a pair of integers")
    a = a.astype(np.int64)
    bad_rows = np.flatnonzero((a[:, 0] < 0) | (a[:, 1] < 1))
    if bad_rows.size:
        i = int(bad_rows[0])
        raise ValueError(f"lengths[{i}] = {a[i].tolist()}: need prompt >= 0 and output >= 1")
    return a


def length_features(lengths: np.ndarray) -> np.ndarray:
    """log1p of each length, standardized per column (a constant column is only centred)."""
    x = np.log1p(np.asarray(lengths, dtype=float))
    sd = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def kmeans_labels(
    features: np.ndarray, k: int, *, seed: int = 0, n_init: int = 10, iterations: int = 30
) -> np.ndarray:
    """Cluster labels (0..k-1, every cluster non-empty) of the best of ``n_init`` k-means++ runs."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if n_init < 1 or iterations < 1:
        raise ValueError("n_init and iterations must be >= 1")
    distinct = np.unique(features, axis=0).shape[0]
    if distinct < k:
        raise ValueError(f"cannot form k={k} clusters from {distinct} distinct length pair(s)")
    if k == 1:
        return np.zeros(features.shape[0], dtype=np.int64)
    rng = np.random.default_rng(seed)
    best, best_inertia = None, math.inf
    for _ in range(n_init):
        try:
            centroids, labels = kmeans2(features, k, iter=iterations, minit="++", missing="raise", seed=rng)
        except ClusterError:
            continue
        if np.bincount(labels, minlength=k).min() == 0:
            continue
        inertia = float(((features - centroids[labels]) ** 2).sum())
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    if best is None:
        raise ValueError(f"k-means left a cluster empty in all {n_init} runs; try a smaller k")
    return best.astype(np.int64)


def assign_models(names: Sequence[str], models: Models) -> dict[str, str]:
    """Service → model: ``None`` gives "", a str gives that model to all, a list is assigned
    round-robin in service order, a mapping must name every service exactly."""
    if models is None:
        return dict.fromkeys(names, "")
    if isinstance(models, str):
        return dict.fromkeys(names, models)
    if isinstance(models, Mapping):
        missing = [n for n in names if n not in models]
        extra = sorted(set(models) - set(names))
        if missing or extra:
            raise ValueError(
                f"model mapping must name services {list(names)}; missing {missing}, unknown {extra}"
            )
        return {n: str(models[n]) for n in names}
    models = list(models)
    if not models or not all(isinstance(m, str) for m in models):
        raise ValueError(f"models must be a non-empty list of str, got {models!r}")
    return {n: models[i % len(models)] for i, n in enumerate(names)}


@dataclass(frozen=True, eq=False)
class ServiceCluster:
    """One service: its name, model, share of the samples, and its (N, 2) length samples (read-only)."""

    name: str
    model: str
    share: float
    lengths: np.ndarray = field(repr=False)

    @property
    def count(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def mean_prompt(self) -> float:
        return float(self.lengths[:, 0].mean())

    @property
    def mean_output(self) -> float:
        return float(self.lengths[:, 1].mean())


def _rate_plan(
    services: tuple[ServiceCluster, ...],
    total_rate_rps: float | None,
    rates: Mapping[str, float] | Sequence[float] | None,
    segments: Mapping[str, Segments] | None,
) -> list[float | Segments]:
    """Each service's constant rate or its piecewise (duration_s, rate_rps) segments."""
    names = [s.name for s in services]
    segments = dict(segments or {})
    if unknown := sorted(set(segments) - set(names)):
        raise ValueError(f"segments name unknown service(s) {unknown}; services are {names}")
    if total_rate_rps is not None and rates is not None:
        raise ValueError("give total_rate_rps or rates, not both")
    if rates is not None and not isinstance(rates, Mapping):
        rates = list(rates)
        if len(rates) != len(names):
            raise ValueError(f"rates has {len(rates)} entries for {len(names)} services")
        rates = dict(zip(names, rates, strict=True))
    plan: list[float | Segments] = []
    for s in services:
        if s.name in segments:
            plan.append(segments[s.name])
            continue
        if total_rate_rps is not None:
            if not (math.isfinite(total_rate_rps) and total_rate_rps > 0):
                raise ValueError(f"total_rate_rps must be finite and > 0, got {total_rate_rps!r}")
            rate = float(total_rate_rps) * s.share
        elif rates is not None:
            if s.name not in rates:
                raise ValueError(f"rates has no entry for service {s.name!r}")
            rate = float(rates[s.name])
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"rate for {s.name!r} must be finite and >= 0, got {rate!r}")
        else:
            raise ValueError(f"service {s.name!r} has no rate: give total_rate_rps, rates or segments")
        plan.append(rate)
    return plan


@dataclass(frozen=True)
class ServiceMix:
    """Services clustered from length samples, ready to generate workloads."""

    services: tuple[ServiceCluster, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.services)

    def models(self) -> dict[str, str]:
        return {s.name: s.model for s in self.services}

    def with_models(self, models: Models) -> ServiceMix:
        """The same services mapped to other models (see ``assign_models``)."""
        mapping = assign_models(self.names(), models)
        return ServiceMix(tuple(replace(s, model=mapping[s.name]) for s in self.services))

    def generate(
        self,
        *,
        total_rate_rps: float | None = None,
        rates: Mapping[str, float] | Sequence[float] | None = None,
        segments: Mapping[str, Segments] | None = None,
        n_requests: int | None = None,
        duration_s: float | None = None,
        cv: float = 1.0,
        seed: int = 0,
    ) -> Workload:
        """Merge one arrival process per service into a ``Workload``.

        A service's rate is, in order of precedence: its piecewise-Poisson ``segments`` (a sequence of
        (duration_s, rate_rps) from t = 0; idle after the last), its entry in ``rates`` (by name, or a
        list in service order; 0 disables it), or ``total_rate_rps`` × its share of the samples.
        Constant-rate services use Gamma gaps with coefficient of variation ``cv`` (1.0 = Poisson);
        segments are Poisson with ``cv`` = 1, else bursty Gamma renewals per segment
        (:func:`~llmfleet.workload.arrivals.piecewise_gamma`). Give exactly one of ``n_requests`` (the first
        that many merged arrivals) or ``duration_s`` (arrivals in [0, duration_s)). Request ids are
        ``f"{service}-{j}"``, j counting that service's arrivals from 0.
        """
        if (n_requests is None) == (duration_s is None):
            raise ValueError("give exactly one of n_requests or duration_s")
        if n_requests is not None and (
            isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 0
        ):
            raise ValueError(f"n_requests must be an int >= 0, got {n_requests!r}")
        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")
        if not (math.isfinite(cv) and cv > 0):
            raise ValueError(f"cv must be finite and > 0, got {cv!r}")
        plan = _rate_plan(self.services, total_rate_rps, rates, segments)

        streams = np.random.SeedSequence(seed).spawn(len(self.services))
        times, owner, index, picks = [], [], [], []
        for i, (svc, how) in enumerate(zip(self.services, plan, strict=True)):
            arrival_ss, length_ss = streams[i].spawn(2)
            if isinstance(how, float):
                if how == 0:
                    t = np.empty(0)
                elif cv == 1.0:
                    t = poisson(how, n=n_requests, duration_s=duration_s, seed=arrival_ss)
                else:
                    t = gamma(how, cv, n=n_requests, duration_s=duration_s, seed=arrival_ss)
            else:
                t = (
                    piecewise_poisson(how, seed=arrival_ss)
                    if cv == 1.0
                    else piecewise_gamma(how, cv, seed=arrival_ss)
                )
                if duration_s is not None:
                    t = t[t < duration_s]
            times.append(t)
            owner.append(np.full(t.size, i))
            index.append(np.arange(t.size))
            picks.append(np.random.default_rng(length_ss).integers(0, svc.count, t.size))

        all_t = np.concatenate(times)
        order = np.argsort(all_t, kind="stable")
        if n_requests is not None:
            if order.size < n_requests:
                raise ValueError(f"the services' segments yield only {order.size} of {n_requests} requests")
            order = order[:n_requests]
        all_owner, all_index, all_pick = np.concatenate(owner), np.concatenate(index), np.concatenate(picks)
        reqs = []
        for j in order.tolist():
            svc = self.services[int(all_owner[j])]
            p, o = svc.lengths[int(all_pick[j])].tolist()
            reqs.append(
                WorkloadRequest(f"{svc.name}-{int(all_index[j])}", float(all_t[j]), p, o, svc.name, svc.model)
            )
        return Workload(tuple(reqs))


def from_lengths(
    lengths: Lengths, k: int, *, models: Models = None, seed: int = 0, n_init: int = 10
) -> ServiceMix:
    """Cluster (prompt, output) samples into ``k`` services ``svc0..`` (by mean total length)."""
    a = lengths_array(lengths)
    labels = kmeans_labels(length_features(a), k, seed=seed, n_init=n_init)
    groups = [a[labels == c] for c in range(k)]
    groups.sort(key=lambda g: (float(g.sum(axis=1).mean()), float(g[:, 0].mean())))
    names = [f"svc{i}" for i in range(k)]
    mapping = assign_models(names, models)
    services = []
    for name, g in zip(names, groups, strict=True):
        g = g.copy()
        g.setflags(write=False)
        services.append(ServiceCluster(name, mapping[name], g.shape[0] / a.shape[0], g))
    return ServiceMix(tuple(services))


def synthesize(
    lengths: Lengths,
    *,
    k: int,
    total_rate_rps: float,
    n_requests: int | None = None,
    duration_s: float | None = None,
    models: Models = None,
    cv: float = 1.0,
    seed: int = 0,
) -> Workload:
    """``from_lengths(...).generate(...)``: k services, rate shares ∝ cluster sizes."""
    mix = from_lengths(lengths, k, models=models, seed=seed)
    return mix.generate(
        total_rate_rps=total_rate_rps, n_requests=n_requests, duration_s=duration_s, cv=cv, seed=seed
    )

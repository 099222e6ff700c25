"""The service monitor: per-service sliding-window statistics, locally (:class:`ServiceMonitor`, fed
one request at a time by a scheduler) and fleet-wide (:class:`FleetMonitor`, the placement leader's
merge of the schedulers' reports). Both answer :meth:`loads`, the placement planners' input.

Pure: every time is an argument (seconds on the caller's clock), nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from llmfleet.monitor.merge import merge_services
from llmfleet.monitor.records import Completion
from llmfleet.monitor.solo import SoloTime
from llmfleet.monitor.stats import ServiceStats, WindowStats
from llmfleet.monitor.window import (
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_WINDOWS_S,
    ServiceWindow,
    check_windows,
)
from llmfleet.policies.placement.base import ServiceLoad
from llmfleet.types import Slo


def to_loads(
    stats: Iterable[ServiceStats],
    slos: Mapping[str, Slo],
    models: Mapping[str, str] | None = None,
    window_s: float | None = None,
) -> list[ServiceLoad]:
    """One :class:`ServiceLoad` per service of ``slos`` (sorted by name), from the window ``window_s``
    (default: the middle configured window, 60 s by default). A service without traffic gets rate 0,
    zero lengths and attainment None; when the window completed nothing, lengths come from the
    shortest longer window that did (lengths drift slowly; rates and attainment do not fall back).
    ``models`` names the model of services the monitor has not seen (else their model is "")."""
    by_name = {s.service: s for s in stats}
    out = []
    for name in sorted(slos):
        s = by_name.get(name) or ServiceStats(name)
        w = s.window(window_s)
        lengths = next((x for x in s.windows if x.window_s >= w.window_s and x.completed), w)
        model = (models or {}).get(name) or s.model
        out.append(
            ServiceLoad(
                name=name,
                model=model,
                rate_rps=w.rate_rps,
                mean_prompt_tokens=lengths.prompt_tokens.mean,
                mean_output_tokens=lengths.output_tokens.mean,
                std_prompt_tokens=lengths.prompt_tokens.std,
                std_output_tokens=lengths.output_tokens.std,
                slo=slos[name],
                attainment=w.attainment,
                normalized_latency=w.normalized_latency,
                queued=s.queued,
                cold=s.cold,
                held=s.held,
            )
        )
    return out


@dataclass
class ServiceMonitor:
    """Per-service windows fed by :meth:`arrive` (at arrival) and :meth:`complete` (when a request
    completes or fails). ``solo``: the solo-time estimate (default: each service's floor model, see
    :mod:`llmfleet.monitor.solo`). ``start_s``: when observation began (default: the first event)."""

    windows_s: tuple[float, ...] = DEFAULT_WINDOWS_S
    max_samples: int = DEFAULT_MAX_SAMPLES
    max_events: int = DEFAULT_MAX_EVENTS
    solo: SoloTime | None = None
    start_s: float | None = None
    _services: dict[str, ServiceWindow] = field(default_factory=dict)
    _infeasible: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.windows_s = check_windows(self.windows_s)

    def _window(self, service: str, model: str, t: float) -> ServiceWindow:
        if self.start_s is None:
            self.start_s = t
        w = self._services.get(service)
        if w is None:
            w = self._services[service] = ServiceWindow(
                service, model, self.windows_s, self.max_samples, self.max_events
            )
        return w

    def arrive(self, service: str, model: str, t: float) -> None:
        self._window(service, model, t).arrive(t)

    def complete(self, c: Completion) -> None:
        self._window(c.service, c.model, c.arrival_s).complete(c)

    def count_infeasible(self, service: str) -> None:
        """Dispatch found no feasible worker for a request of ``service`` (Aladdin's scale-out signal)."""
        self._infeasible[service] = self._infeasible.get(service, 0) + 1

    def services(self) -> list[str]:
        return sorted(self._services)

    def stats(self, now: float, slos: Mapping[str, Slo] | None = None) -> list[ServiceStats]:
        """Every service seen within the longest window (and every service of ``slos``, empty when
        unseen), judged against its SLO in ``slos`` (default :class:`Slo`). Services idle for longer
        than the longest window are forgotten."""
        slos = slos or {}
        horizon = self.windows_s[-1]
        for name in [n for n, w in self._services.items() if w.last_event_s <= now - horizon]:
            del self._services[name]
        out = []
        for name in sorted(set(self._services) | set(slos)):
            w = self._services.get(name)
            if w is None:
                out.append(empty_stats(name, self.windows_s, now, self.start_s))
            else:
                out.append(w.stats(now, slos.get(name), self.start_s, self.solo))
        return [replace(s, infeasible=self._infeasible.get(s.service, 0)) for s in out]

    def loads(
        self,
        now: float,
        slos: Mapping[str, Slo],
        *,
        models: Mapping[str, str] | None = None,
        window_s: float | None = None,
    ) -> list[ServiceLoad]:
        """The services of ``slos`` as planner input (see :func:`to_loads`)."""
        return to_loads(self.stats(now, slos), slos, models, window_s)


def empty_stats(
    service: str, windows_s: Sequence[float], now: float = 0.0, start_s: float | None = None
) -> ServiceStats:
    """A service with no traffic: every window empty, rate 0."""
    spans = [w if start_s is None else max(min(w, now - start_s), min(w, 1.0)) for w in windows_s]
    return ServiceStats(service, "", tuple(WindowStats(w, s) for w, s in zip(windows_s, spans, strict=True)))


@dataclass(frozen=True)
class SourceReport:
    """The latest report of one reporter (a scheduler), received at ``received_s``."""

    source: str
    received_s: float
    services: tuple[ServiceStats, ...]
    seq: int = 0
    interval_s: float = 0.0  # the reporter's interval (0: unknown)


@dataclass
class FleetMonitor:
    """The placement leader's view: the latest report of each scheduler, merged per service.

    A scheduler whose last report is older than ``stale_after_s`` (or three of its own report
    intervals, if longer) has left or lost its way to us: its report is dropped. Sample arrival times are on this holder's clock (the wire carries ages).
    """

    stale_after_s: float = 10.0
    max_samples: int = DEFAULT_MAX_SAMPLES
    reports_received: int = 0
    _reports: dict[str, SourceReport] = field(default_factory=dict)

    def update(
        self, source: str, services: Sequence[ServiceStats], now: float, seq: int = 0, interval_s: float = 0.0
    ) -> None:
        """Replace ``source``'s report (a report is the reporter's whole current state)."""
        if not source:
            raise ValueError("a report needs its source (scheduler id)")
        self._reports[source] = SourceReport(source, now, tuple(services), seq, interval_s)
        self.reports_received += 1

    def sources(self, now: float) -> list[SourceReport]:
        """Fresh reports (stale ones are forgotten), by source."""
        stale = [
            k
            for k, r in self._reports.items()
            if now - r.received_s > max(self.stale_after_s, 3 * r.interval_s)
        ]
        for k in stale:
            del self._reports[k]
        return [self._reports[k] for k in sorted(self._reports)]

    def stats(self, now: float) -> list[ServiceStats]:
        """Every reported service, merged over the fresh reports (sorted by name)."""
        parts: dict[str, list[ServiceStats]] = {}
        for r in self.sources(now):
            for s in r.services:
                parts.setdefault(s.service, []).append(s)
        return [merge_services(p, self.max_samples) for _, p in sorted(parts.items())]

    def loads(
        self,
        now: float,
        slos: Mapping[str, Slo],
        *,
        models: Mapping[str, str] | None = None,
        window_s: float | None = None,
    ) -> list[ServiceLoad]:
        """The services of ``slos`` as planner input (see :func:`to_loads`)."""
        return to_loads(self.stats(now), slos, models, window_s)

    def age_s(self, now: float) -> float:
        """Seconds since the freshest report (inf when there is none)."""
        return min((now - r.received_s for r in self.sources(now)), default=math.inf)

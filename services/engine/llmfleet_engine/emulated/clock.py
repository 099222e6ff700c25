"""Wall-clock pacing of emulated work: a step, a transfer or a weight load ends when the cost model
says it would on the GPU, measured from its start on the modelled clock (a step's start is chosen by
:class:`~llmfleet_engine.emulated.pacing.StepPacer`: the previous step's due time when work was
waiting), so the host's own Python time overlaps the modelled work instead of adding to it. ``Lag``
counts what the host could not hide: waits already past due, per step the host's time between a due
time and the next step's scheduling, and the modelled time dropped when catch-up hit its bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


@dataclass
class Lag:
    """How far behind its due times an emulated engine ran (the host could not keep up)."""

    waits: int = 0
    late: int = 0  # waits that were already past due
    total_s: float = 0.0  # summed lateness
    max_s: float = 0.0
    host_steps: int = 0  # steps that started at the previous step's due time
    host_s: float = 0.0  # summed host time from those due times to the steps' scheduling
    host_max_s: float = 0.0
    slips: int = 0  # steps whose start was moved forward to the catch-up bound
    slip_s: float = 0.0  # summed modelled time dropped by those moves
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_host(self, seconds: float) -> None:
        """The host's time between a step's due time and the scheduling of the step that follows."""
        with self._lock:
            self.host_steps += 1
            self.host_s += seconds
            self.host_max_s = max(self.host_max_s, seconds)

    def record_slip(self, seconds: float) -> None:
        """A step's start moved ``seconds`` forward: the host was further behind than catch-up covers."""
        with self._lock:
            self.slips += 1
            self.slip_s += seconds

    def record(self, late_s: float) -> None:
        with self._lock:
            self.waits += 1
            if late_s > 0:
                self.late += 1
                self.total_s += late_s
                self.max_s = max(self.max_s, late_s)

    def read(self) -> Lag:
        """A consistent copy of the counts (taken under the lock)."""
        with self._lock:
            return replace(self, _lock=threading.Lock())


class WallClock:
    """``monotonic`` and ``sleep_until`` on the real clock (tests swap in a simulated one)."""

    def __init__(self) -> None:
        self.lag = Lag()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep_until(self, due: float) -> None:
        """Block until ``due`` (``monotonic`` time); record lateness when it has already passed."""
        remaining = due - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
            late = time.monotonic() - due
            self.lag.record(late if late > 0.002 else 0.0)  # the OS's wake-up jitter is not lag
        else:
            self.lag.record(-remaining)


class LagCollector(Collector):
    """``/metrics`` of an emulated engine's lag: when the host process cannot keep up with the emulated
    GPUs, steps end late and these grow (the sign that the emulation, not the fleet, is the bottleneck)."""

    def __init__(self, lag: Lag) -> None:
        self.lag = lag

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        lag = self.lag.read()
        waits, late, total, worst = lag.waits, lag.late, lag.total_s, lag.max_s
        steps, host, host_max = lag.host_steps, lag.host_s, lag.host_max_s
        slips, slip = lag.slips, lag.slip_s
        yield CounterMetricFamily(
            "llmfleet_emulated_waits", "Emulated steps, loads and transfers paced.", value=waits
        )
        yield CounterMetricFamily(
            "llmfleet_emulated_late", "Of those, how many ended past their due time.", value=late
        )
        yield CounterMetricFamily(
            "llmfleet_emulated_lag_seconds", "Summed lateness past the due times.", value=total
        )
        yield GaugeMetricFamily(
            "llmfleet_emulated_lag_max_seconds", "The largest lateness so far.", value=worst
        )
        yield CounterMetricFamily(
            "llmfleet_emulated_host_steps",
            "Steps that started at the previous step's due time (work was waiting).",
            value=steps,
        )
        yield CounterMetricFamily(
            "llmfleet_emulated_host_seconds",
            "Summed host time from those due times to the next step's scheduling (per step: divide by "
            "llmfleet_emulated_host_steps).",
            value=host,
        )
        yield GaugeMetricFamily(
            "llmfleet_emulated_host_max_seconds", "The largest host time between two steps.", value=host_max
        )
        yield CounterMetricFamily(
            "llmfleet_emulated_slips",
            "Steps whose start moved forward to the catch-up bound (the host fell that far behind).",
            value=slips,
        )
        yield CounterMetricFamily(
            "llmfleet_emulated_slip_seconds",
            "Summed modelled time those moves dropped (the modelled clock slipped by this much).",
            value=slip,
        )

"""The engines' vLLM counters during a live run of ``make bench-prefix``: their /metrics pages
scraped at the start and at the edges of a window, for prefix-cache hits and output tokens in it."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Any

COUNTER = re.compile(
    r"^vllm:(prefix_cache_queries|prefix_cache_hits|generation_tokens|prompt_tokens)(?:_total)?(?:\{[^}]*\})? (\S+)$"
)


COUNTER_NAMES = ("prefix_cache_queries", "prefix_cache_hits", "generation_tokens", "prompt_tokens")


def scrape_sums(
    addresses: list[str], total: dict[str, float], *patterns: re.Pattern[str]
) -> dict[str, float]:
    """``total`` plus, summed over the /metrics pages at ``addresses`` (each read once; an unreachable
    one left out), the value (group 2) of every line a pattern matches, by its group 1."""
    for address in addresses:
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            for pattern in patterns:
                m = pattern.match(line)
                if m:
                    total[m.group(1)] += float(m.group(2))
    return total


def counters(addresses: list[str]) -> dict[str, float]:
    """The engines' vLLM counters (prefix-cache queries and hits, prompt and generation tokens),
    summed over their /metrics pages."""
    return scrape_sums(addresses, dict.fromkeys(COUNTER_NAMES, 0.0), COUNTER)


class Sampler:
    """The engines' counters in a thread, (monotonic time, counters), read as seldom as the figures
    need: every ``period_s`` until the first prompt token is counted (the start), then once at each
    edge of ``window`` (seconds after the start; none without one), then once at exit. An engine host
    builds its /metrics pages under its GIL, so a scrape every half second through a run would delay
    the very steps the run measures."""

    def __init__(
        self, addresses: list[str], window: tuple[float, float] | None = None, period_s: float = 0.5
    ) -> None:
        self.addresses, self.window, self.period_s = addresses, window, period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _take(self) -> None:
        self.samples.append((time.monotonic(), counters(self.addresses)))

    def _run(self) -> None:
        while not self._stop.is_set() and self.start() is None:
            self._take()
            self._stop.wait(self.period_s)
        start = self.start()
        for edge in self.window or ():
            if start is None or self._stop.wait(max(0.0, start + edge - time.monotonic())):
                return
            self._take()

    def start(self) -> float | None:
        """When the first prompt token was counted (to within a sampling period); None before."""
        return next((t for t, c in self.samples if c["prompt_tokens"] > 0), None)

    def last(self) -> dict[str, float]:
        return self.samples[-1][1] if self.samples else {}

    def window_tokens_per_s(self) -> float | None:
        """Generation tokens per second in the window, in seconds after the first prompt token (the
        first request's arrival, to within a sampling period and its queueing), interpolated between
        the samples around each edge; None if the run ended before the window did."""
        start = self.start()
        if start is None or self.window is None:
            return None
        t0, t1 = start + self.window[0], start + self.window[1]
        if self.samples[-1][0] < t1:
            return None
        return (self._at(t1) - self._at(t0)) / (t1 - t0)

    def _at(self, t: float) -> float:
        prev_t, prev_v = self.samples[0][0], self.samples[0][1]["generation_tokens"]
        for ts, c in self.samples:
            v = c["generation_tokens"]
            if ts >= t:
                return prev_v + (v - prev_v) * (t - prev_t) / (ts - prev_t) if ts > prev_t else v
            prev_t, prev_v = ts, v
        return prev_v


def metrics_addresses(endpoints: dict[str, Any]) -> list[str]:
    """Every engine's /metrics address (``host:a..b`` ranges of the emulated hosts expanded)."""
    out = []
    for row in endpoints.values():
        name = row.get("name", "") if isinstance(row, dict) else ""
        if not row.get("metrics") or not name.startswith(("engine", "emu")):
            continue
        host, _, ports = row["metrics"].rpartition(":")
        lo, _, hi = ports.partition("..")
        out += [f"{host}:{p}" for p in range(int(lo), int(hi or lo) + 1)]
    return out

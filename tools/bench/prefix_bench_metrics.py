"""The engines' vLLM counters during a live run of ``make bench-prefix``: their /metrics pages
scraped every half second, for prefix-cache hits and output tokens in a window."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Any

COUNTER = re.compile(
    r"^vllm:(prefix_cache_queries|prefix_cache_hits|generation_tokens|prompt_tokens)(?:_total)?(?:\{[^}]*\})? (\S+)$"
)


def scrape_sums(addresses: list[str], pattern: re.Pattern[str], total: dict[str, float]) -> dict[str, float]:
    """``total`` plus, summed over the /metrics pages at ``addresses`` (an unreachable one left out),
    the value (group 2) of every line ``pattern`` matches, by its group 1."""
    for address in addresses:
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            m = pattern.match(line)
            if m:
                total[m.group(1)] += float(m.group(2))
    return total


def counters(addresses: list[str]) -> dict[str, float]:
    """The engines' vLLM counters (prefix-cache queries and hits, prompt and generation tokens),
    summed over their /metrics pages."""
    names = ("prefix_cache_queries", "prefix_cache_hits", "generation_tokens", "prompt_tokens")
    return scrape_sums(addresses, COUNTER, dict.fromkeys(names, 0.0))


class Sampler:
    """The engines' counters every ``period_s`` in a thread: (monotonic time, counters)."""

    def __init__(self, addresses: list[str], period_s: float = 0.5) -> None:
        self.addresses, self.period_s = addresses, period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic(), counters(self.addresses)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), counters(self.addresses)))
            self._stop.wait(self.period_s)

    def last(self) -> dict[str, float]:
        return self.samples[-1][1] if self.samples else {}

    def window_tokens_per_s(self, window: tuple[float, float]) -> float | None:
        """Generation tokens per second in ``window``, in seconds after the first prompt token (the
        first request's arrival, to within a sampling period and its queueing), interpolated."""
        start = next((t for t, c in self.samples if c["prompt_tokens"] > 0), None)
        if start is None:
            return None
        t0, t1 = start + window[0], start + window[1]
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

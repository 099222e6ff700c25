"""``llmfleet load``'s per-request outcome and its progress line (every ``--report-s``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass
class Outcome:
    service: str
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    engine_id: str = ""
    error: str = ""


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else 0.0


def interval_line(elapsed: float, outcomes: list[Outcome], in_flight: int) -> str:
    ok = [o for o in outcomes if o.ok]
    engines = Counter(o.engine_id or "?" for o in ok)
    per_service = Counter(o.service for o in ok)
    return (
        f"t={elapsed:6.1f}s  done {len(ok):4d} ({', '.join(f'{k} {v}' for k, v in sorted(per_service.items())) or '-'})"
        f"  errors {len(outcomes) - len(ok)}  in flight {in_flight:4d}"
        f"  ttft p50/p99 {pct([o.ttft_s for o in ok], 50):.2f}/{pct([o.ttft_s for o in ok], 99):.2f}s"
        f"  engines {dict(sorted(engines.items())) or '-'}"
    )

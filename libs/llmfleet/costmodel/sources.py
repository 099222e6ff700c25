"""The iteration cost sources: their names and the default, written once.

- ``calibrated`` (the default): measured operator times (Vidur's A100/H100 profiles) plus the
  per-iteration CPU overhead fitted per TP degree (``costmodel.overhead``); on hardware or TP degrees
  without measurements, the roofline scaled by factors fitted where both exist
  (``costmodel.calibrated``).
- ``vidur``: the measured operator times with a fixed 2 ms framework overhead
  (``costmodel.vidur.FRAMEWORK_OVERHEAD_S``); the roofline where nothing is measured.
- ``roofline``: peak rates × efficiency factors (``costmodel.roofline``), no per-iteration overhead.

The simulator (``SimSpec.cost_source``), the emulated engines (``--cost-source``, ``emulated.cost_source``),
the policies' latency models (``costmodel.latency_model``) and the benchmarks all read these names.
"""

from __future__ import annotations

CALIBRATED = "calibrated"
VIDUR = "vidur"
ROOFLINE = "roofline"
COST_SOURCES: tuple[str, ...] = (CALIBRATED, VIDUR, ROOFLINE)
DEFAULT_COST_SOURCE = CALIBRATED


def check_cost_source(name: str) -> str:
    """``name`` if it is a cost source, else ValueError listing the valid ones."""
    if name not in COST_SOURCES:
        raise ValueError(f"unknown cost source {name!r}; valid: {list(COST_SOURCES)}")
    return name

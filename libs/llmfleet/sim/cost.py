"""The simulator's iteration costs: re-exports of :mod:`llmfleet.costmodel.iteration_costs` (the
latency models, :class:`CostBook`) and of Mell's :func:`reprefill_boundary`
(:mod:`llmfleet.policies.migration.hybrid_transfer`), where the simulator's modules import them from.
"""

from llmfleet.costmodel.iteration_costs import (
    COST_SOURCES,
    DEFAULT_COST_SOURCE,
    CostBook,
    Leg,
    LinearCost,
    calibrated_cost,
    fitted_cost,
    roofline_cost,
    vidur_cost,
)
from llmfleet.policies.migration.hybrid_transfer import reprefill_boundary

__all__ = [
    "COST_SOURCES",
    "DEFAULT_COST_SOURCE",
    "CostBook",
    "Leg",
    "LinearCost",
    "calibrated_cost",
    "fitted_cost",
    "reprefill_boundary",
    "roofline_cost",
    "vidur_cost",
]

"""Every default the live services and the simulator share, in one place.

The spec sections (:mod:`llmfleet.spec.policies`), the cluster config, the engine's flags, the
engine's request validation and the simulator all read these names; none repeats the number.
"""

from __future__ import annotations

from typing import Literal, get_args

DEFAULT_MAX_TOKENS = 64  # a request's output cap when it sets none (a service may set its own)
# a static batch's slice end: "keep" its KV, or "recompute" it (the papers' mode)
SliceEnd = Literal["keep", "recompute"]
SLICE_END_MODES: tuple[SliceEnd, ...] = get_args(SliceEnd)
SLICE_END: SliceEnd = "keep"
ENGINE_POLICY = "fcfs"  # the engine-local request policy
DISPATCH_POLICY = "round_robin"
PLACEMENT_POLICY = "static"  # the live leader's default: copy the engines: lists (no planner)
LIVE_PLACEMENT_INTERVAL_S = 30.0  # the live leader's interval when none is given
LIVE_PLACEMENT_CONFIRM_INTERVALS = (
    2  # hysteresis: a changed plan is applied once proposed this often in a row
)
MIGRATION_POLICY = "none"
MIGRATION_EPOCH_S = 1.0
TRANSFER = "hybrid"
# how a request waits for capacity: early = bound to an engine on arrival (the dispatch policy's choice,
# queued there); late = held in the scheduler while every engine hosting its model is saturated
Binding = Literal["early", "late"]
BINDINGS: tuple[Binding, ...] = get_args(Binding)
BINDING: Binding = "late"
# the order of requests held for capacity within a priority: vtc = fair among API keys by tokens served
# (llmfleet.policies.capacity.vtc_fair), none = arrival order
Fairness = Literal["vtc", "none"]
FAIRNESS_MODES: tuple[Fairness, ...] = get_args(Fairness)
FAIRNESS: Fairness = "vtc"
QUEUE_SLACK = 0  # requests an engine may queue past its batch under late binding (docs/benchmarks/burst.md)
KV_ROOM_FRACTION = 0.95

# Where the simulator's presets differ, and why: they reproduce the papers' systems, which plan once
# (no leader), apply a plan at once (no hysteresis) and bind every request on arrival; and a simulated
# request always carries its own output length (the trace's), so its cap only bounds the run.
SIM_PLACEMENT_POLICY = "dedicated_even"  # "static" copies engines: lists, which a simulated GPU pool has not
SIM_PLACEMENT_CONFIRM_INTERVALS = 1
SIM_BINDING: Binding = "early"
SIM_MAX_TOKENS = 4096

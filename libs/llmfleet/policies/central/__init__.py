"""Central scheduling policies: the scheduler (or the simulator) pools a service's requests and schedules
them in rounds, instead of dispatching each request on arrival. One pure policy object per mode, called by
the simulator's driver (``llmfleet.sim.scls_central``) and the live scheduler's
(``llmfleet_scheduler.scls_central``)."""

from __future__ import annotations

from llmfleet.policies.central.scls_central import (
    CENTRAL_MODES,
    MODE,
    CentralBatch,
    CentralStats,
    Offload,
    PoolEntry,
    SclsCentralOptions,
    SclsCentralPolicy,
    TickPlan,
    WorkerView,
    make_central_policy,
)

__all__ = [
    "CENTRAL_MODES",
    "MODE",
    "CentralBatch",
    "CentralStats",
    "Offload",
    "PoolEntry",
    "SclsCentralOptions",
    "SclsCentralPolicy",
    "TickPlan",
    "WorkerView",
    "make_central_policy",
]

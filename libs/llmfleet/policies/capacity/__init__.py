"""Requests that wait for capacity instead of failing: when an engine has room for one more
request (late binding), how long a request for a model no engine hosts may wait (scale from zero), and
the queue that holds them in order (priority, then fair among tenants or by arrival). Pure: the scheduler (``llmfleet_scheduler.capacity``) and the
simulator (``llmfleet.sim``) run the same objects."""

from llmfleet.policies.capacity.cold_start import (
    DEFAULT_COLD_START_CAP_S,
    Unplaceable,
    cold_start_timeout_s,
    unplaceable,
)
from llmfleet.policies.capacity.hold_queue import HoldQueue
from llmfleet.policies.capacity.queue_moves import plan_queue_moves
from llmfleet.policies.capacity.queues import HeldQueue, make_hold_queue
from llmfleet.policies.capacity.saturation import Saturation
from llmfleet.policies.capacity.vtc_fair import FairQueue, weighted_tokens
from llmfleet.spec.defaults import BINDINGS  # the binding modes, defined with the spec's defaults

__all__ = [
    "BINDINGS",
    "DEFAULT_COLD_START_CAP_S",
    "FairQueue",
    "HeldQueue",
    "HoldQueue",
    "Saturation",
    "Unplaceable",
    "cold_start_timeout_s",
    "make_hold_queue",
    "plan_queue_moves",
    "unplaceable",
    "weighted_tokens",
]

"""A request's priority: its own (bounded by what its API key allows) or its service's.

A higher priority leaves the hold queue first and is refused last under overload (admission displaces
a held request of a lower priority before it refuses one of a higher). A negative priority is
*sheddable*: held for capacity, such a request is dropped before it waits past its service's TTFT SLO
(as llm-d's flow control treats negative priorities). Priorities lie in [``MIN_PRIORITY``,
``MAX_PRIORITY``], which also bounds the ``priority`` label of the scheduler's per-key metrics."""

from __future__ import annotations

MIN_PRIORITY = -10
MAX_PRIORITY = 10
DEFAULT_KEY_MAX_PRIORITY = 0  # an API key without max_priority may not ask above 0 (or its service's)


def sheddable(priority: int) -> bool:
    """A request of ``priority`` may be dropped from the hold queue before its TTFT SLO."""
    return priority < 0


def request_priority(asked: int | None, service_priority: int, key_max: int | None) -> int:
    """The priority a request runs at: ``asked`` (None: the service's), checked against the range and
    ``key_max`` (None: no key; a key may always ask for its service's own priority). ValueError says
    why, for the field ``priority``."""
    if asked is None:
        return service_priority
    if not MIN_PRIORITY <= asked <= MAX_PRIORITY:
        raise ValueError(f"must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {asked}")
    if key_max is not None and asked > max(key_max, service_priority):
        raise ValueError(f"{asked} is above what the API key allows ({max(key_max, service_priority)})")
    return asked

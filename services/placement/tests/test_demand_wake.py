"""The placement servicer wakes the leader's loop for requests waiting for capacity: every
report while a service has cold requests (no engine hosts its model), and once when a scheduler starts
holding a service's requests (every engine saturated), not again while that queue lasts."""

from __future__ import annotations

from llmfleet.monitor import ServiceStats
from llmfleet_placement.servicer import DemandWake


def test_cold_wakes_every_time_a_held_queue_only_when_it_starts() -> None:
    s = DemandWake()
    quiet = [ServiceStats("chat")]
    assert not s.wakes("sched-a", quiet)
    assert s.wakes("sched-a", [ServiceStats("chat", queued=40, held=30)])  # a queue starts
    assert not s.wakes("sched-a", [ServiceStats("chat", queued=50, held=35)])  # it lasts
    assert s.wakes("sched-b", [ServiceStats("chat", queued=5, held=5)])  # another scheduler's starts
    assert not s.wakes("sched-a", quiet)  # drained
    assert s.wakes("sched-a", [ServiceStats("qa", queued=3, held=3, cold=3)])
    assert s.wakes("sched-a", [ServiceStats("qa", queued=3, held=3, cold=3)])  # cold: every report

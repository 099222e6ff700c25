"""The emulated engine's step pacing rule (``StepPacer``): steps back to back on the modelled clock
while work waits, real time after the engine idles, and catch-up bounded when the host falls behind."""

from __future__ import annotations

import pytest
from llmfleet_engine.emulated.clock import Lag, LagCollector
from llmfleet_engine.emulated.pacing import StepPacer


def test_the_first_step_starts_now():
    pacer = StepPacer(Lag())
    assert pacer.start(now=10.0, ready=9.99) == 10.0


def test_a_step_whose_work_was_waiting_starts_at_the_previous_due_time():
    lag = Lag()
    pacer = StepPacer(lag)
    due = pacer.begin(pacer.start(now=1.0, ready=1.0), 0.020)
    pacer.ended(now=1.021, busy=True)
    # the host spends 3 ms between the due time and scheduling the next step: the step still starts at
    # the due time, so the host's time overlaps the modelled step instead of adding to it
    assert pacer.start(now=1.023, ready=0.5) == due
    assert lag.host_steps == 1
    assert lag.host_s == pytest.approx(0.003)
    assert lag.slips == 0


def test_a_busy_step_of_only_later_arrivals_starts_at_the_earliest_of_them():
    lag = Lag()
    pacer = StepPacer(lag)
    pacer.begin(1.0, 0.020)
    pacer.ended(now=1.021, busy=True)  # a request arrived as the step completed
    assert pacer.start(now=1.023, ready=1.0205) == 1.0205
    assert lag.host_steps == 0


def test_after_idling_a_fresh_arrival_dates_the_step():
    pacer = StepPacer(Lag())
    due = pacer.begin(1.0, 0.020)
    pacer.ended(now=due + 0.001, busy=False)
    # the engine waited 5 s for work; the request arrived at 6.0 and the worker woke 1 ms later
    assert pacer.start(now=6.001, ready=6.0) == 6.0


def test_after_idling_an_older_arrival_does_not_pull_the_clock_back():
    lag = Lag()
    pacer = StepPacer(lag)
    due = pacer.begin(1.0, 0.020)
    pacer.ended(now=due + 0.001, busy=False)
    # a request migrated in with its age: its arrival predates the idle period and the old due time
    assert pacer.start(now=60.0, ready=0.5) == 60.0
    # one whose age reaches back past the catch-up bound, though after the engine went idle
    assert pacer.start(now=60.0, ready=30.0) == 60.0
    assert (lag.host_steps, lag.slips) == (0, 0)  # neither is the host falling behind


def test_the_clock_restarts_when_no_step_could_run():
    pacer = StepPacer(Lag())
    pacer.begin(1.0, 0.020)
    pacer.ended(now=1.021, busy=True)
    pacer.restart()
    assert pacer.due is None
    assert pacer.start(now=3.0, ready=1.5) == 3.0


def test_catch_up_is_bounded_and_the_slip_is_recorded():
    lag = Lag()
    pacer = StepPacer(lag, max_catchup_s=0.25)
    pacer.begin(1.0, 0.020)
    pacer.ended(now=1.021, busy=True)
    # the host stalled for 2 s with work waiting: the step starts 0.25 s back, not at the due time
    assert pacer.start(now=3.02, ready=0.9) == pytest.approx(2.77)
    assert lag.slips == 1
    assert lag.slip_s == pytest.approx(2.0 - 0.25)
    assert lag.host_s == pytest.approx(2.0)


def test_an_overloaded_host_never_runs_further_behind_than_the_bound():
    """Host time per step (30 ms) above the step's modelled time (20 ms): steps run with no sleep, the
    modelled clock falls behind until the bound, then slips every step; both are counted."""
    lag = Lag()
    pacer = StepPacer(lag, max_catchup_s=0.1)
    now, behind = 0.0, []
    for _ in range(100):
        start = pacer.start(now, ready=0.0)
        behind.append(now - start)
        due = pacer.begin(start, 0.020)
        now = max(now, due)  # sleep until the due time, if it is still ahead
        pacer.ended(now, busy=True)
        now += 0.030  # the host's own time before the next step is scheduled
    assert max(behind) == pytest.approx(0.1)
    assert lag.slips > 80  # each drops the 10 ms the host added beyond the modelled step
    assert lag.slip_s == pytest.approx(0.010 * lag.slips, abs=0.011)
    assert lag.host_steps == 99


def test_a_host_that_keeps_up_never_slips():
    lag = Lag()
    pacer = StepPacer(lag, max_catchup_s=0.1)
    now = 0.0
    first = pacer.start(now, ready=0.0)
    due = first
    for _ in range(50):
        due = pacer.begin(pacer.start(now, ready=0.0), 0.020)
        now = max(now, due) + 0.004  # 4 ms of host time per step, hidden under the next step
        pacer.ended(now - 0.004, busy=True)
    assert due - first == pytest.approx(50 * 0.020)  # back to back on the modelled clock
    assert lag.slips == 0
    assert lag.host_s == pytest.approx(49 * 0.004)


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError):
        StepPacer(Lag(), max_catchup_s=-1.0)


def test_the_slip_is_exported():
    lag = Lag()
    lag.record_slip(0.5)
    lag.record_slip(0.25)
    got = {m.name: m.samples[0].value for m in LagCollector(lag).collect()}
    assert got["llmfleet_emulated_slips"] == 2
    assert got["llmfleet_emulated_slip_seconds"] == pytest.approx(0.75)

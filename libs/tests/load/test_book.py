"""LoadBook: an engine's last load report plus the requests dispatched to it since."""

from __future__ import annotations

from collections import Counter

from llmfleet.load import LoadBook, LoadReport
from llmfleet.policies.dispatch import JoinShortestQueue, LeastLoaded

M = "m"


def cands(book: LoadBook, *ids: str, capacity: int = 0):
    return [book.candidate(e, (M,), capacity) for e in ids]


def test_a_burst_spreads_before_the_next_report():
    """e0 reports 4 running, e1 0: 100 concurrent requests under JSQ fill e1 up to 4, then alternate."""
    book = LoadBook()
    book.report("e0", LoadReport(running=4))
    book.report("e1", LoadReport())
    jsq = JoinShortestQueue()
    sent = Counter()
    for i in range(100):
        e = jsq.choose(M, cands(book, "e0", "e1"))
        book.dispatched(e, f"r{i}")
        sent[e] += 1
    assert sent == {"e1": 52, "e0": 48}  # 4 + 48 == 0 + 52: level queues
    assert [c.queued for c in cands(book, "e0", "e1")] == [52, 52]


def test_zero_load_candidates_would_pile_onto_the_first_engine():
    """The problem the book solves: without load, JSQ picks by engine id."""
    jsq = JoinShortestQueue()
    book = LoadBook()
    assert {jsq.choose(M, cands(book, "e0", "e1")) for _ in range(10)} == {"e0"}


def test_a_request_is_covered_by_the_second_report_after_it_was_sent():
    book = LoadBook()
    book.report("e", LoadReport(running=1))
    book.dispatched("e", "a")
    assert book.candidate("e", (M,)).queued == 2
    book.report("e", LoadReport(running=1))  # may predate a's arrival at the engine: still pending
    assert book.pending("e") == 1 and book.candidate("e", (M,)).queued == 2
    book.dispatched("e", "b")
    book.report("e", LoadReport(running=2, waiting=1))  # the second report after a: covers a, not b
    assert book.pending("e") == 1
    c = book.candidate("e", (M,))
    assert (c.running, c.waiting) == (2, 2)
    book.report("e", LoadReport(running=3))
    assert book.pending("e") == 0 and book.candidate("e", (M,)).queued == 3


def test_released_drops_a_pending_request_at_once_and_ignores_the_rest():
    book = LoadBook()
    book.dispatched("e", "a", kv_bytes=100)
    book.dispatched("e", "b", kv_bytes=50)
    book.released("e", "a")
    c = book.candidate("e", (M,))
    assert (c.queued, c.kv_used_bytes) == (1, 50)
    book.released("e", "a")  # again: no-op
    book.released("e", "zzz")
    book.released("other", "b")  # another engine: no-op
    assert book.pending("e") == 1
    book.report("e", LoadReport(running=1, kv_used_bytes=60))
    book.report("e", LoadReport(running=1, kv_used_bytes=60))  # covers b
    book.released("e", "b")  # covered: the report counts it until the next one
    c = book.candidate("e", (M,))
    assert (c.queued, c.kv_used_bytes) == (1, 60)


def test_without_reports_the_load_is_what_this_dispatcher_has_outstanding():
    book = LoadBook()
    for i in range(3):
        book.dispatched("e", f"r{i}")
    c = book.candidate("e", (M,), kv_capacity_bytes=1000)
    assert (c.running, c.waiting, c.kv_capacity_bytes) == (0, 3, 1000)
    book.released("e", "r1")
    assert book.candidate("e", (M,)).queued == 2


def test_dispatching_again_restamps_and_does_not_double_count():
    book = LoadBook()
    book.dispatched("e", "a", kv_bytes=10)
    book.report("e", LoadReport())
    book.dispatched("e", "a", kv_bytes=30)  # sent again (after a failure or a migration back)
    book.report("e", LoadReport())  # second report after the first send, first after the second
    c = book.candidate("e", (M,))
    assert (book.pending("e"), c.kv_used_bytes) == (1, 30)
    book.report("e", LoadReport())
    assert book.pending("e") == 0


def test_kv_pending_capacity_and_bytes_per_token():
    book = LoadBook()
    assert book.kv_bytes_per_token(M) == 0.0
    book.report("e0", LoadReport(1, 0, 1000, 10_000, {M: 512.0}))
    book.report("e1", LoadReport(0, 0, 0, 0))  # capacity unknown in the report: the fallback is used
    assert book.kv_bytes_per_token(M) == 512.0
    book.dispatched("e1", "a", kv_bytes=2048)
    c0, c1 = cands(book, "e0", "e1", capacity=8000)
    assert (c0.kv_used_bytes, c0.kv_capacity_bytes) == (1000, 10_000)
    assert (c1.kv_used_bytes, c1.kv_capacity_bytes) == (2048, 8000)
    # least_loaded: 1000/10000 = 0.1 < 2048/8000 = 0.256
    assert LeastLoaded().choose(M, [c0, c1]) == "e0"
    book.dispatched("e1", "neg", kv_bytes=-5)  # clamped at 0
    assert book.candidate("e1", (M,)).kv_used_bytes == 2048


def test_engines_that_leave_are_forgotten():
    book = LoadBook()
    book.report("e0", LoadReport(running=5))
    book.dispatched("e1", "a")
    book.dispatched("e2", "b")
    book.forget("e0")
    assert book.last_report("e0") is None and book.candidate("e0", (M,)).queued == 0
    book.retain(["e2"])
    assert book.pending("e1") == 0 and book.pending("e2") == 1


def test_progress_rides_on_candidates_that_ask_for_it_until_released():
    """What the relay measured of each request decoding on an engine (Aladdin's constraint (d))."""
    from llmfleet.policies.dispatch import RequestProgress

    book = LoadBook()
    assert book.candidate("e", ("m",)).requests is None
    assert book.candidate("e", ("m",), with_progress=True).requests == ()
    book.dispatched("e", "r1", 100)
    book.progress("e", "r1", "m", 1, 10.0)
    book.progress("e", "r1", "m", 5, 10.0)  # later tokens replace the earlier count
    book.dispatched("e", "r2", 100)
    book.progress("e", "r2", "m", 3, 11.0)
    c = book.candidate("e", ("m",), with_progress=True)
    assert set(c.requests) == {RequestProgress("r1", "m", 5, 10.0), RequestProgress("r2", "m", 3, 11.0)}
    assert book.candidate("e", ("m",)).requests is None  # not asked: not built
    book.report("e", LoadReport(running=2))
    book.released("e", "r1")  # finished or migrated away: no longer ongoing here
    assert book.candidate("e", ("m",), with_progress=True).requests == (RequestProgress("r2", "m", 3, 11.0),)
    book.forget("e")
    assert book.candidate("e", ("m",), with_progress=True).requests == ()


def test_occupancy_counts_a_pending_request_once_when_the_report_names_it() -> None:
    from llmfleet.load.book import LoadBook, LoadReport

    book = LoadBook()
    book.report("e", LoadReport(running=3, waiting=0))
    book.dispatched("e", "a")
    book.dispatched("e", "b")
    assert book.occupancy("e") == 5  # the report predates both
    book.report("e", LoadReport(running=4, waiting=0, request_ids=frozenset({"x", "y", "z", "a"})))
    assert book.candidate("e", ("m",)).queued == 5  # "a" once: the report names it
    assert book.occupancy("e") == 5  # "a" is in the report; "b" is not yet
    book.released("e", "b")
    assert book.occupancy("e") == 4 and book.occupancy("unknown") == 0


def test_occupancy_leaves_out_a_request_that_ended_since_the_report_named_it() -> None:
    from llmfleet.load.book import LoadBook, LoadReport

    book = LoadBook()
    book.report("e", LoadReport(running=2, waiting=1, request_ids=frozenset({"x", "y", "z"})))
    book.released("e", "x")  # ended: its slot is free now, not at the next report
    book.released("e", "other")  # not named: nothing to leave out
    assert book.occupancy("e") == 2
    c = book.candidate("e", ("m",))
    assert (c.running, c.waiting) == (1, 1)  # the candidate leaves it out at once too
    book.dispatched("e", "x")  # sent again (a resumed stream): counted again
    assert book.occupancy("e") == 3
    book.report("e", LoadReport(running=1, waiting=0, request_ids=frozenset({"y"})))
    book.released("e", "y")
    assert book.occupancy("e") == 0 + 1  # y ended; x is pending, not in this report


def test_candidates_see_ends_and_sends_between_reports_as_occupancy_does() -> None:
    """Between two reports a candidate's queue is the report less what ended plus what was sent and is
    not named, whatever the order of events; ends beyond the running requests come off the waiting."""
    book = LoadBook()
    book.report("e", LoadReport(running=2, waiting=2, request_ids=frozenset({"a", "b", "c", "d"})))
    book.dispatched("e", "c")  # re-sent while the report names it: counted once
    book.dispatched("e", "x")
    assert book.candidate("e", (M,)).queued == book.occupancy("e") == 5
    for rid in ("a", "b", "c"):  # c ends while pending: dropped from pending and from the report
        book.released("e", rid)
    c = book.candidate("e", (M,))
    assert (c.running, c.waiting) == (0, 2) and c.queued == book.occupancy("e")  # d waiting, x pending
    book.report("e", LoadReport(running=1, waiting=0, request_ids=frozenset({"x"})))  # x admitted
    assert book.pending("e") == 1 and book.candidate("e", (M,)).queued == book.occupancy("e") == 1
    book.dispatched("e", "y")
    book.released("e", "x")  # named and pending: out of both
    assert book.candidate("e", (M,)).queued == book.occupancy("e") == 1


def test_a_pending_request_the_report_names_has_its_kv_counted_by_the_report_only() -> None:
    """Until covered, a request the report names counts its KV in the report, not again as pending;
    the pending KV of requests the report does not name stays, in any order of events."""
    book = LoadBook()
    book.report("e", LoadReport(running=1, kv_used_bytes=100, request_ids=frozenset({"a"})))
    book.dispatched("e", "b", kv_bytes=40)
    book.dispatched("e", "c", kv_bytes=25)
    assert book.candidate("e", (M,)).kv_used_bytes == 165
    # b admitted: the next report counts its KV; c still in flight
    book.report("e", LoadReport(running=2, kv_used_bytes=140, request_ids=frozenset({"a", "b"})))
    assert (book.pending("e"), book.candidate("e", (M,)).kv_used_bytes) == (2, 165)
    book.dispatched("e", "b", kv_bytes=50)  # re-sent while named: still counted by the report
    assert book.candidate("e", (M,)).kv_used_bytes == 165
    book.released("e", "b")
    book.released("e", "c")
    assert (book.pending("e"), book.candidate("e", (M,)).kv_used_bytes) == (0, 140)
    book.dispatched("e", "d", kv_bytes=7)  # a report that names nobody counts no pending KV twice
    book.report("e", LoadReport(running=1, kv_used_bytes=100))
    assert book.candidate("e", (M,)).kv_used_bytes == 107

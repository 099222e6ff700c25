"""``LoadBook.placed``: the requests an engine holds as ``occupancy`` counts them."""

from __future__ import annotations

from llmfleet.load import LoadBook, LoadReport


def test_placed_is_the_report_less_the_ended_plus_the_pending() -> None:
    book = LoadBook()
    assert book.placed("e0") == []
    book.report("e0", LoadReport(running=2, request_ids=frozenset({"a", "b"})))
    book.dispatched("e0", "c")
    book.dispatched("e0", "a")  # named by the report already: counted once
    book.released("e0", "b")
    assert sorted(book.placed("e0")) == ["a", "c"]
    assert len(book.placed("e0")) == book.occupancy("e0")

"""The prefix index's compact table (per-block arrays and an intrusive LRU list) names, parks, claims,
touches, evicts and forgets blocks exactly as the plain reference does (a dict per direction and an
``OrderedDict`` of idle blocks), over random sequences of the operations the allocator makes."""

from __future__ import annotations

from collections import Counter, OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st
from llmfleet.kvblocks.prefix import PrefixIndex

N = 48  # blocks
OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "park", "claim", "evict", "touch", "drop"]),
        st.integers(0, N - 1),
        st.integers(0, 80),
        st.sampled_from(["a", "b"]),
    ),
    max_size=250,
)


class Reference:
    """The index as plain dicts: hash -> block, block -> hash, idle block -> model in LRU order."""

    def __init__(self) -> None:
        self.by_hash: dict[int, int] = {}
        self.of_block: dict[int, int] = {}
        self.idle: OrderedDict[int, str] = OrderedDict()

    def forget(self, block: int) -> None:
        del self.idle[block]
        del self.by_hash[self.of_block.pop(block)]


def step(idx: PrefixIndex, ref: Reference, op: str, block: int, h: int, model: str) -> None:
    if op == "add":
        expected = block not in ref.of_block and h not in ref.by_hash
        if expected:
            ref.by_hash[h] = block
            ref.of_block[block] = h
        assert idx.add(block, h) == expected
    elif op == "park" and block not in ref.idle:  # the allocator parks the blocks a sequence lets go
        expected = block in ref.of_block
        if expected:
            ref.idle[block] = model
        assert idx.park(block, model) == expected
    elif op == "claim":
        expected = block in ref.idle
        if expected:
            del ref.idle[block]
        assert idx.claim(block) == expected
    elif op == "evict" and ref.idle:
        oldest = next(iter(ref.idle))
        ref.forget(oldest)
        assert idx.evict() == oldest
    elif op == "touch":
        hashes = [*list(ref.by_hash)[h % (len(ref.by_hash) + 1) :][:4], -1 - h]  # a miss ends the prefix
        moved = 0
        for x in reversed(hashes[:-1]):
            b = ref.by_hash[x]
            if b in ref.idle:
                ref.idle.move_to_end(b)
                moved += 1
        assert idx.touch(hashes) == moved
    elif op == "drop":
        dropped = [b for b, m in ref.idle.items() if m == model]
        for b in dropped:
            ref.forget(b)
        assert idx.drop_model(model) == dropped


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_compact_index_behaves_as_the_reference(ops):
    idx, ref = PrefixIndex(N), Reference()
    for op in ops:
        step(idx, ref, *op)
        assert len(idx) == len(ref.by_hash) and idx.idle_count == len(ref.idle)
        assert idx.idle_by_model == dict(Counter(ref.idle.values()))
        assert [b for b in range(N) if idx.is_idle(b)] == sorted(ref.idle)
        assert idx.match(list(ref.by_hash)) == len(ref.by_hash)
    assert [idx.evict() for _ in range(len(ref.idle))] == list(ref.idle)  # the whole LRU order
    assert idx.idle_count == 0

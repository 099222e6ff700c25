"""Property tests: random interleavings of every allocator operation over 3 models in one small pool.

The machine keeps a reference model of each sequence's token contents and a fake byte store keyed by
``(block, offset)``: every token written lands at its slot, every fork performs the copies the
allocator returns. After every step each live token must read back its own value (so no two sequences
can share a slot unless they share the contents through a fork), and the block accounting must add up.
The machine's reference model also records which sequences are live and which model each belongs to;
the pool's free list (and the order it hands blocks out in) is read through the public API by letting
a copy of the pool allocate every free block (``free_order``).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from llmfleet.kvblocks import (
    BlockAllocator,
    DuplicateSequence,
    KvShape,
    ModelInUse,
    OutOfBlocks,
    ShapeMismatch,
    UnknownModel,
)
from pool_helpers import free_order

BB = 2048
SHAPES = {
    "m0": KvShape(2, 2, 16, "float32"),  # 512 B/token → T = 4, no tail
    "m1": KvShape(3, 1, 32, "float16"),  # 384 B/token → T = 5, 128 B tail
    "m2": KvShape(3, 2, 32, "float32"),  # 1536 B/token → T = 1, 512 B tail
}
OTHER = {"m0": SHAPES["m1"], "m1": SHAPES["m2"], "m2": SHAPES["m0"]}
NAMES = sorted(SHAPES)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PoolMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(1, 24),
        watermark=st.sampled_from([0.0, 0.1, 0.25]),
        preregistered=st.sets(st.sampled_from(NAMES), min_size=1),
    )
    def setup(self, num_blocks: int, watermark: float, preregistered: set[str]) -> None:
        self.a = BlockAllocator(num_blocks, BB, watermark=watermark)
        for name in sorted(preregistered):
            self.a.register_model(name, SHAPES[name])
        self.content: dict[str, list[int]] = {}  # live seq → token values (reference model)
        self.model_of: dict[str, str] = {}  # live seq → its model (reference model)
        self.store: dict[tuple[int, int], int] = {}  # the fake KV bytes
        self.next_value = 0
        self.next_seq = 0

    # ---------------------------------------------------------------------------------- helpers
    def fresh_seq(self) -> str:
        self.next_seq += 1
        return f"s{self.next_seq}"

    def write(self, seq: str, slots) -> None:
        for slot in slots:
            self.next_value += 1
            self.store[slot] = self.next_value
            self.content[seq].append(self.next_value)

    def pick(self, data) -> str:
        return data.draw(st.sampled_from(sorted(self.content)), label="seq")

    def state(self):
        """Everything observable about the pool; the ids are all that were ever handed out."""
        a = self.a
        ids = [f"s{i}" for i in range(1, self.next_seq + 1)]
        return (
            free_order(a),
            len(a),
            {s: a.table(s) if s in a else None for s in ids},
            [a.block_refcount(b) for b in range(a.num_blocks)],
            a.stats(),
        )

    def registered(self, name: str) -> bool:
        return name in self.a.models()

    # ---------------------------------------------------------------------------------- models
    @rule(name=st.sampled_from(NAMES), conflicting=st.booleans())
    def register(self, name: str, conflicting: bool) -> None:
        shape = OTHER[name] if conflicting else SHAPES[name]
        current = self.a.models().get(name)
        if current is not None and current != shape:
            with pytest.raises(ShapeMismatch):
                self.a.register_model(name, shape)
            return
        assert self.a.register_model(name, shape) == shape.tokens_per_block(BB)
        assert self.a.models()[name] == shape

    @rule(name=st.sampled_from(NAMES))
    def unregister(self, name: str) -> None:
        if not self.registered(name):
            with pytest.raises(UnknownModel):
                self.a.unregister_model(name)
        elif name in self.model_of.values():
            with pytest.raises(ModelInUse):
                self.a.unregister_model(name)
        else:
            self.a.unregister_model(name)
            assert name not in self.a.models()

    # ---------------------------------------------------------------------------------- sequences
    @rule(data=st.data(), n=st.integers(0, 30), importing=st.booleans(), wrong=st.booleans())
    def allocate(self, data, n: int, importing: bool, wrong: bool) -> None:
        a = self.a
        # Mostly a registered model (an unknown one now and then).
        name = data.draw(st.sampled_from(sorted(a.models()) * 4 + NAMES), label="model")
        seq = self.fresh_seq()
        before = self.state()
        if not self.registered(name):
            with pytest.raises(UnknownModel):
                a.allocate(seq, name, n)
            assert self.state() == before
            return
        shape = a.models()[name]
        needed = ceil_div(n, a.tokens_per_block(name))
        free = a.free_blocks
        assert a.can_allocate(name, n) == (free - needed >= a.watermark_blocks)
        assert a.can_allocate(name, n, ignore_watermark=True) == (needed <= free)

        def call():
            if importing:
                return a.reserve_import(seq, name, OTHER[name] if wrong else shape, n)
            return a.allocate(seq, name, n)

        if importing and wrong and OTHER[name] != shape:
            with pytest.raises(ShapeMismatch):
                call()
            assert self.state() == before
            return
        if needed > free:
            with pytest.raises(OutOfBlocks) as e:
                call()
            assert (e.value.needed, e.value.free) == (needed, free)
            assert self.state() == before
            return
        order = free_order(a)
        table = call()
        assert table.num_tokens == n and len(table.blocks) == needed and table.model == name
        assert list(table.blocks) == order[:needed]  # taken from the free list, next ones first
        self.content[seq] = []
        self.model_of[seq] = name
        self.write(seq, a.slots(seq, 0, n))

    @precondition(lambda self: self.content)
    @rule(data=st.data())
    def duplicate_allocate(self, data) -> None:
        seq = self.pick(data)
        before = self.state()
        with pytest.raises(DuplicateSequence):
            self.a.allocate(seq, self.model_of[seq], 1)
        assert self.state() == before

    @precondition(lambda self: self.content)
    @rule(data=st.data(), steps=st.integers(1, 8))
    def decode(self, data, steps: int) -> None:
        """``steps`` decode iterations of one sequence: one ``append_slot`` each."""
        a = self.a
        seq = self.pick(data)
        for _ in range(steps):
            t = a.table(seq)
            grows = t.num_tokens % t.tokens_per_block == 0
            assert a.blocks_needed_to_grow_each([seq], 1) == int(grows)
            if grows and a.free_blocks == 0:
                before = self.state()
                with pytest.raises(OutOfBlocks) as e:
                    a.append_slot(seq)
                assert (e.value.needed, e.value.free) == (1, 0)
                assert self.state() == before
                return
            order = free_order(a)
            slot = a.append_slot(seq)
            assert slot.offset == t.num_tokens % t.tokens_per_block
            assert slot.block == (order[0] if grows else t.blocks[-1])
            self.write(seq, [slot])

    @precondition(lambda self: self.content)
    @rule(data=st.data(), n=st.integers(0, 12))
    def grow_each(self, data, n: int) -> None:
        """``n`` more tokens for one or several sequences at once (a prefill chunk, or a batched
        decode run): all or nothing, then the new tokens are written at their ``slots``."""
        a = self.a
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.content)), min_size=1, max_size=3, unique=True))
        tables = {seq: a.table(seq) for seq in seqs}
        needs = [ceil_div(t.num_tokens + n, t.tokens_per_block) - len(t.blocks) for t in tables.values()]
        needed = sum(needs)
        assert a.blocks_needed_to_grow_each(seqs, n) == needed
        if needed > a.free_blocks:
            before = self.state()
            with pytest.raises(OutOfBlocks) as e:
                a.grow_each(seqs, n)
            assert (e.value.needed, e.value.free) == (needed, a.free_blocks)
            assert self.state() == before
            return
        order = free_order(a)
        assert a.grow_each(seqs, n) == needed
        new_blocks = []
        for seq, t in tables.items():
            after = a.table(seq)
            assert after.num_tokens == t.num_tokens + n and after.blocks[: len(t.blocks)] == t.blocks
            new_blocks += after.blocks[len(t.blocks) :]
            slots = a.slots(seq, t.num_tokens, t.num_tokens + n)
            assert len(slots) == n
            self.write(seq, slots)
        assert new_blocks == order[:needed]  # taken from the free list, in the order of ``seqs``

    @precondition(lambda self: self.content)
    @rule(data=st.data())
    def fork(self, data) -> None:
        a = self.a
        src = self.pick(data)
        t = a.table(src)
        partial = t.num_tokens % t.tokens_per_block != 0
        dst = self.fresh_seq()
        if partial and a.free_blocks == 0:
            before = self.state()
            with pytest.raises(OutOfBlocks):
                a.fork(src, dst)
            assert self.state() == before
            return
        copies = a.fork(src, dst)
        assert len(copies) == int(partial)
        for s_block, d_block in copies:  # what the storage does: copy the whole block
            assert s_block == t.blocks[-1] and a.block_refcount(d_block) == 1
            for off in range(t.tokens_per_block):
                if (s_block, off) in self.store:
                    self.store[(d_block, off)] = self.store[(s_block, off)]
        self.content[dst] = list(self.content[src])
        self.model_of[dst] = self.model_of[src]

    @precondition(lambda self: self.content)
    @rule(data=st.data())
    def free(self, data) -> None:
        a = self.a
        seq = self.pick(data)
        blocks = a.table(seq).blocks
        expected = sum(a.block_refcount(b) == 1 for b in blocks)
        free_before = a.free_blocks
        assert a.free(seq) == expected
        assert a.free_blocks == free_before + expected
        del self.content[seq]
        del self.model_of[seq]
        assert seq not in a
        with pytest.raises(KeyError):
            a.table(seq)

    @precondition(lambda self: self.content)
    @rule(data=st.data(), chunk=st.integers(1, 9))
    def read_in_chunks(self, data, chunk: int) -> None:
        """What a migration export does: read the slots of ``[0, n)`` in chunks of ``chunk`` tokens."""
        seq = self.pick(data)
        n = self.a.num_tokens(seq)
        parts = [self.a.slots(seq, s, min(s + chunk, n)) for s in range(0, n, chunk)]
        assert all(0 < len(p) <= chunk for p in parts)
        assert [slot for p in parts for slot in p] == self.a.slots(seq, 0, n)

    @rule()
    def free_everything(self) -> None:
        for seq in list(self.content):
            self.a.free(seq)
            del self.content[seq]
            del self.model_of[seq]
        self.check_empty()

    def check_empty(self) -> None:
        a = self.a
        assert a.free_blocks == a.num_blocks and a.used_blocks == 0 and len(a) == 0
        assert sorted(free_order(a)) == list(range(a.num_blocks))
        assert all(a.block_refcount(b) == 0 for b in range(a.num_blocks))
        s = a.stats()
        assert s.internal_fragmentation_bytes == 0 and s.fragmentation == 0 and s.utilization == 0
        assert all(u.blocks == u.tokens == u.sequences == u.token_capacity == 0 for u in s.models.values())

    def teardown(self) -> None:
        if hasattr(self, "a"):
            self.free_everything()

    # ---------------------------------------------------------------------------------- invariants
    @invariant()
    def accounting_adds_up(self) -> None:
        a = self.a
        free_ids = free_order(a)
        assert len(free_ids) == len(set(free_ids)) == a.free_blocks
        assert a.free_blocks + a.used_blocks == a.num_blocks
        # The live sequences are exactly the reference model's (same count, and each one is live).
        assert len(a) == len(self.content) == len(self.model_of)
        assert all(seq in a for seq in self.content)

        owners: Counter[int] = Counter()
        model_blocks: dict[str, set[int]] = {name: set() for name in a.models()}
        fill: dict[int, int] = {}  # tokens stored in each physical block
        for seq in self.content:
            t = a.table(seq)
            assert t.model == self.model_of[seq]
            assert t.num_tokens == len(self.content[seq]) == a.num_tokens(seq)
            assert len(t.blocks) == ceil_div(t.num_tokens, t.tokens_per_block)
            assert len(set(t.blocks)) == len(t.blocks)
            assert t.tokens_per_block == a.tokens_per_block(t.model)
            owners.update(t.blocks)
            model_blocks[t.model].update(t.blocks)
            for i, b in enumerate(t.blocks):
                f = min(t.tokens_per_block, t.num_tokens - i * t.tokens_per_block)
                assert fill.setdefault(b, f) == f  # sharers agree on the block's contents
        # Refcount == number of owners; owned blocks are not free; free blocks have no owner.
        for b in range(a.num_blocks):
            assert a.block_refcount(b) == owners[b]
        assert set(free_ids).isdisjoint(owners) and len(owners) == a.used_blocks
        # A block belongs to one model; a shared block is full.
        assert sum(len(bs) for bs in model_blocks.values()) == a.used_blocks
        shapes = a.models()
        for name, bs in model_blocks.items():
            tpb = shapes[name].tokens_per_block(BB)
            assert all(fill[b] == tpb for b in bs if owners[b] > 1)

        s = a.stats()
        assert (s.total_blocks, s.free_blocks, s.used_blocks) == (a.num_blocks, a.free_blocks, a.used_blocks)
        assert set(s.models) == set(shapes)
        assert sum(u.blocks for u in s.models.values()) == s.used_blocks
        assert sum(u.sequences for u in s.models.values()) == s.num_sequences == len(self.content)
        frag = 0
        for name, u in s.models.items():
            bs = model_blocks[name]
            tpb = shapes[name].tokens_per_block(BB)
            assert u.blocks == len(bs) and u.token_capacity == len(bs) * tpb
            assert u.tokens == sum(fill[b] for b in bs)
            assert u.sequences == sum(m == name for m in self.model_of.values())
            frag += sum(BB - fill[b] * shapes[name].bytes_per_token for b in bs)
        assert s.internal_fragmentation_bytes == frag
        assert s.fragmentation == (frag / (s.used_blocks * BB) if s.used_blocks else 0.0)
        assert s.utilization == s.used_blocks / s.total_blocks

    @invariant()
    def every_token_reads_back_its_own_value(self) -> None:
        a = self.a
        holders: dict[tuple[int, int], set[int]] = {}
        for seq, values in self.content.items():
            slots = a.slots(seq, 0, len(values))
            for pos, (slot, value) in enumerate(zip(slots, values, strict=True)):
                assert self.store[slot] == value, (seq, pos, slot)
                assert a.slot_of(seq, pos) == slot
                holders.setdefault(slot, set()).add(pos)
        # A slot held by several sequences is the same position of a forked prefix.
        assert all(len(ps) == 1 for ps in holders.values())


PoolMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pool_state_machine = PoolMachine.TestCase

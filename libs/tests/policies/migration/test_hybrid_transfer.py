from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llmfleet.policies.migration.base import Migration, TransferBudget, TransferPlanner
from llmfleet.policies.migration.hybrid_transfer import (
    HybridTransfer,
    KvOnly,
    TokensOnly,
    communication_boundary,
    computation_boundary,
    transfer_order,
)


def mig(mid: str, kv: int, tokens: int, src: str = "g0", dst: str = "g1") -> Migration:
    return Migration(mid, mid, "llama", src, dst, kv_bytes=kv, tokens=tokens)


ONE_LINK = TransferBudget(link_bytes={("g0", "g1"): 100}, prefill_tokens={"g1": 100})


def modes(scheduled: tuple[Migration, ...]) -> dict[str, str]:
    return {m.migration_id: m.mode for m in scheduled}


def test_planners_satisfy_protocol():
    for planner in (HybridTransfer(), HybridTransfer("best", "tokens"), KvOnly(), TokensOnly()):
        assert isinstance(planner, TransferPlanner)


def test_first_fit_defers_where_best_fit_packs():
    # a: first fit takes the link (40 left), best fit the tighter compute bin (5 left);
    # b: then fits only the other bin; c (45 bytes, 3 tokens) fits only best fit's leftovers.
    ms = [mig("c", 45, 3), mig("a", 60, 95), mig("b", 55, 99)]
    ff_sched, ff_def = HybridTransfer("first", "kv").assign(ms, ONE_LINK)
    assert modes(ff_sched) == {"a": "kv", "b": "tokens"}
    assert [m.migration_id for m in ff_def] == ["c"]
    bf_sched, bf_def = HybridTransfer("best", "kv").assign(ms, ONE_LINK)
    assert modes(bf_sched) == {"a": "tokens", "b": "kv", "c": "kv"}
    assert bf_def == ()


def test_prefer_orders_the_bins_and_breaks_best_fit_ties():
    ms = [mig("a", 50, 50)]
    assert modes(HybridTransfer("first", "tokens").assign(ms, ONE_LINK)[0]) == {"a": "tokens"}
    assert modes(HybridTransfer("first", "kv").assign(ms, ONE_LINK)[0]) == {"a": "kv"}
    # equal tightness (0.5 of each bin left): the preferred bin wins
    assert modes(HybridTransfer("best", "tokens").assign(ms, ONE_LINK)[0]) == {"a": "tokens"}
    assert modes(HybridTransfer("best", "kv").assign(ms, ONE_LINK)[0]) == {"a": "kv"}


def test_defers_when_both_bins_are_full():
    ms = [mig("a", 100, 100), mig("b", 90, 100), mig("c", 1, 1)]
    sched, deferred = HybridTransfer().assign(ms, ONE_LINK)
    assert modes(sched) == {"a": "kv", "b": "tokens"}
    assert [m.migration_id for m in deferred] == ["c"]
    assert deferred[0].mode == "kv"  # deferred migrations keep their input


def test_bins_are_per_link_and_per_destination():
    budget = TransferBudget(link_bytes={("g0", "g1"): 10}, default_link_bytes=0, default_prefill_tokens=10)
    ms = [
        mig("a", 10, 10, "g0", "g1"),  # link g0->g1
        mig("b", 10, 10, "g2", "g1"),  # no link budget: compute bin of g1
        mig("c", 10, 10, "g3", "g1"),  # g1's compute bin is full now
        mig("d", 10, 10, "g3", "g4"),  # g4's own compute bin
    ]
    sched, deferred = HybridTransfer().assign(ms, budget)
    assert modes(sched) == {"a": "kv", "b": "tokens", "d": "tokens"}
    assert [m.migration_id for m in deferred] == ["c"]


def test_deterministic_order_independent_of_input_order():
    ms = [mig("b", 50, 10), mig("a", 50, 10), mig("c", 50, 20), mig("d", 70, 1)]
    assert [m.migration_id for m in transfer_order(ms)] == ["d", "c", "a", "b"]
    budget = TransferBudget(default_link_bytes=100, default_prefill_tokens=30)
    first = HybridTransfer().assign(ms, budget)
    for perm in (ms[::-1], ms[1:] + ms[:1], ms[2:] + ms[:2]):
        assert HybridTransfer().assign(perm, budget) == first
    sched, deferred = first
    # d: kv (30 bytes left); c: tokens (10 left); a before b (ids tie-break): tokens (0 left); b: neither
    assert [m.migration_id for m in sched] == ["d", "c", "a"]
    assert modes(sched) == {"d": "kv", "c": "tokens", "a": "tokens"}
    assert [m.migration_id for m in deferred] == ["b"]


def test_zero_tokens_never_go_as_tokens():
    assert HybridTransfer(prefer="tokens").assign([mig("a", 10, 0)], ONE_LINK) == ((mig("a", 10, 0),), ())
    assert TokensOnly().assign([mig("a", 10, 0)], ONE_LINK) == ((), (mig("a", 10, 0),))


def test_kv_only_and_tokens_only_use_one_bin():
    ms = [mig("a", 60, 30), mig("b", 50, 80), mig("c", 40, 60)]
    sched, deferred = KvOnly().assign(ms, ONE_LINK)
    assert modes(sched) == {"a": "kv", "c": "kv"}
    assert [m.migration_id for m in deferred] == ["b"]
    sched, deferred = TokensOnly().assign(ms, ONE_LINK)
    assert modes(sched) == {"a": "tokens", "c": "tokens"}
    assert [m.migration_id for m in deferred] == ["b"]
    assert HybridTransfer().assign(ms, ONE_LINK)[1] == ()  # hybrid fits all three


def test_invalid_arguments():
    with pytest.raises(ValueError):
        # a wrong value on purpose: the check under test
        HybridTransfer(fit="worst")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        # a wrong value on purpose: the check under test
        HybridTransfer(prefer="disk")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        HybridTransfer().assign([mig("a", -1, 0)], ONE_LINK)


def test_communication_boundary():
    assert communication_boundary(10e9, 0.5) == 5e9
    assert communication_boundary(10e9, 0.5, share=0.2) == pytest.approx(1e9)
    with pytest.raises(ValueError):
        communication_boundary(1.0, 1.0, share=1.5)
    with pytest.raises(ValueError):
        communication_boundary(-1.0, 1.0)


def test_computation_boundary_linear_prefill():
    # 1 ms per 100 tokens; steps of 20 ms, slack 0.5 -> chunk 1000 tokens; 50 steps per second
    def linear(t: int) -> float:
        return t * 1e-5

    assert computation_boundary(linear, decode_step_s=0.02, epoch_s=1.0, slack=0.5) == 50 * 1000


def test_computation_boundary_intercept_quadratic_and_cap():
    def fixed_cost(t: int) -> float:
        return 0.004 + t * 1e-6  # 4 ms overhead

    assert computation_boundary(fixed_cost, 0.01, 0.1, slack=0.3) == 0.0  # 3 ms < overhead
    assert computation_boundary(fixed_cost, 0.01, 0.1, slack=0.5) == 10 * 1000

    def quadratic(t: int) -> float:
        return t * t / 2**20

    # 0.5 s steps, slack 0.5: chunks of t² ≤ 2^18, t = 512; 10 steps in a 5 s epoch
    assert computation_boundary(quadratic, 0.5, 5.0, slack=0.5) == 10 * 512

    def free(t: int) -> float:
        return 0.0

    assert computation_boundary(free, 0.01, 0.1, slack=1.0, max_chunk_tokens=300) == 10 * 300
    assert computation_boundary(free, 0.5, 0.4, slack=1.0) == 0.0  # no whole step in the epoch
    with pytest.raises(ValueError):
        computation_boundary(free, 0.0, 1.0, 1.0)


@st.composite
def instances(draw):
    gpus = ["g0", "g1", "g2"]
    n = draw(st.integers(0, 12))
    ms = []
    for i in range(n):
        src, dst = draw(st.permutations(gpus))[:2]
        ms.append(mig(f"m{i}", draw(st.integers(0, 60)), draw(st.integers(0, 60)), src, dst))
    budget = TransferBudget(
        link_bytes={(a, b): draw(st.integers(0, 120)) for a in gpus for b in gpus if a != b},
        prefill_tokens={g: draw(st.integers(0, 120)) for g in gpus},
    )
    return ms, budget


PLANNERS = [
    HybridTransfer("first", "kv"),
    HybridTransfer("first", "tokens"),
    HybridTransfer("best", "kv"),
    HybridTransfer("best", "tokens"),
    KvOnly(),
    TokensOnly(),
]


@settings(max_examples=150, deadline=None)
@given(instances(), st.sampled_from(PLANNERS))
def test_no_bin_exceeded_and_every_migration_accounted_for(case, planner):
    ms, budget = case
    sched, deferred = planner.assign(ms, budget)
    as_mode = {m.migration_id: m for m in ms}
    assert Counter(m.migration_id for m in sched + deferred) == Counter(m.migration_id for m in ms)
    assert all(d == as_mode[d.migration_id] for d in deferred)
    link: Counter = Counter()
    prefill: Counter = Counter()
    for m in sched:
        assert m == replace(as_mode[m.migration_id], mode=m.mode)
        if m.mode == "kv":
            link[(m.source, m.destination)] += m.kv_bytes
        else:
            assert m.tokens > 0
            prefill[m.destination] += m.tokens
    assert all(v <= budget.link(*k) for k, v in link.items())
    assert all(v <= budget.prefill(k) for k, v in prefill.items())
    if isinstance(planner, KvOnly):
        assert all(m.mode == "kv" for m in sched)
    if isinstance(planner, TokensOnly):
        assert all(m.mode == "tokens" for m in sched)
    # bins only shrink, so what was deferred fits neither of its bins' final leftovers either
    for d in deferred:
        kv_ok = (
            not isinstance(planner, TokensOnly)
            and d.kv_bytes <= budget.link(d.source, d.destination) - link[(d.source, d.destination)]
        )
        tok_ok = (
            not isinstance(planner, KvOnly)
            and d.tokens > 0
            and d.tokens <= budget.prefill(d.destination) - prefill[d.destination]
        )
        assert not (kv_ok or tok_ok)

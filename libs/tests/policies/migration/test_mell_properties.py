"""Mell's packer on random epochs: capacity, one place per request, the move cap, and the peak within
4/3 of a lower bound on OPT."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmfleet.policies.migration.base import EpochPlan, GpuState, RequestState
from llmfleet.policies.migration.mell import MAX_MOVES_PER_OP, MellOptions, MellPacker, allocate_target
from mell_helpers import C


def lower_bound(sizes: Sequence[int], cap: int = C) -> int:
    """A lower bound on OPT, the fewest GPUs that hold ``sizes`` now: the fluid bound ⌈ΣS/C⌉ and
    Martello–Toth's L2 (items above C/2 need a GPU each; items of at least α fill what those leave)."""
    best = math.ceil(sum(sizes) / cap)
    for alpha in {0, *(s for s in sizes if 2 * s <= cap)}:
        big = [s for s in sizes if s > cap - alpha]
        mid = [s for s in sizes if cap - alpha >= s and 2 * s > cap]
        small = sum(s for s in sizes if 2 * s <= cap and s >= alpha)
        spare = len(mid) * cap - sum(mid)
        best = max(best, len(big) + len(mid) + max(0, math.ceil((small - spare) / cap)))
    return best


def apply(
    plan: EpochPlan, place: dict[str, dict[str, int]], rng: random.Random | None = None, p: float = 1.0
):
    """Run the plan's migrations in order (each from where its request is). With ``rng``, each runs
    with probability ``p`` and only if its destination has room (an executor deferring some)."""
    for m in plan.migrations:
        assert m.request_id in place[m.source] or rng is not None, f"{m} does not start where its request is"
        size = place[m.source].get(m.request_id)
        if rng is not None and (
            size is None or rng.random() > p or sum(place[m.destination].values()) + size > C
        ):
            continue
        place[m.destination][m.request_id] = place[m.source].pop(m.request_id)


SIZES = st.one_of(st.integers(1, C // 8), st.integers(C // 8, C // 2), st.integers(C // 2, C))
EPOCHS = st.lists(
    st.tuples(st.lists(SIZES, max_size=6), st.integers(0, C // 8), st.integers(0, 2**32 - 1)),
    min_size=1,
    max_size=16,
)


def simulate(
    epochs,
    batching: bool,
    hosts: dict[str, tuple[str, ...]],
    models: Sequence[str],
    executed: float = 1.0,
    fill_first: bool = False,
    compact: bool = False,
) -> dict[str, float]:
    """Random arrivals (dispatched as Allocate would: ``allocate_target`` over the packer's view),
    growth and departures; each plan is checked on the state it plans (all its migrations applied),
    and then ``executed`` of its migrations run (the rest are deferred: the packer sees that)."""
    p = MellPacker(MellOptions(batching=batching, fill_first=fill_first, compact=compact))
    place: dict[str, dict[str, int]] = {g: {} for g in hosts}
    model_of: dict[str, str] = {}
    active: set[str] = set()
    n = 0
    peak_active = peak_lb = peak_fluid = 0
    for arrivals, grow, seed in epochs:
        rng = random.Random(seed)
        for v in place.values():
            for rid in sorted(v):
                if rng.random() < 0.15:
                    del v[rid]  # finished
                else:
                    v[rid] = min(C, v[rid] + rng.randint(0, grow))  # KV grows (engines may overflow)
        for size in arrivals:
            n += 1
            rid, model = f"r{n:03d}", models[n % len(models)]
            states = [state(g, place, model_of, hosts, active) for g in hosts]
            target = allocate_target(p.view(), states, model, size)
            if target is not None:
                place[target][rid] = size
                model_of[rid] = model
        expected = Counter(rid for v in place.values() for rid in v)
        plan = p.epoch([state(g, place, model_of, hosts, active) for g in hosts], 0.0)
        assert max(p.last_op_moves, default=0) <= MAX_MOVES_PER_OP
        planned = {g: dict(v) for g, v in place.items()}
        apply(plan, planned)
        assert Counter(rid for v in planned.values() for rid in v) == expected  # each in exactly one place
        assert all(model_of[rid] in hosts[g] for g, v in planned.items() for rid in v)
        assert set(plan.deactivate) <= {g for g, v in planned.items() if not v}
        assert set(plan.activate) <= {g for g, v in planned.items() if v}
        opened = (active | set(plan.activate) | {g for g, v in planned.items() if v}) - set(plan.deactivate)
        if len(opened) < len(hosts):  # an idle GPU was there to open: nothing may stay over capacity
            assert all(sum(v.values()) <= C for v in planned.values()), plan.notes
        if executed < 1.0:
            apply(plan, place, rng, executed)
        else:
            place = planned
        active = (opened | {g for g, v in place.items() if v}) - {g for g, v in place.items() if not v}
        sizes = [s for v in place.values() for s in v.values()]
        peak_active = max(peak_active, sum(1 for v in place.values() if v))
        peak_lb = max(peak_lb, lower_bound(sizes))
        peak_fluid = max(peak_fluid, math.ceil(sum(sizes) / C))
    return {"active": peak_active, "lb": peak_lb, "fluid": peak_fluid}


def state(g: str, place, model_of, hosts, active) -> GpuState:
    reqs = tuple(RequestState(r, model_of[r], s) for r, s in sorted(place[g].items()))
    return GpuState(g, hosts[g], C, reqs, g in active)


# a run Hypothesis found (without batching, operations run in id order, so a finished multi-item is
# still on its GPU when another operation moves a tiny request there)
GHOST_BUNDLE_EPOCHS = [
    ([450, 134], 54, 50), ([120], 144, 204), ([979, 95, 48, 325, 1058, 218], 74, 969), ([147, 154, 1], 114, 5499),
    ([340, 1041], 95, 0), ([599, 1029, 33, 134, 256], 49, 88), ([664, 45, 743, 231, 231, 803], 86, 1112),
    ([35, 94, 807, 23, 704], 18, 188824), ([151, 90, 141], 87, 25379), ([566, 282], 60, 2746), ([], 13, 23993),
]  # fmt: skip


def test_a_tiny_request_never_joins_a_finished_multi_item():
    """A tiny request moved onto a GPU joins a multi-item there, never one whose requests all finished:
    that one's Depart takes every request it holds, and the live one would vanish from the plan's
    view of its GPU, which then takes more than it can hold."""
    simulate(GHOST_BUNDLE_EPOCHS, False, {f"g{i:02d}": ("m",) for i in range(100)}, ("m",))


ADDITIVE = 3


def test_random_epochs_keep_capacity_and_stay_within_4_3_of_opt():
    """After every epoch: no GPU over capacity, each request in exactly one place, at most 10 moves per
    operation. Peak active GPUs ≤ 4/3 · LB + 3, LB a lower bound on OPT's peak (``lower_bound``).

    Why not the fluid bound ⌈ΣKV/C⌉ alone: Theorem 2 compares with OPT, and OPT itself can be twice
    the fluid bound (every item just above C/2 needs its own GPU), so LB adds Martello–Toth's L2
    (≤ OPT). The additive 3: Theorem 2 is asymptotic, "with a constant number of exceptions" (Theorem
    1): the most recently activated T-, S- and M-GPU may each be nearly empty — one GPU per class
    whose GPUs are filled in activation order. The printed ratios are also given for runs whose peak
    LB is at least 6 GPUs, where the additive constant weighs less."""
    worst = {"ratio": 0.0, "fluid_ratio": 0.0, "excess": -math.inf, "ratio6": 0.0, "fluid_ratio6": 0.0}
    hosts = {f"g{i:02d}": ("m",) for i in range(100)}

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(EPOCHS, st.booleans())
    def check(epochs, batching):
        peak = simulate(epochs, batching, hosts, ("m",))
        assert peak["active"] <= 4 / 3 * peak["lb"] + ADDITIVE, peak
        if peak["lb"]:
            worst["ratio"] = max(worst["ratio"], peak["active"] / peak["lb"])
            worst["fluid_ratio"] = max(worst["fluid_ratio"], peak["active"] / max(peak["fluid"], 1))
            worst["excess"] = max(worst["excess"], peak["active"] - 4 / 3 * peak["lb"])
        if peak["lb"] >= 6:
            worst["ratio6"] = max(worst["ratio6"], peak["active"] / peak["lb"])
            worst["fluid_ratio6"] = max(worst["fluid_ratio6"], peak["active"] / peak["fluid"])

    check()
    print(
        f"\nMell worst peak active GPUs: {worst['ratio']:.3f} x LB, {worst['fluid_ratio']:.3f} x fluid bound "
        f"(peak LB >= 6: {worst['ratio6']:.3f} x LB, {worst['fluid_ratio6']:.3f} x fluid); "
        f"worst peak - 4/3 LB = {worst['excess']:.2f} GPUs (allowed {ADDITIVE})"
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EPOCHS, st.sampled_from([1.0, 0.5]))
def test_random_epochs_with_several_models_and_deferred_moves_keep_every_invariant(epochs, executed):
    """Engines host different model sets (a GPU is one bin whatever its requests' models), and an
    executor may run only some migrations (the rest are planned again while they fit)."""
    hosts = {f"g{i:02d}": (("a",), ("b",), ("a", "b"))[i % 3] for i in range(60)}
    simulate(epochs, True, hosts, ("a", "b"), executed)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EPOCHS, st.booleans(), st.sampled_from([1.0, 0.5]), st.booleans())
def test_fill_first_and_compact_keep_every_invariant_and_the_peak_bound(epochs, batching, executed, compact):
    """The ``fill_first`` option (types mix), with or without ``compact``, keeps capacity, one place per
    request and the 10-move cap, also with several models and deferred moves, and its peak stays within
    4/3 · LB + 3."""
    hosts = {f"g{i:02d}": ("m",) for i in range(100)}
    peak = simulate(epochs, batching, hosts, ("m",), executed, fill_first=True, compact=compact)
    assert peak["active"] <= 4 / 3 * peak["lb"] + ADDITIVE, peak
    mixed = {f"g{i:02d}": (("a",), ("b",), ("a", "b"))[i % 3] for i in range(60)}
    simulate(epochs, batching, mixed, ("a", "b"), executed, fill_first=True, compact=compact)

from hypothesis import given, settings
from hypothesis import strategies as st
from llmfleet.policies.migration.base import GpuState, MigrationPolicy, RequestState, migration_id
from llmfleet.policies.migration.llumnix_lb import LlumnixBalance, LlumnixOptions


def req(rid: str, kv: int, tokens: int | None = None, model: str = "llama") -> RequestState:
    return RequestState(rid, model, kv_bytes=kv, tokens=kv if tokens is None else tokens)


def gpu(gid: str, *reqs: RequestState, capacity: int = 100, models=("llama",), active=True) -> GpuState:
    return GpuState(gid, tuple(models), capacity, tuple(reqs), active=active)


def moves(plan) -> list[tuple[str, str, str]]:
    return [(m.request_id, m.source, m.destination) for m in plan.migrations]


def test_is_a_migration_policy():
    assert isinstance(LlumnixBalance(), MigrationPolicy)


def test_balances_two_gpus_shortest_first():
    g0 = gpu("g0", req("a", 10), req("b", 20), req("c", 30))  # 0.6
    g1 = gpu("g1", req("d", 10))  # 0.1
    plan = LlumnixBalance().epoch([g0, g1], now=0.0)
    # a: 0.5 vs 0.2; b: 0.3 vs 0.4 (gap 0.1 in the other direction, g1 took requests: stop)
    assert moves(plan) == [("a", "g0", "g1"), ("b", "g0", "g1")]
    m = plan.migrations[0]
    assert (m.migration_id, m.model, m.kv_bytes, m.tokens, m.mode) == (
        migration_id("a", "g0", "g1", 0),
        "llama",
        10,
        10,
        "kv",
    )
    assert plan.activate == () and plan.deactivate == () and plan.deferred == ()


def test_shorter_sequence_first_even_if_it_holds_more_kv():
    g0 = gpu("g0", req("long", 10, tokens=500), req("short", 30, tokens=20), req("x", 40, tokens=900))
    g1 = gpu("g1")
    plan = LlumnixBalance(LlumnixOptions(max_migrations_per_epoch=1)).epoch([g0, g1], 0.0)
    assert moves(plan) == [("short", "g0", "g1")]


def test_no_move_that_widens_the_gap():
    # "big" is the shorter sequence, but moving it would leave 0.1 vs 0.8, wider than the gap 0.5
    g0 = gpu("g0", req("big", 60, tokens=1), req("small", 10, tokens=2))  # 0.7
    g1 = gpu("g1", req("z", 20))  # 0.2
    assert moves(LlumnixBalance().epoch([g0, g1], 0.0)) == [("small", "g0", "g1")]


def test_respects_threshold():
    g0 = gpu("g0", req("a", 20), req("b", 5))  # 0.25
    g1 = gpu("g1", req("c", 15))  # 0.15: gap 0.1, not above the threshold
    assert LlumnixBalance(LlumnixOptions(threshold=0.1)).epoch([g0, g1], 0.0).migrations == ()
    assert moves(LlumnixBalance(LlumnixOptions(threshold=0.05)).epoch([g0, g1], 0.0)) == [("b", "g0", "g1")]


def test_never_overfills_a_destination():
    g0 = gpu("g0", req("a", 40), req("b", 50), capacity=100)  # 0.9
    g1 = gpu("g1", req("c", 5), capacity=40)  # 0.125, 35 bytes free
    assert LlumnixBalance().epoch([g0, g1], 0.0).migrations == ()
    full = gpu("g1", req("c", 50), capacity=40)  # over capacity: takes nothing, and g0 has no room for c
    assert LlumnixBalance().epoch([g0, full], 0.0).migrations == ()
    g2 = gpu("g2", capacity=100)
    plan = LlumnixBalance().epoch([g0, g1, g2], 0.0)
    assert all(m.destination == "g2" for m in plan.migrations) and plan.migrations


def test_destination_must_host_the_model():
    g0 = gpu("g0", req("q", 30, model="qwen"), req("l", 40), models=("llama", "qwen"))
    g1 = gpu("g1", models=("mistral",))  # least loaded, hosts neither
    g2 = gpu("g2", req("x", 10), models=("qwen",))
    plan = LlumnixBalance().epoch([g0, g1, g2], 0.0)
    assert moves(plan) == [("q", "g0", "g2")]
    assert plan.migrations[0].model == "qwen"


def test_inactive_gpus_take_no_part_and_nothing_is_activated():
    g0 = gpu("g0", req("a", 30), req("b", 40))
    idle = gpu("idle", active=False)
    off_loaded = gpu("off", req("c", 90), active=False)
    plan = LlumnixBalance().epoch([g0, idle, off_loaded], 0.0)
    assert plan.migrations == () and plan.activate == () and plan.deactivate == ()
    g1 = gpu("g1")
    plan = LlumnixBalance().epoch([g0, idle, off_loaded, g1], 0.0)
    assert {m.destination for m in plan.migrations} == {"g1"}
    assert {m.source for m in plan.migrations} == {"g0"}
    assert plan.activate == () and plan.deactivate == ()


def test_max_migrations_and_epoch_counter():
    g0 = gpu("g0", *(req(f"r{i}", 5) for i in range(16)))  # 0.8
    g1 = gpu("g1")
    policy = LlumnixBalance(LlumnixOptions(threshold=0.0, max_migrations_per_epoch=3))
    first = policy.epoch([g0, g1], 0.0)
    assert len(first.migrations) == 3
    assert [m.request_id for m in first.migrations] == ["r0", "r1", "r10"]  # ties by request_id
    second = policy.epoch([g0, g1], 1.0)
    assert [m.migration_id for m in second.migrations] == [
        migration_id(r, "g0", "g1", 1) for r in ("r0", "r1", "r10")
    ]
    assert LlumnixBalance(LlumnixOptions(max_migrations_per_epoch=0)).epoch([g0, g1], 0.0).migrations == ()


@st.composite
def clusters(draw):
    models = ["a", "b"]
    gpus = []
    for i in range(draw(st.integers(1, 5))):
        hosted = tuple(draw(st.lists(st.sampled_from(models), min_size=1, max_size=2, unique=True)))
        reqs = tuple(
            RequestState(
                f"r{i}_{j}", draw(st.sampled_from(hosted)), draw(st.integers(0, 40)), draw(st.integers(0, 99))
            )
            for j in range(draw(st.integers(0, 6)))
        )
        gpus.append(GpuState(f"g{i}", hosted, draw(st.integers(0, 150)), reqs, active=draw(st.booleans())))
    return gpus


@settings(max_examples=150, deadline=None)
@given(clusters(), st.floats(0.0, 0.5), st.integers(0, 8))
def test_invariants(gpus, threshold, cap):
    plan = LlumnixBalance(LlumnixOptions(threshold=threshold, max_migrations_per_epoch=cap)).epoch(gpus, 0.0)
    by_id = {g.gpu_id: g for g in gpus}
    assert len(plan.migrations) <= cap
    assert plan.activate == () and plan.deactivate == () and plan.deferred == ()
    used = {g.gpu_id: g.used_bytes for g in gpus}
    srcs = {m.source for m in plan.migrations}
    dsts = {m.destination for m in plan.migrations}
    assert not srcs & dsts
    assert len({m.request_id for m in plan.migrations}) == len(plan.migrations)
    for m in plan.migrations:
        src, dst = by_id[m.source], by_id[m.destination]
        assert src.active and dst.active
        assert m.model in dst.models
        assert any(r.request_id == m.request_id and r.kv_bytes == m.kv_bytes for r in src.requests)
        # before the move: the pair was out of balance by more than the threshold
        assert used[m.source] / src.capacity_bytes - used[m.destination] / dst.capacity_bytes > threshold
        used[m.source] -= m.kv_bytes
        used[m.destination] += m.kv_bytes
        assert used[m.destination] <= dst.capacity_bytes

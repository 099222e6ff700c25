"""UELLM SLO-ODBS / SLO-DBS / ODBS (He et al. 2024, §4.2 Algorithm 1) and the S³-style baseline."""

import pytest
from llmfleet.policies.batching import (
    POLICIES,
    Odbs,
    S3Batching,
    SloDbs,
    SloOdbs,
    SloOdbsOptions,
    StaticBatch,
    StaticBatchPolicy,
    StaticSls,
    StaticSlsOptions,
    make_batching_policy,
    padding_tokens,
)
from llmfleet.policies.request import BatchLimits, PoolView, SchedRequest

TPB = 16
LIMITS = BatchLimits(max_requests=64, max_prefill_tokens=100_000)


def pool(free=100_000):
    return PoolView(free, 0, {"m": TPB, "n": TPB})


def q(rid, prompt, out, slo=None, arrival=0.0, model="m", max_new=2048, predicted="out"):
    return SchedRequest(
        rid,
        "svc",
        model,
        arrival,
        prompt,
        max_new,
        predicted_output_tokens=float(out) if predicted == "out" else predicted,
        deadline_s=None if slo is None else arrival + slo,
    )


def ids(batches):
    return [b.request_ids for b in batches]


# ------------------------------------------------------------------------------ Figure 3

# Figure 3: three queries; default (FIFO) batching makes one batch with 6 input paddings and 174 tokens,
# UELLM two batches with 2 paddings and 74 tokens. Inputs 8/6/4 and outputs 50/2/2 reproduce those
# numbers exactly; SLOs put the short-output queries first.
FIG3 = [q("q1", 8, 50, slo=4.0), q("q2", 6, 2, slo=2.0), q("q3", 4, 2, slo=3.0)]
OUT = {"q1": 50, "q2": 2, "q3": 2}
# The figure's lengths are ~100× below the workloads the default threshold (15000) is set for.
TOY = {"preset": "authors", "threshold": 100.0}
AUTH = {"preset": "authors"}


def members(batch):
    return [r for r in FIG3 if r.request_id in batch.request_ids]


def padding(batches):
    return sum(padding_tokens(members(b), [OUT[r.request_id] for r in members(b)]) for b in batches)


def input_padding(batches):
    return sum(
        max(r.prompt_tokens for r in members(b)) * len(members(b)) - sum(r.prompt_tokens for r in members(b))
        for b in batches
    )


def tokens(batches):
    return sum(
        len(members(b))
        * (max(r.prompt_tokens for r in members(b)) + max(OUT[r.request_id] for r in members(b)))
        for b in batches
    )


def test_figure3_slo_odbs_pads_less_than_fifo():
    fifo = [StaticSls(StaticSlsOptions(batch_size=3)).form_batch(FIG3, pool(), LIMITS, 0.0)]
    assert ids(fifo) == [("q1", "q2", "q3")]
    assert (input_padding(fifo), tokens(fifo), padding(fifo)) == (6, 174, 102)
    ue = SloOdbs(SloOdbsOptions(**TOY)).partition(FIG3, pool(), LIMITS, 0.0)
    assert ids(ue) == [("q2", "q3"), ("q1",)]
    assert (input_padding(ue), tokens(ue), padding(ue)) == (2, 74, 2)  # the paper: 2 paddings, 74 tokens
    # one batch per call: the tightest SLOs first, then the rest
    p = SloOdbs(SloOdbsOptions(**TOY))
    first = p.form_batch(FIG3, pool(), LIMITS, 0.0)
    assert first == StaticBatch("m", ("q2", "q3"))
    assert p.form_batch([FIG3[0]], pool(), LIMITS, 0.0) == StaticBatch("m", ("q1",))


def test_figure3_variants():
    # SLO-DBS ignores output lengths: q1 joins (T_l = (4+3)·3 = 21 ≤ 100) → FIFO's padding
    dbs = SloDbs(SloOdbsOptions(**TOY)).partition(FIG3, pool(), LIMITS, 0.0)
    assert ids(dbs) == [("q2", "q3", "q1")] and padding(dbs) == 102
    # ODBS splits on the 48-token padding jump: 48·3·1.2 = 172.8 > 100
    assert ids(Odbs(SloOdbsOptions(**TOY)).partition(FIG3, pool(), LIMITS, 0.0)) == [("q2", "q3"), ("q1",)]


def test_slo_term_splits_only_where_it_counts():
    reqs = [q("s1", 8, 10, slo=40.0), q("s2", 8, 10, slo=45.0)]  # equal lengths; T_l = (45+40)·2 = 170
    assert ids(SloDbs(SloOdbsOptions(**TOY)).partition(reqs, pool(), LIMITS, 0.0)) == [("s1",), ("s2",)]
    assert ids(SloOdbs(SloOdbsOptions(**TOY)).partition(reqs, pool(), LIMITS, 0.0)) == [("s1",), ("s2",)]
    assert ids(Odbs(SloOdbsOptions(**TOY)).partition(reqs, pool(), LIMITS, 0.0)) == [("s1", "s2")]
    assert ids(SloDbs(SloOdbsOptions(**AUTH, threshold=170.0)).partition(reqs, pool(), LIMITS, 0.0)) == [
        ("s1", "s2")
    ]  # ≤ joins


# ------------------------------------------------------------------------------ thresholds and caps


def ten(last_out, slo):
    return [q(f"r{i}", 10, 20, slo=slo + i * 1e-3) for i in range(9)] + [q("long", 10, last_out, slo=slo + 1)]


def test_default_threshold_on_the_length_term():
    # 10th request (n = 9): T_o = (len − 20)·10·1.2; 15000 allows a jump of 1250 tokens
    assert ids(Odbs(SloOdbsOptions(**AUTH)).partition(ten(1500, 1.0), pool(), LIMITS, 0.0))[-1] == (
        "long",
    )  # 17760 > 15000
    assert len(Odbs(SloOdbsOptions(**AUTH)).partition(ten(1200, 1.0), pool(), LIMITS, 0.0)) == 1  # 14160
    # SLO-ODBS adds T_l = (SLO_q + L_CM)·10: small at 1 s SLOs, decisive at 60 s
    assert (
        len(SloOdbs(SloOdbsOptions(**AUTH)).partition(ten(1200, 1.0), pool(), LIMITS, 0.0)) == 1
    )  # 14160 + ~40
    assert ids(SloOdbs(SloOdbsOptions(**AUTH)).partition(ten(1200, 60.0), pool(), LIMITS, 0.0))[-1] == (
        "long",
    )  # + ~1210


def test_batch_cap_and_engine_limits():
    reqs = [q(f"r{i:02d}", 10, 20, slo=1.0) for i in range(25)]
    assert [
        len(b.request_ids) for b in SloOdbs(SloOdbsOptions(**AUTH)).partition(reqs, pool(), LIMITS, 0.0)
    ] == [10, 10, 5]
    assert [
        len(b.request_ids) for b in SloOdbs(SloOdbsOptions(max_batch=12)).partition(reqs, pool(), LIMITS, 0.0)
    ] == [
        12,
        12,
        1,
    ]
    assert len(SloOdbs().form_batch(reqs, pool(), BatchLimits(max_requests=4), 0.0).request_ids) == 4
    # padded prefill n · longest prompt ≤ max_prefill_tokens
    assert len(SloOdbs().form_batch(reqs, pool(), BatchLimits(max_prefill_tokens=35), 0.0).request_ids) == 3


def test_length_increment_is_clamped():
    p = Odbs(SloOdbsOptions(**AUTH))
    assert p.join_cost(slo_q=9.0, len_q=5.0, l_cm=9.0, o_cm=50.0, n=3) == 0.0  # shorter: no padding added
    assert p.join_cost(slo_q=9.0, len_q=60.0, l_cm=9.0, o_cm=50.0, n=3) == pytest.approx(10 * 4 * 1.2)
    assert SloDbs(SloOdbsOptions(**AUTH)).join_cost(2.0, 60.0, 3.0, 50.0, 1) == pytest.approx(
        (2 + 3) * 2 * 1.0
    )
    assert SloOdbs(
        SloOdbsOptions(slo_weight=2.0, length_weight=0.5, slo_scale=3.0, length_scale=4.0)
    ).join_cost(1.0, 7.0, 2.0, 5.0, 1) == pytest.approx(2.0 * (1 + 2) * 2 * 3.0 + 0.5 * 2 * 2 * 4.0)


# ------------------------------------------------------------------------------ SLO and length


def test_slo_is_remaining_seconds_and_orders_edf():
    p = SloOdbs()
    assert p.slo(q("a", 1, 1, slo=100.0, arrival=0.0), now=40.0) == 60.0
    assert p.slo(q("b", 1, 1, arrival=10.0), now=0.0) == 360.0  # no deadline: arrival + 350 s
    assert p.slo(q("c", 1, 1, slo=1.0), now=5.0) == 0.0  # overdue
    reqs = [q("late", 8, 10, slo=400.0), q("none", 8, 10), q("soon", 8, 10, slo=5.0, model="n")]
    assert SloOdbs(SloOdbsOptions(**TOY)).form_batch(reqs, pool(), LIMITS, 0.0) == StaticBatch(
        "n", ("soon",)
    )  # its model
    assert ids(SloOdbs(SloOdbsOptions(max_batch=1)).partition(reqs[:2], pool(), LIMITS, 0.0)) == [
        ("none",),
        ("late",),
    ]


def test_length_is_the_prediction_capped_or_the_max():
    assert SloOdbs.length(q("a", 1, 30, max_new=100)) == 30.0
    assert SloOdbs.length(q("b", 1, 300, max_new=100)) == 100.0
    assert SloOdbs.length(q("c", 1, 0, max_new=100, predicted=None)) == 100.0


def test_padded_kv_of_the_predicted_output_must_fit():
    # two rows of 10 + 100 tokens = 2·7 = 14 blocks > 13; with 10-token outputs 2·2 = 4 blocks
    big = [q("a", 10, 100, slo=1.0), q("b", 10, 100, slo=2.0)]
    small = [q("a", 10, 10, slo=1.0), q("b", 10, 10, slo=2.0)]
    assert ids(SloOdbs().partition(big, pool(13), LIMITS, 0.0)) == [("a",), ("b",)]
    assert ids(SloOdbs().partition(small, pool(13), LIMITS, 0.0)) == [("a", "b")]
    # a request that cannot even be admitted (prompt + 1 = 63 blocks) is left out
    stuck = [q("huge", 1000, 1, slo=0.5), *small]
    assert ids(SloOdbs().partition(stuck, pool(13), LIMITS, 0.0)) == [("a", "b")]
    assert SloOdbs().form_batch(stuck[:1], pool(13), LIMITS, 0.0) is None


def test_registry_names_and_options():
    assert {
        "slo_odbs": SloOdbs,
        "slo_dbs": SloDbs,
        "odbs": Odbs,
        "s3": S3Batching,
    }.items() <= POLICIES.items()
    for name in ("slo_odbs", "slo_dbs", "odbs", "s3"):
        p = make_batching_policy(name)
        assert isinstance(p, StaticBatchPolicy) and p.name == name
    assert make_batching_policy("odbs", threshold=5.0).threshold == 5.0
    assert (SloOdbs(mode="slo_dbs").length_weight, SloOdbs(mode="odbs").slo_weight) == (0.0, 0.0)
    for name, bad in [("slo_dbs", {"mode": "odbs"}), ("slo_odbs", {"mode": "x"}), ("odbs", {"length_scale": -1}),
                      ("slo_odbs", {"max_batch": 0}), ("slo_odbs", {"threshold": float("inf")}),
                      ("s3", {"max_batch": 0})]:  # fmt: skip
        with pytest.raises(ValueError, match=f"bad options for batching policy '{name}'"):
            make_batching_policy(name, **bad)


def test_on_batch_done_marks_members():
    reqs = [q("a", 1, 1), q("b", 1, 1)]
    for p in (SloOdbs(), S3Batching()):
        p.on_batch_done(StaticBatch("m", ("a",)), 1.0, 3.0, reqs)
        assert reqs[0].first_scheduled_s == 2.0 and reqs[1].last_run_s is None


# ------------------------------------------------------------------------------ S³ baseline


def s3req(rid, arrival, predicted, model="m"):
    return SchedRequest(rid, "svc", model, arrival, 10, 500, predicted_output_tokens=predicted)


def test_s3_reserves_the_predicted_output_not_the_maximum():
    reqs = [s3req(f"r{i}", float(i), 20.0) for i in range(3)]  # 3 rows · ⌈30/16⌉ = 6 blocks ≤ 10
    assert S3Batching().form_batch(reqs, pool(10), LIMITS, 0.0).request_ids == ("r0", "r1", "r2")
    unknown = [s3req(f"r{i}", float(i), None) for i in range(3)]  # max reservation: 2 · ⌈510/16⌉ = 64 > 10
    assert S3Batching().form_batch(unknown, pool(10), LIMITS, 0.0).request_ids == ("r0",)
    over = [s3req(f"r{i}", float(i), 5000.0) for i in range(3)]  # prediction capped by max_new_tokens
    assert S3Batching().form_batch(over, pool(64), LIMITS, 0.0).request_ids == ("r0", "r1")


def test_s3_is_fcfs_and_stops_at_the_first_misfit():
    reqs = [s3req("r0", 0.0, 20.0), s3req("r1", 1.0, 400.0), s3req("r2", 2.0, 20.0)]
    assert S3Batching().form_batch(reqs, pool(10), LIMITS, 0.0).request_ids == ("r0",)  # r2 must not jump r1
    mixed = [s3req("n0", 0.0, 20.0, model="n"), s3req("m0", 1.0, 20.0), s3req("n1", 2.0, 20.0, model="n")]
    assert S3Batching().form_batch(mixed, pool(), LIMITS, 0.0) == StaticBatch("n", ("n0", "n1"))
    many = [s3req(f"r{i:02d}", float(i), 20.0) for i in range(30)]
    assert len(S3Batching().form_batch(many, pool(), BatchLimits(max_requests=5), 0.0).request_ids) == 5
    assert S3Batching().form_batch([], pool(), LIMITS, 0.0) is None

"""The calibrated cost source (``costmodel.calibrated``), the source names (``costmodel.sources``) and
the latency model built on a cost source (``costmodel.latency_model``)."""

from __future__ import annotations

import numpy as np
import pytest
from llmfleet.costmodel import (
    COST_SOURCES,
    DEFAULT_COST_SOURCE,
    CostBook,
    calibrated_cost,
    check_cost_source,
    cost_of,
    decode_iteration_time,
    hardware,
    latency_model,
    model_arch,
    roofline_cost,
)
from llmfleet.costmodel import calibrated as cal
from llmfleet.costmodel.overhead import VIDUR_A100_OVERHEAD
from llmfleet.costmodel.vidur import vidur_legs

A100, H100 = hardware("a100-80gb"), hardware("h100")
L7 = model_arch("llama2-7b")


def test_names_and_default_are_written_once():
    assert DEFAULT_COST_SOURCE == "calibrated" and set(COST_SOURCES) == {"calibrated", "vidur", "roofline"}
    assert check_cost_source("vidur") == "vidur"
    with pytest.raises(
        ValueError, match=r"unknown cost source 'x'; valid: \['calibrated', 'vidur', 'roofline'\]"
    ):
        check_cost_source("x")
    assert CostBook.build(A100, {"llama2-7b": L7}).source == DEFAULT_COST_SOURCE
    assert cost_of("roofline", L7, A100, 2) == roofline_cost(L7, A100, 2)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_measured_operators_plus_the_fitted_overhead(tp):
    c = calibrated_cost(L7, A100, tp)
    v = vidur_legs(L7, A100, tp, overhead_s=0.0)
    assert c.source == "calibrated:a100"
    a, k = VIDUR_A100_OVERHEAD.coefficients(tp)
    for b, s in ((1, 600), (16, 16 * 900), (128, 128 * 300)):
        plain = max(al + be * b + ga * s for al, be, ga in v.decode)
        assert c.decode(b, s) == pytest.approx(plain + a + k * b)
    for t in (64, 1500):
        plain = max(al + be * t + ga * t * t for al, be, ga in v.prefill)
        assert c.prefill(t) == pytest.approx(plain + a + k)
    # a mixed iteration pays the fixed part once: a + c·(b + 1)
    mixed = c.iteration(100, 100 * 100, 8, 8 * 500)
    parts = c.prefill(100) + c.decode(8, 8 * 500)
    assert mixed < parts and mixed == pytest.approx(parts - c.shared_fixed)
    assert c.shared_fixed >= a


def test_the_overhead_grows_with_tp_as_measured():
    one, two = calibrated_cost(L7, A100, 1), calibrated_cost(L7, A100, 2)
    # TP 2 halves the GEMMs but pays vLLM's Ray round trip: at batch 1 it is slower than TP 1
    assert two.decode(1, 512) > one.decode(1, 512)
    assert calibrated_cost(model_arch("opt-6.7b"), A100, 1).source == "calibrated:a100:derived"


def test_unmeasured_hardware_and_tp_scale_the_roofline():
    scale = cal.roofline_scale()
    for hw, tp in ((hardware("l4"), 1), (hardware("h200"), 2), (H100, 16)):
        c = calibrated_cost(L7, hw, tp)
        r = roofline_cost(L7, hw, tp)
        assert c.source == "calibrated:scaled-roofline"
        kc, km, e = scale.of("decode", tp)
        a, k = VIDUR_A100_OVERHEAD.coefficients(tp)
        for b, s in ((1, 700), (64, 64 * 1000)):
            (ac, bc, gc), (am, bm, gm) = r.decode_legs
            want = max(kc * (ac + bc * b + gc * s), km * (am + bm * b + gm * s)) + e * L7.num_layers
            assert c.decode(b, s) == pytest.approx(want + a + k * b)
    # the CPU is no GPU: the plain roofline
    assert calibrated_cost(L7, hardware("cpu"), 1) == roofline_cost(L7, hardware("cpu"), 1)


def test_fit_scale_recovers_known_factors():
    rng = np.random.default_rng(3)
    pts = []
    for tp in (1, 2):
        c, m = rng.uniform(1e-3, 5e-2, 40), rng.uniform(1e-3, 5e-2, 40)
        y = np.maximum(2.0 * c, 1.5 * m) + 1e-4 * 40
        pts.append(cal.Points("g", "s", tp, "decode", 40, c, m, y))
    kc, km, e = cal.fit_scale(pts).of("decode", 2)
    assert kc == pytest.approx(2.0, rel=0.02) and km == pytest.approx(1.5, rel=0.02)
    assert e == pytest.approx(1e-4, rel=0.2)
    assert cal.fit_scale(pts).of("decode", 8) == cal.fit_scale(pts).of("decode", 2)  # nearest TP
    with pytest.raises(ValueError, match="no points"):
        cal.fit_scale([])


def test_heldout_errors_cover_every_gpu_and_shape():
    rows = cal.scale_heldout_errors()
    held = {r["held_out"] for r in rows}
    assert {"gpu a100", "gpu h100", "none (in sample)"} <= held
    assert {f"shape {s}" for s in ("llama2-7b", "llama2-13b", "llama2-70b")} <= held
    for r in rows:
        assert r["n"] > 0 and 0 <= r["mean_rel"] <= r["max_rel"]
    in_sample = [r for r in rows if r["held_out"] == "none (in sample)"]
    assert all(r["mean_rel"] < 0.15 for r in in_sample)


def test_latency_model_follows_the_cost_source():
    lat = latency_model(L7, A100, 1)
    lm = calibrated_cost(L7, A100, 1)
    assert lat.source == "calibrated:a100"
    assert lat.prefill.predict(700) == lm.prefill(700) == lat.prefill_time(700)
    assert lat.decode.predict(8, 400) == lm.decode(8, 3200) == lat.decode_time(8, 400)
    t_dec = 0.015
    limit = lat.decode.context_limit(8, t_dec)
    assert 0 < limit < np.inf
    assert lm.decode(8, limit) == pytest.approx(t_dec)
    assert lm.decode(8, 1.01 * limit) > t_dec
    assert lat.decode.context_limit(8, 1e-4) == 0.0  # even an empty context is too slow
    with pytest.raises(ValueError, match="batch must be > 0"):
        lat.decode.context_limit(0, t_dec)
    assert latency_model(L7, A100, 1, "roofline").source == "roofline"
    it = decode_iteration_time(L7, A100)
    assert it(2, 4, 300.0) == calibrated_cost(L7, A100, 2).decode(4, 1200)


def test_cost_record_fits_the_forms_to_the_cost_source():
    from llmfleet.costmodel import cost_record, roofline_record
    from llmfleet.policies.batching.scls_dp import default_scls_cost

    a13 = model_arch("llama2-13b")
    rec = cost_record(a13, A100, date="2026-01-01T00:00:00")
    assert (rec.source, rec.engine) == ("calibrated", "calibrated")
    lm = calibrated_cost(a13, A100, 1)
    # Aladdin's decode form t = (k2·l + c2)·b + c3 against the cost at its own grid
    d = rec.aladdin.decode
    for b, ln in ((1, 512), (16, 1024), (64, 256)):
        assert d.predict(b, ln) == pytest.approx(
            lm.decode(b, b * ln), rel=rec.reports["aladdin.decode"].max_rel_error + 1e-6
        )
    # the roofline's record is the same fit on the roofline source's points
    roof, via = roofline_record(a13, A100), cost_record(a13, A100, source="roofline")
    assert via.source == roof.source == "roofline"
    for form in ("prefill", "decode"):
        mine, theirs = getattr(via.scls, form).to_dict(), getattr(roof.scls, form).to_dict()
        assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-12)
    scls = default_scls_cost()
    assert scls.prefill == rec.scls.prefill and scls.decode == rec.scls.decode

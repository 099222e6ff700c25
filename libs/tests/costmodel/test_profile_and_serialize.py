"""fit_engine_profile on synthetic engine samples, ProfileRecord JSON round trip, roofline records."""

import json

import numpy as np
import pytest
from llmfleet.costmodel import (
    DecodeModel,
    KvModel,
    PrefillModel,
    ProfileRecord,
    SclsDecode,
    SclsPrefill,
    fit_engine_profile,
    hardware,
    load_record,
    model_arch,
    record_from_fit,
    roofline_record,
    save_record,
)
from llmfleet.costmodel.fit import FitError

PRE = PrefillModel(k1=1e-4, c1=0.01)
DEC = DecodeModel(k2=3e-7, c2=2e-4, c3=0.01)


def engine_samples(noise: float = 0.003):
    rng = np.random.default_rng(11)
    out = []
    for b in (1, 2, 4, 8):
        for t in (32, 128, 512, 1024):
            out.append(("prefill", b, t, PRE.predict(b * t) * (1 + rng.normal(0, noise))))
            out.append(("decode", b, t, DEC.predict(b, t) * (1 + rng.normal(0, noise))))
    return out


def test_fit_engine_profile_recovers_aladdin_and_fits_scls():
    fit = fit_engine_profile(engine_samples())
    assert fit.aladdin_prefill.k1 == pytest.approx(PRE.k1, rel=0.03)
    assert fit.aladdin_prefill.c1 == pytest.approx(PRE.c1, rel=0.2)
    assert fit.aladdin_decode.k2 == pytest.approx(DEC.k2, rel=0.05)
    assert fit.aladdin_decode.c3 == pytest.approx(DEC.c3, rel=0.1)
    # Aladdin's prefill k1·N·L + c1 is SCLS's with p1 = k1, p2 = p3 = 0, p4 = c1; decode likewise
    assert fit.scls_prefill.p1 == pytest.approx(PRE.k1, rel=0.05)
    assert fit.scls_decode.d1 == pytest.approx(DEC.k2, rel=0.05)
    assert fit.scls_decode.d2 == pytest.approx(DEC.c2, rel=0.1)
    assert set(fit.reports) == {"aladdin.prefill", "aladdin.decode", "scls.prefill", "scls.decode"}
    assert all(r.max_rel_error < 0.03 for r in fit.reports.values())


def test_fit_engine_profile_accepts_objects_and_rejects_bad_phase():
    class Sample:
        def __init__(self, phase, batch_size, tokens, seconds):
            self.phase, self.batch_size, self.tokens, self.seconds = phase, batch_size, tokens, seconds

    fit = fit_engine_profile([Sample(*s) for s in engine_samples(0.0)])
    assert fit.aladdin_decode.k2 == pytest.approx(DEC.k2, rel=1e-6)
    with pytest.raises(FitError, match="phase"):
        fit_engine_profile([("warmup", 1, 1, 0.1)])
    with pytest.raises(FitError):
        fit_engine_profile([s for s in engine_samples() if s[0] == "prefill"])  # no decode samples


def test_record_round_trip(tmp_path):
    fit = fit_engine_profile(engine_samples())
    rec = record_from_fit(
        fit, "tiny-llama", "cpu", "native", kv=KvModel(512.0, 0.0), date="2025-01-02T03:04:05+00:00"
    )
    assert rec.source == "fitted" and rec.key == "profiles/tiny-llama/cpu"
    again = ProfileRecord.from_json(rec.to_json())
    assert again == rec
    assert json.loads(again.to_json()) == json.loads(rec.to_json())
    save_record(rec, tmp_path / "p.json")
    assert load_record(tmp_path / "p.json") == rec
    no_kv = ProfileRecord.from_dict({**rec.to_dict(), "aladdin": {**rec.to_dict()["aladdin"], "kv": None}})
    assert no_kv.aladdin.kv is None and ProfileRecord.from_json(no_kv.to_json()) == no_kv
    with pytest.raises(ValueError):
        ProfileRecord.from_dict({**rec.to_dict(), "source": "guessed"})


def test_roofline_record_same_structure():
    arch, hw = model_arch("llama2-7b"), hardware("a100-80gb")
    rec = roofline_record(arch, hw, date="2025-01-02T00:00:00+00:00")
    assert rec.source == "roofline" and rec.model == "llama2-7b" and rec.hardware == "a100-80gb"
    assert isinstance(rec.aladdin.prefill, PrefillModel) and isinstance(rec.scls.decode, SclsDecode)
    assert isinstance(rec.scls.prefill, SclsPrefill)
    assert rec.aladdin.kv == KvModel(float(arch.kv_bytes_per_token), 0.0)
    assert rec.reports["aladdin.decode"].max_rel_error < 0.05  # decode is memory-bound: linear
    assert rec.aladdin.prefill.predict(1) > 0  # non-negative coefficients
    assert ProfileRecord.from_json(rec.to_json()) == rec
    fitted_keys = set(
        record_from_fit(fit_engine_profile(engine_samples()), "m", "h", "e", date=rec.date).to_dict()
    )
    assert set(rec.to_dict()) == fitted_keys
    # a model too large for one device still yields a record
    assert roofline_record(model_arch("llama3-70b"), hardware("l4"), date=rec.date).source == "roofline"


def test_fit_engine_profile_fits_relative_error_by_default():
    # a fixed 0.2 ms + a per-token cost that flattens: sub-millisecond points make plain LS miss badly
    samples = []
    for b in (1, 2, 4, 8):
        for t in (16, 32, 64, 128, 256):
            samples.append(("prefill", b, t, 2e-4 + 2e-6 * b * t + 4e-4 * (1 - np.exp(-b * t / 128))))
            samples.append(("decode", b, t, 3e-4 + b * (1e-5 + 1e-8 * t) + 2e-4 * (1 - np.exp(-b / 2))))
    rel, plain = fit_engine_profile(samples), fit_engine_profile(samples, relative=False)
    for form in ("aladdin.prefill", "aladdin.decode", "scls.prefill", "scls.decode"):
        assert rel.reports[form].max_rel_error < plain.reports[form].max_rel_error, form


def test_min_max_bounds():
    from llmfleet.costmodel.fit import min_max_rel_error
    from llmfleet.costmodel.profile_fit import min_max_bounds

    exact = min_max_bounds(engine_samples(0.0))
    assert set(exact) == {"aladdin.prefill", "aladdin.decode", "scls.prefill", "scls.decode"}
    assert all(v < 1e-6 for v in exact.values())  # the data follow the forms exactly
    noisy = engine_samples(0.02)
    bounds, fit = min_max_bounds(noisy), fit_engine_profile(noisy)
    for form, bound in bounds.items():  # no fit beats the bound; the relative fit comes close
        assert 0 < bound <= fit.reports[form].max_rel_error + 1e-9
        assert fit.reports[form].max_rel_error < 2.5 * bound
    # y = θ·x through (1, 1), (2, 2), (3, 4): x/y ∈ {1, 0.75}; θ = 8/7 errs by 1/7 both ways
    assert min_max_rel_error([[1.0], [2.0], [3.0]], [1.0, 2.0, 4.0], [True]) == pytest.approx(1 / 7)

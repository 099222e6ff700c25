"""DispatchRouter: one policy object per service, and predictions only where something reads them."""

from __future__ import annotations

import pytest
from llmfleet.spec.services import ServiceSpec
from llmfleet.types import Slo
from llmfleet_scheduler.routing import DispatchRouter


def test_each_service_gets_its_own_policy_object():
    r = DispatchRouter("round_robin")
    a, b = ServiceSpec("a", "tiny-llama"), ServiceSpec("b", "tiny-llama", dispatch="jsq")
    assert r.for_service(a).name == "round_robin" and r.for_service(b).name == "jsq"
    assert r.for_service(a) is r.for_service(a)
    assert r.for_service(a) is not r.for_service(ServiceSpec("c", "tiny-llama"))


def test_aladdin_is_built_from_the_cost_model_and_the_service_slo():
    spec = ServiceSpec("s", "tiny-llama", slo=Slo(ttft_s=2.0, tpot_s=0.2), dispatch="aladdin_bestfit")
    assert DispatchRouter(hardware="cpu").for_service(spec).name == "aladdin_bestfit"


def test_predictions_are_asked_for_only_when_used():
    r = DispatchRouter("round_robin")
    plain = ServiceSpec("p", "tiny-llama")
    asks = ServiceSpec("q", "tiny-llama", predict=True)
    reads = ServiceSpec("r", "tiny-llama", dispatch="scls_maxmin")
    assert not r.wants_prediction(plain, "auto")
    assert r.wants_prediction(asks, "auto") and r.wants_prediction(reads, "auto")
    assert r.wants_prediction(plain, "always") and not r.wants_prediction(reads, "never")


def test_a_load_reading_default_without_a_load_source_is_refused_at_start():
    with pytest.raises(
        ValueError, match=r"--dispatch jsq: dispatch policy 'jsq' reads engine load \(queue lengths\)"
    ):
        DispatchRouter("jsq", load_source=False).check_default()
    with pytest.raises(
        ValueError, match="drop --no-load-monitor or pick a load-blind policy: aladdin_bestfit"
    ):
        DispatchRouter("least_loaded", load_source=False).check_default()
    DispatchRouter("round_robin", load_source=False).check_default()
    DispatchRouter("jsq").check_default()


def test_per_service_policies_get_the_context():
    r = DispatchRouter("round_robin", load_source=False)
    with pytest.raises(ValueError, match="'least_loaded' reads engine load"):
        r.for_service(ServiceSpec("s", "tiny-llama", dispatch="least_loaded"))
    spec = ServiceSpec("a", "tiny-llama", slo=Slo(ttft_s=2.0, tpot_s=0.2), dispatch="aladdin_bestfit")
    ctx = r.context("aladdin_bestfit", spec)
    assert set(ctx.latency_models) == {"tiny-llama"} and ctx.slos == {"tiny-llama": (2.0, 0.2)}
    gpu = DispatchRouter("round_robin", hardware="a100-80gb").context("aladdin_bestfit", spec)
    assert gpu.latency_models["tiny-llama"].source == "calibrated:a100:derived"  # the default cost source
    assert not ctx.load_source and r.for_service(spec).slos == {"tiny-llama": (2.0, 0.2)}
    assert r.context("round_robin", spec).latency_models == {}  # no costs for who does not read them


def test_mell_dispatch_reads_the_migration_leaders_view():
    from llmfleet.coord.migration_state import MigrationState
    from llmfleet.policies.migration import MellPacker, MellView
    from llmfleet_scheduler.routing import mell_view_of

    view = MellPacker().view()
    state = MigrationState(3, "mell", "m-1", view=view.to_json())
    r = DispatchRouter("round_robin", mell_view=lambda: mell_view_of(state))
    policy = r.for_service(ServiceSpec("s", "tiny-llama", dispatch="mell"))
    assert isinstance(policy.view_source(), MellView)
    assert mell_view_of(None) is None and mell_view_of(MigrationState(1, "llumnix_lb")) is None
    assert mell_view_of(MigrationState(1, "mell", view={"gpus": "garbage"})) is None  # logged, best fit


def test_the_published_mell_view_is_parsed_once_per_publication():
    """Dispatch's memo of the GPUs it opened (MellView.opened) lives on one view object until the
    leader publishes the next; a view parsed per call would forget them at once."""
    from llmfleet.coord.migration_state import MigrationState
    from llmfleet.policies.migration import MellPacker
    from llmfleet_scheduler.routing import MellViewReader

    current: list[MigrationState | None] = [None]
    read = MellViewReader(lambda: current[0])
    assert read() is None
    current[0] = MigrationState(3, "mell", "m-1", view=MellPacker().view().to_json())
    first = read()
    assert first is not None and read() is first
    first.opened["e1"] = ("T", 0)
    assert read().opened == {"e1": ("T", 0)}
    current[0] = MigrationState(4, "mell", "m-1", view=MellPacker().view().to_json())
    assert read() is not first and read().opened == {}

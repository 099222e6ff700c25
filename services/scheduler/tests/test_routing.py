"""DispatchRouter: one policy object per service, and predictions only where something reads them."""

from __future__ import annotations

from llmfleet.types import ServiceSpec, Slo
from llmfleet_scheduler.routing import DispatchRouter


def test_each_service_gets_its_own_policy_object():
    r = DispatchRouter("round_robin")
    a, b = ServiceSpec("a", "tiny-llama"), ServiceSpec("b", "tiny-llama", dispatch="jsq")
    assert r.for_service(a).name == "round_robin" and r.for_service(b).name == "jsq"
    assert r.for_service(a) is r.for_service(a)
    assert r.for_service(a) is not r.for_service(ServiceSpec("c", "tiny-llama"))


def test_aladdin_is_built_from_the_roofline_and_the_service_slo():
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

"""--dispatch-options: the constructor options of the default dispatch policy, refused at start when bad."""

from __future__ import annotations

import pytest
from llmfleet.spec.services import ServiceSpec
from llmfleet_scheduler.main import build_node, build_parser
from llmfleet_scheduler.relay import Relay
from llmfleet_scheduler.routing import DispatchRouter


def _args(*flags: str):
    return build_parser().parse_args(["--http-port", "-1", "--stats-interval-s", "0", *flags])


async def test_options_reach_the_default_policy_only():
    args = _args("--dispatch", "worst_fit_kv", "--dispatch-options", '{"active_only": true}')
    assert args.dispatch_options == {"active_only": True}
    node, servicer = build_node(args)
    assert isinstance(servicer.relay, Relay)
    router = servicer.relay.router
    default = router.for_service(ServiceSpec("a", "tiny-llama"))
    assert default.name == "worst_fit_kv" and default.active_only is True
    assert router.for_service(ServiceSpec("a", "tiny-llama")) is default  # built once per service
    # a service that names its own policy builds it without the options
    own = router.for_service(ServiceSpec("b", "tiny-llama", dispatch="worst_fit_kv"))
    assert own is not default and own.active_only is False
    assert {id(p) for p in router.policies()} == {id(default), id(own)}
    await node.server.stop()


def test_no_options_is_the_plain_router():
    assert _args().dispatch_options == {}
    r = DispatchRouter("round_robin")
    r.check_default()
    assert r.for_service(ServiceSpec("a", "tiny-llama")).name == "round_robin"


def test_bad_options_are_refused_at_start_naming_the_flag():
    with pytest.raises(ValueError, match=r"--dispatch-options .*'worst_fit_kv'.*bogus"):
        build_node(_args("--dispatch", "worst_fit_kv", "--dispatch-options", '{"bogus": 1}'))
    with pytest.raises(ValueError, match="--dispatch-options"):
        DispatchRouter("power_of_two", default_options={"seed": "x", "extra": 1}).check_default()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_bad_json_is_a_usage_error_naming_the_flag(text, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dispatch-options", text])
    assert "--dispatch-options" in capsys.readouterr().err


def test_a_service_naming_its_own_policy_gets_its_own_options():
    router = DispatchRouter("worst_fit_kv", default_options={"active_only": True})
    spec = ServiceSpec(
        "b", "tiny-llama", dispatch={"policy": "worst_fit_kv", "options": {"active_only": False}}
    )
    own = router.for_service(spec)
    assert own.active_only is False  # the service's options, not the default's
    assert router.for_service(spec) is own
    # `llmfleet apply` changed the options: the policy is built again with the new ones
    again = router.for_service(
        ServiceSpec("b", "tiny-llama", dispatch={"policy": "worst_fit_kv", "options": {"active_only": True}})
    )
    assert again is not own and again.active_only is True


def test_service_dispatch_options_travel_through_etcd_json():
    spec = ServiceSpec("b", "tiny-llama", dispatch={"policy": "power_of_two", "options": {"seed": 7}})
    back = ServiceSpec.from_json(spec.to_json())
    assert back == spec and back.dispatch is not None and back.dispatch.options == {"seed": 7}
    # a section without options has none; the scheduler's policy is no section at all
    assert ServiceSpec.from_json(b'{"name": "b", "model": "m", "dispatch": "jsq"}').dispatch.options == {}
    assert ServiceSpec.from_json(b'{"name": "b", "model": "m", "dispatch": null}').dispatch is None

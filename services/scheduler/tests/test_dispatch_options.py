"""--dispatch-options: the constructor options of the default dispatch policy, refused at start when bad."""

from __future__ import annotations

import pytest
from llmfleet.types import ServiceSpec
from llmfleet_scheduler.main import build_node, build_parser
from llmfleet_scheduler.routing import DispatchRouter


def _args(*flags: str):
    return build_parser().parse_args(["--http-port", "-1", "--stats-interval-s", "0", *flags])


async def test_options_reach_the_default_policy_only():
    args = _args("--dispatch", "worst_fit_kv", "--dispatch-options", '{"active_only": true}')
    assert args.dispatch_options == {"active_only": True}
    node, servicer = build_node(args)
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

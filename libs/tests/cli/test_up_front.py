"""``llmfleet up`` starts the OpenAI front on ``--http-port`` (``--front-workers`` processes), and the
schedulers then serve no HTTP of their own; without a front they serve it as before."""

from __future__ import annotations

import argparse

from llmfleet.cli import up
from llmfleet.config import ClusterConfig

CONFIG = {
    "services": {"chat": {"model": "m"}},
    "models": {"m": {"source": "tiny://llama"}},
    "engines": {"e0": {}},
}


def _plans(tmp_path, **kw) -> dict[str, up.ServicePlan]:
    cfg = ClusterConfig.model_validate(CONFIG)
    plans = up.plan_services(
        cfg, "c.yaml", etcd="e:1", state_dir=tmp_path, base_port=7000, schedulers=2, **kw
    )
    return {p.name: p for p in plans}


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_front_serves_the_http_port_in_place_of_the_schedulers(tmp_path) -> None:
    plans = _plans(tmp_path, http_port=8000, front_workers=2, api_keys="/k.yaml")
    front = plans["front"]
    assert front.address == "127.0.0.1:7004" and front.http == "127.0.0.1:8000"
    assert _flag(front.argv, "--http-port") == "8000" and _flag(front.argv, "--workers") == "2"
    assert _flag(front.argv, "--api-keys") == "/k.yaml" and _flag(front.argv, "--etcd") == "e:1"
    assert _flag(front.argv, "--port") == "7004" and _flag(front.argv, "--id") == "front"
    for name in ("scheduler", "scheduler-1"):
        assert _flag(plans[name].argv, "--http-port") == "-1" and plans[name].http == ""
    assert list(plans).index("front") < list(plans).index("e0")  # started with the control plane
    assert len({p.address for p in plans.values()}) == len(plans)  # no port shared


def test_without_a_front_the_schedulers_serve_http(tmp_path) -> None:
    plans = _plans(tmp_path, http_port=8000, front_workers=0)
    assert "front" not in plans
    assert plans["scheduler"].http == "127.0.0.1:8000" and plans["scheduler-1"].http == "127.0.0.1:8001"


def test_no_http_port_no_front(tmp_path) -> None:
    plans = _plans(tmp_path, http_port=-1, front_workers=3)
    assert "front" not in plans and _flag(plans["scheduler"].argv, "--http-port") == "-1"


def test_up_starts_one_front_worker_by_default() -> None:
    ap = argparse.ArgumentParser()
    up.add_arguments(ap)
    args = ap.parse_args([])
    assert args.front_workers == 1 and args.http_port == up.DEFAULT_HTTP_PORT


def test_the_front_asks_its_users_no_client_certificate() -> None:
    from llmfleet.cli.up_security import child_env

    base = {"LLMFLEET_TLS_CERT": "c.pem", "LLMFLEET_TLS_CLIENT_AUTH": "1"}
    assert child_env(base, "front")["LLMFLEET_TLS_CLIENT_AUTH"] == "0"
    assert child_env(base, "placement")["LLMFLEET_TLS_CLIENT_AUTH"] == "1"

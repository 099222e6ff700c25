"""``llmfleet up`` passes the cluster config's ``scheduler:`` section to every scheduler, and shares the
host's cores among the CPU engines it starts (each engine's own ``threads`` wins)."""

from __future__ import annotations

import pytest
from llmfleet.cli import up
from llmfleet.config import ClusterConfig
from llmfleet.spec.live_loops import SchedulerConfig

BASE = {
    "services": {"chat": {"model": "m"}},
    "models": {"m": {"source": "tiny://llama"}},
    "engines": {"e0": {}, "e1": {}, "e2": {"threads": 3}},
}


def test_scheduler_section_becomes_scheduler_flags(tmp_path) -> None:
    cfg = ClusterConfig.model_validate(
        {**BASE, "scheduler": {"binding": "early", "cold_start": False, "move_queued": True}}
    )
    plans = up.plan_services(
        cfg, tmp_path / "c.yaml", etcd="127.0.0.1:2379", state_dir=tmp_path, schedulers=2
    )
    for p in (p for p in plans if p.name.startswith("scheduler")):
        argv = p.argv
        assert argv[argv.index("--binding") + 1] == "early"
        assert "--no-cold-start" in argv and "--move-queued" in argv
        assert argv[argv.index("--ready-when") + 1] == "servable"


def test_defaults_are_late_binding_with_cold_starts() -> None:
    args = SchedulerConfig().args()
    assert args[args.index("--binding") + 1] == "late" and "--no-cold-start" not in args


def test_bad_scheduler_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match="binding"):
        ClusterConfig.model_validate({**BASE, "scheduler": {"binding": "sometimes"}})
    with pytest.raises(ValueError, match="kv_room_fraction"):
        ClusterConfig.model_validate({**BASE, "scheduler": {"kv_room_fraction": 0}})


def test_cpu_engines_share_the_cores(tmp_path) -> None:
    cfg = ClusterConfig.model_validate(BASE)
    assert up.cpu_threads_each(cfg, cores=2) == 1  # three engines, two cores: one each, not two
    assert up.cpu_threads_each(cfg, cores=12) == 4
    plans = {
        p.name: p.argv for p in up.plan_services(cfg, tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path)
    }
    assert plans["e0"][plans["e0"].index("--threads") + 1] == str(up.cpu_threads_each(cfg))
    assert plans["e2"].count("--threads") == 1 and plans["e2"][plans["e2"].index("--threads") + 1] == "3"


def test_up_forgets_the_node_records_a_previous_run_left_in_its_etcd(tmp_path) -> None:
    import subprocess

    from llmfleet.coord import LocalEtcd

    etcd = LocalEtcd(tmp_path / "etcd").start()
    try:
        ctl = [str(LocalEtcd.etcdctl_path()), "--endpoints", etcd.endpoint]
        subprocess.run([*ctl, "put", "/llmfleet/nodes/engine-0", "{}"], check=True, capture_output=True)
        subprocess.run([*ctl, "put", "/llmfleet/services/chat", "{}"], check=True, capture_output=True)
        up.forget_nodes(etcd, None)
        keys = subprocess.run(
            [*ctl, "get", "--prefix", "/llmfleet/", "--keys-only"], capture_output=True, text=True
        )
        assert keys.stdout.split() == ["/llmfleet/services/chat"]  # only the nodes are gone
    finally:
        etcd.stop()


def test_schedulers_of_an_emulated_pool_price_requests_on_its_gpu(tmp_path) -> None:
    """aladdin_bestfit reads the cost model of ``--hardware``: on an emulated A100 pool that is the A100's,
    not the CPU default."""
    emulated = {
        "services": {"chat": {"model": "llama2-7b"}},
        "models": {"llama2-7b": {"source": "emulated://llama2-7b"}},
        "placement": {"policy": "aladdin"},
        "emulated": {"hardware": "A100-40GB", "count": 2},
    }
    plans = up.plan_services(
        ClusterConfig.model_validate(emulated),
        tmp_path / "c.yaml",
        etcd="x:1",
        state_dir=tmp_path,
        schedulers=2,
    )
    for p in (p for p in plans if p.name.startswith("scheduler")):
        assert p.argv[p.argv.index("--hardware") + 1] == "a100-40gb"
    plans = up.plan_services(
        ClusterConfig.model_validate(BASE), tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path
    )
    assert all("--hardware" not in p.argv for p in plans if p.name.startswith("scheduler"))


def test_an_emulated_pools_block_tokens_reach_its_engines(tmp_path) -> None:
    pool = {"hardware": "A100-80GB", "count": 2, "engine": {"block_tokens": 32}}
    config = {
        "services": {"chat": {"model": "llama2-7b"}},
        "models": {"llama2-7b": {"source": "emulated://llama2-7b"}},
        "emulated": pool,
    }
    plans = up.plan_services(
        ClusterConfig.model_validate(config), tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path
    )
    emu = [p for p in plans if p.name.startswith("emu")]
    assert emu and all(p.argv[p.argv.index("--block-tokens") + 1] == "32" for p in emu)
    config["emulated"] = {"hardware": "A100-80GB", "count": 2}
    plans = up.plan_services(
        ClusterConfig.model_validate(config), tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path
    )
    assert all("--block-tokens" not in p.argv for p in plans)  # the engines' default


def test_the_preemption_rule_reaches_the_schedulers_and_every_engine_core(tmp_path) -> None:
    """One setting, ``scheduler.preemption``: the schedulers' late binding and the engines' cores read the
    same rule (fairness among keys only where the hold queue is fair: vtc)."""
    preemption = {"max_preemptions": 5, "credit_window_s": 3}
    emulated = {
        "services": {"chat": {"model": "llama2-7b"}},
        "models": {"llama2-7b": {"source": "emulated://llama2-7b"}},
        "emulated": {"hardware": "A100-80GB", "count": 2},
    }
    for config, fairness in [({**BASE, "engines": {"e0": {}}}, "vtc"), (emulated, "none")]:
        cfg = ClusterConfig.model_validate(
            {**config, "scheduler": {"fairness": fairness, "preemption": preemption}}
        )
        plans = up.plan_services(cfg, tmp_path / "c.yaml", etcd="x:1", state_dir=tmp_path)
        sched = next(p.argv for p in plans if p.name.startswith("scheduler"))
        assert sched[sched.index("--preemption-max-preemptions") + 1] == "5"
        assert sched[sched.index("--preemption-credit-window-s") + 1] == "3.0"
        (engine,) = [p.argv for p in plans if p.name in ("e0", "emu0")]
        assert engine[engine.index("--preemption-max-preemptions") + 1] == "5"
        assert engine[engine.index("--preemption-credit-window-s") + 1] == "3.0"
        # the engine has no hold queue: its fairness comes resolved
        assert ("--preemption-fairness" in engine, "--no-preemption-fairness" in engine) == (
            (True, False) if fairness == "vtc" else (False, True)
        )
    rule = ClusterConfig.model_validate(
        {**BASE, "scheduler": {"fairness": "none"}}
    ).scheduler.preemption_rule()
    assert rule is not None and rule.priority and not rule.fairness


def test_bad_preemption_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match="credit_window_s"):
        ClusterConfig.model_validate({**BASE, "scheduler": {"preemption": {"credit_window_s": -1}}})
    with pytest.raises(ValueError, match="max_preemptions"):
        ClusterConfig.model_validate({**BASE, "scheduler": {"preemption": {"max_preemptions": "many"}}})
    with pytest.raises(ValueError, match=r"preemption\.every"):
        ClusterConfig.model_validate({**BASE, "scheduler": {"preemption": {"every": True}}})
    off = ClusterConfig.model_validate(
        {**BASE, "scheduler": {"preemption": {"priority": False, "fairness": False}}}
    )
    assert off.scheduler.preemption_rule() is None

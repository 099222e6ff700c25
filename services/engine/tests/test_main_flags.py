"""``llmfleet-engine`` flags: what ``llmfleet up`` passes from the cluster config reaches ExecutorConfig."""

from __future__ import annotations

import pytest
from llmfleet.engine_core import EngineLimits
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.spec.engines import EngineConfig
from llmfleet_engine import main


def executor_config(argv: list[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(main, "Executor", lambda config: config)  # capture, build nothing
    return main.make_executor(main.build_parser().parse_args(argv))


def test_cluster_config_engine_entry_reaches_the_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = EngineConfig(
        models=["m"],
        policy="static_sls",
        options={"batch_size": 8, "max_iterations": 64, "slice_end": "recompute"},
        max_running=16,
        max_batch_requests=8,
        max_prefill_tokens=2048,
        watermark=0.05,
        block_bytes=4096,
        stream_interval_s=0.0,
    )
    cfg = executor_config(entry.engine_args(), monkeypatch)
    assert cfg.stream_interval_s == 0.0
    assert cfg.policy == "static_sls"
    assert cfg.options == {"batch_size": 8, "max_iterations": 64, "slice_end": "recompute"}
    assert cfg.limits == EngineLimits(16, 8, 2048, watermark=0.05, block_bytes=4096)


def test_defaults_and_the_slice_end_option(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = executor_config([], monkeypatch)
    assert (cfg.policy, cfg.options, cfg.max_batch_requests, cfg.block_bytes) == (
        "fcfs",
        {},
        32,
        65536,
    )
    assert cfg.stream_interval_s == 0.0  # tokens never wait for a timer
    opts = ["--policy-options", '{"slice_end": "recompute"}', "--policy", "scls"]
    assert executor_config(opts, monkeypatch).options == {"slice_end": "recompute"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy-options", "{bad"], "argument --policy-options: not JSON"),
        (["--policy-options", "[1]"], "must be a JSON object"),
        (["--policy-options", '{"x": 1}'], "bad options for request policy 'fcfs'"),
        (["--policy", "static_sls", "--policy-options", '{"batch_size": 0}'], "batch_size must be an int >= 1"),
        (["--policy", "scls", "--policy-options", '{"slice_end": "drop"}'],
         "slice_end must be one of ['keep', 'recompute'], got 'drop'"),
        (["--policy", "scls", "--policy-options", '{"keep_kv": true}'],
         "bad options for engine policy 'scls': keep_kv was renamed: write slice_end: keep|recompute"),
        (["--policy", "scls", "--slice-end", "recompute"],
         """--slice-end was renamed: write --policy-options '{"slice_end": "keep|recompute"}'"""),
        (["--policy", "scls", "--slice-end"], "--slice-end was renamed"),
    ],
)  # fmt: skip
def test_bad_policy_options_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as e:
        main.build_parser().parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_max_migrations_flag(capsys: pytest.CaptureFixture) -> None:
    assert main.build_parser().parse_args([]).max_migrations == 4
    assert main.build_parser().parse_args(["--max-migrations", "9"]).max_migrations == 9
    with pytest.raises(SystemExit) as e:
        main.build_parser().parse_args(["--max-migrations", "0"])
    assert e.value.code == 2 and "--max-migrations: must be >= 1" in capsys.readouterr().err


def test_prefix_caching_is_on_by_default_and_switched_per_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert executor_config([], monkeypatch).prefix_caching is True
    entry = EngineConfig(models=["m"], prefix_caching=False)
    assert "--no-prefix-caching" in entry.engine_args()
    assert executor_config(entry.engine_args(), monkeypatch).limits.prefix_caching is False
    assert executor_config(["--prefix-caching"], monkeypatch).prefix_caching is True
    with pytest.raises(SystemExit):
        main.build_parser().parse_args(["--prefix-caching", "maybe"])


def test_the_preemption_flags_reach_the_core_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """``llmfleet up`` passes the scheduler section's preemption, resolved, as these flags."""
    cfg = executor_config([], monkeypatch)
    assert cfg.preemption == PreemptionRule()  # the defaults: priority, fairness, 2, 10 s
    argv = [
        "--no-preemption-fairness",
        "--preemption-max-preemptions",
        "4",
        "--preemption-credit-window-s",
        "0",
    ]
    cfg = executor_config(argv, monkeypatch)
    assert cfg.preemption == PreemptionRule(fairness=False, max_preemptions=4, credit_window_s=0.0)
    cfg = executor_config(["--no-preemption-priority", "--no-preemption-fairness"], monkeypatch)
    assert cfg.preemption is None  # neither: the core preempts on a KV shortage only


def test_a_vllm_engine_refuses_the_native_cores_preemption_flags(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main.build_parser().parse_args(["--backend", "vllm", "--preemption-max-preemptions", "3"])
    assert "--preemption-max-preemptions" in capsys.readouterr().err

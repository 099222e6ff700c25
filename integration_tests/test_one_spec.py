"""One cluster file, two sides: the flags ``llmfleet up`` gives each live service, parsed by that
service's own parser, build the same policies with the same options as ``llmfleet sim
--cluster-config`` reads from the same file."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
from llmfleet.cli.sim import add_arguments
from llmfleet.cli.sim_args import bundles
from llmfleet.cli.up_plan import preemption_args
from llmfleet.config import ClusterConfig
from llmfleet.policies.dispatch import make_dispatch_policy
from llmfleet.policies.engine_policy import make_engine_policy
from llmfleet.policies.migration import make_migration_policy, make_transfer_planner
from llmfleet.policies.placement import make_placement_policy
from llmfleet.policies.request.preemption import PreemptionRule
from llmfleet.spec.live_loops import SCHEDULER_FLAGS

CLUSTER = """
services:
  chat: {model: llama2-7b, slo: {ttft_s: 2.0, tpot_s: 0.1}, max_tokens: 128}
  code: {model: llama2-13b, slo: {ttft_s: 3.0, tpot_s: 0.15}}
models:
  llama2-7b: {source: "emulated://llama2-7b", dtype: float16}
  llama2-13b: {source: "emulated://llama2-13b", dtype: float16}
engines:
  e0: {policy: static_sls, options: {batch_size: 6, max_iterations: 40, slice_end: recompute}, max_batch_requests: 32}
  e1: {policy: static_sls, options: {batch_size: 6, max_iterations: 40, slice_end: recompute}, max_batch_requests: 32}
placement:
  policy: aladdin
  interval_s: 5
  window_s: 10
  confirm_intervals: 3
  options: {k5: 0.25, min_workers: 1}
migration: {policy: mell, options: {batching: false}, epoch_s: 2, transfer: kv}
scheduler:
  binding: late
  queue_slack: 2
  kv_room_fraction: 0.9
  dispatch: {policy: power_of_two, options: {seed: 7}}
  fairness: none
  preemption: {max_preemptions: 3, credit_window_s: 4}
"""


def _config(obj: Any) -> Any:
    """A policy object's public configuration, nested objects included (state and RNGs left out)."""
    if isinstance(obj, int | float | str | bool | type(None)):
        return obj
    if isinstance(obj, list | tuple):
        return [_config(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _config(v) for k, v in obj.items()}
    public = {k: _config(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return (type(obj).__name__, public)


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return path


def _live(path: Path) -> dict[str, Any]:
    """What each live service builds from the flags ``llmfleet up`` passes it."""
    from llmfleet_engine.main import build_parser as engine_parser
    from llmfleet_migration.main import build_parser as migration_parser
    from llmfleet_scheduler.main import build_parser as scheduler_parser

    config = ClusterConfig.load(path)
    engines = [
        engine_parser().parse_args([*e.engine_args(), *preemption_args(config)])
        for _, e in sorted(config.engines.items())
    ]
    sched = scheduler_parser().parse_args(config.scheduler.args())
    mig = migration_parser().parse_args(config.migration.args())
    p = config.placement  # the placement leader reads its section from the cluster file itself
    return {
        "engine": [_config(make_engine_policy(ns.policy, **ns.policy_options)) for ns in engines],
        "dispatch": _config(make_dispatch_policy(sched.dispatch, **sched.dispatch_options)),
        "capacity": (sched.binding, sched.queue_slack, sched.kv_room_fraction, sched.move_queued),
        "preemption": (
            [ns.preemption.rule() for ns in engines],
            SCHEDULER_FLAGS.read(sched).preemption_rule(),
        ),
        "placement": _config(make_placement_policy(p.policy, **p.options)),
        "placement_loop": (p.interval_s, p.window_s, p.confirm_intervals),
        "migration": _config(make_migration_policy(mig.policy, **mig.policy_options)),
        "migration_loop": (mig.epoch_s, _config(make_transfer_planner(mig.transfer))),
    }


def _simulated(path: Path) -> dict[str, Any]:
    """What ``llmfleet sim --cluster-config`` runs from the same file."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--synthetic", "10", "--cluster-config", str(path)])
    (b,) = bundles(args, ClusterConfig.load(path))
    c = b.capacity
    return {
        "engine": [_config(b.local_factory()()) for _ in range(2)],
        "dispatch": _config(make_dispatch_policy(b.dispatch.policy, **b.dispatch.options)),
        "capacity": (c.binding, c.queue_slack, c.kv_room_fraction, c.move_queued),
        "preemption": ([c.preemption_rule() for _ in range(2)], c.preemption_rule()),
        "placement": _config(make_placement_policy(b.placement.policy, **b.placement.options)),
        "placement_loop": (b.placement.interval_s, b.placement.window_s, b.placement.confirm_intervals),
        "migration": _config(make_migration_policy(b.migration.policy, **b.migration.options)),
        "migration_loop": (b.migration.epoch_s, _config(make_transfer_planner(b.migration.transfer))),
    }


def test_live_and_simulated_build_the_same_policies(cluster_file: Path) -> None:
    live, sim = _live(cluster_file), _simulated(cluster_file)
    assert live == sim
    # and they are the file's, not defaults that happen to agree
    assert sim["engine"][0] == ("StaticSls", sim["engine"][0][1]) and sim["engine"][0][1]["batch_size"] == 6
    assert sim["dispatch"] == ("PowerOfTwo", {"seed": 7})
    assert sim["capacity"] == ("late", 2, 0.9, False)
    assert sim["preemption"][1] == PreemptionRule(fairness=False, max_preemptions=3, credit_window_s=4.0)
    assert sim["placement"][1]["k5"] == 0.25 and sim["placement_loop"] == (5.0, 10.0, 3)
    assert sim["migration"][1]["batching"] is False and sim["migration_loop"][0] == 2.0


def test_a_changed_option_shows_on_both_sides(cluster_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(CLUSTER.replace("seed: 7", "seed: 8").replace("k5: 0.25", "k5: 0.5"))
    assert _live(other) == _simulated(other)
    assert _live(other)["dispatch"] != _live(cluster_file)["dispatch"]
    assert _simulated(other)["placement"] != _simulated(cluster_file)["placement"]


@pytest.mark.parametrize(
    ("new", "old", "message"),
    [
        ("options: {batch_size: 6", "policy_options: {batch_size: 6", "policy_options was renamed: write options"),
        ("max_tokens: 128", "default_max_tokens: 128", "default_max_tokens was renamed: write max_tokens"),
        ("slice_end: recompute}", "keep_kv: false}", "keep_kv was renamed: write slice_end: keep|recompute"),
        ("tpot_s: 0.1}", "atgt_s: 0.1}", "atgt_s was renamed: write tpot_s"),
    ],
)  # fmt: skip
def test_an_old_spelling_is_an_error_naming_the_new(tmp_path: Path, new: str, old: str, message: str) -> None:
    path = tmp_path / "old.yaml"
    assert new in CLUSTER
    path.write_text(CLUSTER.replace(new, old))
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterConfig.load(path)


def test_a_cluster_of_engines_that_differ_cannot_be_simulated_as_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        CLUSTER.replace(
            "e1: {policy: static_sls, options: {batch_size: 6, max_iterations: 40, slice_end: recompute}",
            "e1: {policy: fcfs",
        )
    )
    with pytest.raises(ValueError, match="the simulator runs one engine policy, but engines differ"):
        _simulated(bad)

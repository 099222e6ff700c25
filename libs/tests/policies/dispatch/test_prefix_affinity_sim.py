"""prefix_affinity in the simulator: multi-turn conversations, each turn resending the history, stay on
the instance that served the turn before, where join-the-shortest-queue and round robin scatter them:
by their prompts alone (the simulator hands the policy each arrival's prompt text), or by name."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace

import pytest
from llmfleet.sim.run import preset, simulate
from llmfleet.sim.spec import ClusterSpec, SimService, SimSpec
from llmfleet.types import Slo
from llmfleet.workload import Workload
from llmfleet.workload.conversations import conversations

SPEC = SimSpec(
    ClusterSpec.parse("4xA100-80GB"), (SimService("chat", "llama2-7b", Slo(ttft_s=1.0, tpot_s=0.1)),)
)


@pytest.fixture(scope="module")
def work():
    return conversations(60, rate=2.0, mean_turns=4.0, system_tokens=300, think_s=3.0, seed=3)


def anonymous(work: Workload) -> Workload:
    """The same requests without their conversation ids: only the prompts tell the turns together."""
    return Workload(tuple(replace(r, session="") for r in work))


def same_instance_share(dispatch: str, work) -> tuple[float, int]:
    """Of the turns after a conversation's first, the share served where the turn before was."""
    exp = simulate(SPEC, work, preset("fcfs-jsq", dispatch=dispatch), samples=10)
    assert exp.report["policy"]["dispatch"]["policy"] == dispatch
    records = exp.result.records
    assert all(r.done for r in records) and len(records) == len(work)
    where: dict[str, list[str]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.arrival_s):
        where[r.request_id.rsplit("-t", 1)[0]].append(r.instance)
    same = [a == b for turns in where.values() for a, b in itertools.pairwise(turns)]
    return sum(same) / len(same), len(set().union(*map(set, where.values())))


def test_conversations_stay_where_their_history_is(work):
    for w in (anonymous(work), work):
        share, used = same_instance_share("prefix_affinity", w)
        assert share >= 0.85 and used == 4  # affinity, and still every instance serves
    for baseline in ("jsq", "round_robin"):
        assert same_instance_share(baseline, work)[0] <= 0.5

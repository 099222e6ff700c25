"""The chaos suite, CI-sized (``make chaos`` is the full run: ``python -m tools.chaos.chaos``).

Under 16 steady concurrent greedy streams (8 through the SDK given both scheduler replicas, 8 through
the OpenAI-compatible HTTP API alternating replicas): kill -9 an engine, a scheduler replica and the
placement leader (each restarted a second later, as ``llmfleet up`` would), then freeze etcd past the
lease TTL. Every request must complete with exactly the tokens of an uninterrupted run: 0 lost,
0 duplicated / gapped / wrong, 0 errors seen by SDK clients; HTTP clients may retry a request cut by
a replica's death on the other replica (a retry, never an error), and the cluster must become whole
again (every process registered with a live lease, leaders elected, both replicas routing to every
engine) after each fault.
"""

from __future__ import annotations

import pytest

from tools.chaos.chaos import ChaosCluster, markdown, run_chaos

TTL_S = 3
FAULTS = ("engine", "scheduler", "placement-leader", "etcd-freeze")


@pytest.fixture(scope="module")
def chaos_cluster(tmp_path_factory):
    c = ChaosCluster(tmp_path_factory.mktemp("chaos"), engines=2, ttl=TTL_S)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.timeout(480)
async def test_chaos_subset_loses_nothing_and_recovers(chaos_cluster):
    report = await run_chaos(
        chaos_cluster,
        FAULTS,
        concurrency=16,
        baseline_s=3,
        settle_s=3,
        restart_delay_s=1.0,
        whole_timeout_s=90,
        drain_s=60,
        lengths=(8, 16, 32),
    )
    print(markdown(report))
    total = report["total"]
    assert total["started"] > 0 and total["completed"] > 0
    assert [f["fault"] for f in report["faults"]] == list(FAULTS)
    for f in report["faults"]:
        assert f["whole_after_inject_s"] is not None, (
            f"{f['fault']}: never whole again: {f['not_whole_reason']}"
        )
        assert f["counts"]["started"] > 0, f"{f['fault']}: no request started while it was injected"
    assert total["lost"] == 0, total["examples"]
    assert total["duplicated"] + total["gapped"] + total["wrong"] == 0, total["examples"]
    assert total["sdk"]["errors"] == 0, total["examples"]
    assert total["http"]["errors"] == 0, total["examples"]  # retried on the other replica, never failed
    assert total["completed"] == total["started"]
    # the scheduler replica's death cut live streams: the SDK resumed them on the other replica
    sched = next(f for f in report["faults"] if f["fault"] == "scheduler")
    assert sched["in_flight_at_inject"] > 0

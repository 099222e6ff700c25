"""Every scheduling policy live: one cluster whose engines each run a different engine-local policy
(continuous: fcfs, doubling_budget, muxserve_rr; static batching: static_sls, scls, slo_odbs, s3) and
whose services each use a different dispatch policy (from the cluster config). A mixed workload —
every service at once, several lengths — must complete every request with exactly its tokens."""

from __future__ import annotations

import asyncio

import pytest
from harness import launch
from llmfleet.client import AsyncClient

ENDLESS = {"source": "{endless}"}  # the tiny llama without EOS: every request runs to max_tokens
ENGINES = {
    "e-fcfs": {"models": ["tiny-llama"], "policy": "fcfs", "max_batch_requests": 4},  # an engine limit
    "e-db": {"models": ["shared"], "policy": "doubling_budget"},
    "e-mux": {"models": ["shared"], "policy": "muxserve_rr"},
    "e-sls": {"models": ["m-sls"], "policy": "static_sls", "options": {"batch_size": 4}},
    "e-scls": {"models": ["m-scls"], "policy": "scls"},
    "e-odbs": {"models": ["m-odbs"], "policy": "slo_odbs"},
    "e-s3": {"models": ["m-s3"], "policy": "s3"},
}
SERVICES = {
    "s-aladdin": {"model": "tiny-llama", "dispatch": "aladdin_bestfit", "slo": {"ttft_s": 5, "tpot_s": 1}},
    "s-jsq": {"model": "shared", "dispatch": "jsq"},
    "s-p2c": {"model": "shared", "dispatch": "power_of_two"},
    "s-least": {"model": "shared", "dispatch": "least_loaded"},
    "s-best": {"model": "shared", "dispatch": "best_fit_kv"},
    "s-worst": {"model": "shared", "dispatch": "worst_fit_kv"},
    "s-sls": {"model": "m-sls"},
    "s-scls": {"model": "m-scls", "dispatch": "scls_maxmin"},
    # SLO-ODBS orders by predicted length and reads the deadline
    "s-odbs": {"model": "m-odbs", "slo": {"deadline_s": 60}, "predict": True},
    "s-s3": {"model": "m-s3", "predict": True},
}
CONFIG = {
    "services": {name: {"max_tokens": 8, **s} for name, s in SERVICES.items()},
    "models": {m: ENDLESS for m in ("tiny-llama", "shared", "m-sls", "m-scls", "m-odbs", "m-s3")},
    "engines": ENGINES,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = launch(tmp_path_factory.mktemp("policies"), config=CONFIG, placement_replicas=1)
    yield c
    c.stop()


async def test_mixed_workload_completes_under_every_policy(cluster):
    jobs = [
        (service, f"request {i} for {service}: " + "word " * (3 + 5 * i), 3 + 2 * i)
        for service in SERVICES
        for i in range(4)
    ]
    async with AsyncClient(cluster.scheduler, timeout_s=120) as client:
        results = await asyncio.gather(
            *(client.complete(prompt, service=service, max_tokens=n) for service, prompt, n in jobs)
        )
    for (service, _, n), r in zip(jobs, results, strict=True):
        assert r.usage.finish_reason == "length", (service, r.usage)
        assert len(r.token_ids) == n, (service, len(r.token_ids), n)
    engines_of = {}
    for (service, _, _), r in zip(jobs, results, strict=True):
        engines_of.setdefault(service, set()).add(r.usage.engine_id)
    assert engines_of["s-sls"] == {"e-sls"} and engines_of["s-scls"] == {"e-scls"}
    assert engines_of["s-aladdin"] == {"e-fcfs"}
    shared = set().union(*(engines_of[s] for s in ("s-jsq", "s-p2c", "s-least", "s-best", "s-worst")))
    assert shared <= {"e-db", "e-mux"}

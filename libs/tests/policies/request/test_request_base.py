import pytest
from llmfleet.policies.request import (
    POLICIES,
    Batch,
    BatchLimits,
    DoublingBudget,
    Fcfs,
    PoolView,
    RequestPolicy,
    SchedRequest,
    admission_blocks,
    make_request_policy,
    stuck_requests,
)


def req(rid, model="m", prompt=10, **kw):
    return SchedRequest(rid, kw.pop("service", model), model, kw.pop("arrival", 0.0), prompt, 8, **kw)


def test_pool_view_blocks_and_watermark():
    pool = PoolView(free_blocks=10, watermark_blocks=3, tokens_per_block={"a": 16, "b": 4})
    assert pool.available_blocks == 7
    assert [pool.blocks_for("a", t) for t in (0, 1, 16, 17)] == [0, 1, 1, 2]
    assert pool.blocks_for("b", 17) == 5
    assert admission_blocks(pool, req("r", model="a", prompt=16)) == 2  # prompt + first token
    assert PoolView(2, 5, {"a": 1}).available_blocks == 0
    with pytest.raises(ValueError, match="no block size for model 'c'"):
        pool.blocks_for("c", 1)
    with pytest.raises(ValueError):
        PoolView(1, 0, {"a": 0})
    with pytest.raises(ValueError):
        PoolView(-1, 0, {"a": 1})


def test_dataclass_validation():
    r = req("r", prompt=5, generated=3)
    assert r.context_tokens == 8 and r.phase == "prefill" and r.first_scheduled_s is None
    with pytest.raises(ValueError):
        req("", prompt=1)
    with pytest.raises(ValueError):
        req("r", prompt=-1)
    with pytest.raises(ValueError):
        req("r", phase="running")
    with pytest.raises(ValueError):
        Batch("m", "decode", ())
    with pytest.raises(ValueError):
        Batch("m", "both", ("r",))
    with pytest.raises(ValueError):
        BatchLimits(max_requests=0)
    assert BatchLimits() == BatchLimits(32, 4096)


def test_registry_and_protocol():
    assert set(POLICIES) == {"fcfs", "longest_prefix", "doubling_budget", "muxserve_rr"}
    assert isinstance(make_request_policy("fcfs"), Fcfs)
    db = make_request_policy("doubling_budget", default_mean_s=2.0, default_std_s=0.0)
    assert isinstance(db, DoublingBudget) and db.budget_unit("x") == 2.0
    for p in (Fcfs(), DoublingBudget(), make_request_policy("muxserve_rr")):
        assert isinstance(p, RequestPolicy)
    with pytest.raises(
        ValueError,
        match=r"unknown request policy 'sjf'; valid: \['doubling_budget', 'fcfs', 'longest_prefix', 'muxserve_rr'\]",
    ):
        make_request_policy("sjf")
    with pytest.raises(ValueError, match="bad options for request policy 'fcfs'"):
        make_request_policy("fcfs", nope=1)
    with pytest.raises(ValueError):
        make_request_policy("doubling_budget", default_mean_s=0.0)


def test_stuck_requests_only_when_nothing_runs():
    pool = PoolView(4, 1, {"m": 10})  # 3 blocks available = 30 tokens
    big, small = req("big", prompt=40), req("small", prompt=5)
    assert stuck_requests([big, small], [], pool) == [big]
    assert stuck_requests([big], [req("run", phase="decode")], pool) == []

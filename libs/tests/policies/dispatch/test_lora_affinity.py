"""LoRA-affinity dispatch (``lora_affinity``) and llm-d's rule (``lora_llmd``): tiers, the load bound,
the recent-dispatch memory, and what the candidates carry from a load report."""

from __future__ import annotations

import pytest
from llmfleet.api.v1 import common_pb2
from llmfleet.load import LoadBook
from llmfleet.load.monitor import report_from_proto
from llmfleet.policies.dispatch import (
    AdapterPoolView,
    DispatchRequest,
    EngineCandidate,
    LlmdLoraAffinity,
    LoraAffinity,
    NoCandidate,
    dispatch_needs,
    make_dispatch_policy,
)
from llmfleet.policies.dispatch.lora_affinity import EVICT, RESIDENT, ROOM, adapter_tier

BASE = "llama"


def cand(eid: str, queued: int = 0, resident: tuple[str, ...] = (), slots: int = 2) -> EngineCandidate:
    models = (BASE, "a", "b", "c", "d")
    return EngineCandidate(
        eid, models, running=queued, adapter_pools=(AdapterPoolView(BASE, resident, slots),)
    )


def req(adapter: str, t: float = 0.0, base: str = BASE) -> DispatchRequest:
    return DispatchRequest(f"r{t}", adapter, arrival_s=t, base=base)


def test_tiers():
    assert adapter_tier(cand("e", resident=("a",)), "a", BASE) == RESIDENT
    assert adapter_tier(cand("e", resident=("b",)), "a", BASE) == ROOM
    assert adapter_tier(cand("e", resident=("b", "c")), "a", BASE) == EVICT
    assert adapter_tier(EngineCandidate("e", (BASE, "a")), "a", BASE) == EVICT  # no pool reported
    # without the request's base the only pool is the base's
    assert adapter_tier(cand("e", resident=("b",)), "a", "") == ROOM


def test_resident_beats_room_beats_evict_within_the_bound():
    p = LoraAffinity()
    cands = [cand("e0", 3, ("b", "c")), cand("e1", 2, ("b",)), cand("e2", 4, ("a", "b"))]
    assert p.choose("a", cands, request=req("a", 0.0)) == "e2"
    assert p.choose("d", cands, request=req("d", 0.0)) == "e1"  # room beats a fuller queue that evicts
    assert p.stats.resident == 1 and p.stats.room == 1


def test_a_hot_adapter_spreads_once_its_engine_is_past_the_bound():
    p = make_dispatch_policy("lora_affinity", max_load_excess=2, max_load_ratio=1.0, recent_s=0)
    cands = [cand("e0", 5, ("a",)), cand("e1", 2, ("b",)), cand("e2", 2, ("b", "c"))]
    assert p.choose("a", cands, request=req("a", 0.0)) == "e1"  # e0 at 5 > 2 + 2: the least loaded with room
    assert p.stats.over_bound == 1
    cands[0] = cand("e0", 4, ("a",))
    assert p.choose("a", cands, request=req("a", 1.0)) == "e0"  # within the bound again


def test_a_burst_of_a_cold_adapter_stays_on_one_engine_until_reports_catch_up():
    p = LoraAffinity()
    cands = [cand("e0", 0, ()), cand("e1", 0, ())]
    picks = {p.choose("a", cands, request=req("a", 0.1 * i)) for i in range(3)}
    assert picks == {"e0"}
    # sent lately: "a" takes one of e0's two slots, so "b" and "c" find room on e0 only until it is full
    assert adapter_tier(cands[0], "b", BASE, p.recent, 0.3) == ROOM
    p.recent.sent("e0", "b", 0.3)
    assert adapter_tier(cands[0], "c", BASE, p.recent, 0.3) == EVICT
    assert adapter_tier(cands[0], "a", BASE, p.recent, 10.0) == ROOM  # forgotten after recent_s


def test_plain_model_and_no_request_are_jsq():
    p = LoraAffinity()
    cands = [cand("e0", 3, ("a",)), cand("e1", 1)]
    assert p.choose(BASE, cands, request=DispatchRequest("r", BASE)) == "e1"
    assert p.choose("a", cands) == "e1"
    with pytest.raises(NoCandidate):
        p.choose("zz", cands, request=req("zz"))


def test_options_are_checked():
    with pytest.raises(ValueError, match="max_load_ratio"):
        make_dispatch_policy("lora_affinity", max_load_ratio=0.5)
    with pytest.raises(ValueError, match="recent_s"):
        make_dispatch_policy("lora_affinity", recent_s=-1)
    assert dispatch_needs("lora_affinity").reads_queue and not dispatch_needs("lora_affinity").reads_kv


def test_llmd_scores_resident_room_and_queue():
    p = LlmdLoraAffinity()
    # resident (1.0) + queue 0 (longest) vs room (0.8) + queue 1 (shortest): the queue wins
    cands = [cand("e0", 10, ("a",)), cand("e1", 0, ("b",))]
    assert p.choose("a", cands, request=req("a")) == "e1"
    # resident with queue score 0.75 (1.75) loses to room with queue score 1 (1.8)
    cands = [cand("e0", 1, ("c",)), cand("e1", 0, ("b",)), cand("e2", 4, ("b", "c"))]
    assert p.choose("c", cands, request=req("c", 5.0)) == "e1"
    # a resident adapter on an equal queue wins
    cands = [cand("e0", 2, ("b",)), cand("e1", 2, ("d",))]
    assert p.choose("d", cands, request=req("d", 9.0)) == "e1"
    assert make_dispatch_policy("lora_llmd", lora_weight=2.0).options.lora_weight == 2.0


def test_candidates_carry_the_reported_adapter_pools():
    snap = common_pb2.LoadSnapshot(
        running=1,
        models=[
            common_pb2.ModelLoad(model=BASE, adapters=["b", "a"], adapter_slots=4, adapter_loads=3),
            common_pb2.ModelLoad(model="plain"),
        ],
    )
    report = report_from_proto(snap)
    assert report.adapter_pools == (AdapterPoolView(BASE, ("b", "a"), 4),)
    book = LoadBook()
    book.report("e0", report)
    c = book.candidate("e0", (BASE, "a", "b"))
    assert c.holds_adapter("a") and not c.holds_adapter("c")
    assert c.adapter_pool(BASE) is not None and c.adapter_pool(BASE).free == 2
    assert c.adapter_pool("plain") is None

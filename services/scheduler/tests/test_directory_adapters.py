"""The scheduler's directory for LoRA adapters: an adapter model's base from the model catalog, and
candidates carrying each engine's reported adapter pools (what ``lora_affinity`` dispatch reads)."""

from __future__ import annotations

from llmfleet.coord.desired import ModelEntry
from llmfleet.load.book import LoadReport
from llmfleet.policies.dispatch import AdapterPoolView, DispatchRequest, make_dispatch_policy
from llmfleet.testing import StaticView
from llmfleet.types import ENGINE_ROLE, NodeRecord
from llmfleet_scheduler.directory import ClusterDirectory


def node(nid: str) -> NodeRecord:
    return NodeRecord(node_id=nid, role=ENGINE_ROLE, address=f"{nid}:1", models=["llama", "chat-lora"])


def test_base_of_and_candidates_with_adapter_pools():
    models = {
        "llama": ModelEntry("llama", "tiny://llama"),
        "chat-lora": ModelEntry("chat-lora", "", base="llama", adapter="/adapters/chat"),
    }
    d = ClusterDirectory(
        nodes_view=StaticView({"e0": node("e0"), "e1": node("e1")}), models_view=StaticView(models)
    )
    assert d.base_of("chat-lora") == "llama"
    assert d.base_of("llama") == "" and d.base_of("unknown") == ""
    d.load.report("e0", LoadReport(running=2, adapter_pools=(AdapterPoolView("llama", ("other",), 1),)))
    d.load.report("e1", LoadReport(running=3, adapter_pools=(AdapterPoolView("llama", ("chat-lora",), 1),)))
    cands = {c.engine_id: c for c in d.candidates()}
    assert cands["e1"].holds_adapter("chat-lora") and not cands["e0"].holds_adapter("chat-lora")
    policy = make_dispatch_policy("lora_affinity")
    req = DispatchRequest("r", "chat-lora", arrival_s=1.0, base=d.base_of("chat-lora"))
    assert policy.choose("chat-lora", list(cands.values()), request=req) == "e1"

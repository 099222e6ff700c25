"""The policy's input from the live cluster: one :class:`GpuState` per reporting engine (pure).

Each engine's latest load snapshot lists the requests it holds (``LoadSnapshot.requests``: id, model,
context tokens, KV bytes, phase, LoRA adapter); its node record gives its models (with the adapters
registered on them, so a policy moves an adapter's request only to an engine serving that adapter) and
address (the machine is the
address's host, for Mell's same-machine priority). A request still waiting for admission holds no KV
yet; it counts with the KV its prompt will take (``tokens`` × the model's bytes per token seen on
that engine), so the packer reserves room for it. Engines whose snapshot is older than ``stale_s``
(or missing) are left out: nothing is planned to or from them this epoch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

from llmfleet.api.v1 import common_pb2
from llmfleet.policies.migration import GpuState, RequestState
from llmfleet.types import ENGINE_ROLE, NodeRecord


def machine_of(address: str) -> str:
    """The host part of ``host:port`` (``[v6]:port`` too)."""
    return urlsplit(f"//{address}").hostname or address


def bytes_per_token(snap: common_pb2.LoadSnapshot) -> dict[str, float]:
    """KV bytes per token per model on this engine, from its model loads and its requests."""
    out = {m.model: m.kv_used_bytes / m.kv_tokens for m in snap.models if m.kv_tokens}
    for r in snap.requests:
        if r.model not in out and r.kv_bytes and r.tokens:
            out[r.model] = r.kv_bytes / r.tokens
    return out


def gpu_states(
    snapshots: Mapping[str, tuple[common_pb2.LoadSnapshot, float]],
    nodes: Mapping[str, NodeRecord],
    now: float,
    *,
    active: Collection[str] | None = None,
    stale_s: float = 5.0,
) -> list[GpuState]:
    """``snapshots``: engine id → (snapshot, monotonic receive time). ``active``: the leader's active
    set (None: an engine is active when it holds a request)."""
    out = []
    for eid in sorted(snapshots):
        snap, at = snapshots[eid]
        node = nodes.get(eid)
        if node is None or node.role != ENGINE_ROLE or now - at > stale_s or not snap.kv_capacity_bytes:
            continue
        bpt = bytes_per_token(snap)
        reqs = []
        for r in snap.requests:
            kv = r.kv_bytes if r.kv_bytes else int(r.tokens * bpt.get(r.model, 0.0))
            reqs.append(RequestState(r.request_id, r.model, kv, r.tokens, r.adapter))
        is_active = bool(reqs) if active is None else (eid in active or bool(reqs))
        out.append(
            GpuState(
                eid,
                tuple(node.models),
                snap.kv_capacity_bytes,
                tuple(reqs),
                is_active,
                machine_of(node.address),
            )
        )
    return out

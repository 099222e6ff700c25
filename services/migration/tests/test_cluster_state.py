"""The policy's input from load snapshots and node records."""

from __future__ import annotations

from llmfleet.api.v1 import common_pb2
from llmfleet.types import ENGINE_ROLE, NodeRecord
from llmfleet_migration.cluster_state import gpu_states, machine_of


def snap(capacity: int, *reqs: tuple[str, int, int, str]) -> common_pb2.LoadSnapshot:
    s = common_pb2.LoadSnapshot(kv_capacity_bytes=capacity)
    for rid, tokens, kv, phase in reqs:
        s.requests.add(request_id=rid, model="m", tokens=tokens, kv_bytes=kv, phase=phase)
    return s


def node(eid: str, address: str, role: str = ENGINE_ROLE) -> NodeRecord:
    return NodeRecord(eid, role, address, models=("m",))


def test_states_from_snapshots() -> None:
    snaps = {
        "a": (snap(1000, ("r1", 10, 100, "decode"), ("r2", 5, 0, "waiting")), 9.0),
        "b": (snap(1000), 9.5),
        "stale": (snap(1000, ("r3", 1, 10, "decode")), 1.0),
        "sched": (snap(1000), 9.0),
    }
    nodes = {
        "a": node("a", "10.0.0.1:50061"),
        "b": node("b", "10.0.0.2:50062"),
        "stale": node("stale", "10.0.0.3:1"),
        "sched": node("sched", "10.0.0.4:1", role="scheduler"),
    }
    a, b = gpu_states(snaps, nodes, now=10.0, stale_s=5.0)
    assert (a.gpu_id, b.gpu_id) == ("a", "b")  # stale and non-engine nodes are left out
    assert [r.request_id for r in a.requests] == ["r1", "r2"]
    assert a.requests[1].kv_bytes == 50  # waiting: its prompt at the engine's 10 bytes/token
    assert a.active and not b.active and a.machine == "10.0.0.1" and a.capacity_bytes == 1000
    (a2, b2) = gpu_states(snaps, nodes, now=10.0, active={"b"})
    assert a2.active and b2.active  # in the leader's active set, or holding a request


def test_machine_of_addresses() -> None:
    assert machine_of("10.1.2.3:50061") == "10.1.2.3"
    assert machine_of("[::1]:50061") == "::1"
    assert machine_of("engine-1:50062") == "engine-1"


def test_a_request_of_an_adapter_carries_it_and_engines_list_the_adapters_they_serve() -> None:
    s = common_pb2.LoadSnapshot(kv_capacity_bytes=1000)
    s.requests.add(request_id="r", model="m", tokens=10, kv_bytes=100, phase="decode", adapter="lora-a")
    s.requests.add(request_id="x", model="m", tokens=10, kv_bytes=100, phase="decode")
    nodes = {"a": NodeRecord("a", ENGINE_ROLE, "10.0.0.1:1", models=("lora-a", "m"))}
    (a,) = gpu_states({"a": (s, 9.0)}, nodes, now=10.0)
    r, x = a.requests
    assert (r.model, r.adapter, r.served_as) == ("m", "lora-a", "lora-a")  # its KV is its base's
    assert (x.adapter, x.served_as) == ("", "m")
    assert a.models == ("lora-a", "m")  # the node record's: the base and the adapters registered on it

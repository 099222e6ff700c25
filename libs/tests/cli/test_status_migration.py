"""``llmfleet status``'s migration section from the migration leader's Status."""

from __future__ import annotations

import io

from llmfleet.api.v1 import migration_pb2
from llmfleet.cli.status_migration import migration_status, render_migration
from llmfleet.types import NodeRecord
from rich.console import Console

RECORDS = {"migration-1": NodeRecord("migration-1", "migration", "10.0.0.9:50054")}


def reply() -> migration_pb2.StatusResponse:
    r = migration_pb2.StatusResponse(leader_id="migration-1", is_leader=True, policy="mell", epoch_s=1.0)
    e = r.engines.add(engine_id="engine-0", active=True, gpu_type="T")
    e.load.running, e.load.kv_used_bytes, e.load.kv_capacity_bytes = 3, 250, 1000
    e.load.kv_blocks_total = 100  # 10 bytes a block: its 40 cached blocks are 400 bytes
    e.load.prefix_cache.blocks, e.load.prefix_cache.queries, e.load.prefix_cache.hits = 40, 200, 50
    r.engines.add(engine_id="engine-1", active=False)
    r.running.add(migration_id="x#4@m", request_id="x", source="engine-1", destination="engine-0", mode="kv",
                  kv_bytes=4096, state="running")  # fmt: skip
    r.recent.add(request_id="y", source="engine-1", destination="engine-0", mode="tokens", state="failed",
                 error="ABORTED: link dropped")  # fmt: skip
    r.epochs.add(epoch=4, time=1.0, operations=3, planned=2, executed=1, failed=1, deactivated=["engine-1"],
                 active_engines=1)  # fmt: skip
    return r


async def test_rows_and_rendering() -> None:
    async def source(address: str) -> migration_pb2.StatusResponse:
        assert address == "10.0.0.9:50054"
        return reply()

    m = await migration_status("migration-1", RECORDS, source)
    assert (
        m.error is None
        and m.policy == "mell"
        and [e.engine_id for e in m.engines] == ["engine-0", "engine-1"]
    )
    assert m.engines[0].gpu_type == "T" and not m.engines[1].active
    assert (m.engines[0].prefix_cached_bytes, m.engines[0].prefix_hit_rate) == (400, 0.25)
    assert (m.engines[1].prefix_cached_bytes, m.engines[1].prefix_hit_rate) == (None, None)  # not reported
    assert m.running[0].state == "running" and m.recent[0].error == "ABORTED: link dropped"
    assert m.epochs[0].deactivated == ["engine-1"] and m.epochs[0].planned == 2
    out = io.StringIO()
    render_migration(m, Console(file=out, width=200))
    text = out.getvalue()
    assert "mell" in text and "25.0%" in text and "-engine-1" in text and "link dropped" in text
    assert "prefix cache" in text and "40.0%" in text  # its cached blocks' share of the pool


async def test_no_leader_or_unreachable_is_a_note_not_a_failure() -> None:
    async def down(address: str):
        raise ConnectionError("refused")

    assert (await migration_status(None, RECORDS, down)).error == "no migration leader"
    m = await migration_status("migration-1", RECORDS, down)
    assert "10.0.0.9:50054" in m.error and "refused" in m.error

"""The coordinator's executor against a scripted engine over real gRPC: modes and ids are sent,
UNAVAILABLE is retried with the same id, other errors are final, concurrency is bounded."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.policies.migration import Migration
from llmfleet.rpc.migrate_status import NOT_ATTACHED
from llmfleet.rpc.server import GrpcServer, service_name
from llmfleet_migration.executor import MigrationExecutor


class ScriptedEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self) -> None:
        self.calls: list[engine_pb2.MigrateRequest] = []
        self.flaky = {"r-flaky": 1}  # request id -> UNAVAILABLE answers left
        self.in_flight = 0
        self.max_in_flight = 0

    async def Migrate(self, request, context):
        self.calls.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            if self.flaky.get(request.request_id, 0) > 0:
                self.flaky[request.request_id] -= 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
            if request.request_id.startswith("gone"):
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no active request {request.request_id!r}")
            if request.request_id.startswith("fresh"):
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"request {request.request_id!r} {NOT_ATTACHED}: later",
                )
            return engine_pb2.MigrateResponse(
                request_id=request.request_id, bytes=1000, transfer_s=0.01, mode=request.mode,
                migration_id=request.migration_id,
            )  # fmt: skip
        finally:
            self.in_flight -= 1


def mig(rid: str, mode: str = "kv", dst: str = "b") -> Migration:
    return Migration(f"{rid}:a->{dst}#1", rid, "m", "a", dst, 1000, 10, mode)


@pytest.fixture
async def engine():
    eng = ScriptedEngine()
    server = GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, eng, service_name(engine_pb2, "Engine"))]
    )
    await server.start()
    yield eng, server.address
    await server.stop()


async def test_modes_ids_retries_and_final_errors(engine) -> None:
    eng, addr = engine
    ex = MigrationExecutor(lambda: {"a": addr, "b": "127.0.0.1:1"}, max_concurrency=2)
    try:
        out = await ex.run(
            [
                mig("r1"),
                mig("r2", "tokens"),
                mig("r-flaky"),
                mig("gone-1"),
                mig("r3", dst="dead"),
                mig("fresh-1"),
            ]
        )
    finally:
        await ex.close()
    ok = {o.migration.request_id: o for o in out}
    assert [o.ok for o in out] == [True, True, True, False, False, False]
    # just moved in and not followed by the scheduler yet: a later epoch, not a failure
    assert ok["fresh-1"].state == "not yet"
    assert "NOT_FOUND" in ok["gone-1"].error and "engine dead is not live" in ok["r3"].error
    assert (ok["gone-1"].state, ok["r3"].state, ok["r1"].state) == ("gone", "failed", "done")
    modes = {c.request_id: c.mode for c in eng.calls}
    assert modes["r1"] == engine_pb2.MIGRATE_MODE_KV and modes["r2"] == engine_pb2.MIGRATE_MODE_TOKENS
    flaky = [c for c in eng.calls if c.request_id == "r-flaky"]
    assert len(flaky) == 2 and flaky[0].migration_id == flaky[1].migration_id  # retried, same id
    assert all(c.destination == "127.0.0.1:1" for c in eng.calls)
    assert eng.max_in_flight <= 2 and not ex.running
    assert [o.migration.request_id for o in ex.recent] and ok["r1"].bytes == 1000


def test_bad_concurrency_is_named() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        MigrationExecutor(dict, max_concurrency=0)


class ProbingEngine(ScriptedEngine):
    def __init__(self) -> None:
        super().__init__()
        self.probes: list[engine_pb2.MeasureLinkRequest] = []

    async def MeasureLink(self, request, context):
        self.probes.append(request)
        if request.destination.endswith(":1"):
            await context.abort(grpc.StatusCode.ABORTED, "destination unreachable")
        return engine_pb2.MeasureLinkResponse(
            destination=request.destination, bytes=request.bytes, seconds=0.5, bytes_per_s=2.0 * request.bytes
        )


async def test_measure_links_asks_each_source_to_probe_its_destination() -> None:
    eng = ProbingEngine()
    server = GrpcServer(
        [(engine_pb2_grpc.add_EngineServicer_to_server, eng, service_name(engine_pb2, "Engine"))]
    )
    await server.start()
    ex = MigrationExecutor(lambda: {"a": server.address, "b": "10.1.1.1:7", "c": "127.0.0.1:1"})
    try:
        got = await ex.measure_links([("a", "b"), ("a", "c"), ("a", "gone")], 1 << 20)
    finally:
        await ex.close()
        await server.stop()
    assert got == {("a", "b"): 2.0 * (1 << 20)}  # c refused the probe; "gone" is not live (no call)
    assert sorted((p.destination, p.bytes) for p in eng.probes) == [
        ("10.1.1.1:7", 1 << 20),
        ("127.0.0.1:1", 1 << 20),
    ]

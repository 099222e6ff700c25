"""Migrate calls of one engine: a bound on those in flight, idempotent migration ids, link estimates.

- At most ``max_in_flight`` migrations run at once; one more is refused (RESOURCE_EXHAUSTED) rather than
  queued, so a coordinator sees the limit at once.
- A ``migration_id`` names one migration: a call with an id in flight waits for that one and returns
  its outcome; a completed one returns its recorded outcome, success or error (the last ``history``
  ids are kept). The migration runs to its end even when the caller goes away (a retry finds it).
- A request that is not here is NOT_FOUND; if this engine moved it recently, the message says where.
- ``LinkTable``: the latest bandwidth per destination, from MeasureLink probes and from the K/V
  transfer of completed KV-mode migrations (bytes / transfer_s, when at least ``min_bytes`` moved).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import grpc

from llmfleet_engine import kv_rpc
from llmfleet_engine.backend import KvMigration
from llmfleet_engine.kv_rpc import MigrateMode, MigrationResult
from llmfleet_engine.outputs import MigrationConflictError, RequestNotFoundError, TransferError

log = logging.getLogger(__name__)

DEFAULT_MAX_MIGRATIONS = 4
DEFAULT_HISTORY = 1024
MIN_ESTIMATE_BYTES = 256 * 1024  # smaller K/V transfers are mostly latency, not bandwidth


@dataclass(frozen=True)
class LinkEstimate:
    destination: str
    bytes: int
    seconds: float
    source: str  # "probe" | "migration"
    timestamp: float  # seconds since the epoch

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class LinkTable:
    """The latest bandwidth estimate per destination (at most ``capacity`` destinations, oldest out)."""

    def __init__(self, capacity: int = 256, min_bytes: int = MIN_ESTIMATE_BYTES) -> None:
        self.capacity = capacity
        self.min_bytes = min_bytes
        self._links: OrderedDict[str, LinkEstimate] = OrderedDict()

    def record(self, destination: str, nbytes: int, seconds: float, source: str) -> LinkEstimate | None:
        if seconds <= 0 or nbytes <= 0 or (source == "migration" and nbytes < self.min_bytes):
            return None
        est = LinkEstimate(destination, nbytes, seconds, source, time.time())
        self._links[destination] = est
        self._links.move_to_end(destination)
        while len(self._links) > self.capacity:
            self._links.popitem(last=False)
        return est

    def get(self, destination: str) -> LinkEstimate | None:
        return self._links.get(destination)

    def estimates(self) -> list[LinkEstimate]:
        return sorted(self._links.values(), key=lambda e: e.destination)


@dataclass(frozen=True)
class MigrateCall:
    request_id: str
    destination: str
    mode: MigrateMode = "kv"
    chunk_tokens: int = kv_rpc.DEFAULT_CHUNK_TOKENS


@dataclass(frozen=True)
class MigrateOutcome:
    """A migration's result, or the status it failed with (``code`` set)."""

    migration_id: str
    call: MigrateCall
    result: MigrationResult | None = None
    code: grpc.StatusCode | None = None
    details: str = ""


class Migrations:
    """Runs an engine's Migrate calls (see the module docstring)."""

    def __init__(
        self,
        ops: KvMigration,
        engine_id: str,
        *,
        max_in_flight: int = DEFAULT_MAX_MIGRATIONS,
        history: int = DEFAULT_HISTORY,
        links: LinkTable | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.ops = ops
        self.engine_id = engine_id
        self.max_in_flight = max_in_flight
        self.history = history
        self.links = links if links is not None else LinkTable()
        self._in_flight: dict[str, tuple[MigrateCall, asyncio.Task[MigrateOutcome]]] = {}
        self._done: OrderedDict[str, MigrateOutcome] = OrderedDict()
        self._moved: OrderedDict[str, tuple[str, str]] = OrderedDict()  # request -> (destination, id)

    async def migrate(self, call: MigrateCall, migration_id: str = "") -> MigrateOutcome:
        """Run ``call`` as ``migration_id`` (a new id when empty), or join / replay that id."""
        mid = migration_id or uuid.uuid4().hex
        if (done := self._done.get(mid)) is not None:
            self._done.move_to_end(mid)
            return self._same_call(done.call, call, mid) or done
        if (running := self._in_flight.get(mid)) is not None:
            return self._same_call(running[0], call, mid) or await asyncio.shield(running[1])
        if len(self._in_flight) >= self.max_in_flight:
            return MigrateOutcome(
                mid,
                call,
                code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                details=f"{len(self._in_flight)} migrations in flight on engine {self.engine_id}, the "
                f"limit (--max-migrations {self.max_in_flight}); retry when one has finished",
            )
        task = asyncio.create_task(self._run(mid, call), name=f"migrate-{mid}")
        self._in_flight[mid] = (call, task)
        return await asyncio.shield(task)  # a caller going away does not cut the migration

    def _same_call(self, first: MigrateCall, call: MigrateCall, mid: str) -> MigrateOutcome | None:
        """None when ``call`` repeats ``first`` (chunk size aside), else the INVALID_ARGUMENT outcome."""
        a = (first.request_id, first.destination, first.mode)
        b = (call.request_id, call.destination, call.mode)
        if a == b:
            return None
        return MigrateOutcome(
            mid,
            call,
            code=grpc.StatusCode.INVALID_ARGUMENT,
            details=f"migration_id {mid!r} names the migration of {first.request_id!r} to "
            f"{first.destination} ({first.mode}); use a new id for another",
        )

    async def _run(self, mid: str, call: MigrateCall) -> MigrateOutcome:
        rid, dest = call.request_id, call.destination
        try:
            result = await kv_rpc.migrate(self.ops, self.engine_id, rid, dest, call.chunk_tokens, call.mode)
            outcome = MigrateOutcome(mid, call, result)
            if result.mode == "kv":
                self.links.record(dest, result.bytes, result.transfer_s, "migration")
            self._moved[rid] = (dest, mid)
            while len(self._moved) > self.history:
                self._moved.popitem(last=False)
        except RequestNotFoundError:
            outcome = MigrateOutcome(mid, call, code=grpc.StatusCode.NOT_FOUND, details=self._not_here(rid))
        except MigrationConflictError as e:
            outcome = MigrateOutcome(mid, call, code=grpc.StatusCode.FAILED_PRECONDITION, details=str(e))
        except TransferError as e:
            outcome = MigrateOutcome(
                mid, call, code=grpc.StatusCode.ABORTED, details=f"{e}; the request continues here"
            )
        except Exception as e:
            log.exception("migration %s of %s to %s failed", mid, rid, dest)
            outcome = MigrateOutcome(
                mid, call, code=grpc.StatusCode.INTERNAL, details=f"migration failed: {e}"
            )
        finally:
            self._in_flight.pop(mid, None)
        self._done[mid] = outcome
        while len(self._done) > self.history:
            self._done.popitem(last=False)
        return outcome

    def _not_here(self, request_id: str) -> str:
        moved = self._moved.get(request_id)
        if moved is not None:
            return (
                f"request {request_id!r} is not on engine {self.engine_id}: migration {moved[1]} "
                f"moved it to {moved[0]}"
            )
        return (
            f"request {request_id!r} is not on engine {self.engine_id} (finished, cancelled, moved "
            "away or never here)"
        )

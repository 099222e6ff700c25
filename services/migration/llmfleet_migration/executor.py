"""Run planned migrations against the engines: bounded concurrency, retries, idempotent ids.

Each migration is one ``Migrate`` call on its source engine (destination address, mode, migration
id). The engine owns the safety: if the transfer fails the request keeps running on the source, and a
repeated call with the same migration id returns the first call's result instead of moving twice —
so the executor may retry an UNAVAILABLE / DEADLINE_EXCEEDED call (tenacity, a few attempts) and a
successor leader may re-issue a move without duplicating a request. Any other error is final for
this epoch (the request stays where it is; the policy sees the real state next epoch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from llmfleet.api.v1 import engine_pb2, engine_pb2_grpc
from llmfleet.policies.migration import Migration
from llmfleet.rpc.channels import open_channel
from llmfleet.rpc.migrate_status import NOT_ATTACHED
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

log = logging.getLogger(__name__)

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
MODES = {"kv": engine_pb2.MIGRATE_MODE_KV, "tokens": engine_pb2.MIGRATE_MODE_TOKENS}


def _retryable(e: BaseException) -> bool:
    return isinstance(e, grpc.aio.AioRpcError) and e.code() in RETRYABLE


@dataclass
class Outcome:
    """A finished (or failed) migration, as Status shows it."""

    migration: Migration
    ok: bool
    error: str = ""
    seconds: float = 0.0
    bytes: int = 0
    transfer_s: float = 0.0
    gone: bool = False  # NOT_FOUND: the request finished (or moved) after the load report it was planned on
    # the request had just moved to the source and the scheduler had not followed it yet: a later epoch
    # moves it (moving it on first would leave the scheduler's stream behind: a token gap)
    not_yet: bool = False

    @property
    def state(self) -> str:
        return "done" if self.ok else "gone" if self.gone else "not yet" if self.not_yet else "failed"


@dataclass
class MigrationExecutor:
    """``addresses()``: engine id → host:port (live engines). At most ``max_concurrency`` calls run at once."""

    addresses: Callable[[], Mapping[str, str]]
    max_concurrency: int = 4
    attempts: int = 3
    timeout_s: float = 60.0
    history: int = 64
    running: dict[str, Migration] = field(default_factory=dict)
    recent: deque[Outcome] = field(init=False)
    _sem: asyncio.Semaphore = field(init=False)
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        self.recent = deque(maxlen=self.history)
        self._sem = asyncio.Semaphore(self.max_concurrency)

    async def run(self, migrations: Sequence[Migration]) -> list[Outcome]:
        """Run them all (bounded), in order of submission; one outcome each."""
        return list(await asyncio.gather(*(self._one(m) for m in migrations)))

    async def _one(self, m: Migration) -> Outcome:
        async with self._sem:
            self.running[m.migration_id] = m
            t0 = time.monotonic()
            try:
                out = await self._call(m)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                out = Outcome(
                    m,
                    False,
                    f"{e.code().name}: {e.details()}",
                    gone=e.code() == grpc.StatusCode.NOT_FOUND,
                    not_yet=e.code() == grpc.StatusCode.FAILED_PRECONDITION
                    and NOT_ATTACHED in (e.details() or ""),
                )
            except Exception as e:  # a bad address, a closed channel: never fail the epoch
                out = Outcome(m, False, f"{type(e).__name__}: {e}")
            finally:
                self.running.pop(m.migration_id, None)
            out.seconds = time.monotonic() - t0
            if out.gone or out.not_yet:
                log.info(
                    "migration %s: %s (%s)",
                    m.migration_id,
                    out.error,
                    "finished since the report it was planned on"
                    if out.gone
                    else "deferred to a later epoch",
                )
            elif not out.ok:
                log.warning(
                    "migration %s failed: %s (the request stays on %s)", m.migration_id, out.error, m.source
                )
            self.recent.append(out)
            return out

    async def _call(self, m: Migration) -> Outcome:
        addresses = self.addresses()
        src, dst = addresses.get(m.source), addresses.get(m.destination)
        if src is None or dst is None:
            missing = m.source if src is None else m.destination
            return Outcome(m, False, f"engine {missing} is not live")
        stub = engine_pb2_grpc.EngineStub(self._channel(src))
        req = engine_pb2.MigrateRequest(
            request_id=m.request_id, destination=dst, mode=MODES[m.mode], migration_id=m.migration_id
        )
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.1, max=1.0),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                resp = await stub.Migrate(req, timeout=self.timeout_s)
        return Outcome(m, True, bytes=resp.bytes, transfer_s=resp.transfer_s)

    async def measure_links(
        self, pairs: Sequence[tuple[str, str]], nbytes: int, timeout_s: float = 5.0
    ) -> dict[tuple[str, str], float]:
        """Bytes per second of each (source, destination) engine pair: the source's ``MeasureLink``
        probe of ``nbytes`` to the destination (bounded like migrations). A pair that cannot be measured
        (an engine not live, the probe refused or timed out) is left out, logged."""

        async def one(src: str, dst: str) -> tuple[tuple[str, str], float] | None:
            addresses = self.addresses()
            a, b = addresses.get(src), addresses.get(dst)
            if a is None or b is None:
                return None
            async with self._sem:
                try:
                    resp = await engine_pb2_grpc.EngineStub(self._channel(a)).MeasureLink(
                        engine_pb2.MeasureLinkRequest(destination=b, bytes=nbytes), timeout=timeout_s
                    )
                except grpc.aio.AioRpcError as e:
                    log.info("link %s -> %s not measured: %s %s", src, dst, e.code().name, e.details())
                    return None
            return ((src, dst), resp.bytes_per_s) if resp.bytes_per_s > 0 else None

        found = await asyncio.gather(*(one(s, d) for s, d in pairs))
        return dict(x for x in found if x is not None)

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address)
        return ch

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

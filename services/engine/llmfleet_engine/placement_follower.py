"""Reconcile the engine's loaded models to its desired state in etcd (``placement/{engine_id}``).

No key for this engine means "no opinion": whatever is loaded stays (a drain in progress is called
off). A key means exactly those models (``()``: idle). Replacement loses no request:

1. **load first**: missing models are loaded while the old ones keep serving (a load that does not
   fit beside them, or a new source under the same name, is retried once they are gone);
2. **hand-off**: a model leaving this engine keeps serving until another engine the desired state
   gives it to advertises it (at most ``handoff_timeout_s``), so the fleet never has a gap;
3. **drain**: the model is no longer advertised (schedulers stop routing to it) and new requests get
   UNAVAILABLE (the relay re-routes them); running requests finish here (``mode="wait"``) for up to
   ``timeout_s``; past it, or at once with ``mode="migrate"``, each is moved: Migrate with its KV to an
   engine advertising the model, else evicted with UNAVAILABLE so the scheduler resumes it elsewhere
   from the delivered tokens (re-prefill);
4. **unload** once no request of the model is left.

A model desired again while draining serves again at once. Both the native and the vLLM backend
drain; the vLLM one has no KV export, so its moved requests are evicted and resumed by re-prefill.
Failed loads are retried every ``retry_s``; a change of the desired state wakes the follower at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from llmfleet.coord import PrefixView
from llmfleet.types import ENGINE_ROLE, DesiredPlacement, ModelSpec, NodeRecord

from llmfleet_engine import kv_rpc
from llmfleet_engine.backend import KvMigration, ModelHosting
from llmfleet_engine.models import ModelLoadError
from llmfleet_engine.outputs import (
    ExecutorClosedError,
    MigrationConflictError,
    ModelConflictError,
    RequestNotFoundError,
    ResourceExhaustedError,
    TransferError,
)
from llmfleet_engine.reconcile import is_stale

log = logging.getLogger(__name__)

DrainMode = Literal["wait", "migrate"]
DRAIN_MODES: tuple[str, ...] = ("wait", "migrate")
LOAD_ERRORS = (ModelLoadError, ModelConflictError, ExecutorClosedError, ResourceExhaustedError)


@dataclass(frozen=True)
class DrainSettings:
    """How a leaving model's requests are treated (engine flags ``--drain-*``)."""

    mode: DrainMode = "wait"  # wait: finish in place up to timeout_s, then move; migrate: move at once
    timeout_s: float = 30.0
    handoff_timeout_s: float = 60.0  # longest wait for another engine to advertise a leaving model
    poll_s: float = 0.1  # how often a leaving model's progress is checked

    def __post_init__(self) -> None:
        if self.mode not in DRAIN_MODES:
            raise ValueError(f"drain mode must be one of {DRAIN_MODES}, got {self.mode!r}")
        if min(self.timeout_s, self.handoff_timeout_s) < 0 or self.poll_s <= 0:
            raise ValueError(f"drain timeouts must be >= 0 and poll_s > 0, got {self}")


@dataclass
class _Leaving:
    """A model on its way out of this engine."""

    noticed_s: float
    draining_since: float | None = None
    mover: asyncio.Task[None] | None = None


class NodesView(Protocol):
    """What the follower reads of the nodes ``PrefixView``: the records, and a wake on each change."""

    def snapshot(self) -> dict[str, NodeRecord]: ...

    def subscribe(self) -> AsyncIterator[tuple[int, dict[str, NodeRecord]]]: ...


@dataclass
class PlacementFollower:
    """Follows ``placement/{engine_id}`` with the engine's models (``host``); a leaving model's requests
    move by KV migration (``migration``; None: they are evicted and resumed elsewhere by re-prefill)."""

    engine_id: str
    host: ModelHosting
    migration: KvMigration | None
    retry_s: float = 5.0
    drain: DrainSettings = field(default_factory=DrainSettings)
    nodes: NodesView | None = None  # other engines: hand-off check, migration targets
    applied: DesiredPlacement | None = None  # the last desired state reached completely
    _leaving: dict[str, _Leaving] = field(default_factory=dict)
    _failed: dict[str, tuple[ModelSpec, float]] = field(default_factory=dict)  # failed loads: spec, when
    _needs_room: set[str] = field(default_factory=set)  # loads waiting for a leaving model's unload

    async def run(self, view: PrefixView[DesiredPlacement]) -> None:
        """Follow ``view`` forever."""
        changed = asyncio.Event()

        async def pump(v: PrefixView[DesiredPlacement] | NodesView) -> None:
            async for _ in v.subscribe():
                changed.set()

        pumps = [asyncio.create_task(pump(v)) for v in (view, self.nodes) if v is not None]
        try:
            while True:
                changed.clear()  # before reading, so a change during a pass triggers another one
                wait = await self.step(view.snapshot())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=wait)
        finally:
            for p in pumps:
                p.cancel()
            for lv in self._leaving.values():
                if lv.mover is not None:
                    lv.mover.cancel()

    async def step(self, placements: dict[str, DesiredPlacement]) -> float | None:
        """One reconcile pass over the desired state of every engine; returns how long to wait before
        the next pass (None: until the desired state changes)."""
        desired = placements.get(self.engine_id)
        if desired is None:
            for name in list(self._leaving):
                self._keep(name)
            return None
        want = {s.name: s for s in desired.models}
        loaded = self.host.models
        self._failed = {n: f for n, f in self._failed.items() if want.get(n) == f[0]}  # a new spec: at once
        if not self._leaving:
            self._needs_room.clear()
        for name, model in loaded.items():  # what leaves (or is replaced by another source)
            if is_stale(want.get(name), model) and name not in self._leaving:
                self._leaving[name] = _Leaving(time.monotonic())
        for name, spec in want.items():  # 1. load first
            model = loaded.get(name)
            if model is not None and not is_stale(spec, model):
                self._keep(name)
            elif model is None and name not in self._needs_room and self._may_retry(name):
                await self._load(spec)
        unloaded = False
        for name in list(self._leaving):  # 2.-4. hand off, drain, move, unload
            unloaded |= await self._progress(name, placements)
        if unloaded:  # room for what waited
            self._needs_room.clear()
            for name, spec in want.items():
                if name not in self.host.models and self._may_retry(name):
                    await self._load(spec)
        if self._leaving:
            return self.drain.poll_s
        if self._failed or any(n not in self.host.models for n in want):
            return self.retry_s
        self.applied = desired
        return None

    # ------------------------------------------------------------------ loading

    def _may_retry(self, name: str) -> bool:
        failed = self._failed.get(name)
        return failed is None or time.monotonic() - failed[1] >= self.retry_s

    async def _load(self, spec: ModelSpec) -> bool:
        """Load ``spec``. A model that does not fit while others are still leaving waits for their
        unload (``_needs_room``) instead of failing."""
        try:
            result = await asyncio.to_thread(self.host.load, spec)
        except LOAD_ERRORS as e:
            if isinstance(e, ResourceExhaustedError | ModelConflictError) and self._leaving:
                self._needs_room.add(spec.name)
                log.info("%s: %s waits for a leaving model's unload: %s", self.engine_id, spec.name, e)
            else:
                self._failed[spec.name] = (spec, time.monotonic())
                log.error(
                    "%s: could not load %s: %s; retrying in %.0fs", self.engine_id, spec.name, e, self.retry_s
                )
            return False
        self._failed.pop(spec.name, None)
        if not result.already_loaded:
            log.info("%s: loaded %s", self.engine_id, spec.name)
        return True

    # ------------------------------------------------------------------ leaving models

    def _keep(self, name: str) -> None:
        """``name`` is desired here again: call its departure off."""
        lv = self._leaving.pop(name, None)
        if lv is None:
            return
        if lv.mover is not None:
            lv.mover.cancel()
        self.host.end_drain(name)

    async def _progress(self, name: str, placements: dict[str, DesiredPlacement]) -> bool:
        """Advance ``name``'s departure; True once it is unloaded."""
        host = self.host
        lv = self._leaving[name]
        now = time.monotonic()
        if lv.draining_since is None:
            waited = now - lv.noticed_s
            taker = self._handoff_pending(name, placements)
            if taker and waited < self.drain.handoff_timeout_s:
                return False  # keep serving until the new host advertises it
            if taker:
                log.warning(
                    "%s: %s is not advertised by %s after %.0fs; draining anyway",
                    self.engine_id, name, taker, waited,
                )  # fmt: skip
            host.begin_drain(
                name, f"model {name!r} is draining from engine {self.engine_id} (placement moved it)"
            )
            lv.draining_since = now
        ids = host.model_request_ids(name)
        if not ids:
            if lv.mover is not None and not lv.mover.done():
                return False
            del self._leaving[name]
            if await asyncio.to_thread(host.unload, name):
                log.info("%s: drained and unloaded %s", self.engine_id, name)
            return True
        overdue = now - lv.draining_since >= self.drain.timeout_s
        if (self.drain.mode == "migrate" or overdue) and (lv.mover is None or lv.mover.done()):
            why = (
                "drain mode migrate"
                if self.drain.mode == "migrate"
                else f"drain timeout {self.drain.timeout_s}s"
            )
            log.info("%s: moving %d request(s) of %s (%s)", self.engine_id, len(ids), name, why)
            lv.mover = asyncio.create_task(self._move_all(name, ids))
        return False

    def _handoff_pending(self, name: str, placements: dict[str, DesiredPlacement]) -> str:
        """The engines that should take ``name`` over but do not advertise it yet ("" when none need to:
        another engine already serves it, or the model leaves the fleet)."""
        takers = sorted(
            eid
            for eid, p in placements.items()
            if eid != self.engine_id and any(s.name == name for s in p.models)
        )
        if not takers or self.nodes is None:
            return ""
        if self._destinations(name):
            return ""
        return ", ".join(takers)

    def _destinations(self, name: str) -> list[str]:
        """Addresses of the other live engines that advertise ``name`` (in id order)."""
        if self.nodes is None:
            return []
        return [
            n.address
            for eid, n in sorted(self.nodes.snapshot().items())
            if n.role == ENGINE_ROLE and eid != self.engine_id and name in n.models
        ]

    async def _move_all(self, name: str, request_ids: list[str]) -> None:
        """Move each request: KV migration to an engine advertising ``name`` (round robin; one without a
        LoRA adapter's request's adapter refuses it, and the next is tried), else evict it so that the
        scheduler resumes it elsewhere by re-prefill."""
        ops = self.migration
        dests = self._destinations(name) if ops is not None else []
        for i, rid in enumerate(request_ids):
            moved = False
            for k in range(len(dests)):
                dest = dests[(i + k) % len(dests)]
                try:
                    assert ops is not None  # dests is empty without it
                    await kv_rpc.migrate(ops, self.engine_id, rid, dest)
                    moved = True
                    break
                except (RequestNotFoundError, MigrationConflictError):
                    moved = True  # it finished meanwhile, or another migration is moving it
                    break
                except TransferError as e:
                    log.warning("%s: could not migrate %s to %s: %s", self.engine_id, rid, dest, e)
                except Exception as e:  # a destination that went away: try the next one
                    log.warning("%s: migrating %s to %s failed: %s", self.engine_id, rid, dest, e)
            if not moved and self.host.evict(
                rid, f"model {name!r} left engine {self.engine_id}; resume on another engine"
            ):
                log.info("%s: evicted %s (%s) to be resumed elsewhere", self.engine_id, rid, name)

"""What a dispatcher knows of each engine's load: its last report plus what was sent to it since.

Engines report load over their ``WatchLoad`` streams every ``interval_s`` (the shared
:class:`~llmfleet.load.monitor.LoadMonitor` follows them). Between two reports the scheduler may send an
engine many requests — a burst of 100 concurrent requests arrives within milliseconds — and a
dispatcher reading only the last report would send them all to the same engine. :class:`LoadBook`
therefore adds to each engine's last report the requests *this* dispatcher sent there that the report
cannot reflect yet.

Accounting (per engine; pure, single-threaded, no clock):

- ``report(engine, r)`` numbers the engine's reports as they arrive: 1, 2, 3, ...
- ``dispatched(engine, request, kv_bytes)`` records the request as *pending* on the engine, stamped
  with the number ``n`` of reports received from it so far, with its KV estimate (the caller's:
  prompt tokens x the model's KV bytes per token, what it holds once prefilled).
- A pending request is *covered* — dropped, since the reports now count it — by report ``n + 2``,
  the second report received after it was sent. Report ``n + 1`` may have been taken before the
  request reached the engine (it was in flight, or the engine had not admitted it yet); report
  ``n + 2`` was taken one full report interval after report ``n + 1``, which itself was taken no
  earlier than (send time - network transit). So no engine clock is needed; the rule only assumes
  that an engine admits a request within one report interval of its sending, and that reports are
  not held up longer than that. Until covered, a request the report already names is counted once,
  by the report: its place in the queue and its KV (in the report's ``kv_used_bytes`` once admitted,
  in ``kv_waiting_bytes`` while it waits), not its pending KV estimate.
- ``released(engine, request)`` ends a placement (the request finished, failed, was cancelled or
  migrated away): a pending request is dropped at once, and one the last report names is left out of
  the engine's count at once (its slot is free now, not at the next report).
- Without any report from an engine (monitor off, engine not reporting yet) nothing is ever covered:
  its load is exactly the requests this dispatcher has outstanding there — a local join-the-shortest-
  queue that needs no load source.
- ``forget(engine)`` drops everything about an engine that left.
- ``progress(engine, request, model, tokens, first_token_s)`` records what the relay measured of a
  request decoding there (tokens streamed so far, when the first came); ``released`` drops it. A
  candidate built ``with_progress`` carries these as ``requests`` (Aladdin's constraint (d)). They
  are this dispatcher's own requests only: other scheduler replicas' are not seen.

Each request is counted once: the report's requests less those that ended since, plus the pending
ones the report does not name (engines name every request they hold, ``request_ids``). A candidate
(:meth:`LoadBook.candidate`) is the report's ``running`` less the requests that ended since, its
``waiting`` plus the pending requests it does not name (so ``queued`` is :meth:`LoadBook.occupancy`:
a dispatcher between two reports sees its own sends and ends at once, as the simulator's dispatch
sees an instance), ``kv_used`` plus the KV estimates of the pending requests the report does not name,
and the report's KV capacity (else the caller's fallback, e.g. the capacity the engine registered in
etcd), with the report's adapter pools (what LoRA-affinity dispatch reads).
Each operation is O(1) amortised (pending requests are kept in send order, so covering pops from the
front) except ``report``, which also counts the pending requests the report names (O(pending)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmfleet.policies.dispatch.base import AdapterPoolView, EngineCandidate, RequestProgress

COVERED_AFTER = 2  # reports received after sending a request before the reports count it


@dataclass(frozen=True)
class LoadReport:
    """One engine load report as plain data (``common.LoadSnapshot`` without the transport)."""

    running: int = 0
    waiting: int = 0
    kv_used_bytes: int = 0
    kv_capacity_bytes: int = 0
    # model -> KV bytes per token on this engine, for the models that hold tokens in its KV pool
    kv_bytes_per_token: Mapping[str, float] = field(default_factory=dict)
    kv_waiting_bytes: int = 0  # KV the queued requests' prompts will take (from per-request loads)
    max_running: int = 0  # the most requests the engine runs in one batch (0: unknown)
    request_ids: frozenset[str] = frozenset()  # the requests the report counts (running and waiting)
    prefix_cached_bytes: int | None = None  # KV its prefix cache holds (None: not reported)
    # per base model with LoRA on: its resident adapters (least recently used first) and slots
    adapter_pools: tuple[AdapterPoolView, ...] = ()


@dataclass
class _Engine:
    reports: int = 0  # reports received so far
    last: LoadReport | None = None
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)  # request -> (reports, kv bytes)
    pending_kv: int = 0
    ended: set[str] = field(default_factory=set)  # requests the last report names that ended since
    pending_named: int = 0  # pending requests the last report names (counted there already)
    pending_named_kv: int = 0  # their KV estimates (the report counts their KV)
    # request -> its measured progress (tokens relayed so far, first-token time), while placed here
    progress: dict[str, RequestProgress] = field(default_factory=dict)


class LoadBook:
    """Per-engine last report plus the requests dispatched since (see the module docstring)."""

    def __init__(self) -> None:
        self._engines: dict[str, _Engine] = {}
        self._bpt: dict[str, float] = {}  # model -> KV bytes per token (latest report naming it)

    def _engine(self, engine_id: str) -> _Engine:
        e = self._engines.get(engine_id)
        if e is None:
            e = self._engines[engine_id] = _Engine()
        return e

    # ------------------------------------------------------------------------------------ events
    def report(self, engine_id: str, report: LoadReport) -> None:
        """A new load report from ``engine_id``; covers what was sent before its previous report."""
        e = self._engine(engine_id)
        e.reports += 1
        e.last = report
        e.ended.clear()
        self._bpt.update(report.kv_bytes_per_token)
        horizon = e.reports - COVERED_AFTER
        pending = e.pending
        while pending:
            rid, (n, kv) = next(iter(pending.items()))
            if n > horizon:
                break
            del pending[rid]
            e.pending_kv -= kv
        named = report.request_ids
        e.pending_named = e.pending_named_kv = 0
        if named:
            for rid, (_, kv) in pending.items():
                if rid in named:
                    e.pending_named += 1
                    e.pending_named_kv += kv

    def dispatched(self, engine_id: str, request_id: str, kv_bytes: int = 0) -> None:
        """``request_id`` was sent to ``engine_id`` (again: it is re-stamped)."""
        e = self._engine(engine_id)
        e.ended.discard(request_id)
        named = e.last is not None and request_id in e.last.request_ids
        self._drop_pending(e, request_id, named)
        kv = max(0, int(kv_bytes))
        e.pending[request_id] = (e.reports, kv)
        e.pending_kv += kv
        if named:
            e.pending_named += 1
            e.pending_named_kv += kv

    def released(self, engine_id: str, request_id: str) -> None:
        """The placement of ``request_id`` on ``engine_id`` ended (any outcome); unknown ids are ignored."""
        e = self._engines.get(engine_id)
        if e is None:
            return
        e.progress.pop(request_id, None)
        named = e.last is not None and request_id in e.last.request_ids
        self._drop_pending(e, request_id, named)
        if named:
            e.ended.add(request_id)

    @staticmethod
    def _drop_pending(e: _Engine, request_id: str, named: bool) -> None:
        old = e.pending.pop(request_id, None)
        if old is None:
            return
        e.pending_kv -= old[1]
        if named:
            e.pending_named -= 1
            e.pending_named_kv -= old[1]

    def progress(
        self, engine_id: str, request_id: str, model: str, generated_tokens: int, first_token_s: float
    ) -> None:
        """``request_id`` on ``engine_id`` has streamed ``generated_tokens`` output tokens, the first
        at ``first_token_s`` (the caller's clock: the one it gives the dispatcher). Kept until the
        placement is ``released``; dispatchers reading progress (Aladdin's constraint (d)) see it."""
        self._engine(engine_id).progress[request_id] = RequestProgress(
            request_id, model, int(generated_tokens), float(first_token_s)
        )

    def forget(self, engine_id: str) -> None:
        """``engine_id`` left the cluster."""
        self._engines.pop(engine_id, None)

    def retain(self, engine_ids: Iterable[str]) -> None:
        """Forget every engine not in ``engine_ids``."""
        keep = set(engine_ids)
        for eid in [e for e in self._engines if e not in keep]:
            del self._engines[eid]

    # ------------------------------------------------------------------------------------ views
    def kv_bytes_per_token(self, model: str) -> float:
        """KV bytes per token of ``model`` as the engines report it (0 while unknown)."""
        return self._bpt.get(model, 0.0)

    def pending(self, engine_id: str) -> int:
        """Requests sent to ``engine_id`` that its reports do not count yet."""
        e = self._engines.get(engine_id)
        return len(e.pending) if e is not None else 0

    def occupancy(self, engine_id: str) -> int:
        """Requests on ``engine_id`` counted once: its last report's running + waiting less those that
        ended since, plus the pending requests that report does not name (engines name every request
        they hold): a candidate's ``queued``."""
        e = self._engines.get(engine_id)
        if e is None:
            return 0
        r = e.last or _EMPTY
        return r.running + r.waiting - len(e.ended) + len(e.pending) - e.pending_named

    def placed(self, engine_id: str) -> list[str]:
        """The ids of the requests on ``engine_id`` that :meth:`occupancy` counts: those its last report
        names less those that ended since, then the pending ones it does not name."""
        e = self._engines.get(engine_id)
        if e is None:
            return []
        named = (e.last or _EMPTY).request_ids
        out = [rid for rid in named if rid not in e.ended]
        out += [rid for rid in e.pending if rid not in named]
        return out

    def last_report(self, engine_id: str) -> LoadReport | None:
        e = self._engines.get(engine_id)
        return e.last if e is not None else None

    def candidate(
        self, engine_id: str, models: tuple[str, ...], kv_capacity_bytes: int = 0, with_progress: bool = False
    ) -> EngineCandidate:
        """The engine as a dispatcher sees it: last report + pending (``kv_capacity_bytes``: used when
        no report gives a capacity); ``with_progress``: plus the measured progress of the requests
        decoding there (``requests``; else None)."""
        e = self._engines.get(engine_id)
        if e is None:
            return EngineCandidate(
                engine_id, models, kv_capacity_bytes=kv_capacity_bytes, requests=() if with_progress else None
            )
        r = e.last or _EMPTY
        ended = len(e.ended)  # ended since the report: running ones, or waiting ones cancelled
        return EngineCandidate(
            engine_id,
            models,
            running=max(0, r.running - ended),
            waiting=max(0, r.waiting - max(0, ended - r.running)) + len(e.pending) - e.pending_named,
            kv_used_bytes=r.kv_used_bytes + e.pending_kv - e.pending_named_kv,
            kv_capacity_bytes=r.kv_capacity_bytes or kv_capacity_bytes,
            kv_waiting_bytes=r.kv_waiting_bytes,
            max_running=r.max_running,
            requests=tuple(e.progress.values()) if with_progress else None,
            prefix_cached_bytes=r.prefix_cached_bytes,
            adapter_pools=r.adapter_pools,
        )


_EMPTY = LoadReport()

"""Dispatch interface shared by the scheduler service and the simulator.

``choose(model, candidates, exclude, request)`` picks an engine for one request. ``request`` carries what
load-aware policies need (prompt length, predicted output, KV bytes per token); policies that only need
the model ignore it, and callers that know nothing more may leave it ``None``.

What a policy reads is declared by type, so callers never probe attributes:

- ``needs``: a :class:`DispatchNeeds` class attribute (every policy has one): whether it reads the
  candidates' queue lengths, their KV use, predicted output lengths, or latency models and SLOs from
  the :class:`DispatchContext`. A policy reading none of the load is *load blind*: the simulator need
  not refresh candidates and may split a run across processes, and a scheduler without a load source
  may run it. A load-reading policy is refused (:func:`check_context`) where no load source exists.
- ``needs.reads_progress``: the candidates' ``requests`` (:class:`RequestProgress`: each decoding
  request's tokens so far and first-token time). The simulator fills them from its instances, the
  live scheduler from the tokens it relays; ``None`` means the caller has no such view.
- :class:`Rebalancer`: a policy that plans moves of not-yet-started requests between engines every
  epoch (Aladdin's Algorithm 2); the caller carries them out (``Simulator.move_request``) and records
  each with ``apply_move``.
- :class:`FinishListener`: policies that keep their own books of what they placed (Aladdin, SCLS
  max-min) subclass it; callers tell them of every terminal outcome of a placement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable


class NoCandidate(LookupError):
    """No engine can take the request (none hosts the model, or all were excluded)."""


class RequestProgress(NamedTuple):
    """One request decoding on an engine, as measured: ``generated_tokens`` output tokens so far (the
    first one, from its prefill, included) and ``first_token_s``, when that first token came (on the
    caller's clock, the ``now`` it gives the policy). Its decode time so far is ``now − first_token_s``
    and its ATGT so far ``(now − first_token_s) / (generated_tokens − 1)`` (Aladdin §3).

    A named tuple (immutable, compared by value): the simulator builds one per decoding request of
    every busy instance for each dispatch, which a frozen dataclass makes several times dearer."""

    request_id: str
    model: str
    generated_tokens: int
    first_token_s: float


@dataclass(frozen=True, slots=True)
class AdapterPoolView:
    """One base model's LoRA adapter pool on an engine, as reported: the adapters resident in it (least
    recently used first) and its slots (``max_loras``; an adapter not resident takes a free slot, or
    evicts the least recently used adapter no request holds)."""

    base: str
    resident: tuple[str, ...] = ()
    slots: int = 0

    @property
    def free(self) -> int:
        return max(0, self.slots - len(self.resident))


@dataclass(frozen=True)
class EngineCandidate:
    """An engine as the dispatcher sees it: id, hosted models, and its latest load (if known).

    ``running``/``waiting`` count requests; ``kv_used_bytes``/``kv_capacity_bytes`` describe its KV pool
    (capacity 0 means unknown); ``kv_waiting_bytes`` is the KV its queued requests' prompts will take
    once admitted (0 when unknown). ``adapter_pools``: one :class:`AdapterPoolView` per base model with
    LoRA on (empty: none, or not reported); its ``models`` name the adapters it serves beside their bases.
    """

    engine_id: str
    models: tuple[str, ...]
    running: int = 0
    waiting: int = 0
    kv_used_bytes: int = 0
    kv_capacity_bytes: int = 0
    kv_waiting_bytes: int = 0
    requests: tuple[RequestProgress, ...] | None = None
    max_running: int = 0  # the most requests the engine runs in one batch, as it reports (0: unknown)
    # KV bytes the engine's prefix cache holds (cached blocks, held or idle), as it reports; None:
    # not reported (no prefix caching there, or an engine that does not count its cached blocks)
    prefix_cached_bytes: int | None = None
    adapter_pools: tuple[AdapterPoolView, ...] = ()
    # requests on the engine, running or waiting (the JSQ queue length); a plain attribute, not a
    # property, so scans over 1,000 candidates (min by queue) read it at C speed
    queued: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "queued", self.running + self.waiting)

    @property
    def kv_free_bytes(self) -> int:
        return max(0, self.kv_capacity_bytes - self.kv_used_bytes)

    def adapter_pool(self, base: str = "") -> AdapterPoolView | None:
        """The adapter pool of ``base`` ("": the only pool, when there is one); None when unknown."""
        pools = self.adapter_pools
        if not base:
            return pools[0] if len(pools) == 1 else None
        return next((p for p in pools if p.base == base), None)

    def holds_adapter(self, adapter: str) -> bool:
        """``adapter`` is resident in one of its adapter pools (as last reported)."""
        return any(adapter in p.resident for p in self.adapter_pools)


@dataclass(frozen=True)
class DispatchRequest:
    """What a dispatcher may know about one request (no oracle: ``predicted_output_tokens`` is a guess)."""

    request_id: str
    model: str
    service: str = ""
    prompt_tokens: int = 0
    predicted_output_tokens: float = 0.0
    kv_bytes_per_token: int = 0
    arrival_s: float = 0.0
    # the prompt's text, for policies that read it (``needs.reads_prompt``); "" when the caller has none
    prompt: str = ""
    # the conversation the request continues ("" when none is named)
    session: str = ""
    # the base model when ``model`` is a LoRA adapter ("" when it is not, or the caller does not know)
    base: str = ""

    @property
    def kv_need_bytes(self) -> int:
        """KV bytes the request is expected to hold at its end: (prompt + predicted output) · bytes/token."""
        return int((self.prompt_tokens + self.predicted_output_tokens) * self.kv_bytes_per_token)


@dataclass(frozen=True)
class DispatchNeeds:
    """What a dispatch policy reads (a class attribute ``needs`` of every policy).

    ``reads_queue``: the candidates' ``running``/``waiting`` (``queued``). ``reads_kv``: their
    ``kv_used_bytes`` (free KV, utilization); a KV *capacity* alone is not load. ``reads_predictions``:
    ``request.predicted_output_tokens`` (the scheduler asks the profiler for it). ``reads_costs``: the
    latency models and SLOs of the :class:`DispatchContext` (given to its constructor as
    ``latency_models``/``slos`` unless the options name them). ``reads_progress``: the candidates'
    ``requests`` (per-request tokens so far and first-token time); the live scheduler measures them
    from the tokens it relays, so they need no load source, but the choices then depend on the
    engines' state (see ``state_blind``). ``reads_prompt``: ``request.prompt`` (the prompt's text; the
    simulator renders it from the workload's prompt content only for such policies). ``per_model``: its
    choice for a model reads only the candidates hosting that model and its own state for that model,
    so instances that share no model never affect each other's routing (a plan's simulation may then
    run its components apart: ``llmfleet.sim.plan_eval``).
    """

    reads_queue: bool = False
    reads_kv: bool = False
    reads_predictions: bool = False
    reads_costs: bool = False
    reads_progress: bool = False
    reads_prompt: bool = False
    per_model: bool = False

    @property
    def load_blind(self) -> bool:
        """Reads no engine load report (queue, KV): it can run where no load source exists."""
        return not (self.reads_queue or self.reads_kv)

    @property
    def state_blind(self) -> bool:
        """Reads nothing of the engines' state (load or per-request progress): its choices do not
        depend on it, so a simulator need not refresh candidates and may split a run."""
        return self.load_blind and not self.reads_progress

    def describe(self) -> str:
        """What it reads, in words (for error messages)."""
        parts = [
            what
            for flag, what in (
                (self.reads_queue, "queue lengths"),
                (self.reads_kv, "KV-cache use"),
                (self.reads_predictions, "predicted output lengths"),
                (self.reads_costs, "latency models and SLOs"),
                (self.reads_progress, "per-request decode progress"),
                (self.reads_prompt, "prompt text"),
            )
            if flag
        ]
        return ", ".join(parts) or "nothing but the engines' models"


@dataclass(frozen=True)
class DispatchContext:
    """What the caller that builds a dispatch policy can offer it (``make_dispatch_policy(name, ctx)``).

    ``latency_models``: model -> latency model (``AladdinModel``/``RooflineModel``); ``slos``: model ->
    (TTFT, TPOT) seconds; ``load_source``: whether the candidates will carry live load (engine load
    reports in the scheduler, instance state in the simulator); ``hardware``: catalog name of the
    engines' hardware ("" = unknown).
    """

    latency_models: Mapping[str, Any] = field(default_factory=dict)
    slos: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    load_source: bool = True
    hardware: str = ""


class DispatchPolicy(Protocol):
    name: str
    needs: ClassVar[DispatchNeeds]

    def choose(
        self,
        model: str,
        candidates: Sequence[EngineCandidate],
        exclude: frozenset[str] = ...,
        request: DispatchRequest | None = ...,
    ) -> str:
        """Engine id for a request of ``model``; raises NoCandidate when none qualifies."""
        ...


@runtime_checkable
class FinishListener(Protocol):
    """A dispatch policy that tracks what it placed. Callers (simulator, scheduler) call ``on_finish``
    once per placement when it ends, whatever the outcome: finished, failed, cancelled, or migrated
    away from ``engine_id``. ``output_tokens`` = tokens produced so far, ``now`` = the caller's clock.
    Unknown request ids must be ignored."""

    def on_finish(self, request_id: str, engine_id: str, output_tokens: int, now: float) -> None: ...


@runtime_checkable
class Rebalancer(Protocol):
    """A dispatch policy that revises its placements each epoch (Aladdin Algorithm 2).

    ``rebalance(now)`` returns moves (request_id, from_engine, to_engine) of requests that have not
    started (no token yet); the caller moves each (between steps, like a migration) and, when the move
    happened, calls ``apply_move(request_id, to_engine, now)``."""

    def rebalance(self, now: float) -> list[tuple[str, str, str]]: ...

    def apply_move(self, request_id: str, to_engine: str, now: float) -> None: ...


def check_context(name: str, needs: DispatchNeeds, ctx: DispatchContext) -> None:
    """ValueError when policy ``name`` cannot run in ``ctx`` (it reads load and there is none)."""
    if not needs.load_blind and not ctx.load_source:
        raise ValueError(
            f"dispatch policy {name!r} reads engine load ({needs.describe()}), "
            "but no engine load reports come in (no load source)"
        )


class HostList(list):
    """Candidates known to host ``model``, sorted by engine id: callers that keep per-model lists (the
    simulator with 1,000 engines) pass one so :func:`eligible` need not filter and sort per request."""

    def __init__(self, model: str, items: Sequence[EngineCandidate] = ()) -> None:
        super().__init__(items)
        self.model = model


def load_bounded(
    pool: Sequence[EngineCandidate], max_excess: float, max_ratio: float
) -> tuple[list[EngineCandidate], float]:
    """The engines of ``pool`` (non-empty) whose queue is within ``max(least + max_excess, least ·
    max_ratio)`` of the least loaded one's, and that bound: the load limit within which an affinity
    policy may prefer an engine for what it holds (never empty: the least loaded is in it)."""
    least = min(c.queued for c in pool)
    bound = max(least + max_excess, least * max_ratio)
    return [c for c in pool if c.queued <= bound], bound


def eligible(
    model: str, candidates: Sequence[EngineCandidate], exclude: frozenset[str]
) -> Sequence[EngineCandidate]:
    """Candidates hosting ``model`` and not excluded, sorted by id (a stable order for every policy).

    A :class:`HostList` for ``model`` with nothing excluded is returned as it is (do not mutate it)."""
    if not exclude and isinstance(candidates, HostList) and candidates.model == model and candidates:
        return candidates
    out = sorted(
        (c for c in candidates if model in c.models and c.engine_id not in exclude), key=lambda c: c.engine_id
    )
    if not out:
        hosts = sorted(c.engine_id for c in candidates if model in c.models)
        why = f"all hosts excluded ({', '.join(hosts)})" if hosts else "no engine hosts it"
        raise NoCandidate(f"no engine available for model {model!r}: {why}")
    return out


@runtime_checkable
class CountsInfeasible(Protocol):
    """A dispatcher that counts the requests it found no feasible worker for (Aladdin's best fit):
    the simulator and the scheduler report the count per model, and Aladdin's planner scales out on it."""

    infeasible: int
